"""Network policy across a cluster, end to end: a real 3-member etcd (one member per node
namespace), ``pycni node --policy`` on each node, routed + cluster-ipam pods a, b, c in
namespaces x, y, z spread over the three nodes, policies applied with ``pycni policy apply``,
labels with ``pycni endpoint label`` / ``pycni namespace label``, and every matrix probed with
real TCP and UDP packets on ports 80 and 81 (tests/policy_cases.py holds the truth).

Enforcement is asynchronous (the agents follow etcd's watch), so a matrix is probed until it
equals the expected one or a deadline passes; the failure message prints the last matrix. The
no-window tests are not eventual: a pod under deny-all is probed from inside right after ADD
returns, and through an agent's restart, and must never get a single packet through.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_util import EtcdCluster, EtcdNode, etcd_available
from netns_util import Namespace, new_namespace
from plugin_util import err, ok, run
from policy_cases import (
    CASES,
    DENY_INGRESS_X,
    KEYS,
    NAMED_PORTS,
    PORTS,
    XA_INGRESS_DENIED,
    expected,
    grid,
    policies_text,
    render,
)
from policy_probe import EchoServers, PacketWatch, probe

from pycni import ipaddr
from pycni.cluster.model import Keys, PodMeta
from pycni.cluster.node import DEFAULT_VXLAN_DEVICE, RTPROT_PYCNI

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and etcd (Debian's etcd-server)")

SUBNET = "10.92.0.0/16"
SUBNET6 = "fd92::/64"  # pods are dual-stack; IPv6 crosses nodes in vxlan mode (no IPv6 underlay here)
CONVERGE = 30.0  # seconds an agent may take to follow a change on a loaded machine


class Env:
    def __init__(self, cluster: EtcdCluster, tmp: Path, plugin_dir: str) -> None:
        self.cluster, self.tmp, self.plugin_dir = cluster, tmp, plugin_dir
        self.prefix = f"/po-{os.getpid()}"
        self.keys = Keys(self.prefix)
        self.nodes: list[EtcdNode] = cluster.nodes
        self.agents: dict[int, subprocess.Popen[bytes]] = {}
        self.pods: dict[str, tuple[Namespace, dict[int, str]]] = {}
        self.where: dict[str, int] = {}
        self.namespaces: list[Namespace] = []
        self.servers: EchoServers | None = None
        self.pod_prefix = "pe34-pod"  # the pods' namespaces' prefix
        self.extra: Any = lambda i: []  # more flags for node i's agent

    def log(self, i: int) -> Path:
        return self.tmp / f"agent-{self.nodes[i].name}.log"

    def start_agent(self, i: int, mode: str = "host-gw", endpoints: list[str] | None = None,
                    ready: bool = True) -> None:
        """Start node ``i``'s agent; with ``ready``, wait until it has reconciled its table."""
        node = self.nodes[i]
        cmd = ["ip", "netns", "exec", node.ns.name, sys.executable, "-m", "pycni", "node", "--policy",
               "--etcd-endpoints", ",".join(endpoints or self.cluster.endpoints), "--etcd-prefix", self.prefix,
               "--node-name", node.name, "--underlay-ip", node.ip, "--ttl", "30", "--mode", mode,
               "--flows-socket", str(self.tmp / f"flows-{node.name}.sock"), *self.extra(i)]
        before = self.log(i).read_text().count("policy: reconciled with the kernel") if self.log(i).exists() else 0
        with open(self.log(i), "ab") as log:
            self.agents[i] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env={**os.environ, "PYCNI_POLICY_STRICT": "1"})
        if ready:
            self.wait(lambda: self.log(i).read_text().count("policy: reconciled with the kernel") > before,
                      f"agent {node.name} programmed its policy table")

    def close(self) -> None:
        """Everything the env made: echo servers, agents, pods' namespaces, the nodes' policy
        tables and routes (the nodes themselves are the etcd cluster's)."""
        if self.servers is not None:
            self.servers.close()
        for i in list(self.agents):
            self.stop_agent(i, signal.SIGKILL)
        for ns in self.namespaces:
            ns.delete()
        for node in self.nodes:
            node.ns.run(["nft", "delete", "table", "inet", "pycni_policy"], check=False)
            node.ns.run(["ip", "-4", "route", "flush", "proto", str(RTPROT_PYCNI)], check=False)

    def stop_agent(self, i: int, sig: int = signal.SIGTERM) -> None:
        proc = self.agents.pop(i, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=20)

    @staticmethod
    def wait(cond: Any, what: str, timeout: float = CONVERGE) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for: {what}")
            time.sleep(0.1)

    def conf(self, i: int, **extra: Any) -> dict[str, Any]:
        c = {"cniVersion": "1.1.0", "name": "podnet", "type": "routed", "policySetupTimeout": 20,
             "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.cluster.endpoints, "etcdPrefix": self.prefix,
                      "nodeName": self.nodes[i].name, "ranges": [[{"subnet": SUBNET}], [{"subnet": SUBNET6}]],
                      "blockSize": 26,
                      "etcdTimeout": 10, "lockDir": str(self.tmp / "locks")}}
        c.update(extra)
        return c

    def add(self, key: str, i: int, **conf: Any) -> tuple[Namespace, dict[str, Any]]:
        ns_name, pod = key.split("/")
        pns = new_namespace(self.pod_prefix)
        self.namespaces.append(pns)
        outcome = run("routed", "ADD", self.conf(i, **conf), host=self.nodes[i].ns, netns=pns,
                      cni_path=self.plugin_dir,
                       container_id=f"po-{ns_name}-{pod}",
                       args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns_name};K8S_POD_NAME={pod}")
        if outcome.exit_code != 0:  # say what the agents were doing
            logs = "\n".join(f"--- {self.nodes[j].name}:\n" + self.log(j).read_text()[-3000:]
                             for j in range(len(self.nodes)) if self.log(j).exists())
            raise AssertionError(f"ADD {key} on {self.nodes[i].name}: {outcome.stdout.decode()}\n{logs}")
        res = ok(outcome)
        addrs = {ipaddr.ip_interface(x["address"]).version: x["address"].split("/")[0] for x in res["ips"]}
        self.pods[key] = (pns, addrs)
        self.where[key] = i
        return pns, res

    def delete(self, key: str, **conf: Any) -> None:
        pns, _ = self.pods.pop(key)
        ns_name, pod = key.split("/")
        ok(run("routed", "DEL", self.conf(self.where[key], **conf), host=self.nodes[self.where[key]].ns, netns=pns,
               cni_path=self.plugin_dir, container_id=f"po-{ns_name}-{pod}"))

    def cli(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        node = self.nodes[0]
        return node.ns.run([sys.executable, "-m", "pycni", *args, "--etcd-endpoints", ",".join(self.cluster.endpoints),
                            "--etcd-prefix", self.prefix], input=stdin, check=check)

    def put(self, key: str, value: str) -> None:
        with self.cluster.client() as etcd:
            etcd.put(key, value)

    def clear_policies(self) -> None:
        with self.cluster.client() as etcd:
            etcd.delete_prefix(self.keys.policies)

    def apply(self, case: dict[str, object]) -> None:
        self.clear_policies()
        text = policies_text(case, {k: v[1][4] for k, v in self.pods.items() if k in KEYS})
        if text.strip():
            self.cli("policy", "apply", "-f", "-", stdin=text)

    def matrix(self, case: dict[str, object] | None = None, want: dict[tuple[str, str], bool] | None = None,
               timeout: float = CONVERGE, version: int = 4) -> None:
        """Probe the nine pods' matrix on every port (over IPv``version``) until it is the case's (or
        ``want``) everywhere."""
        flows = [(s, d, port, proto) for s in KEYS for d in KEYS for port, proto in PORTS]

        def exp(port: int, proto: str) -> dict[tuple[str, str], bool]:
            return want if want is not None else expected(case, port, proto)  # type: ignore[arg-type]

        deadline = time.monotonic() + timeout
        while True:
            got = probe(self.pods, flows, version=version, expect=lambda f: exp(f[2], f[3])[(f[0], f[1])])
            bad = []
            for port, proto in PORTS:
                m = {(s, d): got[(s, d, port, proto)] for s in KEYS for d in KEYS}
                if m != exp(port, proto):
                    bad.append(f"{port}/{proto} IPv{version}:\n{render(m, exp(port, proto))}")
            if not bad:
                return
            if time.monotonic() > deadline:
                name = case["name"] if case else "matrix"
                raise AssertionError(f"{name}: not enforced within {timeout:g}s\n" + "\n".join(bad))
            time.sleep(0.5)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, plugin_dir: str) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("po-cluster")
    with EtcdCluster(size=3, subnet="10.232.0.0/24", prefix="pe34-etcd") as cluster:
        e = Env(cluster, tmp, plugin_dir)
        try:
            for i in range(3):
                e.start_agent(i)
            for ns in "xyz":
                e.cli("namespace", "label", ns, f"ns={ns}")
            # labels and named ports: some set before the pod's ADD, the rest after
            for n, key in enumerate(KEYS):
                ns, pod = key.split("/")
                meta = PodMeta(labels={"pod": pod}, ports=[(name, port, proto) for (name, proto), port in
                                                          NAMED_PORTS.items()])
                if n % 2 == 0:
                    e.put(e.keys.pod(ns, pod), meta.to_json())
                e.add(key, n % 3)
                if n % 2 == 1:
                    e.put(e.keys.pod(ns, pod), meta.to_json())
            e.servers = EchoServers(ns for ns, _ in e.pods.values())
            e.matrix(CASES[0])  # everything reaches everything before any policy
            yield e
        finally:
            e.close()


TRUTH = ["deny-all ingress in x", "deny-all egress in x", "x/a allows ingress from pod=b of its own namespace",
         "both selectors in one peer are an AND (y/b only)", "two peers are an OR (namespace y, or pod=b of x)",
         "ipBlock with except (every address but y/a's)", "a named port (serve-81-tcp) opens 81/TCP only",
         "endPort: 81-90/TCP into x/a", "egress from x/a to an ipBlock (z/a, z/b) on 80/TCP",
         "egress rules without policyTypes make x/a Ingress+Egress (ingress then allows nothing)",
         "policies are additive: deny-all in x, x/a from y, x from z/c"]


def _case(name: str) -> dict[str, object]:
    return next(c for c in CASES if c["name"] == name)


def test_truth_tables_across_nodes(env: Env) -> None:
    for name in TRUTH:
        case = _case(name)
        env.apply(case)
        env.matrix(case)
    # updated in place, then deleted
    case = _case("x allows ingress from namespace y")
    env.apply(case)
    env.matrix(case)
    env.cli("policy", "apply", "-f", "-", stdin=str(case["policies"]).replace('{ns: "y"}', "{ns: z}"))
    env.matrix(want=grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  .  .  .  .  .  .
  xb  X  .  X  .  .  .  .  .  .
  xc  X  X  .  .  .  .  .  .  .
  ya  X  X  X  .  .  .  .  .  .
  yb  X  X  X  .  .  .  .  .  .
  yc  X  X  X  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
"""))
    listed = env.cli("policy", "list", "-A").stdout
    assert ["x", "allow-ns-y", "(all)", "Ingress"] in [ln.split() for ln in listed.splitlines()], listed
    env.cli("policy", "delete", "x/allow-ns-y")
    env.matrix(CASES[0])
    assert env.cli("policy", "delete", "x/allow-ns-y", check=False).returncode == 1


def test_label_and_namespace_label_changes(env: Env) -> None:
    case = _case("both selectors in one peer are an AND (y/b only)")
    env.apply(case)
    env.matrix(case)
    env.cli("endpoint", "label", "y/b", "pod=q")
    env.matrix(want=XA_INGRESS_DENIED)
    env.cli("endpoint", "label", "y/b", "pod=b")
    env.matrix(case)
    case = _case("x allows ingress from namespace y")
    env.apply(case)
    env.matrix(case)
    env.cli("namespace", "label", "y", "ns-")
    env.matrix(want=DENY_INGRESS_X)
    env.cli("namespace", "label", "y", "ns=y")
    env.matrix(case)
    # what the operator sees
    wide = env.cli("endpoint", "list", "-A", "-o", "wide").stdout
    assert "x/a" in wide and "pod=a" in wide and "podnet" in wide
    why = env.cli("policy", "why", "z/a", "x/b", "80/TCP", check=False)
    assert why.returncode == 3 and "denied; selected by x/allow-ns-y" in why.stdout  # DENIED: not argparse's 2
    why = env.cli("policy", "why", "y/c", "x/b", "81/UDP")
    assert "allowed by x/allow-ns-y (ingress rule 0)" in why.stdout


def test_pod_churn_keeps_the_matrix(env: Env) -> None:
    case = _case("two peers are an OR (namespace y, or pod=b of x)")
    env.apply(case)
    env.matrix(case)
    for key in ("x/b", "y/c"):
        i = env.where[key]
        env.delete(key)
        env.add(key, i)
        env.servers.close()  # type: ignore[union-attr]
        env.servers = EchoServers(ns for ns, _ in env.pods.values())
    env.matrix(case)


class Hammer:
    """Probes the given flows over and over from a thread; counts what got through."""

    def __init__(self, env: Env, flows: list[tuple[str, str, int, str]]) -> None:
        self.env, self.flows = env, flows
        self.passed: list[tuple[str, str, int, str]] = []
        self.rounds = 0
        self.stopping = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopping:
            got = probe(self.env.pods, self.flows, retries=0, window=0.3)
            self.passed += [f for f, ok_ in got.items() if ok_]
            self.rounds += 1

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(30)


def test_agent_restart_keeps_rules_and_opens_no_window(env: Env) -> None:
    deny = _case("deny-all ingress in x")
    env.apply(deny)
    env.matrix(deny)
    into_xa = [(s, "x/a", port, proto) for s in KEYS if s != "x/a" for port, proto in PORTS]
    hammer = Hammer(env, into_xa)
    try:
        i = env.where["x/a"]
        env.stop_agent(i, signal.SIGKILL)
        time.sleep(1.0)
        env.start_agent(i)
        env.stop_agent(i, signal.SIGTERM)
        env.start_agent(i)
        time.sleep(0.5)
    finally:
        hammer.stop()
    assert hammer.rounds >= 2 and not hammer.passed, f"{len(hammer.passed)} probes got through: {hammer.passed[:5]}"
    env.matrix(deny)
    # a change made while an agent is down is enforced once it is back
    i = env.where["x/b"]
    env.stop_agent(i, signal.SIGKILL)
    case = _case("x allows ingress from namespace y")
    env.apply(case)
    env.start_agent(i)
    env.matrix(case)


def test_periodic_check_repairs_the_table_without_leaving_the_watch(env: Env) -> None:
    """With --resync 1 an agent checks its kernel every second inside its watch: its policy table
    edited by hand (a verdict chain flushed, a covered interface removed: x/a cut off and opened)
    and then deleted whole is put back from what it knows, with no full read of etcd."""
    deny = _case("deny-all ingress in x")
    env.apply(deny)
    env.matrix(deny)
    i = env.where["x/a"]
    env.stop_agent(i)
    env.extra = lambda j: ["--resync", "1"] if j == i else []
    try:
        env.start_agent(i)
        node = env.nodes[i]
        full_reads = env.log(i).read_text().count("resyncing")
        table = "inet pycni_policy"
        listing = json.loads(node.ns.run(["nft", "-j", "list", "table", *table.split()]).stdout)
        chains = [c["chain"]["name"] for c in listing["nftables"] if "chain" in c and "hook" not in c["chain"]]
        iface = next(e for s in listing["nftables"] if "set" in s and s["set"]["name"] == "covered"
                     for e in s["set"].get("elem", []))
        before = env.log(i).read_text().count("checked off the event path")
        node.ns.run(["nft", "-f", "-"], input="".join(f"flush chain {table} {c}\n" for c in chains)
                    + f'delete element {table} covered {{ "{iface}" }}\n')
        env.wait(lambda: env.log(i).read_text().count("checked off the event path") > before,
                 "the agent reconciles with the kernel")
        env.matrix(deny)
        node.ns.run(["nft", "delete", "table", *table.split()])
        env.wait(lambda: node.ns.run(["nft", "list", "table", *table.split()], check=False).returncode == 0,
                 "the agent makes its table again")
        env.matrix(deny)
        assert env.log(i).read_text().count("resyncing") == full_reads  # (never left the watch)
    finally:
        env.extra = lambda j: []
        env.stop_agent(i)
        env.start_agent(i)


DENY_BOTH_X = """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
"""


def _churn(env: Env, n: int, burst: int) -> None:
    """Policies of namespaces y and z written one by one (each a transaction of the agents'):
    they select y's and z's pods and open nothing to or from x."""
    with env.cluster.client() as etcd:
        for j in range(n):
            ns = "yz"[j % 2]
            doc = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"name": f"churn{j}", "namespace": ns},
                   "spec": {"podSelector": {},
                            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": ns}}}],
                                         "ports": [{"port": 1000 + 100 * burst + j, "protocol": "UDP"}]}]}}
            etcd.put(env.keys.policy(ns, f"churn{j}"), json.dumps(doc))


def test_restart_window_with_a_packet_watch(env: Env) -> None:
    """Deny-all both ways on namespace x; every flow to and from x's pods hammered, and every
    TCP/UDP packet arriving in any pod watched, while the agent of x/b's node is SIGKILLed and
    restarted, SIGTERMed and restarted, SIGKILLed three times in the middle of a burst of policy
    transactions (between two of them), SIGKILLed during its start (after registering, while it
    reads etcd and reconciles), and started once with etcd out of reach (then stopped).
    Not one packet of a denied pair may arrive."""
    env.clear_policies()
    env.cli("policy", "apply", "-f", "-", stdin=DENY_BOTH_X)

    def denied(s: str, d: str) -> bool:
        return s != d and (s.startswith("x/") or d.startswith("x/"))

    env.matrix(want={(s, d): not denied(s, d) for s in KEYS for d in KEYS})
    flows = [(s, d, port, proto) for s in KEYS for d in KEYS if denied(s, d) for port, proto in PORTS]
    watch = PacketWatch(env.pods, denied)
    assert all(probe(env.pods, [("y/a", "z/b", 80, "TCP"), ("z/c", "y/b", 81, "UDP")]).values())
    env.wait(lambda: watch.seen >= 2, "the watch sees allowed packets arrive", timeout=5)
    hammer = Hammer(env, flows)
    i = env.where["x/b"]
    try:
        env.stop_agent(i, signal.SIGKILL)
        time.sleep(1.0)
        env.start_agent(i)
        # a restart over an unchanged cluster finds the kernel as wanted and changes nothing
        assert "reconciled with the kernel (0 commands" in env.log(i).read_text().splitlines()[-1]
        env.stop_agent(i, signal.SIGTERM)
        env.start_agent(i)
        assert "reconciled with the kernel (0 commands" in env.log(i).read_text().splitlines()[-1]
        for burst in range(3):  # killed between two transactions
            before = env.log(i).read_text().count("policy: updated")
            worker = threading.Thread(target=_churn, args=(env, 30, burst))
            worker.start()
            env.wait(lambda b=before: env.log(i).read_text().count("policy: updated") > b + 2,  # type: ignore[misc]
                     "the agent is applying the burst")
            env.stop_agent(i, signal.SIGKILL)
            worker.join(60)
            env.start_agent(i)
        # killed while it starts: after registering, in the middle of its first full read and reconcile
        before = env.log(i).read_text().count("registered ")
        env.stop_agent(i, signal.SIGTERM)
        env.start_agent(i, ready=False)
        env.wait(lambda b=before: env.log(i).read_text().count("registered ") > b, "the agent registers")  # type: ignore[misc]
        env.stop_agent(i, signal.SIGKILL)
        env.start_agent(i)
        # etcd out of reach while it starts: it waits, changes nothing, and stops
        before = env.log(i).read_text().count("cannot reach etcd")
        env.stop_agent(i, signal.SIGTERM)
        env.start_agent(i, endpoints=["http://10.232.0.250:2379"], ready=False)
        env.wait(lambda: env.log(i).read_text().count("cannot reach etcd") > before, "the agent waits for etcd")
        time.sleep(2.0)
        env.stop_agent(i, signal.SIGTERM)
        env.start_agent(i)
        time.sleep(1.0)
    finally:
        hammer.stop()
        watch.close()
        with env.cluster.client() as etcd:
            for j in range(30):
                etcd.delete(env.keys.policy("yz"[j % 2], f"churn{j}"))
    assert hammer.rounds >= 5, hammer.rounds
    assert not watch.crossed, f"{len(watch.crossed)} packets crossed: {watch.crossed[:5]}"
    assert not hammer.passed, f"{len(hammer.passed)} probes got through: {hammer.passed[:5]}"
    env.matrix(want={(s, d): not denied(s, d) for s in KEYS for d in KEYS})


def test_no_window_for_a_new_pod(env: Env) -> None:
    """A pod under deny-all gets no packet through, from the first moment after ADD; a pod under no
    policy reaches others at once (ADD waited for its agent)."""
    env.clear_policies()
    env.cli("policy", "apply", "-f", "-", stdin="""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: lockdown, namespace: w}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
""")
    env.matrix(CASES[0])  # (the others are unaffected)
    targets = ["x/a", "y/b", "z/c"]
    for round_ in range(3):
        key = f"w/p{round_}"
        i = round_ % 3
        pns, _ = env.add(key, i)
        servers = EchoServers([pns])
        try:
            flows = [(key, t, port, proto) for t in targets for port, proto in PORTS]
            flows += [(t, key, port, proto) for t in targets for port, proto in PORTS]
            passed = []
            for _ in range(5):
                got = probe(env.pods, flows, retries=0, window=0.3)
                passed += [f for f, ok_ in got.items() if ok_]
            assert not passed, f"{key}: {passed}"
        finally:
            servers.close()
            env.delete(key)
    # the control: no policy selects namespace v, so its pod is reachable right after ADD
    pns, _ = env.add("v/open", 1)
    servers = EchoServers([pns])
    try:
        flows = [("v/open", t, 80, "TCP") for t in targets] + [(t, "v/open", 81, "UDP") for t in targets]
        got = probe(env.pods, flows, retries=3)
        assert all(got.values()), got
    finally:
        servers.close()
        env.delete("v/open")


def test_add_fails_closed_when_the_agent_does_not_answer(env: Env) -> None:
    i = 2
    env.stop_agent(i, signal.SIGKILL)
    try:
        pns = new_namespace("pe34-pod")
        env.namespaces.append(pns)
        out = err(run("routed", "ADD", env.conf(i, policySetupTimeout=1.5), host=env.nodes[i].ns, netns=pns,
                      cni_path=env.plugin_dir, container_id="po-late", args="IgnoreUnknown=1;K8S_POD_NAMESPACE=w;"
                       "K8S_POD_NAME=late"))
        assert out["code"] == 11 and "did not program network policy" in out["msg"], out
        assert "pycni node" in out["details"]
        with env.cluster.client() as etcd:  # nothing left behind: no endpoint, no handle
            assert all("po-late" not in kv.key for kv in etcd.get_prefix(env.keys.endpoints)[0])
            assert all("po-late" not in kv.key for kv in etcd.get_prefix(env.keys.handles)[0])
        assert "eth0" not in pns.run(["ip", "link"]).stdout
    finally:
        env.start_agent(i)


def test_cli_views_and_refusals(env: Env) -> None:
    import json as _json

    listed = env.cli("endpoint", "list", "-n", "x").stdout.splitlines()
    assert listed[0].split() == ["WORKLOAD", "NODE", "NETWORKS", "INTERFACE"]
    assert sorted(ln.split()[0] for ln in listed[1:]) == ["x/a", "x/b", "x/c"]
    rows = _json.loads(env.cli("endpoint", "list", "-A", "-o", "json").stdout)
    xa = next(r for r in rows if (r["namespace"], r["pod"]) == ("x", "a"))
    assert xa["orchestrator"] == "k8s" and xa["node"] == env.nodes[env.where["x/a"]].name
    assert xa["profiles"] == ["podnet"] and xa["labels"]["pod"] == "a" and xa["interfaceName"].startswith("rtd")
    # a bad manifest is refused whole, naming the document and the field
    bad = env.cli("policy", "apply", "-f", "-", check=False, stdin="""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: fine, namespace: x}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: broken, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/8]}}]}]
""")
    assert bad.returncode == 1
    assert "document 2 (broken): spec.ingress[0].from[0].ipBlock.except[0]" in bad.stderr, bad.stderr
    assert "fine" not in env.cli("policy", "list", "-n", "x").stdout
    bad = env.cli("endpoint", "label", "x/a", "bad key=1", check=False)
    assert bad.returncode == 1 and "invalid label change" in bad.stderr
    # ipam show: the pool and its blocks, with their nodes
    confdir = env.tmp / "net.d"
    confdir.mkdir(exist_ok=True)
    conf = env.conf(0)
    (confdir / "podnet.conflist").write_text(_json.dumps({"cniVersion": "1.1.0", "name": "podnet",
                                                          "plugins": [{k: v for k, v in conf.items()
                                                                       if k not in ("cniVersion", "name")}]}))
    out = env.nodes[0].ns.run([sys.executable, "-m", "pycni", "ipam", "show", "--show-blocks", "podnet"],
                              env={**os.environ, "NETCONFPATH": str(confdir)}).stdout.splitlines()
    assert out[0].split()[:2] == ["GROUPING", "CIDR"]
    pool = out[1].split()
    assert pool[:4] == ["IP", "Pool", SUBNET, "65536"], out
    assert any(ln.split()[:3] == ["IP", "Pool", SUBNET6] for ln in out[2:]), out  # (the pods are dual-stack)
    blocks = [ln.split() for ln in out[2:] if not ln.startswith("IP Pool")]
    assert blocks and all(b[0] == "Block" and b[-1].startswith("node") for b in blocks), out
    assert sum(int(b[3]) for b in blocks if ":" not in b[1]) == int(pool[4]) == len(env.pods)


def test_default_policy_deny(env: Env) -> None:
    """A network with "defaultPolicy": "deny": its pod gets nothing through until a policy opens it."""
    env.clear_policies()
    pns, _ = env.add("d/locked", 1, defaultPolicy="deny")
    servers = EchoServers([pns])
    try:
        flows = [("d/locked", t, 80, "TCP") for t in ("x/a", "y/b")]
        flows += [(t, "d/locked", 81, "UDP") for t in ("x/a", "z/c")]
        got = probe(env.pods, flows, retries=0, window=0.5)
        assert not any(got.values()), got
        env.cli("policy", "apply", "-f", "-", stdin="""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: open, namespace: d}
spec:
  podSelector: {}
  ingress: [{}]
  egress: [{}]
""")
        deadline = time.monotonic() + CONVERGE
        while not all((got := probe(env.pods, flows, retries=1)).values()):
            assert time.monotonic() < deadline, got
        why = env.cli("policy", "why", "x/a", "d/locked", "80/TCP").stdout
        assert "allowed by d/open (ingress rule 0)" in why
    finally:
        servers.close()
        env.delete("d/locked", defaultPolicy="deny")
        env.clear_policies()


def test_default_policy_deny_needs_cluster_ipam(netns_factory: Any, plugin_dir: str, tmp_path: Path) -> None:
    host, pod = netns_factory(), netns_factory()
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "routed", "defaultPolicy": "deny",
            "ipam": {"type": "host-local", "dataDir": str(tmp_path), "ranges": [[{"subnet": "10.93.0.0/24"}]]}}
    out = err(run("routed", "ADD", conf, host=host, netns=pod, cni_path=plugin_dir))
    assert out["code"] == 7 and "needs cluster-ipam" in out["msg"]
    out = err(run("routed", "ADD", {**conf, "defaultPolicy": "closed"}, host=host, netns=pod, cni_path=plugin_dir))
    assert out["code"] == 7 and "defaultPolicy" in out["msg"]
    assert "eth0" not in pod.run(["ip", "link"]).stdout


def test_daemon_mode_waits_too(env: Env) -> None:
    """Through a `pycni daemon` (the shim forwards, the handler runs in-process with libnftables):
    the same endpoint, the same wait, the same deny from the first packet, the same DEL."""
    import json as _json
    import logging

    from plugin_util import daemon_in_thread

    from pycni.install_plugins import install

    shims = env.tmp / "po-shims"
    shims.mkdir(exist_ok=True)
    install(str(shims), daemon=True)
    served: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            served.append(record.getMessage())

    dlog = logging.getLogger("pycni.daemon")
    handler, level = Collect(), dlog.level
    dlog.addHandler(handler)
    dlog.setLevel(logging.DEBUG)
    env.clear_policies()
    env.cli("policy", "apply", "-f", "-", stdin="""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: lockdown, namespace: w}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
""")
    sock = str(env.tmp / "po-daemon.sock")
    i = 1
    node = env.nodes[i]
    pns = new_namespace("pe34-pod")
    env.namespaces.append(pns)
    base = {"CNI_CONTAINERID": "po-daemon", "CNI_NETNS": pns.path, "CNI_IFNAME": "eth0", "CNI_PATH": env.plugin_dir,
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=w;K8S_POD_NAME=daemon", "PYCNI_SOCKET": sock,
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    conf = _json.dumps(env.conf(i))
    with daemon_in_thread(sock) as daemon:
        out = node.ns.run([str(shims / "routed")], input=conf, env={**base, "CNI_COMMAND": "ADD"})
        res = _json.loads(out.stdout)
        env.pods["w/daemon"] = (pns, {4: res["ips"][0]["address"].split("/")[0]})
        env.where["w/daemon"] = i
        servers = EchoServers([pns])
        try:
            flows = [("w/daemon", t, 80, "TCP") for t in ("x/a", "y/b")] + [("z/c", "w/daemon", 81, "UDP")]
            got = probe(env.pods, flows, retries=0, window=0.5)
            assert not any(got.values()), got
        finally:
            servers.close()
        assert daemon is not None
        with env.cluster.client() as etcd:
            assert etcd.get(env.keys.endpoint(node.name, "podnet", "po-daemon", "eth0")) is not None
        node.ns.run([str(shims / "routed")], input=conf, env={**base, "CNI_COMMAND": "DEL"})
        env.pods.pop("w/daemon")
        with env.cluster.client() as etcd:
            assert etcd.get(env.keys.endpoint(node.name, "podnet", "po-daemon", "eth0")) is None
    dlog.removeHandler(handler)
    dlog.setLevel(level)
    env.clear_policies()
    assert any(m.startswith("routed ADD") for m in served) and any(m.startswith("routed DEL") for m in served), served


# (cases without ipBlock: their address templates are IPv4)
VXLAN_CASES = ["deny-all ingress in x", "two peers are an OR (namespace y, or pod=b of x)",
               "a named port (serve-81-tcp) opens 81/TCP only", "egress from x/a to y/b only"]


def test_vxlan_mode_dual_stack(env: Env) -> None:
    """The agents in vxlan mode (pods' traffic between nodes encapsulated; the policy hook is the
    same forward path on the host interface): truth tables across the three nodes over IPv4 and
    over IPv6, which reaches other nodes only through the vxlan device here. Last in the module:
    it leaves the agents in host-gw mode again."""
    try:
        for i in range(3):
            env.stop_agent(i)
            env.start_agent(i, "vxlan")
        env.clear_policies()
        for version in (4, 6):
            env.matrix(CASES[0], version=version)  # routes over vxlan in place, every pod reaches every pod
        for name in VXLAN_CASES:
            case = _case(name)
            env.apply(case)
            for version in (4, 6):
                env.matrix(case, version=version)
        # the other nodes' blocks really are routed through the vxlan device, both families
        for family in ("-4", "-6"):
            routes = env.nodes[0].ns.run(["ip", family, "route", "show", "proto", str(RTPROT_PYCNI)]).stdout
            assert f"dev {DEFAULT_VXLAN_DEVICE}" in routes, routes
    finally:
        env.clear_policies()
        for i in range(3):
            env.stop_agent(i)
            env.start_agent(i)
