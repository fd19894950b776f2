"""routed with Calico's Kubernetes keys: a pod's endpoint is born with its labels from the API.

One node (its namespace holds an etcd member, the node agent with policy, and the pods' host
ends), the API stand-in and ``pycni kube-controllers`` in the underlay namespace. Real packets:
a pod that a policy admits by label gets through right after its ADD returns, one that the policy
excludes never does, and a label changed in the API reaches the dataplane.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_util import EtcdCluster, etcd_available
from kube_apiserver import KubeAPI, namespace, pod
from kube_cluster import Cluster
from netns_util import new_namespace
from plugin_util import err, ok, run
from policy_probe import EchoServers, probe

from pycni.cluster.model import Keys, WorkloadEndpoint
from pycni.cluster.policy import workload

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")
pytest.importorskip("kubernetes")

PREFIX = "/pk31r"
KEYS = Keys(PREFIX)
SUBNET = "10.93.0.0/16"
DB_FROM_WEB = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "db-from-web", "namespace": "x"},
               "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                     "ports": [{"port": "http"}]}]}}  # db's named port (TCP 80), from the API


class Node(Cluster):
    """One node of a :class:`kube_cluster.Cluster`, with Calico-shaped confs of its own."""

    def __init__(self, cluster: EtcdCluster, api: KubeAPI, tmp: str, plugin_dir: str) -> None:
        super().__init__(cluster, api, tmp, plugin_dir, prefix=PREFIX)
        self.ns = cluster.nodes[0].ns
        self.log_file = os.path.join(tmp, "cni.log")

    def logs(self, *more: str) -> str:
        return super().logs("cni.log", *more)

    def conf(self, **extra: Any) -> dict[str, Any]:
        """A Calico-shaped conflist entry with "type": "routed" (no ipam.nodeName: "nodename" names it)."""
        c: dict[str, Any] = {
            "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "routed", "mtu": 1450,
            "nodename": self.etcd.nodes[0].name, "log_level": "debug", "log_file_path": self.log_file,
            "policy": {"type": "k8s"}, "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"},
            "policySetupTimeout": 15,
            "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.etcd.endpoints, "etcdPrefix": PREFIX,
                     "ranges": [[{"subnet": SUBNET}]], "lockDir": os.path.join(self.tmp, "locks")}}
        c.update(extra)
        return c

    def add_pod(self, key: str, uid: str = "", **extra: Any) -> tuple[int, dict[str, Any]]:
        ns_name, name = key.split("/")
        pns = new_namespace("pk31")
        self.made.append(pns)
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns_name};K8S_POD_NAME={name}" + (f";K8S_POD_UID={uid}"
                                                                                    if uid else "")
        out = run("routed", "ADD", self.conf(**extra), host=self.ns, netns=pns, cni_path=self.cni_path,
                  container_id=f"pk31-{name}", args=args)
        if out.exit_code == 0:
            res = ok(out)
            self.pods[key] = (pns, {4: res["ips"][0]["address"].split("/")[0]})
            return 0, res
        return out.exit_code, err(out)


@pytest.fixture
def node(plugin_dir: str, tmp_path: Any) -> Iterator[Node]:
    with EtcdCluster(size=1, subnet="10.231.133.0/24", prefix="pk31") as cluster:
        api = KubeAPI(cluster, bookmark_interval=0.5).start()
        n = Node(cluster, api, str(tmp_path), plugin_dir)
        try:
            assert cluster.underlay is not None
            n.spawn(cluster.underlay, "ctl", "kube-controllers", "--kubeconfig", n.kubeconfig, "--resync", "5",
                    "--gc-grace", "30", "--lease-ttl", "3")
            n.spawn(n.ns, "agent", "node", "--policy", "--node-name", cluster.nodes[0].name,
                    "--underlay-ip", cluster.nodes[0].ip, "--ttl", "30", "--flows-socket", "")
            deadline = time.monotonic() + 30
            while n.ns.run(["nft", "list", "table", "inet", workload.TABLE], check=False).returncode != 0:
                assert time.monotonic() < deadline, "the agent made no policy table\n" + n.logs()
                time.sleep(0.1)
            yield n
        finally:
            n.close()
            api.stop()


def _endpoint(node: Node, name: str) -> WorkloadEndpoint | None:
    with node.etcd.client(timeout=5) as e:
        kvs, _ = e.get_prefix(KEYS.endpoints)
    return next((ep for kv in kvs if (ep := WorkloadEndpoint.from_json(kv.value)) and ep.pod == name), None)


def test_first_packet_is_judged_with_the_api_labels(node: Node) -> None:
    api = node.api
    api.create(namespace("x"))
    api.create(DB_FROM_WEB)
    uids = {name: api.create(pod("x", name, {"app": app}, node="node1",
                                 ports=[("http", 80, "TCP")] if name == "db" else None))["metadata"]["uid"]
            for name, app in (("db", "db"), ("web", "web"), ("other", "other"))}
    code, _ = node.add_pod("x/db", uids["db"])
    assert code == 0, node.logs()
    ep = _endpoint(node, "db")
    assert ep is not None and ep.labels == {"app": "db"}, "the endpoint is born with the API's labels"
    assert ep.pod_uid == uids["db"]
    servers = EchoServers([node.pods["x/db"][0]], ports=(80,))
    try:
        for name in ("web", "other"):
            code, res = node.add_pod(f"x/{name}", uids[name])
            assert code == 0, res
            flows = [(f"x/{name}", "x/db", 80, "TCP"), (f"x/{name}", "x/db", 80, "UDP")]
            got = probe(node.pods, flows, retries=0)
            # at once, no retry: web reaches db's named port http (TCP 80) and nothing else; other nothing
            want = {flows[0]: name == "web", flows[1]: False}
            if got != want:  # say whether it was late or wrong
                again = probe(node.pods, flows, retries=2)
                rules = node.ns.run(["nft", "list", "table", "inet", workload.TABLE], check=False).stdout
                raise AssertionError(f"{name}: first packets {got}, a second later {again}\n{rules}\n{node.logs()}")
        # a label changed in the API reaches the dataplane
        api.patch("pods", "x", "other", {"metadata": {"labels": {"app": "web"}}})
        deadline = time.monotonic() + 15
        while not all(probe(node.pods, [("x/other", "x/db", 80, "TCP")], retries=0).values()):
            assert time.monotonic() < deadline, node.logs()
            time.sleep(0.1)
    finally:
        servers.close()
    with open(node.log_file) as f:
        text = f.read()
    assert "ADD pk31-web/eth0: 10.93." in text and "recorded with labels {'app': 'web'}" in text


def test_add_waits_for_the_mirror_then_times_out_cleanly(node: Node) -> None:
    api = node.api
    api.create(namespace("y"))
    # the pod object comes 0.7 s after the ADD starts: the ADD waits for it
    timer = threading.Timer(0.7, lambda: api.create(pod("y", "late", {"app": "late"}, node="node1")))
    start = time.monotonic()
    timer.start()
    try:
        code, res = node.add_pod("y/late")
    finally:
        timer.join()
    assert code == 0, res
    assert time.monotonic() - start >= 0.7
    ep = _endpoint(node, "late")
    assert ep is not None and ep.labels == {"app": "late"}
    # no pod in the API: code 11 past the timeout, and nothing left behind
    with node.etcd.client(timeout=5) as e:
        handles_before = len(e.get_prefix(KEYS.handles)[0])
    links_before = node.ns.run(["ip", "-o", "link"]).stdout.count("\n")
    code, res = node.add_pod("y/ghost", policySetupTimeout=1.5)
    assert code == 1 and res["code"] == 11 and "kube-controllers" in res["details"], res
    assert _endpoint(node, "ghost") is None
    with node.etcd.client(timeout=5) as e:
        assert len(e.get_prefix(KEYS.handles)[0]) == handles_before, "the address went back"
    assert node.ns.run(["ip", "-o", "link"]).stdout.count("\n") == links_before, "the host end went"


def test_go_key_rules_name_the_ipam_section() -> None:
    """A conflist spelling "IPAM" (Go's decoder matches keys case-insensitively) records endpoints."""
    conf = {"name": "n", "type": "routed",
            "IPAM": {"Type": "cluster-ipam", "etcdEndpoints": ["http://10.0.0.1:2379"], "nodeName": "a"}}
    cfg = workload.cluster_settings(conf)
    assert cfg is not None and cfg.node == "a" and cfg.network == "n"
    # Calico's top-level "nodename" names the node when ipam.nodeName does not
    conf2 = {"name": "n", "nodename": "calico-node-7",
             "ipam": {"type": "cluster-ipam", "etcdEndpoints": ["http://10.0.0.1:2379"]}}
    cfg2 = workload.cluster_settings(conf2)
    assert cfg2 is not None and cfg2.node == "calico-node-7"
    assert json.dumps(conf)  # (the conf is plain JSON, as a runtime sends it)
