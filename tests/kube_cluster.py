"""Kubernetes on several nodes for tests: the API stand-in (tests/kube_apiserver.py), a real etcd
cluster whose members' namespaces play the nodes, ``pycni kube-controllers`` in the underlay
namespace, ``pycni node`` agents, and routed + cluster-ipam pods added as kubelet would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

from etcd_util import EtcdCluster
from kube_apiserver import KubeAPI
from netns_util import Namespace, new_namespace
from plugin_util import ok, run
from policy_probe import probe

PREFIX = "/pk31c"
SUBNET = "10.95.0.0/16"
KUBECTL = shutil.which("kubectl")
CONVERGE = 20.0


class Cluster:
    """The processes and pods of one test or bench run (``prefix``: its etcd prefix); :meth:`close`
    ends the processes and deletes the pods' namespaces."""

    def __init__(self, etcd: EtcdCluster, api: KubeAPI, tmp: str, cni_path: str, prefix: str = PREFIX) -> None:
        self.etcd, self.api, self.tmp, self.cni_path, self.prefix = etcd, api, tmp, cni_path, prefix
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pods: dict[str, tuple[Namespace, dict[int, str]]] = {}
        self.made: list[Namespace] = []
        self.kubeconfig = api.kubeconfig(os.path.join(tmp, "kubeconfig"))

    def spawn(self, where: Namespace, name: str, *args: str) -> subprocess.Popen[bytes]:
        if args[:1] == ("node",) and "--flows-socket" not in args:  # (never the machine's /run/pycni)
            args = (*args, "--flows-socket", os.path.join(self.tmp, f"{name}-flows.sock"))
        with open(os.path.join(self.tmp, f"{name}.log"), "ab") as f:
            p = subprocess.Popen(["ip", "netns", "exec", where.name, sys.executable, "-m", "pycni", *args,
                                  "--etcd-endpoints", ",".join(self.etcd.endpoints), "--etcd-prefix", self.prefix],
                                 stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = p
        return p

    def controller(self, *extra: str) -> subprocess.Popen[bytes]:
        assert self.etcd.underlay is not None
        return self.spawn(self.etcd.underlay, "ctl", "kube-controllers", "--kubeconfig", self.kubeconfig,
                          "--resync", "3", "--gc-grace", "2", "--lease-ttl", "3", *extra)

    def logs(self, *more: str) -> str:
        """The tail of each process's log (and of the files ``more`` names in the run's directory)."""
        out = []
        for name in [*(f"{n}.log" for n in sorted(self.procs)), *more]:
            path = os.path.join(self.tmp, name)
            if os.path.exists(path):
                with open(path) as f:
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
                "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.etcd.endpoints, "etcdPrefix": self.prefix,
                         "ranges": [[{"subnet": SUBNET}]], "lockDir": os.path.join(self.tmp, "locks")}}
        res = ok(run("routed", "ADD", conf, host=self.etcd.nodes[i].ns, netns=pns, cni_path=self.cni_path,
                     container_id=f"pk31-{ns_name}-{name}",
                     args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns_name};K8S_POD_NAME={name}"))
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
