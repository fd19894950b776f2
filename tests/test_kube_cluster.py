"""Kubernetes on three nodes with real traffic: the API stand-in, ``pycni kube-controllers``, a
3-member etcd, ``pycni node --policy`` on every node and routed + cluster-ipam pods across them.
Changes are made with kubectl where the machine has it (else through the API directly), and
every expectation is probed with real TCP packets between the nodes; a pod deleted without its
DEL has its address released."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_util import EtcdCluster, etcd_available
from kube_apiserver import KubeAPI, namespace, pod
from kube_cluster import KUBECTL, PREFIX, Cluster
from policy_probe import EchoServers, probe

from pycni.cluster.model import Keys
from pycni.cluster.policy.workload import TABLE

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")
pytest.importorskip("kubernetes")

KEYS = Keys(PREFIX)

# db (ns "data", node1) admits only pods labelled role=client from namespaces labelled env=prod
DB_POLICY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": "db", "namespace": "data"},
             "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                      "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                             "podSelector": {"matchLabels": {"role": "client"}}}]}]}}


@pytest.fixture
def cluster(plugin_dir: str, tmp_path: Any) -> Iterator[Cluster]:
    with EtcdCluster(size=3, subnet="10.231.135.0/24", prefix="pk31") as etcd:
        api = KubeAPI(etcd, bookmark_interval=1.0).start()
        c = Cluster(etcd, api, str(tmp_path), plugin_dir)
        try:
            c.controller()
            for n in etcd.nodes:
                c.spawn(n.ns, f"agent-{n.name}", "node", "--policy", "--node-name", n.name, "--underlay-ip", n.ip,
                        "--ttl", "30")
            for n in etcd.nodes:
                c.until(f"{n.name}'s policy table",
                        lambda n=n: n.ns.run(["nft", "list", "table", "inet", TABLE], check=False).returncode == 0,
                        timeout=60)
            yield c
        finally:
            c.close()
            api.stop()


def test_api_changes_reach_every_node(cluster: Cluster) -> None:
    api = cluster.api
    api.create(namespace("data"))
    api.create(namespace("front", {"env": "prod"}))
    api.create(namespace("lab", {"env": "dev"}))
    if KUBECTL is not None:
        cluster.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(DB_POLICY))
    else:
        api.create(DB_POLICY)
    api.create(pod("data", "db", {"app": "db"}, node="node1"))
    for key, labels, node in (("front/a", {"role": "client"}, 1), ("front/b", {"role": "other"}, 2),
                              ("lab/c", {"role": "client"}, 2)):
        api.create(pod(*key.split("/"), labels, node=f"node{node + 1}"))
    cluster.add("data/db", 0)
    servers = EchoServers([cluster.pods["data/db"][0]], ports=(80,))
    try:
        # the first packets, right after each ADD: admitted by label through at once, excluded never
        cluster.add("front/a", 1)
        assert all(probe(cluster.pods, [("front/a", "data/db", 80, "TCP")], retries=0).values()), cluster.logs()
        cluster.add("front/b", 2)
        cluster.add("lab/c", 2)
        got = probe(cluster.pods, [("front/b", "data/db", 80, "TCP"), ("lab/c", "data/db", 80, "TCP")], window=1.0)
        assert not any(got.values()), got
        # a pod label (kubectl label) reaches node1's dataplane for a pod on node3
        cluster.label("pods", "front", "b", {"role": "client"})
        cluster.until("front/b admitted", lambda: cluster.reaches("front/b", "data/db"))
        # a namespace label
        cluster.label("namespaces", "", "lab", {"env": "prod"})
        cluster.until("lab/c admitted", lambda: cluster.reaches("lab/c", "data/db"))
        cluster.label("namespaces", "", "front", {"env": "dev"})
        cluster.until("front/a denied again", lambda: not cluster.reaches("front/a", "data/db"))
        # the controller SIGKILLed while labels change; its successor applies what it missed
        cluster.procs["ctl"].send_signal(signal.SIGKILL)
        cluster.procs["ctl"].wait()
        cluster.label("namespaces", "", "front", {"env": "prod"})
        api.delete("networkpolicies", "data", "db")
        time.sleep(1.0)
        assert not cluster.reaches("front/a", "data/db"), "nothing changes without the mirror"
        cluster.controller()
        cluster.until("the policy gone after the restart: everyone admitted",
                      lambda: cluster.reaches("front/a", "data/db") and cluster.reaches("front/b", "data/db"))
        with cluster.etcd.client(timeout=5) as e:
            assert e.get(KEYS.policy("data", "db")) is None
        # lab/c deleted from the API and its DEL never comes: its address is released after the grace
        # period; front/b's, whose pod exists, stays
        api.delete("pods", "lab", "c")

        def handles() -> set[str]:
            with cluster.etcd.client(timeout=5) as e:
                return {kv.key.rsplit("/", 2)[1] for kv in e.get_prefix(KEYS.handles)[0]}

        cluster.until("lab/c's address released", lambda: "pk31-lab-c" not in handles())
        assert {"pk31-front-a", "pk31-front-b", "pk31-data-db"} <= handles()
        with cluster.etcd.client(timeout=5) as e:
            assert not [kv for kv in e.get_prefix(KEYS.endpoints)[0] if "pk31-lab-c" in kv.key]
    finally:
        servers.close()
