"""A real Prometheus scraping every component of a two-node Kubernetes-style cluster: both
nodes' ``pycni node`` agents, ``pycni kube-controllers`` and a ``pycni daemon`` — each with
``--metrics-address`` — and queries whose answers move as pods are added and policies applied.

The API server is the stand-in of tests/kube_apiserver.py (no real kube-apiserver can run here);
etcd, the agents, the controller, the daemon, Prometheus and the pods are real, in throwaway
namespaces: Prometheus runs in the underlay namespace, which reaches every node's address.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_proc import DaemonProc, needs_privileges, request
from etcd_util import EtcdCluster, etcd_available
from kube_apiserver import KubeAPI, namespace, pod
from kube_cluster import Cluster
from plugin_util import env
from prom_util import Prometheus, query, wait_above, wait_value

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")
pytest.importorskip("kubernetes")

AGENT_PORT, CONTROLLER_PORT, DAEMON_PORT = 9464, 9465, 9466
POLICY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": "db", "namespace": "data"},
          "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": []}}


@pytest.fixture
def cluster(plugin_dir: str, tmp_path: Path) -> Iterator[Cluster]:
    with EtcdCluster(size=2, subnet="10.231.136.0/24", prefix="pm36") as etcd:
        api = KubeAPI(etcd, bookmark_interval=1.0).start()
        c = Cluster(etcd, api, str(tmp_path), plugin_dir)
        try:
            assert etcd.underlay is not None
            c.controller("--metrics-address", f"127.0.0.1:{CONTROLLER_PORT}")
            for n in etcd.nodes:
                c.spawn(n.ns, f"agent-{n.name}", "node", "--node-name", n.name, "--underlay-ip", n.ip, "--ttl", "30",
                        "--metrics-address", f"{n.ip}:{AGENT_PORT}")
            yield c
        finally:
            c.close()
            api.stop()


@needs_privileges
def test_prometheus_scrapes_agents_controller_and_daemon(cluster: Cluster, tmp_path: Path) -> None:
    etcd = cluster.etcd
    ul = etcd.underlay
    assert ul is not None
    sock = str(tmp_path / "pycni.sock")
    daemon = DaemonProc(sock, tmp_path / "daemon.log", "--workers", "1",
                        "--metrics-address", f"{etcd.nodes[0].ip}:{DAEMON_PORT}",
                        prefix=["ip", "netns", "exec", etcd.nodes[0].ns.name])
    prom = None
    try:
        daemon.ready()
        targets = [f"{n.ip}:{AGENT_PORT}" for n in etcd.nodes] + [f"127.0.0.1:{CONTROLLER_PORT}",
                                                                  f"{etcd.nodes[0].ip}:{DAEMON_PORT}"]
        prom = Prometheus(ul, tmp_path / "prom", targets)
        wait_value(ul, "sum(up)", len(targets))
        wait_value(ul, "sum(pycni_nodes)", 4)  # each agent sees both nodes
        wait_value(ul, "pycni_kube_leader", 1)

        # pods added: the cluster's addresses in use move on every agent, each node's endpoints on its own
        api = cluster.api
        api.create(namespace("data"))
        api.create(pod("data", "db", {"app": "db"}, node="node1"))
        api.create(pod("data", "web", {"app": "web"}, node="node2"))
        cluster.add("data/db", 0)
        wait_value(ul, "max(pycni_ipam_addresses_in_use)", 1)
        cluster.add("data/web", 1)
        wait_value(ul, "min(pycni_ipam_addresses_in_use)", 2)
        wait_value(ul, "sum(pycni_endpoints)", 2)
        wait_value(ul, f'pycni_endpoints{{instance="{etcd.nodes[1].ip}:{AGENT_PORT}"}}', 1)
        assert (query(ul, "min(pycni_ipam_addresses_free)") or 0) > 0
        wait_value(ul, "count(count by (pool, node) (pycni_ipam_blocks))", 2)  # a block per node

        # a policy applied in the API: the controller's cache and writes move
        writes = query(ul, "pycni_kube_record_writes_total") or 0
        wait_value(ul, 'pycni_kube_objects{kind="NetworkPolicy"}', 0)
        api.create(POLICY)
        wait_value(ul, 'pycni_kube_objects{kind="NetworkPolicy"}', 1)
        wait_above(ul, "pycni_kube_record_writes_total", writes)

        # etcd requests by verb and outcome, from every component that talks to etcd
        assert (query(ul, 'sum(pycni_etcd_requests_total{outcome="success"})') or 0) > 0
        assert (query(ul, 'count(count by (instance) (pycni_etcd_requests_total))') or 0) == 3
        assert (query(ul, "sum(pycni_agent_resyncs_total)") or 0) >= 2

        # a plugin call served by the daemon
        with etcd.nodes[0].ns.enter():
            code, _out, _err = request(sock, "static", env("ADD", netns="/var/run/netns/none", container_id="c1"),
                                       json.dumps({"cniVersion": "1.0.0", "name": "m", "type": "static",
                                                   "ipam": {"type": "static",
                                                            "addresses": [{"address": "10.9.0.5/24"}]}}).encode())
        assert code == 0
        wait_value(ul, 'sum(pycni_daemon_plugin_calls_total{result="success"})', 1)
    finally:
        if prom is not None:
            prom.stop()
        daemon.reap()

