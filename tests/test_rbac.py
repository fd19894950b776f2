"""deploy/rbac.yaml against a real `pycni kube-controllers`: its rules are enough, and each is needed.

The API stand-in (tests/kube_apiserver.py) is given the ClusterRole's rules as the controller's
token grants (:class:`kube_apiserver.Grants`: verbs, API groups, resources, as RBAC checks them),
over a real etcd. With the rules as shipped the controller mirrors a pod, a namespace and a
policy and collects a leaked attachment and a deleted node with no 403, and asks for nothing
outside them. With any one verb of any rule taken away the stand-in answers 403 and the
controller logs one line naming the kind, the verb and the resource.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from etcd_util import EtcdCluster, etcd_available
from kube_apiserver import Grants, KubeAPI, namespace, node, pod

from pycni.cluster.etcd import Etcd
from pycni.cluster.model import Keys, PodMeta, WorkloadEndpoint

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")
pytest.importorskip("kubernetes")

RBAC = Path(__file__).resolve().parent.parent / "deploy" / "rbac.yaml"
USER = "system:serviceaccount:kube-system:pycni-kube-controllers"
KIND_OF = {"pods": "Pod", "nodes": "Node", "namespaces": "Namespace", "networkpolicies": "NetworkPolicy"}


def shipped_rules() -> list[dict[str, Any]]:
    (role,) = [d for d in yaml.safe_load_all(RBAC.read_text())
               if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "pycni-kube-controllers"]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def granted(rules: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
                  for v in rule["verbs"])


def without(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> list[dict[str, Any]]:
    """``rules`` with one verb of one resource taken away (the rest of its rule kept)."""
    out = []
    for rule in copy.deepcopy(rules):
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            rest = [r for r in rule["resources"] if r != resource]
            if rest:
                out.append({**rule, "resources": rest})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                out.append({**rule, "resources": [resource], "verbs": verbs})
        else:
            out.append(rule)
    return out


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[EtcdCluster, KubeAPI]]:
    """One etcd and the stand-in, holding a namespace, two pods, a policy and a node (read only
    here: every controller gets its own etcd prefix)."""
    with EtcdCluster(size=1, subnet="10.231.232.0/24", prefix="pn32") as cluster:
        api = KubeAPI(cluster, bookmark_interval=0.5).start()
        try:
            api.create(namespace("shop", {"team": "blue"}))
            api.create(pod("shop", "web", {"app": "web"}, node="n1", ports=[("http", 8080, "TCP")]))
            api.create({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": "allow-web", "namespace": "shop"},
                        "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}})
            api.create(node("n1"))
            yield cluster, api
        finally:
            api.stop()


class Run:
    """One `pycni kube-controllers` under ``token`` on its own etcd prefix, seeded with what its
    garbage collection must GET: an attachment of a pod the API does not have (shop/ghost) and
    a node the API does not have (n2)."""

    def __init__(self, cluster: EtcdCluster, api: KubeAPI, tmp: Path, token: str, prefix: str) -> None:
        self.cluster, self.keys, self.prefix = cluster, Keys(prefix), prefix
        self.grants: Grants | None = None
        self.etcd: Etcd = cluster.client(timeout=5)
        self.stopped = False
        self.etcd.delete_prefix(f"{prefix}/")
        self.ghost_ip = self._attach("n1", "c-ghost", "ghost")
        self._attach("n2", "c-n2", "web")
        self.logf = tmp / f"ctl{prefix.replace('/', '-')}.log"
        assert cluster.underlay is not None
        cmd = ["ip", "netns", "exec", cluster.underlay.name, sys.executable, "-m", "pycni", "kube-controllers",
               "--kubeconfig", api.kubeconfig(str(tmp / f"kubeconfig{prefix.replace('/', '-')}"), token),
               "--etcd-endpoints", ",".join(cluster.endpoints), "--etcd-prefix", prefix, "--resync", "2",
               "--gc-grace", "0.5", "--lease-ttl", "3", "--identity", "rbac"]
        with open(self.logf, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _attach(self, node_name: str, cid: str, pod_name: str) -> str:
        from pycni.cluster.ipam import ClusterStore
        from pycni.ipranges import parse_range_set

        store = ClusterStore(self.etcd, "kn", node_name, self.prefix)
        got = store.assign(cid, "eth0", [parse_range_set([{"subnet": "10.77.0.0/16"}])], [])
        ep = WorkloadEndpoint(node=node_name, network="kn", namespace="shop", pod=pod_name, container_id=cid,
                              ifname="eth0", interface_name=f"cali{cid[:8]}", orchestrator="k8s")
        self.etcd.put(self.keys.endpoint(node_name, "kn", cid, "eth0"), ep.to_json())
        return str(got[0].ip)

    def log(self) -> str:
        return self.logf.read_text()

    def handle(self, node_name: str, cid: str) -> Any:
        from pycni.cluster.ipam import ClusterStore

        return ClusterStore(self.etcd, "kn", node_name, self.prefix).handle(cid, "eth0")

    def meta(self, key: str) -> PodMeta | None:
        kv = self.etcd.get(key)
        return PodMeta.from_json(kv.value) if kv else None

    def wait(self, what: str, fn: Callable[[], Any], timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (got := fn()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"timed out waiting for {what} (exit {self.proc.poll()})\n{self.log()[-4000:]}")
            time.sleep(0.05)
        return got

    def stop(self) -> int:
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.etcd.delete_prefix(f"{self.prefix}/")
        self.etcd.close()
        return self.proc.returncode


@pytest.fixture
def runs(stack: tuple[EtcdCluster, KubeAPI], tmp_path: Path) -> Iterator[Callable[[list[dict[str, Any]]], Run]]:
    cluster, api = stack
    made: list[Run] = []

    def start(rules: list[dict[str, Any]]) -> Run:
        token = f"ctl-{len(api.tokens)}"
        api.tokens[token] = grants = Grants(rules, USER)
        made.append(Run(cluster, api, tmp_path, token, f"/pn32-{len(api.tokens)}"))
        made[-1].grants = grants
        return made[-1]

    try:
        yield start
    finally:
        for r in made:
            r.stop()


def test_the_shipped_rules_are_enough_and_all_used(runs: Callable[[list[dict[str, Any]]], Run]) -> None:
    rules = shipped_rules()
    run = runs(rules)
    web = run.wait("the pod's record", lambda: run.meta(run.keys.pod("shop", "web")))
    assert web.labels == {"app": "web"} and web.ports == [("http", 8080, "TCP")] and web.source == "k8s"
    assert run.wait("the namespace's record", lambda: run.meta(run.keys.namespace("shop"))).labels == {"team": "blue"}
    run.wait("the policy's record", lambda: run.etcd.get(run.keys.policy("shop", "allow-web")))
    run.wait("the ghost pod's attachment released (a GET of the pod first)", lambda: not run.handle("n1", "c-ghost"))
    run.wait("node n2's attachment released (a GET of the node first)", lambda: not run.handle("n2", "c-n2"))
    assert run.stop() == 0
    log = run.log()
    assert "403" not in log and "forbidden" not in log, log
    # every verb of every rule was used, and nothing outside them was asked for
    assert run.grants is not None and sorted(run.grants.asked) == granted(rules)


@pytest.mark.parametrize("group,resource,verb", granted(shipped_rules()),
                         ids=[f"{r}-{v}" for _, r, v in granted(shipped_rules())])
def test_each_verb_is_needed(runs: Callable[[list[dict[str, Any]]], Run], group: str, resource: str,
                             verb: str) -> None:
    """Without it the stand-in answers 403, and the controller says so in one line naming it."""
    rules = without(shipped_rules(), group, resource, verb)
    assert len(granted(rules)) == len(granted(shipped_rules())) - 1
    run = runs(rules)
    want = f'cannot {verb} resource "{resource}" in API group "{group}"'
    line = run.wait(f"the 403 for {verb} {resource} in the log",
                    lambda: next((ln for ln in run.log().splitlines() if want in ln), None))
    assert "HTTP 403" in line and f'User "{USER}"' in line and KIND_OF[resource] in line, line
    if verb == "get":  # not confirmed gone: nothing released on a cache's word alone
        assert "not collecting" in line
        time.sleep(1.0)
        ghost = run.handle("n1", "c-ghost") if resource == "pods" else run.handle("n2", "c-n2")
        assert ghost is not None, "released without the API confirming it is gone"
    assert run.proc.poll() is None, "a missing permission is retried, not fatal"
    assert "Traceback" not in run.log()


def test_the_stand_in_checks_verbs_groups_and_names(stack: tuple[EtcdCluster, KubeAPI], tmp_path: Path) -> None:
    """The token model the tests above rely on, through the kubernetes client: a verb, a group or
    an object name outside the rules is 403 with the real server's message; inside, served."""
    from kubernetes import client, config
    from kubernetes.client import ApiException

    cluster, api = stack
    api.tokens["reader"] = Grants([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
                                   {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"],
                                    "resourceNames": ["n1"]}], "reader-user")
    core = client.CoreV1Api(config.new_client_from_config(
        config_file=api.kubeconfig(str(tmp_path / "reader.kc"), "reader")))
    net = client.NetworkingV1Api(core.api_client)

    def refused(call: Callable[[], Any], verb: str, what: str, group: str = "") -> None:
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == 403, (e.value.status, e.value.body)
        msg = json.loads(str(e.value.body))["message"]
        assert msg.startswith(f'{what} is forbidden: User "reader-user" cannot {verb} resource '), msg
        assert f'in API group "{group}"' in msg, msg

    assert cluster.underlay is not None
    with cluster.underlay.enter():
        assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items  # type: ignore[union-attr]
                ] == ["web"]
        refused(lambda: core.read_namespaced_pod("web", "shop"), "get", 'pods "web"')
        new_pod: Any = pod("shop", "new")
        refused(lambda: core.create_namespaced_pod("shop", new_pod), "create", "pods")
        refused(lambda: core.patch_namespaced_pod("web", "shop", {"metadata": {"labels": {"x": "1"}}}), "patch",
                'pods "web"')
        refused(lambda: core.delete_namespaced_pod("web", "shop"), "delete", 'pods "web"')
        assert core.read_node("n1").metadata.name == "n1"  # type: ignore[union-attr] # its resourceNames
        refused(lambda: core.read_node("n2"), "get", 'nodes "n2"')
        refused(core.list_node, "list", "nodes")  # resourceNames never grant a list
        refused(net.list_network_policy_for_all_namespaces, "list", "networkpolicies", "networking.k8s.io")
    assert api.get("pods", "shop", "web") is not None and api.get("pods", "shop", "new") is None
