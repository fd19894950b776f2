"""Kubernetes on three nodes with real traffic: the API stand-in, ``pycni kube-controllers``, a
3-member etcd, ``pycni node --policy`` on every node and routed + cluster-ipam pods across them.
Changes are made with kubectl where the machine has it (else through the API directly), and
every expectation is probed with real TCP packets between the nodes; a pod deleted without its
DEL has its address released."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from etcd_util import EtcdCluster, etcd_available
from kube_apiserver import KubeAPI, namespace, pod
from netns_util import Namespace, new_namespace
from plugin_util import cni_env, ok, run
from policy_probe import EchoServers, probe

from pycni.cluster.model import Keys
from pycni.cluster.policy.workload import TABLE

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")
pytest.importorskip("kubernetes")

PREFIX = "/pk31c"
KEYS = Keys(PREFIX)
SUBNET = "10.95.0.0/16"
KUBECTL = shutil.which("kubectl")
CONVERGE = 20.0

# db (ns "data", node1) admits only pods labelled role=client from namespaces labelled env=prod
DB_POLICY = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": "db", "namespace": "data"},
             "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                      "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                             "podSelector": {"matchLabels": {"role": "client"}}}]}]}}


class Cluster:
    def __init__(self, etcd: EtcdCluster, api: KubeAPI, tmp: str, cni_path: str) -> None:
        self.etcd, self.api, self.tmp, self.cni_path = etcd, api, tmp, cni_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pods: dict[str, tuple[Namespace, dict[int, str]]] = {}
        self.made: list[Namespace] = []
        self.kubeconfig = api.kubeconfig(os.path.join(tmp, "kubeconfig"))

    def spawn(self, where: Namespace, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(os.path.join(self.tmp, f"{name}.log"), "ab") as f:
            p = subprocess.Popen(["ip", "netns", "exec", where.name, sys.executable, "-m", "pycni", *args,
                                  "--etcd-endpoints", ",".join(self.etcd.endpoints), "--etcd-prefix", PREFIX],
                                 stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = p
        return p

    def controller(self) -> subprocess.Popen[bytes]:
        assert self.etcd.underlay is not None
        return self.spawn(self.etcd.underlay, "ctl", "kube-controllers", "--kubeconfig", self.kubeconfig,
                          "--resync", "3", "--gc-grace", "2", "--lease-ttl", "3")

    def logs(self) -> str:
        out = []
        for name in sorted(self.procs):
            with open(os.path.join(self.tmp, f"{name}.log")) as f:
                out.append(f"--- {name}\n{f.read()[-2500:]}")
        return "\n".join(out)

    def kubectl(self, *args: str, input: str | None = None) -> None:
        """kubectl against the stand-in where it is installed, else the same change through the API."""
        assert self.etcd.underlay is not None and KUBECTL is not None
        env = {"PATH": os.environ.get("PATH", ""), "HOME": self.tmp, "KUBECONFIG": self.kubeconfig}
        self.etcd.underlay.run([KUBECTL, *args], input=input, env=env)

    def label(self, resource: str, ns: str, name: str, labels: dict[str, str | None]) -> None:
        if KUBECTL is not None:
            changes = [f"{k}={v}" if v is not None else f"{k}-" for k, v in labels.items()]
            where = ["-n", ns] if ns else []
            self.kubectl("label", *where, "--overwrite", resource.rstrip("s"), name, *changes)
        else:
            self.api.patch(resource, ns, name, {"metadata": {"labels": labels}})

    def add(self, key: str, i: int) -> None:
        ns_name, name = key.split("/")
        pns = new_namespace("pk31")
        self.made.append(pns)
        conf = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "routed",
                "nodename": self.etcd.nodes[i].name, "policy": {"type": "k8s"},
                "kubernetes": {"kubeconfig": self.kubeconfig}, "policySetupTimeout": 20,
                "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.etcd.endpoints, "etcdPrefix": PREFIX,
                         "ranges": [[{"subnet": SUBNET}]], "lockDir": os.path.join(self.tmp, "locks")}}
        res = ok(run("routed", "ADD", conf, host=self.etcd.nodes[i].ns,
                     environ=cni_env("ADD", pns, self.cni_path, container_id=f"pk31-{ns_name}-{name}",
                                     args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns_name};K8S_POD_NAME={name}")))
        self.pods[key] = (pns, {4: res["ips"][0]["address"].split("/")[0]})

    def reaches(self, src: str, dst: str) -> bool:
        return all(probe(self.pods, [(src, dst, 80, "TCP")], window=0.5, retries=1).values())

    def until(self, what: str, cond: Any, timeout: float = CONVERGE) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out: {what}\n{self.logs()}")
            time.sleep(0.1)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for ns in self.made:
            ns.delete()


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
