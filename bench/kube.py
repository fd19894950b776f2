"""Kubernetes as the source of truth, measured: the API stand-in, ``pycni kube-controllers``,
three nodes with ``pycni node --policy`` and real routed + cluster-ipam pods.

    .venv/bin/python bench/kube.py [--trials 20] [--pods 1000] [--policies 200] [--adds 20]

Everything runs in throwaway namespaces (tests/etcd_util.py, tests/kube_apiserver.py).

(A) An API change enforced on every node: namespace x has a client pod on each of the three
    nodes and a policy admitting egress only to namespaces, or pods, labelled ``open=yes``; the
    target pod is in namespace y on node1. Each trial makes one change through the API — label
    namespace y, label the target pod, or create a policy allowing all of x's egress — and times,
    per node, the first TCP handshake from that node's client to the target (probed every ~20 ms);
    a trial's time is the slowest node's. Then the change is undone and every client denied again
    (not timed). p50/p99 over ``--trials`` of each kind.
(B) The controller at scale: ``--pods`` pods (labels, two named ports each) and ``--policies``
    NetworkPolicies created in the API, then the controller started: the time until etcd holds
    all of them, its CPU seconds and peak RSS for that, then CPU per API change over 100 label
    changes, and its RSS after.
(C) routed's ADD with ``"kubernetes"`` (the wait for the mirrored labels, which are there) against
    the same ADD without it: p50 of ``--adds`` ADD+DEL cycles each, on node1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

from etcd_util import EtcdCluster  # noqa: E402
from kube_apiserver import KubeAPI, namespace, pod  # noqa: E402
from kube_cluster import Cluster  # noqa: E402
from netns_util import new_namespace  # noqa: E402
from plugin_util import ok, run  # noqa: E402
from policy_probe import EchoServers, probe  # noqa: E402

from pycni.cluster.model import Keys  # noqa: E402
from pycni.cluster.policy.workload import TABLE  # noqa: E402

PREFIX = "/pk31-bench"
KEYS = Keys(PREFIX)
SUBNET = "10.94.0.0/16"


def log(msg: str) -> None:
    sys.stderr.write(f"[kube bench {time.strftime('%H:%M:%S')}] {msg}\n")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_mem(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) // 1024
    return out["VmRSS"], out["VmHWM"]


class Bench(Cluster):
    """The bench's cluster: :class:`kube_cluster.Cluster` under its own prefix, a controller that
    resyncs rarely, and adds timed."""

    def __init__(self, cluster: EtcdCluster, api: KubeAPI, tmp: str, cni_path: str) -> None:
        super().__init__(cluster, api, tmp, cni_path, prefix=PREFIX)

    def controller(self, *extra: str) -> subprocess.Popen[bytes]:
        assert self.etcd.underlay is not None
        return self.spawn(self.etcd.underlay, "ctl", "kube-controllers", "--kubeconfig", self.kubeconfig,
                          "--resync", "300", "--gc-grace", "300", "--log-level", "warning", *extra)

    def agents(self) -> None:
        for n in self.etcd.nodes:
            self.spawn(n.ns, f"agent-{n.name}", "node", "--policy", "--node-name", n.name, "--underlay-ip", n.ip,
                       "--ttl", "30")
        for n in self.etcd.nodes:
            deadline = time.monotonic() + 60
            while n.ns.run(["nft", "list", "table", "inet", TABLE], check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agent on {n.name} made no table")
                time.sleep(0.1)

    def conf(self, i: int, kube: bool = True) -> dict[str, Any]:
        c: dict[str, Any] = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "routed",
                             "nodename": self.etcd.nodes[i].name, "policySetupTimeout": 30,
                             "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.etcd.endpoints,
                                      "etcdPrefix": PREFIX, "ranges": [[{"subnet": SUBNET}]],
                                      "lockDir": os.path.join(self.tmp, "locks")}}
        if kube:
            c["kubernetes"] = {"kubeconfig": "/unused"}
        return c

    def add_timed(self, key: str, i: int, kube: bool = True, cid: str = "") -> float:
        ns_name, name = key.split("/")
        pns = new_namespace("pk31")
        self.made.append(pns)
        cid = cid or f"pk31-{ns_name}-{name}"
        t0 = time.perf_counter()
        res = ok(run("routed", "ADD", self.conf(i, kube), host=self.etcd.nodes[i].ns, netns=pns,
                     cni_path=self.cni_path, container_id=cid,
                     args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns_name};K8S_POD_NAME={name}"))
        took = time.perf_counter() - t0
        self.pods[key] = (pns, {4: res["ips"][0]["address"].split("/")[0]})
        return took

    def delete(self, key: str, i: int, kube: bool = True, cid: str = "") -> None:
        pns, _ = self.pods.pop(key)
        ns_name, name = key.split("/")
        ok(run("routed", "DEL", self.conf(i, kube), host=self.etcd.nodes[i].ns, netns=pns, cni_path=self.cni_path,
               container_id=cid or f"pk31-{ns_name}-{name}"))


ALLOW_ALL = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": "allow-all", "namespace": "x"},
             "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}}
# one API change of each kind that opens x's egress to the target, and its undoing
CHANGES: dict[str, tuple[Any, Any]] = {
    "namespace label": (lambda api: api.patch("namespaces", "", "y", {"metadata": {"labels": {"open": "yes"}}}),
                        lambda api: api.patch("namespaces", "", "y", {"metadata": {"labels": {"open": None}}})),
    "pod label": (lambda api: api.patch("pods", "y", "target", {"metadata": {"labels": {"open": "yes"}}}),
                  lambda api: api.patch("pods", "y", "target", {"metadata": {"labels": {"open": None}}})),
    "policy": (lambda api: api.create(ALLOW_ALL), lambda api: api.delete("networkpolicies", "x", "allow-all")),
}


def enforcement(b: Bench, trials: int) -> dict[str, list[float]]:
    api = b.api
    api.create(namespace("x"))
    api.create(namespace("y"))
    api.create({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "egress-to-open", "namespace": "x"},
                "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                         "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"open": "yes"}}},
                                            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"open": "yes"}}}
                                            ]}]}})
    api.create(pod("y", "target", {"app": "target"}))
    clients = [f"x/c{i}" for i in range(3)]
    for key in clients:
        api.create(pod("x", key.split("/")[1], {"app": "client"}))
    b.add_timed("y/target", 0)
    for i, key in enumerate(clients):
        b.add_timed(key, i)
    servers = EchoServers([b.pods["y/target"][0]], ports=(80,))
    times: dict[str, list[float]] = {k: [] for k in CHANGES}
    try:
        flows = {key: (key, "y/target", 80, "TCP") for key in clients}
        for t in range(trials * len(CHANGES)):
            kind = list(CHANGES)[t % len(CHANGES)]
            do, undo = CHANGES[kind]
            deadline = time.monotonic() + 30  # every client denied first (the policy holds)
            while any(probe(b.pods, list(flows.values()), window=0.1, retries=0).values()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"trial {t}: the policy does not deny")
                time.sleep(0.05)
            time.sleep(0.2)
            t0 = time.perf_counter()
            do(api)
            done: dict[str, float] = {}
            while len(done) < 3:
                got = probe(b.pods, [f for k, f in flows.items() if k not in done], window=0.02, retries=0)
                now = time.perf_counter() - t0
                for flow, passed in got.items():
                    if passed:
                        done[flow[0]] = now
                if now > 30:
                    raise RuntimeError(f"trial {t} ({kind}): not enforced within 30 s: {done}")
            times[kind].append(max(done.values()))
            undo(api)
    finally:
        servers.close()
    return times


def controller_scale(b: Bench, pods: int, policies: int) -> dict[str, float]:
    api = b.api
    with b.etcd.client(timeout=30) as e:
        e.delete_prefix(f"{PREFIX}/")
    for n in range(20):
        api.create(namespace(f"s{n}", {"team": f"t{n % 5}"}))
    for i in range(pods):
        api.create(pod(f"s{i % 20}", f"p{i}", {"app": f"a{i % 50}", "tier": f"t{i % 3}"},
                       ports=[("http", 8080, "TCP"), ("metrics", 9090, "TCP")]))
    for i in range(policies):
        api.create({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                    "metadata": {"name": f"np{i}", "namespace": f"s{i % 20}"},
                    "spec": {"podSelector": {"matchLabels": {"app": f"a{i % 50}"}},
                             "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": f"t{i % 3}"}}}],
                                          "ports": [{"port": "http"}]}]}})
    log(f"created {pods} pods and {policies} policies in the API")
    t0 = time.perf_counter()
    ctl = b.controller()
    with b.etcd.client(timeout=30) as e:
        while True:
            np_ = len(e.range(KEYS.pods, prefix=True, keys_only=True)[0])
            npol = len(e.range(KEYS.policies, prefix=True, keys_only=True)[0])
            if np_ >= pods and npol >= policies:
                break
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"mirror incomplete: {np_} pods, {npol} policies")
            time.sleep(0.1)
    out = {"initial sync (s)": time.perf_counter() - t0, "initial sync CPU (s)": proc_cpu(ctl.pid)}
    out["peak RSS after sync (MB)"] = proc_mem(ctl.pid)[1]
    cpu0 = proc_cpu(ctl.pid)
    with b.etcd.client(timeout=30) as e:
        for i in range(100):
            api.patch("pods", f"s{i % 20}", f"p{i}", {"metadata": {"labels": {"bench": str(i)}}})
        last = KEYS.pod(f"s{99 % 20}", "p99")
        while '"bench":"99"' not in ((e.get(last) or type("x", (), {"value": ""})).value):
            time.sleep(0.05)
    time.sleep(1.0)
    out["CPU per API change (ms)"] = (proc_cpu(ctl.pid) - cpu0) / 100 * 1000
    out["RSS after (MB)"], out["peak RSS (MB)"] = proc_mem(ctl.pid)
    ctl.kill()
    ctl.wait()
    return out


def add_latency(b: Bench, adds: int) -> dict[str, float]:
    b.api.create(namespace("lat"))
    b.api.create(pod("lat", "p", {"app": "lat"}))
    with b.etcd.client(timeout=10) as e:
        while e.get(KEYS.pod("lat", "p")) is None:
            time.sleep(0.05)
    out = {}
    for kube in (False, True, False, True):
        samples = []
        for n in range(adds):
            cid = f"pk31-lat-{int(kube)}-{n}"
            samples.append(b.add_timed("lat/p", 0, kube, cid))
            b.delete("lat/p", 0, kube, cid)
        out[f"ADD p50 {'with' if kube else 'without'} kubernetes (ms)"] = statistics.median(samples) * 1000
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--policies", type=int, default=200)
    ap.add_argument("--adds", type=int, default=20)
    ap.add_argument("--only", choices=("A", "B", "C"), action="append")
    opts = ap.parse_args()
    only = set(opts.only or ("A", "B", "C"))
    from pycni.install_plugins import install

    with tempfile.TemporaryDirectory(prefix="pk31-bench-") as tmp, \
            EtcdCluster(size=3, subnet="10.231.134.0/24", prefix="pk31") as cluster:
        cni = os.path.join(tmp, "bin")
        os.makedirs(cni)
        install(cni)
        api = KubeAPI(cluster, bookmark_interval=5.0).start()
        b = Bench(cluster, api, tmp, cni)
        try:
            if "A" in only or "C" in only:
                b.controller()
                b.agents()
            if "A" in only:
                for kind, times in enforcement(b, opts.trials).items():
                    print(f"(A) {kind} -> enforced on 3 nodes: p50 {pct(times, 0.5) * 1000:.0f} ms, "
                          f"p99 {pct(times, 0.99) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
                          f"({len(times)} trials; load {os.getloadavg()[0]:.1f})")
            if "C" in only:
                for k, v in add_latency(b, opts.adds).items():
                    print(f"(C) {k}: {v:.1f}")
            if "B" in only:
                for p in b.procs.values():
                    p.kill()
                    p.wait()
                b.procs.clear()
                for k, v in controller_scale(b, opts.pods, opts.policies).items():
                    print(f"(B) {opts.pods} pods, {opts.policies} policies: {k}: {v:.1f}")
        finally:
            b.close()
            api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
