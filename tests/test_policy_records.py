"""Workload endpoints and policy records without a server (pycni.cluster.memkv): an endpoint is
written only beside its IPAM handle and leaves with it; GC; the codec's keys; the agent's view
merges pod labels and named ports; the CLI's label and port edits."""

from __future__ import annotations

import json

import pytest

from pycni.cluster.ipam import ClusterStore
from pycni.cluster.memkv import MemKV
from pycni.cluster.model import Keys, PodMeta, WorkloadEndpoint
from pycni.cluster.policy import workload
from pycni.cluster.policy.agent import PolicyView
from pycni.cluster.policy.cli import label_changes, port_changes
from pycni.cluster.policy.evaluate import decide
from pycni.cluster.settings import ClusterSettings, EtcdSettings
from pycni.ipranges import parse_range_set
from pycni.spec.errors import INVALID_CONFIG, TRY_AGAIN, CNIError

RS = [parse_range_set([{"subnet": "10.90.0.0/24"}])]
CFG = ClusterSettings(network="net", etcd=EtcdSettings(endpoints=["http://127.0.0.1:1"]), node="n1", lock_dir="")


def endpoint(cid: str, ip: str, ns: str = "default", pod: str = "") -> WorkloadEndpoint:
    return WorkloadEndpoint(node="n1", network="net", namespace=ns, pod=pod or cid, container_id=cid, ifname="eth0",
                            interface_name=f"rtd{cid}", mac="02:00:00:00:00:01", ip_networks=[f"{ip}/32"],
                            profiles=["net"])


def test_endpoint_needs_its_handle_and_leaves_with_it() -> None:
    kv = MemKV()
    keys = Keys()
    with pytest.raises(CNIError) as e:
        workload.record_endpoint(CFG, endpoint("c1", "10.90.0.1"), kv=kv)
    assert e.value.code == TRY_AGAIN and "IPAM handle" in e.value.msg
    assert kv.get(keys.endpoint("n1", "net", "c1", "eth0")) is None
    store = ClusterStore(kv, "net", "n1")
    got = store.assign("c1", "eth0", RS, [])
    workload.record_endpoint(CFG, endpoint("c1", str(got[0].ip)), kv=kv)
    stored = kv.get(keys.endpoint("n1", "net", "c1", "eth0"))
    assert stored is not None
    assert WorkloadEndpoint.from_json(stored.value) == endpoint("c1", str(got[0].ip))
    # the release of the handle takes the endpoint in the same transaction
    rev = kv.revision
    assert store.release("c1", "eth0")
    assert kv.get(keys.endpoint("n1", "net", "c1", "eth0")) is None
    assert kv.revision == rev + 1


def test_gc_removes_this_nodes_endpoints_not_listed() -> None:
    kv = MemKV()
    keys = Keys()
    for cid in ("a", "b"):
        kv.put(keys.endpoint("n1", "net", cid, "eth0"), endpoint(cid, "10.90.0.9").to_json())
    kv.put(keys.endpoint("n2", "net", "c", "eth0"), endpoint("c", "10.90.0.8").to_json())
    kv.put(keys.endpoint("n1", "other", "d", "eth0"), endpoint("d", "10.90.0.7").to_json())
    gone = workload.gc_endpoints(CFG, [("a", "eth0")], kv=kv)
    assert gone == [keys.endpoint("n1", "net", "b", "eth0")]
    assert kv.get(keys.endpoint("n2", "net", "c", "eth0")) is not None  # another node's
    assert kv.get(keys.endpoint("n1", "other", "d", "eth0")) is not None  # another network's


def test_workload_names_from_cni_args() -> None:
    from pycni.cniargs import parse_cni_args

    args = parse_cni_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=front-1")
    assert workload.workload_of(args, "cid") == ("k8s", "web", "front-1")
    assert workload.workload_of({}, "cid") == ("cni", "default", "cid")
    assert workload.workload_of(parse_cni_args("IgnoreUnknown=1;K8S_POD_NAME=only"), "cid") == ("cni", "default", "cid")


def test_keys_parse_the_new_kinds() -> None:
    k = Keys("/p")
    e = k.parse(k.endpoint("n1", "net", "c1", "eth0"))
    assert e is not None and (e.kind, e.node, e.network, e.container_id, e.ifname) == ("endpoint", "n1", "net",
                                                                                       "c1", "eth0")
    p = k.parse(k.pod("x", "a"))
    assert p is not None and (p.kind, p.namespace, p.name) == ("pod", "x", "a")
    n = k.parse(k.namespace("x"))
    assert n is not None and (n.kind, n.namespace) == ("namespace", "x")
    q = k.parse(k.policy("x", "deny"))
    assert q is not None and (q.kind, q.namespace, q.name) == ("policy", "x", "deny")
    assert k.parse("/p/pods/x") is None and k.parse("/p/endpoints/n1/net/c1") is None


def test_view_merges_labels_ports_and_policies() -> None:
    kv = MemKV()
    keys = Keys()
    kv.put(keys.endpoint("n1", "net", "c1", "eth0"), endpoint("c1", "10.90.0.1", "x", "a").to_json())
    kv.put(keys.endpoint("n2", "net", "c2", "eth0"), endpoint("c2", "10.90.0.2", "y", "b").to_json())
    kv.put(keys.pod("x", "a"), PodMeta(labels={"app": "web"}, ports=[("http", 8080, "TCP")]).to_json())
    kv.put(keys.namespace("y"), PodMeta(labels={"team": "blue"}).to_json())
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "web", "namespace": "x"},
              "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}],
                                    "ports": [{"port": "http"}]}]}}
    kv.put(keys.policy("x", "web"), json.dumps(policy))
    kv.put(keys.policy("x", "broken"), '{"kind": "NetworkPolicy"}')
    view = PolicyView(keys)
    view.load(kv)
    assert set(view.errors) == {keys.policy("x", "broken")}
    cluster, pods = view.cluster()
    assert pods["x/a"].labels == {"app": "web"} and pods["x/a"].named_ports == {("http", "TCP"): 8080}
    assert decide(cluster, pods["y/b"], pods["x/a"], 8080).allowed
    assert not decide(cluster, pods["y/b"], pods["x/a"], 80).allowed
    # live: the namespace loses its label
    assert view.put(keys.namespace("y"), PodMeta(labels={}).to_json())
    cluster, pods = view.cluster()
    assert not decide(cluster, pods["y/b"], pods["x/a"], 8080).allowed
    assert view.delete(keys.policy("x", "web"))
    cluster, pods = view.cluster()
    assert decide(cluster, pods["y/b"], pods["x/a"], 80).allowed


def test_label_and_port_edits() -> None:
    assert label_changes({"a": "1", "b": "2"}, ["a=3", "b-", "c="]) == {"a": "3", "c": ""}
    with pytest.raises(CNIError) as e:
        label_changes({}, ["app"])
    assert e.value.code == INVALID_CONFIG and "key=value to set a label, key- to remove it" in e.value.details
    with pytest.raises(CNIError):
        label_changes({}, ["tier=front end"])
    ports = port_changes([("http", 80, "TCP")], ["dns=53/udp", "http=8080/TCP", "metrics=9090"])
    assert ports == [("dns", 53, "UDP"), ("http", 8080, "TCP"), ("metrics", 9090, "TCP")]
    assert port_changes(ports, ["http-"]) == [("dns", 53, "UDP"), ("metrics", 9090, "TCP")]
    with pytest.raises(CNIError) as e:
        port_changes([], ["http=99999/TCP"])
    assert "PORT 1-65535" in e.value.details


def test_incremental_patch_equals_full_compile() -> None:
    """patch_node (the agent's fast path for endpoint and pod changes) gives exactly what a full
    compile gives, over a random walk of pods appearing, leaving, relabelled and renumbered."""
    import random

    from policy_cases import CASES, policies_text

    from pycni import ipaddr
    from pycni.cluster.policy.compile import Endpoint, compile_node, patch_node
    from pycni.cluster.policy.evaluate import Workload
    from pycni.cluster.policy.model import parse_policies

    rnd = random.Random(7)
    texts = [policies_text(c, {f"{n}/{p}": f"10.90.{i}.{j}" for i, n in enumerate("xyz") for j, p in enumerate("abc")})
             for c in CASES]
    policies = [p for t in texts for p in parse_policies(t)]
    policies = list({p.key: p for p in policies}.values())
    namespaces = {ns: {"ns": ns} for ns in "xyz"}
    eps: dict[str, Endpoint] = {}

    def make(i: int) -> Endpoint:
        ns = rnd.choice("xyz")
        labels = {"pod": rnd.choice("abcq")} | ({"other": "1"} if rnd.random() < 0.2 else {})
        ips = (ipaddr.ip_address("10.90.0.1") + i, ipaddr.ip_address("fd90::1") + i)
        ports = {(f"serve-{p}-{pr.lower()}", pr): p for p in (80, 81) for pr in ("TCP", "UDP") if rnd.random() < 0.7}
        w = Workload(ns, f"p{i}", labels, ips, ports, node=rnd.choice(["n1", "n2"]))
        return Endpoint(w, f"rtd{i:012x}", "net", rnd.random() < 0.1)

    for i in range(30):
        eps[f"k{i}"] = make(i)
    have = compile_node("n1", eps.values(), policies, namespaces)
    patched = 0
    for step in range(400):
        key = f"k{rnd.randrange(45)}"
        old = eps.get(key)
        if old is not None and rnd.random() < 0.3:
            del eps[key]
            new = None
        else:
            new = make(int(key[1:]) + 1000 * step)
            if old is not None and rnd.random() < 0.5:  # same pod, same place: only labels or ports move
                new = Endpoint(Workload(old.workload.namespace, old.workload.name, new.workload.labels,
                                        old.workload.ips, new.workload.named_ports, old.workload.node),
                               old.iface, "net", old.default_deny)
            eps[key] = new
        full = compile_node("n1", eps.values(), policies, namespaces)
        got = patch_node("n1", have, [(old, new)], policies, namespaces)
        if got is not None:
            patched += 1
            assert got == full, f"step {step}: {key} {old} -> {new}"
        have = full
    assert patched > 100, patched  # the fast path is the common one here


def test_member_sets_reused_when_only_policies_change() -> None:
    """compile_node(members_from=...) after policy changes alone equals a compile from nothing."""
    import random

    from policy_cases import CASES, NAMED_PORTS, policies_text

    from pycni import ipaddr
    from pycni.cluster.policy.compile import Endpoint, Memo, compile_node
    from pycni.cluster.policy.evaluate import Workload
    from pycni.cluster.policy.model import parse_policies

    rnd = random.Random(11)
    eps = [Endpoint(Workload(rnd.choice("xyz"), f"p{i}", {"pod": rnd.choice("abc")},
                             (ipaddr.ip_address("10.90.0.1") + i,), dict(NAMED_PORTS),
                             node=rnd.choice(["n1", "n2"])), f"rtd{i:012x}") for i in range(40)]
    namespaces = {ns: {"ns": ns} for ns in "xyz"}
    addrs = {f"{n}/{p}": "10.90.0.9" for n in "xyz" for p in "abc"}
    memo = Memo()
    have = compile_node("n1", eps, [], namespaces, memo)
    for step in range(60):
        pols = [p for c in rnd.sample(CASES, 3) for p in parse_policies(policies_text(c, addrs))]
        pols = list({p.key: p for p in pols}.values())
        got = compile_node("n1", eps, pols, namespaces, memo, members_from=have)
        assert got == compile_node("n1", eps, pols, namespaces), step
        have = got


def test_policy_patch_equals_full_compile() -> None:
    """patch_policies (the agent's path for policy changes) gives exactly what a compile from
    nothing gives, over a random walk of policies created, replaced and deleted — one or several
    at a time, interleaved with pods appearing (patch_node) as the agent interleaves them, each
    step starting from the previous step's patched result and memo."""
    import random

    from policy_cases import CASES, policies_text

    from pycni import ipaddr
    from pycni.cluster.policy.compile import Endpoint, Memo, compile_node, patch_node, patch_policies
    from pycni.cluster.policy.evaluate import Workload
    from pycni.cluster.policy.model import NetworkPolicy, parse_policies

    rnd = random.Random(25)
    addrs = {f"{n}/{p}": f"10.90.{i}.{j}" for i, n in enumerate("xyz") for j, p in enumerate("abc")}
    pool: list[NetworkPolicy] = [p for c in CASES for p in parse_policies(policies_text(c, addrs))]
    namespaces = {ns: {"ns": ns} for ns in "xyz"}

    def make(i: int) -> Endpoint:
        labels = {"pod": rnd.choice("abcq")} | ({"other": "1"} if rnd.random() < 0.2 else {})
        ips = (ipaddr.ip_address("10.90.0.1") + i, ipaddr.ip_address("fd90::1") + i)
        ports = {(f"serve-{p}-{pr.lower()}", pr): p for p in (80, 81) for pr in ("TCP", "UDP") if rnd.random() < 0.7}
        w = Workload(rnd.choice("xyz"), f"p{i}", labels, ips, ports, node=rnd.choice(["n1", "n2"]))
        return Endpoint(w, f"rtd{i:012x}", "net", rnd.random() < 0.1)

    eps = [make(i) for i in range(40)]
    policies: dict[str, NetworkPolicy] = {}
    memo = Memo()
    have = compile_node("n1", eps, [], namespaces, memo)
    patched = 0
    for step in range(300):
        if rnd.random() < 0.1:  # a pod appears, as the agent's endpoint fast path adds it
            new = make(100 + step)
            got = patch_node("n1", have, [(None, new)], policies.values(), namespaces)
            eps.append(new)
            have = got if got is not None else compile_node("n1", eps, policies.values(), namespaces, memo)
            continue
        spaces = set()
        for _ in range(rnd.choice((1, 1, 1, 2, 5))):
            p = rnd.choice(pool)
            if p.key in policies and rnd.random() < 0.4:
                del policies[p.key]
            else:
                policies[p.key] = p
            spaces.add(p.namespace)
        got = patch_policies("n1", have, spaces, eps, policies.values(), namespaces, memo)
        assert got == compile_node("n1", eps, policies.values(), namespaces), f"step {step}: {sorted(spaces)}"
        assert set(got.sets) == set(compile_node("n1", eps, policies.values(), namespaces).sets)
        patched += 1
        have = got
    assert patched > 200 and len(have.chains) > 10, (patched, len(have.chains))


def test_agent_updates_equal_a_fresh_compile() -> None:
    """The agent as it runs: random batches of watch events (endpoints and pod records, namespace
    labels, policies; each batch of one kind — a patch path — or mixed) through PolicyEnforcer, whose fast paths
    look only at what the events touched; after every batch what it would program equals a
    compile of a fresh read of the same records."""
    import random

    from policy_cases import CASES, policies_text

    from pycni.cluster.policy.agent import PolicyEnforcer
    from pycni.cluster.policy.compile import compile_node
    from pycni.cluster.policy.model import parse_policies
    from pycni.cluster.policy.nftsync import Programmer

    class Recorder(Programmer):  # the kernel side is test_policy_dataplane's; here: what it is asked to hold
        def apply(self, want):  # type: ignore[no-untyped-def]
            self.applied = want
            return "x"

    rnd = random.Random(5)
    keys = Keys("/t")
    addrs = {f"{n}/{p}": f"10.90.{i}.{j}" for i, n in enumerate("xyz") for j, p in enumerate("abc")}
    docs = [dict(p.source) for c in CASES for p in parse_policies(policies_text(c, addrs))]
    enf = PolicyEnforcer(keys, "n1", lambda m: None)
    enf.programmer = Recorder()
    kv = MemKV()

    def event() -> tuple[str, str, str]:
        r = rnd.random()
        if r < 0.4:
            i = rnd.randrange(30)
            key = keys.endpoint("n2" if i % 3 else "n1", "net", f"c{i}", "eth0")  # (one address, one key)
            if rnd.random() < 0.2:
                return "DELETE", key, ""
            ep = endpoint(f"c{i}", f"10.90.0.{i + 1}", rnd.choice("xyz"), f"p{i % 12}")
            ep.node = key.split("/")[3]
            ep.labels = {"pod": rnd.choice("abc")}
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
    enf.apply()
    LOG: list[object] = []  # the last batches, for the failure message
    for step in range(300):
        kinds = rnd.choice(["policies", "endpoints", "namespaces", "any"])
        for _ in range(rnd.choice((1, 1, 2, 4))):
            kind, key, value = event()
            while kinds != "any" and (kinds == "endpoints") != ("/endpoints/" in key or "/pods/" in key) or \
                    kinds in ("policies", "namespaces") and f"/{kinds}/" not in key:
                kind, key, value = event()
            if kind == "DELETE":
                kv.delete(key)
            else:
                kv.put(key, value)
            enf.event(kind, key, value)
            LOG.append((step, kind, key, value[:200]))
        before = (enf.patched, enf.compiled, enf.policy_spaces, enf.only_endpoints, enf.members_changed)
        assert enf.apply()
        LOG.append(before)
        fresh = PolicyEnforcer(keys, "n1", lambda m: None)
        fresh.view.load(kv)
        want = compile_node("n1", fresh.view.compiled_endpoints(), fresh.view.policies.values(),
                            fresh.view.namespace_labels())
        assert enf.programmer.applied == want, "\n".join(map(str, LOG[-12:]))
    assert enf.patched > 100 and enf.compiled > 20, (enf.patched, enf.compiled)


def test_coverage_check_asks_again_when_the_kernel_cut_its_answer_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """``nft get element`` while the agent rewrites the table can fail with EINTR (the kernel's
    NLM_F_DUMP_INTR): that is "not yet", not a failed ADD; anything else still fails."""
    from pycni.net import nft

    def interrupted(script: str, what: str = "") -> str:
        raise nft.NftError(5, "nft failed", "Error: Could not process rule: Interrupted system call\n")

    monkeypatch.setattr(nft, "run", interrupted)
    assert workload._covered("rtdx") is False

    def refused(script: str, what: str = "") -> str:
        raise nft.NftError(5, "nft failed", "Error: Operation not permitted\n")

    monkeypatch.setattr(nft, "run", refused)
    with pytest.raises(nft.NftError):
        workload._covered("rtdx")
