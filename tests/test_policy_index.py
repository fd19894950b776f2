"""The policy index against its oracle: random event sequences (attachments appearing, moving,
relabelled, renumbered and leaving; pod records; namespace labels; policies created, replaced
and deleted), and after every event the incremental index equals a full compile from nothing
(:func:`compile.compile_full`), and the tables of both nodes, read as the kernel would judge a
new flow (tests/policy_nftsim.py), give what :func:`evaluate.decide` says for every probe."""

from __future__ import annotations

import json
import random

import pytest
from policy_cases import CASES, policies_text
from policy_nftsim import allowed

from pycni import ipaddr
from pycni.cluster.memkv import MemKV
from pycni.cluster.model import Keys, PodMeta, WorkloadEndpoint
from pycni.cluster.policy.agent import PolicyEnforcer
from pycni.cluster.policy.compile import Desired, compile_full, verdict_chain_name
from pycni.cluster.policy.evaluate import EGRESS, INGRESS, Cluster, Workload, decide
from pycni.cluster.policy.index import PolicyIndex
from pycni.cluster.policy.model import NetworkPolicy, parse_policies, parse_policy
from pycni.cluster.policy.nftsync import Dirty, Kernel, Writer, _commit, diff_script

NODES = ("n1", "n2")
ADDRS = {f"{n}/{p}": f"10.90.{i}.{j + 1}" for i, n in enumerate("xyz") for j, p in enumerate("abc")}


def _pool(rnd: random.Random) -> list[NetworkPolicy]:
    """The truth tables' policies, and random ones over the same labels and named ports."""
    pool = [p for c in CASES for p in parse_policies(policies_text(c, ADDRS))]

    def sel() -> dict[str, object]:
        r = rnd.random()
        if r < 0.3:
            return {}
        if r < 0.7:
            return {"matchLabels": {"pod": rnd.choice("abcq")}}
        return {"matchExpressions": [{"key": "pod", "operator": rnd.choice(["In", "NotIn"]),
                                      "values": rnd.sample("abc", 2)}]}

    def peer() -> dict[str, object]:
        r = rnd.random()
        if r < 0.15:
            return {"ipBlock": {"cidr": "10.90.0.0/16", "except": ["10.90.1.0/24"]}}
        out: dict[str, object] = {}
        if r < 0.6:
            out["podSelector"] = sel()
        if r > 0.4:
            out["namespaceSelector"] = {"matchLabels": {"ns": rnd.choice("xyz")}} if rnd.random() < 0.7 else {}
        return out or {"podSelector": {}}

    def port() -> dict[str, object]:
        r = rnd.random()
        proto = rnd.choice(["TCP", "UDP"])
        if r < 0.3:
            return {"protocol": proto, "port": f"serve-{rnd.choice([80, 81])}-{proto.lower()}"}
        if r < 0.5:
            return {"protocol": proto, "port": 80, "endPort": 81}
        if r < 0.6:
            return {"protocol": proto}
        return {"protocol": proto, "port": rnd.choice([80, 81])}

    for i in range(40):
        ns = rnd.choice("xyz")
        types = rnd.choice([["Ingress"], ["Egress"], ["Ingress", "Egress"]])
        spec: dict[str, object] = {"podSelector": sel(), "policyTypes": types}
        for t in types:
            spec[t.lower()] = [{("from" if t == "Ingress" else "to"): [peer() for _ in range(rnd.randrange(3))],
                                "ports": [port() for _ in range(rnd.randrange(3))]}
                               for _ in range(rnd.randrange(3))]
        pool.append(parse_policy({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                                  "metadata": {"name": f"r{i}", "namespace": ns}, "spec": spec}))
    return pool


def _workload(rnd: random.Random, i: int, old: Workload | None = None) -> Workload:
    ns = old.namespace if old is not None else rnd.choice("xyz")
    labels = {"pod": rnd.choice("abcq")} | ({"other": "1"} if rnd.random() < 0.2 else {})
    ports = {(f"serve-{p}-{pr.lower()}", pr): p for p in (80, 81) for pr in ("TCP", "UDP") if rnd.random() < 0.6}
    if old is not None and rnd.random() < 0.6:  # same attachment: only labels or ports move
        return Workload(ns, old.name, labels, old.ips, ports, node=old.node, default_deny=old.default_deny,
                        iface=old.iface)
    ips = (ipaddr.ip_address("10.90.0.1") + i, ipaddr.ip_address("fd90::1") + i)
    return Workload(ns, f"p{i}", labels, ips, ports, node=rnd.choice(NODES), default_deny=rnd.random() < 0.15,
                    iface=f"rtd{i:011x}")


def test_index_equals_full_compile_and_decide() -> None:
    rnd = random.Random(34)
    pool = _pool(rnd)
    index = {n: PolicyIndex(n) for n in NODES}
    workloads: dict[str, Workload] = {}
    policies: dict[str, NetworkPolicy] = {}
    namespaces: dict[str, dict[str, str]] = {}
    probes = 0
    counter = 0
    for step in range(700):
        r = rnd.random()
        if r < 0.45:
            key = f"k{rnd.randrange(40)}"
            old = workloads.get(key)
            if old is not None and rnd.random() < 0.25:
                del workloads[key]
                new = None
            else:
                counter += 1
                new = _workload(rnd, counter, old)
                workloads[key] = new
            for ix in index.values():
                ix.set_workload(key, new)
        elif r < 0.55:
            ns = rnd.choice("xyz")
            labels = {"ns": rnd.choice("xyz")} if rnd.random() < 0.8 else None
            if labels is None:
                namespaces.pop(ns, None)
            else:
                namespaces[ns] = labels
            for ix in index.values():
                ix.set_namespace(ns, labels)
        else:
            p = rnd.choice(pool)
            pol = None if p.key in policies and rnd.random() < 0.4 else p
            if pol is None:
                del policies[p.key]
            else:
                policies[p.key] = pol
            for ix in index.values():
                ix.set_policy(p.key, pol)
        tables: dict[str, Desired] = {}
        for n, ix in index.items():
            got = ix.desired()
            want = compile_full(n, workloads.values(), policies.values(), namespaces)
            assert got == want, f"step {step} node {n}"
            tables[n] = got
            # the flows resolver knows exactly the chains a log rule names, and every pod's address
            assert set(ix.tokens) == {c for c in got.chains if c.startswith(("p_", "v_"))}, f"step {step}"
            assert all(ix.tokens[c] == policies[ix.tokens[c]].key for c in ix.tokens if c.startswith("p_"))
            for c in (c for c in ix.tokens if c.startswith("v_")):  # names the policies the chain is of
                named = tuple(ix.tokens[c].removeprefix("default deny: selected by ").split(", "))
                assert verdict_chain_name(named, INGRESS if c.endswith("_in") else EGRESS) == c, ix.tokens[c]
            assert ix.addresses == {str(ip): w.key for w in workloads.values() for ip in w.ips}, f"step {step}"
        if step % 7 == 0 and len(workloads) > 2:
            cluster = Cluster(policies=list(policies.values()), namespaces=namespaces)
            ws = list(workloads.values())
            for _ in range(30):
                src, dst = rnd.sample(ws, 2)
                port, proto, version = rnd.choice([80, 81, 82]), rnd.choice(["TCP", "UDP"]), rnd.choice([4, 6])
                truth = decide(cluster, src, dst, port, proto, version).allowed
                assert allowed(tables, src, dst, port, proto, version) == truth, \
                    f"step {step}: {src.key}@{src.node} -> {dst.key}@{dst.node} {port}/{proto} v{version}"
                probes += 1
    assert probes > 2000
    assert sum(len(t.chains) for t in tables.values()) > 10


def test_writer_diff_from_any_kernel_state_reaches_the_wanted_one() -> None:
    """The writer's transaction from a kernel state (a mirror of another index state, as after a
    crash between two transactions) brings it to the wanted one, and its incremental diffs of the
    dirty objects equal a full comparison."""
    rnd = random.Random(3)
    pool = _pool(rnd)
    ix = PolicyIndex("n1")
    for i in range(30):
        ix.set_workload(f"k{i}", _workload(rnd, i))
    kernel = Kernel()
    _commit(kernel, ix.desired(), None)
    ix.collect()
    for step in range(200):
        for _ in range(rnd.choice((1, 3))):
            if rnd.random() < 0.5:
                p = rnd.choice(pool)
                ix.set_policy(p.key, None if p.key in ix.policies and rnd.random() < 0.4 else p)
            else:
                i = rnd.randrange(40)
                ix.set_workload(f"k{i}", None if rnd.random() < 0.2 else _workload(rnd, 100 + step * 50 + i))
        want, dirty = ix.collect()
        lines = diff_script(kernel, want, dirty).splitlines()
        assert set(lines) <= set(diff_script(kernel, want, None).splitlines() + lines), step
        _commit(kernel, want, dirty)
        full = Kernel()
        _commit(full, want, None)
        assert (kernel.sets, kernel.chains, kernel.ingress, kernel.egress, kernel.covered) == \
            (full.sets, full.chains, full.ingress, full.egress, full.covered), step
    assert not diff_script(kernel, ix.desired(), Dirty())


def test_agent_updates_equal_a_fresh_compile() -> None:
    """The agent as it runs: random batches of watch events (endpoints, pod records, namespace
    labels, policies) through PolicyEnforcer; after every batch what it asks the writer to hold
    equals a full compile of a fresh read of the same records."""
    keys = Keys("/t")
    docs = [dict(p.source) for c in CASES for p in parse_policies(policies_text(c, ADDRS))]

    class Recorder(Writer):  # the kernel side is test_policy_dataplane's; here: what it is asked to hold
        def write(self, want: Desired, dirty: Dirty | None) -> tuple[str, bool]:
            self.held = Desired(sets=dict(want.sets), chains=dict(want.chains), ingress=dict(want.ingress),
                                egress=dict(want.egress), covered=want.covered, log=want.log)
            self.mirror = Kernel()
            return "x", False

    rnd = random.Random(5)
    enf = PolicyEnforcer(keys, "n1", lambda m: None, strict=True)
    enf.writer = rec = Recorder()
    kv = MemKV()

    def event() -> tuple[str, str, str]:
        r = rnd.random()
        if r < 0.4:
            i = rnd.randrange(30)
            key = keys.endpoint("n2" if i % 3 else "n1", "net", f"c{i}", "eth0")
            if rnd.random() < 0.2:
                return "DELETE", key, ""
            ep = WorkloadEndpoint(node=key.split("/")[3], network="net", namespace=rnd.choice("xyz"),
                                  pod=f"p{i % 12}", container_id=f"c{i}", ifname="eth0", interface_name=f"rtdc{i}",
                                  mac="02:00:00:00:00:01", ip_networks=[f"10.90.0.{i + 1}/32"], profiles=["net"],
                                  labels={"pod": rnd.choice("abc")})
            return "PUT", key, ep.to_json()
        if r < 0.65:
            key = keys.pod(rnd.choice("xyz"), f"p{rnd.randrange(12)}")
            meta = PodMeta(labels={"pod": rnd.choice("abcq")},
                           ports=[("serve-81-tcp", 81, "TCP")] if rnd.random() < 0.5 else [])
            return ("DELETE", key, "") if rnd.random() < 0.2 else ("PUT", key, meta.to_json())
        if r < 0.75:
            ns = rnd.choice("xyz")
            return "PUT", keys.namespace(ns), PodMeta(labels={"ns": rnd.choice("xyz")}).to_json()
        doc = rnd.choice(docs)
        key = keys.policy(doc["metadata"]["namespace"], doc["metadata"]["name"])
        return ("DELETE", key, "") if rnd.random() < 0.3 else ("PUT", key, json.dumps(doc))

    enf.load(kv)
    assert enf.apply()
    missed = False
    checked = 0
    for step in range(300):
        for _ in range(rnd.choice((1, 1, 2, 4))):
            kind, key, value = event()
            if kind == "DELETE":
                kv.delete(key)
            else:
                kv.put(key, value)
            if rnd.random() < 0.95:
                enf.event(kind, key, value)
            else:
                missed = True  # the watch missed it: the next full read finds it
        if step % 10 == 9:
            enf.load(kv)  # the periodic full read: only what differs reaches the index
            missed = False
        assert enf.apply()
        fresh = PolicyEnforcer(keys, "n1", lambda m: None)
        fresh.view.load(kv)
        v = fresh.view
        want = compile_full("n1", [v.workload(ep) for ep in v.endpoints.values()], v.policies.values(),
                            {ns: m.labels for ns, m in v.namespaces.items()})
        if not missed:
            assert rec.held == want, step
            checked += 1
    assert enf.rebuilds == 0 and checked > 150, checked


def test_a_kernel_that_cannot_be_read_fails_the_update_not_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconcile's read-back refused (no permission, say): the update fails with one logged
    line, the agent goes on, and the next apply reads again."""
    from pycni.net import nftdump
    from pycni.net.nl import NetlinkError

    def refused(*a: object) -> None:
        raise NetlinkError(1, "Operation not permitted")

    monkeypatch.setattr(nftdump, "read_table", refused)
    logged: list[str] = []
    enf = PolicyEnforcer(Keys("/t"), "n1", logged.append, strict=True)
    enf.load(MemKV())
    assert enf.apply() is False and enf.apply() is False
    assert enf.writer.reads == 2 and enf.writer.mirror is None
    assert logged and all("cannot read the nftables table inet pycni_policy back" in m for m in logged), logged
