"""``pycni kube-controllers`` against the API stand-in and a real etcd: the mirror, its watch
semantics (410 after a compaction in a gap, an API restart), a SIGKILLed controller, two replicas
with one leader, and the release of what deleted pods and nodes held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from etcd_util import EtcdCluster, etcd_available
from kube_apiserver import KubeAPI, namespace, node, pod

from pycni.cluster.etcd import Etcd
from pycni.cluster.model import Keys, PodMeta, PolicyStatus, WorkloadEndpoint

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")
pytest.importorskip("kubernetes")

PREFIX = "/pk31"
KEYS = Keys(PREFIX)


def policy(ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


ALLOW_WEB = {"podSelector": {"matchLabels": {"app": "db"}},
             "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}
EMPTY_PEER = {"podSelector": {}, "ingress": [{"from": [{}]}]}  # the API takes it; pycni refuses it


class Env:
    """An etcd, the API stand-in, and controllers started as `pycni kube-controllers` processes in
    the underlay namespace."""

    def __init__(self, cluster: EtcdCluster, api: KubeAPI, tmp: str) -> None:
        self.cluster, self.api, self.tmp = cluster, api, tmp
        self.kubeconfig = api.kubeconfig(os.path.join(tmp, "kubeconfig"))
        self.procs: list[tuple[subprocess.Popen[bytes], str]] = []
        self.etcd: Etcd = cluster.client(timeout=5)

    def start(self, identity: str = "a", *extra: str) -> subprocess.Popen[bytes]:
        assert self.cluster.underlay is not None
        logf = os.path.join(self.tmp, f"ctl-{identity}-{len(self.procs)}.log")
        cmd = ["ip", "netns", "exec", self.cluster.underlay.name, sys.executable, "-m", "pycni", "kube-controllers",
               "--kubeconfig", self.kubeconfig, "--etcd-endpoints", ",".join(self.cluster.endpoints),
               "--etcd-prefix", PREFIX, "--resync", "2", "--gc-grace", "1", "--lease-ttl", "3",
               "--identity", identity, *extra]
        with open(logf, "wb") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append((p, logf))
        return p

    def log(self, p: subprocess.Popen[bytes]) -> str:
        logf = next(f for q, f in self.procs if q is p)
        with open(logf) as f:
            return f.read()

    def close(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.etcd.close()

    # -- reading etcd --

    def meta(self, key: str) -> PodMeta | None:
        kv = self.etcd.get(key)
        return PodMeta.from_json(kv.value) if kv else None

    def policy(self, ns: str, name: str) -> dict[str, Any] | None:
        kv = self.etcd.get(KEYS.policy(ns, name))
        return json.loads(kv.value) if kv else None

    def leader(self) -> str:
        kv = self.etcd.get(KEYS.kube_leader)
        return kv.value if kv else ""


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 15.0, env: Env | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {f}\n{open(f).read()[-3000:]}" for _, f in env.procs) if env else ""
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[EtcdCluster, KubeAPI]]:
    with EtcdCluster(size=1, subnet="10.231.132.0/24", prefix="pk31") as cluster:
        api = KubeAPI(cluster, bookmark_interval=0.5)
        try:
            yield cluster, api.start()
        finally:
            api.stop()


@pytest.fixture
def env(stack: tuple[EtcdCluster, KubeAPI], tmp_path: Any) -> Iterator[Env]:
    cluster, api = stack
    if api._server is None:
        api.start()
    with cluster.client(timeout=5) as e:  # each test starts from empty stores
        e.delete_prefix(f"{api.prefix}/")
        e.delete_prefix(f"{PREFIX}/")
    e2 = Env(cluster, api, str(tmp_path))
    try:
        yield e2
    finally:
        e2.close()


def test_mirror_follows_the_api(env: Env) -> None:
    api = env.api
    api.create(namespace("shop", {"team": "blue"}))
    api.create(pod("shop", "web", {"app": "web"}, ports=[("http", 8080, "TCP"), ("dns", 53, "UDP")]))
    api.create(pod("shop", "db", {"app": "db"}))
    api.create(policy("shop", "allow-web", ALLOW_WEB))
    api.create(policy("shop", "odd", EMPTY_PEER))
    # an operator's record of a workload outside Kubernetes is not the mirror's to remove
    env.etcd.put(KEYS.pod("default", "cid-outside"), PodMeta(labels={"x": "1"}).to_json())
    ctl = env.start()
    web = wait_for("the pod's record", lambda: env.meta(KEYS.pod("shop", "web")), env=env)
    assert web.labels == {"app": "web"} and web.source == "k8s" and web.uid
    assert sorted(web.ports) == [("dns", 53, "UDP"), ("http", 8080, "TCP")]
    assert wait_for("the namespace's record", lambda: env.meta(KEYS.namespace("shop")), env=env).labels == \
        {"team": "blue"}
    assert wait_for("the policy", lambda: env.policy("shop", "allow-web"), env=env)["spec"] == ALLOW_WEB
    # the refused one: not enforced, reported in its status record and in the log
    status = wait_for("the refusal", lambda: env.etcd.get(KEYS.policy_status("shop", "odd")), env=env)
    assert "ingress[0].from[0]" in PolicyStatus.from_json(status.value).error
    assert env.policy("shop", "odd") is None
    assert "NetworkPolicy shop/odd refused" in env.log(ctl)
    # changes in the API arrive
    api.patch("pods", "shop", "web", {"metadata": {"labels": {"app": "web", "tier": "front"}}})
    api.patch("namespaces", "", "shop", {"metadata": {"labels": {"team": "red"}}})
    api.patch("networkpolicies", "shop", "odd", {"spec": ALLOW_WEB})
    wait_for("the new pod labels", lambda: (env.meta(KEYS.pod("shop", "web")) or PodMeta()).labels.get("tier"),
             env=env)
    wait_for("the new namespace labels",
             lambda: (env.meta(KEYS.namespace("shop")) or PodMeta()).labels == {"team": "red"}, env=env)
    wait_for("the fixed policy", lambda: env.policy("shop", "odd"), env=env)
    wait_for("its status gone", lambda: env.etcd.get(KEYS.policy_status("shop", "odd")) is None, env=env)
    api.delete("pods", "shop", "db")
    api.delete("networkpolicies", "shop", "allow-web")
    wait_for("the pod's record removed", lambda: env.meta(KEYS.pod("shop", "db")) is None, env=env)
    wait_for("the policy removed", lambda: env.policy("shop", "allow-web") is None, env=env)
    time.sleep(2.5)  # a full reconcile later
    assert env.meta(KEYS.pod("default", "cid-outside")) is not None
    ctl.send_signal(signal.SIGTERM)
    assert ctl.wait(timeout=10) == 0
    assert env.leader() == "", "a clean stop gives the leadership up at once"


def test_gap_with_compaction_and_api_restart(env: Env) -> None:
    api = env.api
    api.create(namespace("gap"))
    for name in ("a", "b", "c"):
        api.create(pod("gap", name, {"v": "1"}))
    ctl = env.start()
    wait_for("the pods", lambda: all(env.meta(KEYS.pod("gap", n)) for n in "abc"), env=env)
    api.stop()  # the API server goes away; the controller's watches break
    api.delete("pods", "gap", "b")  # ...while it is away: etcd changes, then is compacted
    api.patch("pods", "gap", "c", {"metadata": {"labels": {"v": "2"}}})
    api.create(pod("gap", "d", {"v": "1"}))
    api.compact()
    time.sleep(1.0)
    api.start()
    wait_for("the gap's deletion", lambda: env.meta(KEYS.pod("gap", "b")) is None, timeout=40, env=env)
    wait_for("the gap's change", lambda: (env.meta(KEYS.pod("gap", "c")) or PodMeta()).labels == {"v": "2"},
             env=env)
    wait_for("the gap's addition", lambda: env.meta(KEYS.pod("gap", "d")), env=env)
    assert "deleted in the gap" in env.log(ctl)


def test_killed_controller_and_restored_etcd_converge(env: Env) -> None:
    api = env.api
    api.create(namespace("k"))
    api.create(pod("k", "p1", {"v": "1"}))
    api.create(pod("k", "p2", {"v": "1"}))
    ctl = env.start()
    wait_for("the pods", lambda: env.meta(KEYS.pod("k", "p2")), env=env)
    ctl.kill()
    ctl.wait()
    api.patch("pods", "k", "p1", {"metadata": {"labels": {"v": "2"}}})
    api.delete("pods", "k", "p2")
    # what a restored backup might hold: a mirrored pod and a policy the API no longer has
    env.etcd.put(KEYS.pod("k", "ghost"), PodMeta(labels={"v": "0"}, source="k8s").to_json())
    env.etcd.put(KEYS.policy("k", "old"), json.dumps(policy("k", "old", ALLOW_WEB)))
    env.start("b")
    wait_for("the change made while it was dead",
             lambda: (env.meta(KEYS.pod("k", "p1")) or PodMeta()).labels == {"v": "2"}, env=env)
    wait_for("the deletion made while it was dead", lambda: env.meta(KEYS.pod("k", "p2")) is None, env=env)
    wait_for("the restored pod record removed", lambda: env.meta(KEYS.pod("k", "ghost")) is None, env=env)
    wait_for("the restored policy removed", lambda: env.policy("k", "old") is None, env=env)


def test_two_replicas_one_leader(env: Env) -> None:
    api = env.api
    api.create(namespace("ha"))
    a = env.start("a")
    wait_for("a leader", env.leader, env=env)
    b = env.start("b")
    api.create(pod("ha", "p", {"v": "1"}))
    wait_for("the pod", lambda: env.meta(KEYS.pod("ha", "p")), env=env)
    first = env.leader()
    time.sleep(1.0)
    assert env.leader() == first
    leader, standby = (a, b) if first == "a" else (b, a)
    assert "leading as" not in env.log(standby)
    leader.kill()
    leader.wait()
    wait_for("the standby leading", lambda: env.leader() not in ("", first), timeout=20, env=env)
    api.patch("pods", "ha", "p", {"metadata": {"labels": {"v": "2"}}})
    wait_for("the new leader mirroring", lambda: (env.meta(KEYS.pod("ha", "p")) or PodMeta()).labels == {"v": "2"},
             env=env)


def test_a_deposed_leader_cannot_write(env: Env) -> None:
    """The fence itself: once another replica holds the key, the old leader's guarded write fails."""
    from pycni.cluster.kube.leader import Leadership
    from pycni.cluster.policy.model import parse_policy
    from pycni.cluster.policy.records import (
        GuardLost,
        delete_meta,
        delete_policy,
        put_policies,
        put_policy_status,
        set_meta,
    )

    with env.cluster.client(timeout=5) as e1, env.cluster.client(timeout=5) as e2:
        old = Leadership(e1, KEYS.kube_leader, ttl=3, identity="old")
        assert old.try_acquire()
        new = Leadership(e2, KEYS.kube_leader, ttl=3, identity="new")
        assert not new.try_acquire()
        e2.lease_revoke(old.lease)  # what an expired lease amounts to
        assert new.try_acquire()
        with pytest.raises(GuardLost):
            set_meta(e1, KEYS.pod("fence", "p"), PodMeta(labels={"by": "old"}), old.guard)
        assert set_meta(e2, KEYS.pod("fence", "p"), PodMeta(labels={"by": "new"}), new.guard)
        assert env.meta(KEYS.pod("fence", "p")) == PodMeta(labels={"by": "new"})
        # every kind of write the mirror makes is fenced the same way
        pol = parse_policy(policy("fence", "np", ALLOW_WEB))
        assert put_policies(e2, KEYS, [pol], new.guard) == {"fence/np": "created"}
        for write in (lambda: delete_meta(e1, KEYS.pod("fence", "p"), old.guard),
                      lambda: delete_policy(e1, KEYS, "fence", "np", old.guard),
                      lambda: put_policies(e1, KEYS, [parse_policy(policy("fence", "np2", ALLOW_WEB))], old.guard),
                      lambda: put_policy_status(e1, KEYS, "fence", "np", PolicyStatus(error="x"), old.guard)):
            with pytest.raises(GuardLost):
                write()
        assert env.meta(KEYS.pod("fence", "p")) is not None and env.policy("fence", "np") is not None
        assert env.policy("fence", "np2") is None and env.etcd.get(KEYS.policy_status("fence", "np")) is None
        new.resign()


def _attach(etcd: Etcd, network: str, node_name: str, cid: str, ns: str, pod_name: str, uid: str = "") -> str:
    """An attachment as cluster-ipam and routed leave it: a handle holding an address in the node's
    block, and its workload endpoint."""
    from pycni.cluster.ipam import ClusterStore
    from pycni.ipranges import parse_range_set

    store = ClusterStore(etcd, network, node_name, PREFIX)
    got = store.assign(cid, "eth0", [parse_range_set([{"subnet": "10.77.0.0/16"}])], [])
    ip = str(got[0].ip)
    ep = WorkloadEndpoint(node=node_name, network=network, namespace=ns, pod=pod_name, container_id=cid,
                          ifname="eth0", interface_name=f"cali{cid[:8]}", orchestrator="k8s", pod_uid=uid)
    etcd.put(KEYS.endpoint(node_name, network, cid, "eth0"), ep.to_json())
    return ip


def test_deleted_pods_and_nodes_are_released(env: Env) -> None:
    from pycni.cluster.ipam import ClusterStore

    api = env.api
    api.create(namespace("gc"))
    api.create(node("n1"))
    api.create(node("n2"))
    uid = api.create(pod("gc", "live", node="n1"))["metadata"]["uid"]
    _attach(env.etcd, "kn", "n1", "c-live", "gc", "live", uid)
    _attach(env.etcd, "kn", "n1", "c-ghost", "gc", "ghost")  # its pod is gone; its DEL never came
    _attach(env.etcd, "kn", "n1", "c-before", "gc", "live", "uid-of-a-pod-deleted-then-made-again")
    _attach(env.etcd, "kn", "n2", "c-n2", "gc", "live")
    ctl = env.start()
    n1 = ClusterStore(env.etcd, "kn", "n1", PREFIX)
    wait_for("the ghost's handle released", lambda: n1.handle("c-ghost", "eth0") is None, env=env)
    wait_for("the re-created pod's predecessor released", lambda: n1.handle("c-before", "eth0") is None, env=env)
    assert env.etcd.get(KEYS.endpoint("n1", "kn", "c-ghost", "eth0")) is None
    time.sleep(1.5)
    assert n1.handle("c-live", "eth0") is not None, "a live pod's attachment is never released"
    api.delete("nodes", "", "n2")
    n2 = ClusterStore(env.etcd, "kn", "n2", PREFIX)
    wait_for("node n2's blocks released", lambda: not [b for b in n2.blocks() if b.node == "n2"], env=env)
    assert n2.handle("c-n2", "eth0") is None
    assert not env.etcd.get_prefix(KEYS.affinities_of("n2", "kn"))[0]
    assert [b.node for b in n1.blocks()] == ["n1"], "the live node keeps its block"
    assert "never deleted: released" in env.log(ctl)


def test_bad_configuration_is_one_line_with_code_7(tmp_path: Any) -> None:
    """No traceback: a kubeconfig that is not there, no etcd endpoints, no in-cluster account."""
    def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        base = {"PATH": os.environ.get("PATH", "")}
        return subprocess.run([sys.executable, "-m", "pycni", "kube-controllers", *args], capture_output=True,
                              text=True, timeout=60, env={**base, **(env or {})})

    missing = os.path.join(str(tmp_path), "nope.kubeconfig")
    out = cli("--kubeconfig", missing, "--etcd-endpoints", "http://10.231.132.1:2379")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot reach the Kubernetes API" in out.stderr and missing in out.stderr and "(code 7)" in out.stderr
    out = cli("--kubeconfig", missing)
    assert out.returncode == 1 and "--etcd-endpoints is required" in out.stderr and "(code 7)" in out.stderr
    out = cli("--etcd-endpoints", "http://10.231.132.1:2379")  # no kubeconfig: the service account, absent here
    assert out.returncode == 1 and "service account" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_in_cluster_service_account(env: Env, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --kubeconfig the client is the pod's service account: KUBERNETES_SERVICE_HOST/PORT,
    the token and the CA (their paths pointed at a temporary copy; the library reads them)."""
    import kubernetes.config.incluster_config as ic

    from pycni.cluster.kube.client import KubeClient

    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("admin-token")
    (sa / "ca.crt").write_text(open(env.api.ca_cert).read())
    monkeypatch.setattr(ic, "SERVICE_TOKEN_FILENAME", str(sa / "token"))
    monkeypatch.setattr(ic, "SERVICE_CERT_FILENAME", str(sa / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", env.api.host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(env.api.port))
    env.api.create(namespace("incluster", {"a": "b"}))
    assert env.cluster.underlay is not None
    with env.cluster.underlay.enter():
        kube = KubeClient("")
        try:
            items, rv = kube.list_all("Namespace", limit=1)
        finally:
            kube.close()
    assert [(o["metadata"]["name"], o["metadata"]["labels"]) for o in items] == [("incluster", {"a": "b"})]
    assert int(rv) > 0


def test_backoff_is_client_gos() -> None:
    """0.8 s doubling to 30 s (each within ±20 % jitter), back to 0.8 s after a success."""
    from pycni.cluster.kube.informer import Backoff

    b = Backoff()
    nominal = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    for want in nominal:
        got = b.next()
        assert want * 0.8 <= got <= want * 1.2, (want, got)
    b.reset()
    assert 0.64 <= b.next() <= 0.96
