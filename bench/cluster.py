"""cluster-ipam on a real 3-member etcd, against host-local (ours and Go's), in one run.

    .venv/bin/python bench/cluster.py [--rounds 9] [--parallel 64] [--allocations 10000]

Everything runs in throwaway namespaces: three "node" namespaces on an underlay bridge, one
etcd member in each (tests/etcd_util.py, data on tmpfs), pods as fresh namespaces with a
macvlan link on the node's underlay interface. Plugins are executed directly (the same driver
for every variant) from inside node1's namespace. Cases:

(A) macvlan ADD+DEL cycle with each IPAM: Go macvlan + Go host-local; ours one-shot with
    host-local and with cluster-ipam; ours through a ``pycni daemon`` with each; and (A') the
    IPAM executable alone, one-shot. Variants alternate within a round, the first round is
    discarded, medians are reported.
    Target: cluster-ipam cycle <= 1.3x ours with host-local (one-shot and daemon).
(B) 3 nodes x N parallel macvlan+cluster-ipam ADDs (one-shot, then daemon): wall time and
    the p99 of single ADD latencies; then duplicates (must be 0) and, after DEL of all,
    leaked handles/allocations (must be 0).
(C) 10,000 allocations in a /16 from 3 nodes at once (in-process store, 4 threads per node
    taking turns on the node lock as the plugin does):
    wall, rate, lost races; a one-shot ADD's latency with the /16 that full, against empty;
    duplicates and, after releasing everything, leaks.
(D) Growth: 10,000 allocations from 50 node names; the one-shot cluster-ipam ADD (the IPAM
    executable alone, median of 15) measured with 0, 5,000 and 10,000 addresses taken, with the
    keys under the prefix and etcd's db size at each point. Target: 10,000th / 1st <= 1.0.
(E) Route convergence, host-gw and vxlan: three ``pycni node`` agents, ``routed`` pods; for each
    new pod (a requested address: a new block, a block with room, or the one free address of a
    tiny pool moving between nodes — a reused address), probes on all three nodes ping it every
    2 ms from before its ADD; convergence = first reply - ADD returned. p50 / p99 / max.
    Targets: p99 <= 25 ms, max <= 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

from etcd_util import EtcdCluster, EtcdNode  # noqa: E402
from netns_util import Namespace, new_namespace  # noqa: E402

from pycni.cluster.ipam import ClusterStore  # noqa: E402
from pycni.install_plugins import install  # noqa: E402
from pycni.ipranges import parse_range_set  # noqa: E402
from pycni.lockfile import flocked  # noqa: E402
from pycni.net import netns  # noqa: E402

GO = "/usr/lib/cni"
Row = tuple[str, float, str]  # case, value, unit: "s" seconds, "x" ratio, "n" a count or rate
PATH_ENV = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
NS_PREFIX = "pycni-bc"  # of every namespace the bench makes (--ns-prefix: two benches side by side)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, cluster: EtcdCluster, tmp: str) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.shims = os.path.join(tmp, "bin")
        install(self.shims, daemon=True)
        self.socket = os.path.join(tmp, "pycni.sock")
        self.daemon_ns = new_namespace(NS_PREFIX)
        self.daemon = subprocess.Popen(["ip", "netns", "exec", self.daemon_ns.name, sys.executable, "-m",
                                        "pycni.daemon", "--socket", self.socket, "--log-file",
                                        os.path.join(tmp, "daemon.log")],
                                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")))
        for _ in range(600):
            if os.path.exists(self.socket):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("pycni daemon did not start")

    def close(self) -> None:
        self.daemon.terminate()
        try:
            self.daemon.wait(20)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait()
        self.daemon_ns.delete()

    def conf(self, network: str, node: EtcdNode, ipam: str, subnet: str) -> dict[str, Any]:
        if ipam == "cluster-ipam":
            section: dict[str, Any] = {"type": "cluster-ipam", "etcdEndpoints": self.cluster.endpoints,
                                       "nodeName": node.name, "ranges": [[{"subnet": subnet}]],
                                       "lockDir": os.path.join(self.tmp, "locks")}
        else:
            section = {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                       "dataDir": os.path.join(self.tmp, "host-local", node.name)}
        return {"cniVersion": "1.0.0", "name": network, "type": "macvlan", "master": node.ifname, "mode": "bridge",
                "ipam": section}

    def call(self, variant: str, node: EtcdNode, command: str, conf: dict[str, Any], cid: str,
             pod: Namespace) -> tuple[float, dict[str, Any]]:
        """One plugin invocation from inside ``node`` (timed without any ``ip netns exec``)."""
        go = variant == "go"
        env = {"PATH": PATH_ENV, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": pod.path,
               "CNI_IFNAME": "eth0", "CNI_PATH": GO if go else self.shims,
               "PYCNI_SOCKET": self.socket if variant == "daemon" else "off"}
        # "ipam": the IPAM plugin alone, one-shot (what the main plugin execs for it)
        exe = os.path.join(GO if go else self.shims, conf["ipam"]["type"] if variant == "ipam" else "macvlan")
        with netns.enter(node.ns.path):
            t = time.perf_counter()
            proc = subprocess.run([exe], input=json.dumps(conf).encode(), env=env, capture_output=True)
            elapsed = time.perf_counter() - t
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} {command} {cid}: {proc.stdout!r} {proc.stderr!r}")
        return elapsed, (json.loads(proc.stdout) if proc.stdout.strip() else {})


def store(cluster: EtcdCluster, network: str, node: str) -> ClusterStore:
    return ClusterStore(cluster.client(timeout=30), network, node)


def leaks(cluster: EtcdCluster, network: str) -> int:
    s = store(cluster, network, "node1")
    return len(s.handles()) + sum(len(b.allocations) for b in s.blocks())


# ---- (A) -------------------------------------------------------------------------------------------

def case_cycle(b: Bench, rounds: int) -> list[Row]:
    node = b.cluster.nodes[0]
    variants = [("go", "host-local"), ("oneshot", "host-local"), ("oneshot", "cluster-ipam"),
                ("daemon", "host-local"), ("daemon", "cluster-ipam"), ("ipam", "host-local"),
                ("ipam", "cluster-ipam")]
    confs = {v: b.conf(f"cyc{i}", node, v[1], f"10.{100 + i}.0.0/16") for i, v in enumerate(variants)}
    times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    for r in range(rounds + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            pod = new_namespace(NS_PREFIX)
            try:
                t_add, _ = b.call(v[0], node, "ADD", confs[v], f"cyc{r}", pod)
                t_del, _ = b.call(v[0], node, "DEL", confs[v], f"cyc{r}", pod)
            finally:
                pod.delete()
            if r:
                times[v].append(t_add + t_del)
    med = {v: statistics.median(xs) for v, xs in times.items()}
    out: list[Row] = [(f"(A) macvlan+{ipam} ADD+DEL, {'Go' if var == 'go' else 'ours ' + var}", med[(var, ipam)],
                       "s") for var, ipam in variants if var != "ipam"]
    out += [(f"(A') {ipam} alone, one-shot ADD+DEL", med[("ipam", ipam)], "s") for ipam in ("host-local",
                                                                                          "cluster-ipam")]
    for var in ("oneshot", "daemon"):
        out.append((f"(A) ratio cluster-ipam / host-local, ours {var} (target <= 1.3)",
                    med[(var, "cluster-ipam")] / med[(var, "host-local")], "x"))
    return out


# ---- (B) -------------------------------------------------------------------------------------------

def case_parallel(b: Bench, per_node: int, variant: str) -> list[Row]:
    network = f"par{variant}"
    subnet = "10.110.0.0/16" if variant == "oneshot" else "10.111.0.0/16"
    jobs = [(n, i) for n in range(3) for i in range(per_node)]
    pods = {j: new_namespace(NS_PREFIX) for j in jobs}
    try:
        def add(j: tuple[int, int]) -> tuple[float, str]:
            node = b.cluster.nodes[j[0]]
            t, res = b.call(variant, node, "ADD", b.conf(network, node, "cluster-ipam", subnet), f"p{j[0]}-{j[1]}",
                            pods[j])
            return t, res["ips"][0]["address"]

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(add, jobs))
        wall = time.perf_counter() - start
        lat = sorted(t for t, _ in results)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        dups = len(results) - len({ip for _, ip in results})

        def delete(j: tuple[int, int]) -> float:
            node = b.cluster.nodes[j[0]]
            return b.call(variant, node, "DEL", b.conf(network, node, "cluster-ipam", subnet), f"p{j[0]}-{j[1]}",
                          pods[j])[0]

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            list(pool.map(delete, jobs))
        leaked = leaks(b.cluster, network)
    finally:
        for pod in pods.values():
            pod.delete()
    tag = f"(B) 3 nodes x {per_node} parallel ADDs, ours {variant}"
    return [(f"{tag}: wall", wall, "s"), (f"{tag}: p99 ADD", p99, "s"), (f"{tag}: duplicates", dups, "n"),
            (f"{tag}: leaked after DEL", leaked, "n")]


# ---- (C) -------------------------------------------------------------------------------------------

def case_many(b: Bench, total: int) -> list[Row]:
    network = "many"
    subnet = "10.120.0.0/16"
    rs = [parse_range_set([{"subnet": subnet}])]
    counts = [total // 12 + (1 if t < total % 12 else 0) for t in range(12)]
    lost = []

    def worker(node: int, k: int) -> list[str]:
        s = store(b.cluster, network, f"node{node + 1}")
        lock = os.path.join(b.tmp, "locks", f"{network}.node{node + 1}.lock")  # the plugin's node lock
        out = []
        for i in range(counts[node * 4 + k]):
            with flocked(lock, create=True):
                got = s.assign(f"m{node}-{k}-{i}", "eth0", rs, [])
            out.append(str(got[0].ip))
        lost.append(s.lost_races)
        s.kv.close()
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=12) as pool:
        futs = [pool.submit(worker, n, k) for n in range(3) for k in range(4)]
        ips = [ip for f in futs for ip in f.result()]
    wall = time.perf_counter() - start
    dups = len(ips) - len(set(ips))
    # a one-shot ADD+DEL with the /16 that full (node2 has blocks with room left or claims a new one)
    node = b.cluster.nodes[1]
    conf = b.conf(network, node, "cluster-ipam", subnet)
    samples = []
    for r in range(5):
        pod = new_namespace(NS_PREFIX)
        try:
            samples.append(b.call("oneshot", node, "ADD", conf, f"late{r}", pod)[0])
            b.call("oneshot", node, "DEL", conf, f"late{r}", pod)
        finally:
            pod.delete()
    full_add = statistics.median(samples)
    # release everything, in parallel per node
    def release(node: int, k: int) -> None:
        s = store(b.cluster, network, f"node{node + 1}")
        lock = os.path.join(b.tmp, "locks", f"{network}.node{node + 1}.lock")
        for i in range(counts[node * 4 + k]):
            with flocked(lock, create=True):
                s.release(f"m{node}-{k}-{i}", "eth0")
        s.kv.close()

    with ThreadPoolExecutor(max_workers=12) as pool:
        for f in [pool.submit(release, n, k) for n in range(3) for k in range(4)]:
            f.result()
    leaked = leaks(b.cluster, network)
    n = total
    return [(f"(C) {n} allocations in a /16, 3 nodes x 4 threads: wall", wall, "s"),
            ("(C) allocations per second", n / wall, "n"), ("(C) lost races retried", sum(lost), "n"),
            (f"(C) one-shot macvlan+cluster-ipam ADD with {n} taken", full_add, "s"), ("(C) duplicates", dups, "n"),
            ("(C) leaked after release", leaked, "n")]


# ---- (D) -------------------------------------------------------------------------------------------

def _db(b: Bench, prefix: str) -> tuple[int, int]:
    """(keys under ``prefix``, etcd's db size in bytes, the first member's)."""
    with b.cluster.client(timeout=30) as etcd:
        keys = len(etcd.range(prefix, prefix=True, keys_only=True)[0])
    assert b.cluster.underlay is not None
    out = b.cluster.underlay.run(["etcdctl", "--endpoints", b.cluster.endpoints[0], "endpoint", "status", "-w",
                                  "json"], env=dict(os.environ, ETCDCTL_API="3")).stdout
    return keys, int(json.loads(out)[0]["Status"]["dbSize"])


def case_growth(b: Bench, total: int, nodes: int = 50) -> list[Row]:
    network = "growth"
    subnet = "10.121.0.0/16"
    rs = [parse_range_set([{"subnet": subnet}])]
    node = b.cluster.nodes[1]
    conf = b.conf(network, node, "cluster-ipam", subnet)
    pod = new_namespace(NS_PREFIX)
    rows: list[Row] = []
    try:
        b.call("ipam", node, "ADD", conf, "warm", pod)  # node2 claims its block: not what is measured

        def sample(label: str) -> float:
            import resource

            xs, cpu = [], []
            for r in range(15):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                xs.append(b.call("ipam", node, "ADD", conf, f"g{label}-{r}", pod)[0])
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                b.call("ipam", node, "DEL", conf, f"g{label}-{r}", pod)
            keys, db = _db(b, "/pycni/")
            t = statistics.median(xs)
            rows.extend([(f"(D) one-shot cluster-ipam ADD with {label} taken", t, "s"),
                         (f"(D) its CPU time (the plugin process) with {label} taken", statistics.median(cpu), "s"),
                         (f"(D) keys under the prefix with {label} taken", keys, "n"),
                         (f"(D) etcd db size (MiB) with {label} taken", db / 2**20, "x")])
            cpus.append(statistics.median(cpu))
            return t

        cpus: list[float] = []
        first = sample("0")
        done = 0
        for stop in (total // 2, total):
            per = (stop - done) // nodes

            def fill(n: int, lo: int = done, per: int = per) -> None:
                s = store(b.cluster, network, f"g-node{n}")
                for i in range(lo, lo + per):
                    s.assign(f"f{n}-{i}", "eth0", rs, [])
                s.kv.close()

            with ThreadPoolExecutor(max_workers=10) as pool:
                for f in [pool.submit(fill, n) for n in range(nodes)]:
                    f.result()
            done += per * nodes
            last = sample(str(done))
            rows.append((f"(D) growth: ADD with {done} taken / with 0 (target <= 1.0)", last / first, "x"))
            rows.append((f"(D) growth of its CPU time, {done} / 0 (what load does not move)", cpus[-1] / cpus[0], "x"))
    finally:
        pod.delete()
    with b.cluster.client(timeout=60) as etcd:  # leave the next case an empty store
        etcd.delete_prefix("/pycni/ipam/blocks/growth/")
        etcd.delete_prefix("/pycni/ipam/handles/growth/")
        for n in range(nodes):
            etcd.delete_prefix(f"/pycni/ipam/affinity/g-node{n}/")
    return rows


# ---- (E) -------------------------------------------------------------------------------------------

WINDOW = 1.5  # seconds (E) watches for the first reply after an ADD


def _quantile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _agent_times(path: Any) -> list[tuple[float, float, float, float]]:
    """The agent's own seconds per applied batch (its "applied rev" lines: wall time from the
    watch's answer to the last change; of the convergence, CPU time, time waiting for a CPU and
    time blocked in the kernel), apart from watch delivery."""
    def ms(ln: str, label: str) -> float:
        return float(ln.split(label)[1].split(" ms")[0]) / 1000 if label in ln else 0.0

    out = []
    for ln in path.read_text().splitlines():
        if ": applied rev " in ln and " ms after they arrived" in ln:
            out.append((ms(ln, " events, "), ms(ln, ", cpu "), ms(ln, "waiting for a cpu "), ms(ln, ", blocked ")))
            if out[-1][0] > 0.025:
                log(f"(E) a slow batch: {ln}")
    return out


def case_convergence(b: Bench, samples: int, modes: list[str]) -> list[Row]:
    from pathlib import Path

    import test_cluster_reuse
    from test_cluster_reuse import Cluster

    from pycni.plugins.main import routed  # noqa: F401 - the plugin the pods use (through Cluster.add)

    test_cluster_reuse.PREFIX = NS_PREFIX  # the pods' namespaces
    rows: list[Row] = []
    for mode in modes:
        load = os.getloadavg()[0]
        work = Path(tempfile.mkdtemp(prefix="pycni-bench-conv-", dir=b.tmp))
        c = Cluster(b.cluster, work, b.shims, mode=mode)
        lat: dict[str, list[float]] = {"new block": [], "block with room": [], "reused address": []}
        try:
            c.start_agents()
            probes = [c.add(i, f"probe{i}", c.conf(n.name, "probes", "10.86.0.0/24", "fd86::/120", (26, 122)))[0]
                      for i, n in enumerate(b.cluster.nodes)]
            tiny = [c.conf(n.name, "tiny", "10.85.0.0/29", "fd85::/125", (30, 126)) for n in b.cluster.nodes]
            for k, i in enumerate((0, 1, 2, 0)):
                c.add(i, f"filler{k}", tiny[i])
            big = [c.conf(n.name, "big", "10.84.0.0/16", "fd84::/112", (28, 124)) for n in b.cluster.nodes]
            free = "10.85.0.6"  # the one address the fillers leave
            for r in range(samples):
                i = r % 3
                kind = ("new block", "block with room", "reused address")[r % 3]
                if kind == "reused address":
                    ip, conf = free, tiny[i]
                else:
                    blk = r // 3
                    ip = f"10.84.{blk}.{16 * i + (4 if kind == 'new block' else 5)}"
                    conf = big[i]
                    if kind == "block with room":  # the block exists: claim it first with another pod
                        c.add(i, f"pre{r}", dict(conf, args={"cni": {"ips": [f"10.84.{blk}.{16 * i + 6}"]}}))
                pingers = [subprocess.Popen(["ip", "netns", "exec", p.name, "ping", "-D", "-n", "-i", "0.002", ip],
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                           for p in probes]
                time.sleep(0.2)
                pod, _ = c.add(i, f"m{r}", dict(conf, args={"cni": {"ips": [ip]}}))
                done = time.time()
                load = max(load, os.getloadavg()[0])
                time.sleep(WINDOW)
                for pg in pingers:
                    pg.send_signal(2)
                for k, pg in enumerate(pingers):
                    out = pg.communicate()[0]
                    stamps = [float(ln[1:ln.index("]")]) for ln in out.splitlines()
                              if ln.startswith("[") and "bytes from" in ln]
                    after = [t for t in stamps if t >= done - 0.05]
                    lat[kind].append(max(0.0, after[0] - done) if after else WINDOW)  # none: the whole window
                    if not after or after[0] - done > 0.1:
                        log(f"(E) {mode} {kind} {ip} on node{i + 1}: first reply after "
                            f"{(after[0] - done) * 1000 if after else float('inf'):.0f} ms at the probe on node{k + 1} "
                            f"(ADD returned {done:.3f})")
                        for a in range(3):
                            for ln in (work / f"agent-node{a + 1}.log").read_text().splitlines()[-6:]:
                                log(f"    {ln}")
                if kind == "reused address":
                    c.delete(i, f"m{r}", conf, pod)
            times = [t for a in range(3) for t in _agent_times(work / f"agent-node{a + 1}.log")]
            agent = sorted(t[0] for t in times)
            cpu = sorted(t[1] for t in times)
            queued = sorted(t[2] for t in times)
            blocked = sorted(t[3] for t in times)
        finally:
            c.close()
        load = max(load, os.getloadavg()[0])
        every = sorted(x for xs in lat.values() for x in xs)
        log(f"(E) {mode}: load average (1 min) up to {load:.1f} on {os.cpu_count()} CPUs; agents applied "
            f"{len(agent)} batches")
        if agent:
            rows += [(f"(E) {mode}: agent's own time per applied batch p50 (n={len(agent)})", _quantile(agent, 0.5),
                      "s"),
                     (f"(E) {mode}: agent's own time per applied batch p99", _quantile(agent, 0.99), "s"),
                     (f"(E) {mode}: agent's own time per applied batch max", agent[-1], "s"),
                     (f"(E) {mode}: agent's CPU time converging a batch p50", _quantile(cpu, 0.5), "s"),
                     (f"(E) {mode}: agent's CPU time converging a batch max", cpu[-1], "s"),
                     (f"(E) {mode}: ... waiting for a CPU (the load) max", queued[-1], "s"),
                     (f"(E) {mode}: ... blocked in the kernel max", blocked[-1], "s")]
        rows += [(f"(E) {mode}: load average during the case", load, "n")]
        rows += [(f"(E) {mode}: convergence p50 (n={len(every)})", _quantile(every, 0.5), "s"),
                 (f"(E) {mode}: convergence p99 (target <= 25 ms)", _quantile(every, 0.99), "s"),
                 (f"(E) {mode}: convergence max (target <= 100 ms)", every[-1], "s")]
        rows += [(f"(E) {mode}: max, {kind}", max(xs), "s") for kind, xs in lat.items() if xs]
    return rows


def main() -> int:
    global NS_PREFIX
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--parallel", type=int, default=64, help="ADDs per node in (B)")
    p.add_argument("--allocations", type=int, default=10000, help="allocations in (C)")
    p.add_argument("--samples", type=int, default=30, help="new pods per mode in (E)")
    p.add_argument("--modes", default="host-gw,vxlan", help="agent modes in (E)")
    p.add_argument("--only", default="A,B,C,D,E")
    p.add_argument("--ns-prefix", default=NS_PREFIX, help="prefix of the namespaces the bench makes")
    opts = p.parse_args()
    NS_PREFIX = opts.ns_prefix
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it creates network namespaces)")
    tmp = tempfile.mkdtemp(prefix="pycni-bench-cluster-")
    rows: list[Row] = []
    started = time.perf_counter()
    try:
        with EtcdCluster(subnet="10.232.0.0/24", prefix=NS_PREFIX) as cluster:
            b = Bench(cluster, tmp)
            try:
                cases: list[tuple[str, Callable[[], list[Row]]]] = [
                    ("A", lambda: case_cycle(b, opts.rounds)),
                    ("B", lambda: case_parallel(b, opts.parallel, "oneshot") + case_parallel(b, opts.parallel,
                                                                                              "daemon")),
                    ("C", lambda: case_many(b, opts.allocations)),
                    ("D", lambda: case_growth(b, opts.allocations)),
                    ("E", lambda: case_convergence(b, opts.samples, opts.modes.split(",")))]
                for name, fn in cases:
                    if name in opts.only.split(","):
                        log(f"case ({name})")
                        rows.extend(fn())
            finally:
                b.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ncluster-ipam bench ({opts.rounds} rounds, medians; run took {time.perf_counter() - started:.0f} s)")
    width = max(len(r[0]) for r in rows)
    for case, value, unit in rows:
        shown = f"{value * 1000:.0f} ms" if unit == "s" else f"{value:.2f}" if unit == "x" else f"{value:.0f}"
        print(f"{case.ljust(width)}  {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
