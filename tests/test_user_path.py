"""The user's path (issue 33): what a new user meets running the cluster verbs of README and docs.

One real single-member etcd in throwaway namespaces (named ``pc33-*``); every ``pycni`` runs as
its own process from the etcd's underlay namespace, as an operator would, with every state
directory a temporary one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from etcd_util import EtcdCluster, etcd_available
from netns_util import Namespace, have_root, new_namespace
from plugin_util import ok, run

pytestmark = pytest.mark.skipif(not (have_root() and etcd_available()), reason="needs root and etcd")

PREFIX = "/pc33"
NETWORK = "podnet"
ENV = {"PATH": os.environ["PATH"]}


class Cluster:
    def __init__(self, etcd: EtcdCluster, tmp: Path) -> None:
        self.etcd = etcd
        self.tmp = tmp
        assert etcd.underlay is not None
        self.ns: Namespace = etcd.underlay
        self.conf_dir = tmp / "net.d"
        self.conf_dir.mkdir()
        self.ipam = {"type": "cluster-ipam", "etcdEndpoints": etcd.endpoints, "etcdPrefix": PREFIX,
                     "nodeName": "node1", "lockDir": str(tmp / "locks"), "ranges": [[{"subnet": "10.133.0.0/16"}]]}
        (self.conf_dir / f"{NETWORK}.conflist").write_text(json.dumps(
            {"cniVersion": "1.1.0", "name": NETWORK, "plugins": [{"type": "ptp", "ipam": self.ipam}]}))

    def flags(self) -> list[str]:
        return ["--etcd-endpoints", ",".join(self.etcd.endpoints), "--etcd-prefix", PREFIX]

    def cli(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        return self.ns.run([sys.executable, "-m", "pycni", *args], input=stdin, check=False, env={**ENV, **(env or {})})

    def allocate(self, container_id: str) -> str:
        conf = {"cniVersion": "1.1.0", "name": NETWORK, "ipam": self.ipam}
        res = ok(run("cluster-ipam", "ADD", conf, host=self.ns, container_id=container_id, netns=self.ns.path,
                     CNI_NETNS_OVERRIDE="1"))
        return str(res["ips"][0]["address"].split("/")[0])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with EtcdCluster(size=1, subnet="10.231.33.0/24", prefix="pc33") as etcd:
        yield Cluster(etcd, tmp_path_factory.mktemp("pc33"))


@pytest.fixture
def lone_ns() -> Iterator[Namespace]:
    """A namespace where nothing listens: every connection to it is refused at once."""
    ns = new_namespace(prefix="pc33")
    try:
        yield ns
    finally:
        ns.delete()


def one_error_line(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert proc.returncode == 1, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    assert line.startswith("pycni: ") and line.count("pycni:") == 1 and line.endswith(f"(code {code})"), line
    for w in words:
        assert w in line, (w, line)
    return line


# ---- item 4: an unreachable etcd fails fast, in one line naming the endpoints ---------------------------

REFUSED = "http://127.0.0.1:1,http://127.0.0.1:2"
VERBS: list[list[str]] = [["endpoint", "list"], ["policy", "list"], ["policy", "apply", "-f", "-"],
                          ["policy", "why", "a/b", "c/d", "80"], ["namespace", "label", "x", "a=b"],
                          ["endpoint", "label", "x/y", "a=b"], ["ipam", "list", NETWORK], ["ipam", "show", NETWORK],
                          ["ipam", "check", NETWORK], ["ipam", "release", NETWORK, "--ip", "10.133.0.9"],
                          ["node", "status"], ["node", "remove", "n1"]]
POLICY = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}}\n"


def conf_dir(verb: list[str], tmp_path: Path) -> list[str]:
    """An empty --conf-dir for the ipam verbs (the machine's /etc/cni/net.d is not read)."""
    return ["--conf-dir", str(tmp_path)] if verb[0] == "ipam" else []


def test_refused_etcd_fails_within_a_second_naming_the_endpoints(lone_ns: Namespace, tmp_path: Path) -> None:
    """Every verb that talks to etcd, with nothing listening: one line, code 11, the endpoints
    named, in under a second past the verb's own start-up (they waited 5-10 s). The start-up is
    the same verb refused before any connection (an endpoint that is not a URL: code 7)."""
    def timed(verb: list[str], endpoints: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        t0 = time.monotonic()
        proc = lone_ns.run([sys.executable, "-m", "pycni", *verb, "--etcd-endpoints", endpoints,
                            *conf_dir(verb, tmp_path)], input=POLICY, check=False, env=ENV)
        return time.monotonic() - t0, proc

    slowest = 0.0
    for verb in VERBS:
        startup, early = timed(verb, "nota-url")
        one_error_line(early, 7, "--etcd-endpoints")
        took, proc = timed(verb, REFUSED)
        one_error_line(proc, 11, "every endpoint refused the connection", "http://127.0.0.1:1, http://127.0.0.1:2")
        slowest = max(slowest, took - startup)
        # what is checked is the mechanism, not speed: a refusal ends the verb at once instead of
        # waiting out the 5 s budget (the measured figure, ~0.5 s, is printed; CI's load varies)
        assert took - startup < 3.0, (verb, took, startup)
    print(f"slowest refused verb: {slowest:.2f} s past its start-up")


def test_a_silent_etcd_costs_one_budget_for_every_verb(lone_ns: Namespace, tmp_path: Path) -> None:
    """An endpoint that accepts connections and never answers: every verb gives up after the one
    budget (--etcd-timeout, here 1 s; 5 s by default), not its own (ipam 8 s, policy 10 s before)."""
    silent = subprocess.Popen(["ip", "netns", "exec", lone_ns.name, sys.executable, "-c",
                               "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 2379)); s.listen(64); "
                               "print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert silent.stdout is not None and silent.stdout.readline().strip() == "up"
        took = {}
        for verb in VERBS:
            t0 = time.monotonic()
            proc = lone_ns.run([sys.executable, "-m", "pycni", *verb, "--etcd-endpoints", "http://127.0.0.1:2379",
                                "--etcd-timeout", "1", *conf_dir(verb, tmp_path)], input=POLICY, check=False, env=ENV)
            took[" ".join(verb[:2])] = round(time.monotonic() - t0, 2)
            one_error_line(proc, 11, "http://127.0.0.1:2379", "timed out")
        assert max(took.values()) < 4.0, took  # one 1 s budget, not each verb's own 5-10 s (load varies)
        print(f"silent etcd, --etcd-timeout 1: {took}")
    finally:
        silent.kill()
        silent.wait()


def test_the_environment_names_etcd_for_every_verb(lone_ns: Namespace, tmp_path: Path) -> None:
    for verb in VERBS:
        proc = lone_ns.run([sys.executable, "-m", "pycni", *verb, *conf_dir(verb, tmp_path)], input=POLICY,
                           check=False, env={**ENV, "PYCNI_ETCD_ENDPOINTS": REFUSED})
        one_error_line(proc, 11, "http://127.0.0.1:1")


# ---- item 5: the ipam verbs take the same etcd flags; the conflist still works --------------------------

def test_ipam_verbs_with_etcd_flags_or_conflist(cluster: Cluster, tmp_path: Path) -> None:
    ip = cluster.allocate("pc33-a")
    empty = str(tmp_path)  # no conflist there: the flags alone name etcd
    by_flags = cluster.cli("ipam", "list", NETWORK, "-o", "json", "--conf-dir", empty, *cluster.flags())
    by_conf = cluster.cli("ipam", "list", NETWORK, "-o", "json", "--conf-dir", str(cluster.conf_dir))
    by_env = cluster.cli("ipam", "list", NETWORK, "-o", "json", "--conf-dir", empty, "--etcd-prefix", PREFIX,
                         env={"PYCNI_ETCD_ENDPOINTS": ",".join(cluster.etcd.endpoints)})
    for proc in (by_flags, by_conf, by_env):
        assert proc.returncode == 0, proc.stderr
        rows = json.loads(proc.stdout)
        assert [(r["ip"], r["containerID"], r["node"]) for r in rows] == [(ip, "pc33-a", "node1")], rows
    # docs/policy.md's example, with the flags: per pool of the conflist, or over the blocks without one
    show = cluster.cli("ipam", "show", "--show-blocks", NETWORK, "--conf-dir", empty, *cluster.flags())
    assert show.returncode == 0, show.stderr
    head, total, block = show.stdout.splitlines()[:3]
    assert head.split()[:2] == ["GROUPING", "CIDR"] and "(all IPv4)" in total and "node1" in block, show.stdout
    show = cluster.cli("ipam", "show", "--show-blocks", NETWORK, "--conf-dir", str(cluster.conf_dir))
    assert show.stdout.splitlines()[1].split()[:6] == ["IP", "Pool", "10.133.0.0/16", "65536", "1", "(0%)"], show.stdout
    check = cluster.cli("ipam", "check", NETWORK, "--conf-dir", empty, *cluster.flags())
    assert check.returncode == 0 and "consistent" in check.stderr, check.stderr
    released = cluster.cli("ipam", "release", NETWORK, "--ip", ip, "--conf-dir", empty, *cluster.flags())
    assert released.returncode == 0 and f"released {ip}" in released.stdout, released.stderr
    # neither flags nor a conflist: one line saying both ways
    none = cluster.cli("ipam", "list", NETWORK, "--conf-dir", empty)
    one_error_line(none, 7, "--etcd-endpoints", "--conf-dir")


# ---- item 8: one set of output formats for every list and show verb -------------------------------------

def test_list_and_show_verbs_print_table_wide_json_yaml(cluster: Cluster) -> None:
    ip = cluster.allocate("pc33-b")
    cluster.cli("policy", "apply", "-f", "-", *cluster.flags(), stdin=POLICY.replace("name: p", "name: pc33"))
    verbs = [["ipam", "list", NETWORK, "--conf-dir", str(cluster.conf_dir)],
             ["ipam", "show", NETWORK, "--conf-dir", str(cluster.conf_dir)],
             ["policy", "list", *cluster.flags()], ["endpoint", "list", "-A", *cluster.flags()],
             ["node", "status", *cluster.flags()], ["list", "--conf-dir", str(cluster.conf_dir)]]
    for verb in verbs:
        out: dict[str | None, Any] = {}
        for fmt in (None, "wide", "json", "yaml"):
            proc = cluster.cli(*verb, *(["-o", fmt] if fmt else []))
            assert proc.returncode == 0, (verb, fmt, proc.stderr)
            out[fmt] = proc.stdout
        assert json.loads(out["json"]) == yaml.safe_load(out["yaml"]), verb
        assert isinstance(json.loads(out["json"]), list), verb
        table, wide = out[None].splitlines(), out["wide"].splitlines()
        if table:
            assert table[0].isupper() and len(wide[0].split("   ")) >= len(table[0].split("   ")), (verb, out)
    rows = json.loads(cluster.cli("ipam", "list", NETWORK, "-o", "json", "--conf-dir", str(cluster.conf_dir)).stdout)
    assert ip in [r["ip"] for r in rows]
    assert "pc33" in cluster.cli("policy", "list", *cluster.flags()).stdout
    cluster.cli("policy", "delete", "default/pc33", *cluster.flags())


# ---- item 3: policy files are YAML (PyYAML), as kubectl writes them ---------------------------------------

KUBECTL_EXPORT = """\
apiVersion: v1
items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"annotations":{},"name":"web"}}
    creationTimestamp: "2026-11-28T08:00:00Z"
    generation: 1
    name: web
    namespace: shop
    resourceVersion: "4242"
    uid: 0b5d7c1e-6a8e-4c1e-9d7a-2f0c1d2e3f40
  spec:
    ingress:
    - from:
      - podSelector: &front
          matchLabels: {app: front,
                        tier: web}
      ports:
      - port: 80
        protocol: TCP
    podSelector:
      matchLabels:
        app: web
    policyTypes:
    - Ingress
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: db, namespace: shop}
  spec:
    podSelector: {matchLabels: {app: db}}
    ingress:
    - from:
      - podSelector: *front
kind: List
metadata:
  resourceVersion: ""
"""


def test_policy_files_are_yaml_as_kubectl_writes_them() -> None:
    from pycni.cluster.policy.model import PolicyError, parse_policies

    web, db = parse_policies(KUBECTL_EXPORT)
    assert (web.namespace, web.name, db.namespace, db.name) == ("shop", "web", "shop", "db")
    assert web.source["spec"]["ingress"][0]["from"][0]["podSelector"] == {"matchLabels": {"app": "front",
                                                                                          "tier": "web"}}
    assert db.source["spec"]["ingress"][0]["from"][0] == web.source["spec"]["ingress"][0]["from"][0]
    with pytest.raises(PolicyError, match=r"line 4: duplicate key 'name'"):
        parse_policies("kind: NetworkPolicy\nmetadata:\n  name: a\n  name: b\n")
    with pytest.raises(PolicyError, match=r"invalid YAML: line 2: did not find expected"):
        parse_policies("a: [1, 2\n")
    assert [p.name for p in parse_policies('{\n\t"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",'
                                           ' "metadata": {"name": "j"}}')] == ["j"]  # JSON, tabs and all


def test_policy_apply_reads_a_kubectl_export(cluster: Cluster) -> None:
    applied = cluster.cli("policy", "apply", "-f", "-", *cluster.flags(), stdin=KUBECTL_EXPORT)
    assert applied.returncode == 0, applied.stderr
    assert "networkpolicy shop/web created" in applied.stdout and "shop/db created" in applied.stdout
    bad = cluster.cli("policy", "apply", "-f", "-", *cluster.flags(), stdin="a: |\n  x\nb: [\n")
    one_error_line(bad, 7, "invalid NetworkPolicy", "invalid YAML: line")
    for name in ("web", "db"):
        assert cluster.cli("policy", "delete", f"shop/{name}", *cluster.flags()).returncode == 0


# ---- item 2: policy is enforced by default; apply warns when no node enforces; status shows it -----------

def start_agent(cluster: Cluster, name: str, *flags: str) -> subprocess.Popen[str]:
    ip = str(list(cluster.etcd.net.hosts())[-1])  # the underlay namespace's own address
    return subprocess.Popen(["ip", "netns", "exec", cluster.ns.name, sys.executable, "-m", "pycni", "node",
                             *cluster.flags(), "--node-name", name, "--underlay-ip", ip, "--flows-socket", "",
                             *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        return proc.communicate(timeout=20)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


def nodes(cluster: Cluster) -> dict[str, dict[str, Any]]:
    proc = cluster.cli("node", "status", "-o", "json", *cluster.flags())
    assert proc.returncode == 0, proc.stderr
    return {n["name"]: n for n in json.loads(proc.stdout)}


def wait_for(cond: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_policy_is_enforced_by_default_and_apply_says_when_nothing_enforces(cluster: Cluster) -> None:
    policy = POLICY.replace("name: p", "name: pc33-enf")
    opted_out = start_agent(cluster, "pc33-off", "--no-policy")
    try:
        wait_for(lambda: "pc33-off" in nodes(cluster), "the --no-policy agent registered")
        assert nodes(cluster)["pc33-off"]["policy"] is False
        table = cluster.cli("node", "status", *cluster.flags()).stdout.splitlines()
        assert table[0].split() == ["NAME", "UNDERLAY", "MODE", "POLICY", "BLOCKS"]
        assert [row.split()[3] for row in table[1:] if row.startswith("pc33-off")] == ["off"], table
        applied = cluster.cli("policy", "apply", "-f", "-", *cluster.flags(), stdin=policy)
        assert applied.returncode == 0 and "created" in applied.stdout, applied.stderr
        assert "pycni: warning: no live node enforces network policy" in applied.stderr, applied.stderr
    finally:
        stop(opted_out)
    enforcing = start_agent(cluster, "pc33-on")  # no flag: enforces
    try:
        wait_for(lambda: nodes(cluster).get("pc33-on", {}).get("policy") is True, "the default agent enforces")
        assert "pc33-on" in cluster.cli("node", "status", *cluster.flags()).stdout
        again = cluster.cli("policy", "apply", "-f", "-", *cluster.flags(), stdin=policy)
        assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout  # item 9: not "configured"
        assert "no live node enforces" not in again.stderr, again.stderr
        old_flag = start_agent(cluster, "pc33-old", "--policy")  # still accepted
        try:
            wait_for(lambda: nodes(cluster).get("pc33-old", {}).get("policy") is True, "--policy enforces")
        finally:
            stop(old_flag)
    finally:
        stop(enforcing)
        cluster.cli("policy", "delete", "default/pc33-enf", *cluster.flags())
        for name in ("pc33-off", "pc33-on", "pc33-old"):
            cluster.cli("node", "remove", name, *cluster.flags())


def test_agent_says_once_that_it_cannot_reach_etcd(lone_ns: Namespace) -> None:
    lone_ns.run(["ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul1"])
    lone_ns.run(["ip", "addr", "add", "192.0.2.10/24", "dev", "ul0"])
    lone_ns.run(["ip", "link", "set", "ul0", "up"])
    agent = subprocess.Popen(["ip", "netns", "exec", lone_ns.name, sys.executable, "-m", "pycni", "node",
                              "--etcd-endpoints", REFUSED, "--node-name", "pc33-lone", "--underlay-ip", "192.0.2.10",
                              "--flows-socket", ""],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(4)
    assert agent.poll() is None  # it keeps retrying
    log = stop(agent)
    said = [line for line in log.splitlines() if "cannot reach etcd" in line]
    assert len(said) == 1, log
    assert "http://127.0.0.1:1, http://127.0.0.1:2: every endpoint refused the connection; retrying with backoff" \
        in said[0], said


# ---- item 9: silent mistakes are said ----------------------------------------------------------------------

def test_labelling_a_pod_that_exists_nowhere_needs_create(cluster: Cluster) -> None:
    nosuch = cluster.cli("endpoint", "label", "shop/nosuch-pod", "app=x", *cluster.flags())
    one_error_line(nosuch, 3, "no pod shop/nosuch-pod", "--create")
    made = cluster.cli("endpoint", "label", "shop/nosuch-pod", "app=x", "--create", *cluster.flags())
    assert made.returncode == 0 and "app=x" in made.stdout, made.stderr
    relabel = cluster.cli("endpoint", "label", "shop/nosuch-pod", "app=y", *cluster.flags())  # now it has a record
    assert relabel.returncode == 0, relabel.stderr
    ports = cluster.cli("endpoint", "ports", "shop/other", "http=80/TCP", *cluster.flags())
    one_error_line(ports, 3, "no pod shop/other")


def test_a_port_name_no_pod_defines_is_accepted_with_a_warning(cluster: Cluster) -> None:
    cluster.cli("endpoint", "ports", "shop/web-1", "http=8080/TCP", "--create", *cluster.flags())
    text = POLICY.replace("name: p", "name: pc33-ports").replace(
        "spec: {podSelector: {}}", "spec: {podSelector: {}, ingress: [{ports: [{port: http}, {port: metrics}]}]}")
    applied = cluster.cli("policy", "apply", "-f", "-", *cluster.flags(), stdin=text)
    assert applied.returncode == 0 and "created" in applied.stdout, applied.stderr
    warned = [line for line in applied.stderr.splitlines() if "no pod defines a port" in line]
    assert len(warned) == 1 and "'metrics'" in warned[0] and warned[0].startswith("pycni: warning: "), warned
    cluster.cli("policy", "delete", "default/pc33-ports", *cluster.flags())


# ---- item 6: `policy why` DENIED has its own exit status (2 is argparse's usage error) ------------------

def test_policy_why_denied_exits_3_and_usage_errors_2(cluster: Cluster) -> None:
    from pycni.cluster.model import Keys, WorkloadEndpoint

    keys = Keys(PREFIX)
    ep = WorkloadEndpoint(node="node1", network=NETWORK, namespace="pc33ns", pod="db", container_id="pc33-db",
                          ifname="eth0", interface_name="rtdpc33db", ip_networks=["10.133.9.9/32"],
                          labels={"app": "db"}, profiles=[NETWORK], orchestrator="k8s")
    with cluster.etcd.client() as etcd:  # the record routed writes at ADD
        etcd.put(keys.endpoint("node1", NETWORK, "pc33-db", "eth0"), ep.to_json())
    try:
        allowed = cluster.cli("policy", "why", "10.133.1.1", "pc33ns/db", "5432", *cluster.flags())
        assert allowed.returncode == 0 and "ALLOWED" in allowed.stdout, allowed
        deny = POLICY.replace("name: p}", "name: deny-all, namespace: pc33ns}")
        assert cluster.cli("policy", "apply", "-f", "-", *cluster.flags(), stdin=deny).returncode == 0
        denied = cluster.cli("policy", "why", "10.133.1.1", "pc33ns/db", "5432", *cluster.flags())
        assert denied.returncode == 3 and "DENIED" in denied.stdout, denied
        usage = cluster.cli("policy", "why", "10.133.1.1", *cluster.flags())
        assert usage.returncode == 2 and usage.stderr.startswith("usage: pycni policy why"), usage
    finally:
        cluster.cli("policy", "delete", "pc33ns/deny-all", *cluster.flags())
        with cluster.etcd.client() as etcd:
            etcd.delete(keys.endpoint("node1", NETWORK, "pc33-db", "eth0"))
