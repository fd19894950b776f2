"""Workload endpoints and policy records without a server (pycni.cluster.memkv): an endpoint is
written only beside its IPAM handle and leaves with it; GC; the codec's keys; the agent's view
merges pod labels and named ports; the CLI's label and port edits."""

from __future__ import annotations

import json
from typing import Any

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


def test_coverage_check_asks_again_when_the_kernel_cut_its_answer_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """``nft get element`` while the agent rewrites the table can fail with EINTR (the kernel's
    NLM_F_DUMP_INTR): that is "not yet", not a failed ADD; anything else still fails."""
    from pycni.net import nft, probe

    monkeypatch.setattr(probe, "nft_set_has_ifname", lambda *a: None)  # (a kernel that does not answer)

    def interrupted(script: str, what: str = "") -> str:
        raise nft.NftError(5, "nft failed", "Error: Could not process rule: Interrupted system call\n")

    monkeypatch.setattr(nft, "run", interrupted)
    assert workload._covered("rtdx") is False

    def refused(script: str, what: str = "") -> str:
        raise nft.NftError(5, "nft failed", "Error: Operation not permitted\n")

    monkeypatch.setattr(nft, "run", refused)
    with pytest.raises(nft.NftError):
        workload._covered("rtdx")


def test_coverage_is_asked_of_the_kernel_by_netlink(monkeypatch: pytest.MonkeyPatch) -> None:
    """routed's wait asks the kernel whether its interface is in ``covered`` with one netlink
    set-element query (no nft process): absent table, absent element, present element."""

    def no_exec(*a: object, **k: object) -> None:
        raise AssertionError("nft was run")

    from netns_util import have_root, new_namespace

    if not have_root():
        pytest.skip("network namespaces need root")
    ns = new_namespace("pe34-cov")
    try:
        _coverage_in(ns, monkeypatch, no_exec)
    finally:
        ns.delete()


def _coverage_in(ns: Any, monkeypatch: pytest.MonkeyPatch, no_exec: Any) -> None:
    from pycni.net import nft

    with ns.enter():
        monkeypatch.setattr(nft, "run", no_exec)
        assert workload._covered("rtdaaaa") is False
        monkeypatch.undo()
        nft.run(f"add table inet {workload.TABLE}\nadd set inet {workload.TABLE} covered {{ type ifname; }}\n"
                f'add element inet {workload.TABLE} covered {{ "rtdaaaa" }}\n')
        monkeypatch.setattr(nft, "run", no_exec)
        assert workload._covered("rtdaaaa") is True
        assert workload._covered("rtdbbbb") is False
        assert workload.wait_covered("rtdaaaa", 1.0, required=True) is True


def test_a_full_read_comes_in_pages_at_one_revision() -> None:
    """PolicyView.load reads every prefix in pages (a 10,000-endpoint read in one request is
    megabytes), all at the first page's revision, and misses nothing at a page's edge."""
    kv = MemKV()
    keys = Keys("/t")
    for i in range(7):
        kv.put(keys.endpoint("n1", "net", f"c{i}", "eth0"), endpoint(f"c{i}", f"10.90.0.{i + 1}").to_json())
        kv.put(keys.pod("default", f"c{i}"), PodMeta(labels={"i": str(i)}).to_json())
    view = PolicyView(keys)
    view.PAGE = 3
    rev = view.load(kv)
    assert rev == kv.revision and len(view.endpoints) == 7 and len(view.pods) == 7
    assert view.workload(view.endpoints[keys.endpoint("n1", "net", "c6", "eth0")]).labels["i"] == "6"
    # the next full read lists keys and revisions, and fetches only what moved
    kv.put(keys.pod("default", "c6"), PodMeta(labels={"i": "six"}).to_json())
    kv.delete(keys.endpoint("n1", "net", "c0", "eth0"))
    fetched: list[str] = []
    real_range = kv.range

    def counting(key: str, **kw: object) -> object:
        if not kw.get("keys_only") and not kw.get("range_end"):
            fetched.append(key)
        return real_range(key, **kw)  # type: ignore[arg-type]

    kv.range = counting  # type: ignore[method-assign]
    assert view.load(kv) == kv.revision
    assert fetched == [keys.pod("default", "c6")]
    assert len(view.endpoints) == 6
    assert view.workload(view.endpoints[keys.endpoint("n1", "net", "c6", "eth0")]).labels["i"] == "six"
