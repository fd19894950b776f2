"""The nftables dataplane on one node, with real packets: nine routed pods (a, b, c in
namespaces x, y, z), every truth-table case of tests/policy_cases.py programmed one after the
other (each an incremental update of the last), and the whole matrix probed over TCP and UDP
on ports 80 and 81, IPv4 and IPv6. No etcd and no agent here: the index and the writer on their
own (test_policy_cluster.py runs the agents). A writer started afresh (as a restarted agent)
over the table of an earlier state reads it back and brings it to the wanted one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import ok, run
from policy_cases import CASES, KEYS, NAMED_PORTS, PORTS, expected, policies_text, render
from policy_probe import EchoServers, probe

from pycni import ipaddr
from pycni.cluster.policy.evaluate import Workload
from pycni.cluster.policy.index import PolicyIndex
from pycni.cluster.policy.model import parse_policies
from pycni.cluster.policy.nftsync import Kernel, Writer, read_table
from pycni.cluster.policy.workload import TABLE

NODE = "n1"


class Node:
    def __init__(self, host: Namespace, pods: dict[str, tuple[Namespace, dict[int, str]]],
                 endpoints: list[Workload]) -> None:
        self.host = host
        self.pods = pods
        self.endpoints = endpoints
        self.index = PolicyIndex(NODE)
        for ns in "xyz":
            self.index.set_namespace(ns, {"ns": ns})
        self.writer = Writer()

    def program(self, policies_yaml: str, default_deny: bool = False, writer: Writer | None = None) -> str:
        """The index moved to these policies (and defaultPolicy), written by ``writer`` (the node's)."""
        from dataclasses import replace

        if any(w.default_deny != default_deny for w in self.endpoints) or not self.index.workloads:
            self.endpoints = [replace(w, default_deny=default_deny) for w in self.endpoints]
            for w in self.endpoints:
                self.index.set_workload(w.key, w)
        pols = {p.key: p for p in (parse_policies(policies_yaml) if policies_yaml.strip() else [])}
        for key in [k for k in self.index.policies if k not in pols]:
            self.index.set_policy(key, None)
        for key, p in pols.items():
            if key not in self.index.policies or self.index.policies[key].source != p.source:
                self.index.set_policy(key, p)
        want, dirty = self.index.collect()
        with self.host.enter():
            return (writer or self.writer).write(want, dirty)[0]

    def kernel(self) -> Kernel:
        with self.host.enter():
            k = read_table()
        assert k is not None
        return k

    def listing(self) -> str:
        return self.host.run(["nft", "list", "table", "inet", TABLE]).stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, plugin_dir: str) -> Iterator[Node]:
    from netns_util import have_root, new_namespace

    if not have_root():
        pytest.skip("network namespaces need root")
    tmp = tmp_path_factory.mktemp("po-dataplane")
    made: list[Namespace] = []
    servers = None
    try:
        host = new_namespace("pe34-host")
        made.append(host)
        cfg: dict[str, Any] = {"cniVersion": "1.1.0", "name": "pods", "type": "routed",
                               "ipam": {"type": "host-local", "dataDir": str(tmp / "ipam"),
                                        "ranges": [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd77::/64"}]]}}
        pods: dict[str, tuple[Namespace, dict[int, str]]] = {}
        endpoints = []
        for key in KEYS:
            ns_name, pod = key.split("/")
            pns = new_namespace("pe34-pod")
            made.append(pns)
            res = ok(run("routed", "ADD", cfg, host=host, netns=pns, cni_path=plugin_dir,
                         container_id=f"po-{ns_name}-{pod}"))
            addrs = {ipaddr.ip_interface(i["address"]).version: i["address"].split("/")[0] for i in res["ips"]}
            pods[key] = (pns, addrs)
            endpoints.append(Workload(ns_name, pod, {"pod": pod}, tuple(ipaddr.ip_address(a) for a in addrs.values()),
                                      dict(NAMED_PORTS), node=NODE, iface=res["interfaces"][0]["name"]))
        servers = EchoServers(ns for ns, _ in pods.values())
        yield Node(host, pods, endpoints)
    finally:
        if servers is not None:
            servers.close()
        for ns in reversed(made):
            ns.delete()


def _matrix_check(node: Node, case: dict[str, object], version: int) -> list[str]:
    flows = [(s, d, port, proto) for s in KEYS for d in KEYS for port, proto in PORTS]
    got = probe(node.pods, flows, version=version, expect=lambda f: expected(case, f[2], f[3])[(f[0], f[1])])
    failures = []
    for port, proto in PORTS:
        want = expected(case, port, proto)
        m = {(s, d): got[(s, d, port, proto)] for s in KEYS for d in KEYS}
        if m != want:
            failures.append(f"{case['name']} on {port}/{proto} IPv{version}:\n{render(m, want)}")
    return failures


def test_truth_tables_incrementally(node: Node) -> None:
    """Every case after the one before (incremental transactions), probed with real packets; the
    incrementally built table equals the one a fresh writer (a restarted agent) makes of the
    previous case's table, and a fresh writer over a table already as wanted sends nothing."""
    failures: list[str] = []
    addrs = {k: v[1][4] for k, v in node.pods.items()}
    previous = None
    for case in CASES:
        node.program(policies_text(case, addrs), bool(case["default_deny"]))
        incremental = node.kernel()
        failures += _matrix_check(node, case, 4)
        assert node.program(policies_text(case, addrs), bool(case["default_deny"]), writer=Writer()) == "", \
            case["name"]
        if previous is not None:
            node.program(policies_text(previous, addrs), bool(previous["default_deny"]))
            script = node.program(policies_text(case, addrs), bool(case["default_deny"]), writer=Writer())
            assert not any(ln.startswith(("add table", "delete table")) for ln in script.splitlines()), script
            assert node.kernel() == incremental, case["name"]
            node.writer.reconcile_next()  # (its mirror is of the previous case's table)
        previous = case
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("name", ["deny-all ingress in x", "two peers are an OR (namespace y, or pod=b of x)",
                                  "a named port (serve-81-tcp) opens 81/TCP only",
                                  "egress from x/a to y/b only"])
def test_truth_tables_ipv6(node: Node, name: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    node.program(str(case["policies"]), bool(case["default_deny"]))
    failures = _matrix_check(node, case, 6)
    assert not failures, "\n\n".join(failures)


def test_uncovered_interface_is_dropped_fail_closed(node: Node) -> None:
    """An rtd interface the agent has not programmed (not in 'covered') sends and receives nothing,
    whatever the policies; once programmed it follows them (here: none, so everything passes)."""
    node.program("")
    first = node.endpoints[0]
    xa = KEYS[0]
    with node.host.enter():
        from pycni.net import nft

        nft.run(f'delete element inet {TABLE} covered {{ "{first.iface}" }}\n')
    flows = [(xa, d, 80, "TCP") for d in KEYS[1:]] + [(s, xa, 81, "UDP") for s in KEYS[1:]]
    got = probe(node.pods, flows, retries=0, window=1.0)
    assert not any(got.values()), got
    node.writer.reconcile_next()  # (told the kernel changed: a resync finds it so too)
    node.program("")
    got = probe(node.pods, flows)
    assert all(got.values()), got


def test_conflicting_updates_are_one_transaction(node: Node) -> None:
    """A change that replaces a policy's chain and its sets is a single nft transaction: the script
    for one policy edit touches only that policy's objects."""
    base = next(c for c in CASES if c["name"] == "x allows ingress from namespace y")
    node.program(str(base["policies"]))
    script = node.program(str(base["policies"]).replace('{ns: "y"}', "{ns: z}"))
    lines = script.splitlines()
    assert lines, "an edit must change something"
    assert not any(ln.startswith(("add table", "delete table")) for ln in lines), script
    assert all(" v_" not in ln for ln in lines), script  # the verdict chains stay as they are
    assert any(ln.startswith("add element") and "s_" in ln for ln in lines), script
    assert any(ln.startswith("delete set") for ln in lines), script


def test_sctp_rules_load(node: Node) -> None:
    """SCTP ports compile to rules the kernel takes; probing them needs the kernel's SCTP, which
    this machine may lack (then only the rules are checked, and the test says so)."""
    import socket

    node.program("""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: sctp, namespace: x}
spec:
  podSelector: {}
  ingress: [{ports: [{protocol: SCTP, port: 3868}, {protocol: SCTP, port: 9000, endPort: 9010}]}]
""")
    listing = node.listing()
    assert "sctp dport 3868 jump pa_" in listing, listing  # (through the policy's logging accept chain)
    assert "9000-9010" in listing
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP).close()
    except OSError as e:
        print(f"SCTP not probed: the kernel has no SCTP sockets here ({e})")


def _json_kernel(listing: dict[str, Any]) -> Kernel:
    """The table from ``nft -j list table``: an independent reading to check the netlink one."""
    from pycni.cluster.policy.compile import BASE_CHAINS, BASE_OBJECTS

    def elem(e: Any) -> str:
        return " . ".join(str(x) for x in e["concat"]) if isinstance(e, dict) else str(e)

    def verdict(v: Any) -> str:
        return f"jump {v['jump']['target']}" if "jump" in v else next(iter(v))

    k = Kernel()
    items = listing["nftables"]
    for it in items:
        if "set" in it:
            s = it["set"]
            if s["name"] in BASE_OBJECTS:
                k.base.add(s["name"])
                k.covered = {elem(e) for e in s.get("elem", ())}
            else:
                typ = " . ".join(s["type"]) if isinstance(s["type"], list) else s["type"]
                k.sets[s["name"]] = (typ, frozenset(elem(e) for e in s.get("elem", ())))
        elif "map" in it:
            m = it["map"]
            k.base.add(m["name"])
            getattr(k, m["name"]).update({key: verdict(v) for key, v in m.get("elem", ())})
        elif "chain" in it:
            c = it["chain"]
            if c["name"] in BASE_CHAINS:
                k.base_chains[c["name"]] = (c["prio"], ())
            else:
                k.chains[c["name"]] = ()
        elif "rule" in it:
            r = it["rule"]
            if r["chain"] in k.base_chains:
                prio, tags = k.base_chains[r["chain"]]
                k.base_chains[r["chain"]] = (prio, (*tags, r.get("comment")))
            else:
                k.chains[r["chain"]] = (*k.chains[r["chain"]], r.get("comment"))
    return k


def test_netlink_reading_equals_nft_json(node: Node) -> None:
    """The writer's reading of the table (netlink dumps) equals nft's own JSON listing of it, on
    a table with every kind of object: selector and named-port sets (IPv4, IPv6), both maps with
    jumps and drops, covered, base chains, tagged rules."""
    import json

    case = next(c for c in CASES if c["name"] == "a named port (serve-81-tcp) opens 81/TCP only")
    addrs = {k: v[1][4] for k, v in node.pods.items()}
    node.program(policies_text(case, addrs) + "\n---\n" + policies_text(CASES[1], addrs), default_deny=True)
    listing = json.loads(node.host.run(["nft", "-j", "list", "table", "inet", TABLE]).stdout)
    got = node.kernel()
    assert any(name.startswith("np_") for name in got.sets) and got.ingress and got.covered
    assert got == _json_kernel(listing)


def test_a_foreign_or_older_table_is_reconciled_in_place(node: Node) -> None:
    """A table the writer did not make (an older version's: rules without tags, a base chain at
    another priority, a chain and a set nobody wants) is brought to the wanted state in one
    transaction that never deletes the table; the pods stay covered throughout (the writer's
    script only ever adds to ``covered`` here)."""
    from pycni.net import nft

    case = next(c for c in CASES if c["name"] == "deny-all ingress in x")
    node.program(str(case["policies"]))
    want = node.kernel()
    with node.host.enter():
        nft.run(f"flush chain inet {TABLE} wl_ingress\n"
                f"add rule inet {TABLE} wl_ingress ct state established,related accept\n"
                f"delete chain inet {TABLE} wl_egress\n"
                f"add chain inet {TABLE} wl_egress {{ type filter hook forward priority 0; policy accept; }}\n"
                f"add chain inet {TABLE} junk\nadd rule inet {TABLE} junk accept\n"
                f"add set inet {TABLE} s_junk_4 {{ type ipv4_addr; }}\n"
                f"add element inet {TABLE} s_junk_4 {{ 10.9.9.9 }}\n")
    script = node.program(str(case["policies"]), writer=Writer())
    lines = script.splitlines()
    assert not any(ln.startswith(("add table", "delete table", "delete element inet pycni_policy covered"))
                   for ln in lines), script
    assert f"delete chain inet {TABLE} junk" in lines and f"delete set inet {TABLE} s_junk_4" in lines, script
    assert node.kernel() == want
    failures = _matrix_check(node, case, 4)
    assert not failures, "\n\n".join(failures)
