"""routed + cluster-ipam and the node agent on a real 3-member etcd, in one run.

    .venv/bin/python bench/routed.py [--rounds 9] [--claims 100] [--parallel 100] [--only A,B,C]

Everything runs in throwaway namespaces: three "node" namespaces on an underlay bridge with an
etcd member each (tests/etcd_util.py), a ``pycni node`` agent per node (host-gw), pods as fresh
namespaces. Plugins are executed directly from inside node1 (the same driver for every
variant), ours one-shot or through a ``pycni daemon`` (bench/cluster.py's setup). Cases:

(A) ADD+DEL cycle: routed + cluster-ipam against ptp + host-local (Go's, ours one-shot, ours
    with the daemon). Variants alternate within a round; the first round is discarded; medians.
    Target: routed + cluster-ipam <= 1.3x ours with ptp + host-local.
(B) Route convergence: node1 claims a new block the way cluster-ipam does (block and affinity
    created in one transaction); the time from just before that transaction is sent until the
    route to the block is in the kernel of node2 *and* node3 (netlink route notifications,
    timestamped as they arrive). p50/p99 over ``--claims`` claims. Target: p99 < 1 s.
(B') The same with real claims: ``--claims`` pods ADDed on node1 with cluster-ipam blocks of one
    address (every ADD claims a block): from the claim's watch event (as a client of etcd sees
    it) and from the start of the ADD, until the route is on both other nodes.
(C) Agents' CPU time and resident memory: idle over 10 s, and while ``--parallel`` pods are
    ADDed at once across the three nodes (routed + cluster-ipam, one-shot) and DELeted again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]

from cluster import GO, PATH_ENV, Bench, log  # noqa: E402  (bench/cluster.py: the daemon, the log line)
from etcd_util import EtcdCluster, EtcdNode  # noqa: E402
from netns_util import Namespace, new_namespace  # noqa: E402

from pycni.cluster.etcd import if_absent, op_put  # noqa: E402
from pycni.cluster.node import RTPROT_PYCNI  # noqa: E402
from pycni.net import netns, nl  # noqa: E402

Row = tuple[str, float, str]  # case, value, unit: "s" seconds, "x" ratio, "n" a number, "%" percent, "MB"
PREFIX = "/pycni"
RTMGRP_IPV4_ROUTE = 0x40


def conf(b: Bench, kind: str, node: EtcdNode, network: str, subnet: str, etcd_timeout: int = 8) -> dict[str, Any]:
    if kind == "routed":
        return {"cniVersion": "1.1.0", "name": network, "type": "routed",
                "ipam": {"type": "cluster-ipam", "etcdEndpoints": b.cluster.endpoints, "etcdPrefix": PREFIX,
                         "nodeName": node.name, "ranges": [[{"subnet": subnet}]], "etcdTimeout": etcd_timeout,
                         "lockDir": os.path.join(b.tmp, "locks")}}
    return {"cniVersion": "1.0.0", "name": network, "type": "ptp",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                     "dataDir": os.path.join(b.tmp, "host-local", node.name)}}


def call(b: Bench, variant: str, node: EtcdNode, command: str, c: dict[str, Any], cid: str,
         pod: Namespace) -> float:
    """One plugin invocation from inside ``node`` (timed without any ``ip netns exec``)."""
    go = variant == "go"
    bindir = GO if go else b.shims
    env = {"PATH": PATH_ENV, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": pod.path,
           "CNI_IFNAME": "eth0", "CNI_PATH": bindir, "PYCNI_SOCKET": b.socket if variant == "daemon" else "off"}
    with netns.enter(node.ns.path):
        t = time.perf_counter()
        proc = subprocess.run([os.path.join(bindir, c["type"])], input=json.dumps(c).encode(), env=env,
                              capture_output=True)
        elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} {c['type']} {command} {cid}: {proc.stdout!r} {proc.stderr!r}")
    return elapsed


# ---- agents --------------------------------------------------------------------------------------

class Agents:
    def __init__(self, cluster: EtcdCluster, tmp: str) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        for node in cluster.nodes:
            log_file = open(os.path.join(tmp, f"agent-{node.name}.log"), "ab")
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", node.ns.name, sys.executable, "-m", "pycni", "node", "--etcd-endpoints",
                 ",".join(cluster.endpoints), "--etcd-prefix", PREFIX, "--node-name", node.name, "--underlay-ip",
                 node.ip, "--mode", "host-gw", "--flows-socket", ""], stdout=log_file, stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))))
            log_file.close()
        time.sleep(1.5)

    def usage(self) -> list[tuple[float, int]]:
        """(CPU seconds so far, resident bytes) of each agent."""
        tick = os.sysconf("SC_CLK_TCK")
        out = []
        for p in self.procs:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            with open(f"/proc/{p.pid}/status") as f:
                rss = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:"))
            out.append((cpu, rss))
        return out

    def close(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class RouteWatch:
    """Netlink route notifications in one node, timestamped on arrival: when did dst appear?"""

    def __init__(self, node: EtcdNode) -> None:
        with netns.enter(node.ns.path):
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nl.NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind((0, RTMGRP_IPV4_ROUTE))
        self.seen: dict[str, float] = {}
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            now = time.perf_counter()
            off = 0
            while off + 16 <= len(data):
                length, mtype = int.from_bytes(data[off:off + 4], "little"), int.from_bytes(data[off + 4:off + 6],
                                                                                             "little")
                if length < 16:
                    break
                if mtype == nl.RTM_NEWROUTE:
                    msg = nl._decode(mtype, data[off + 16:off + length])
                    if msg is not None and msg["proto"] == RTPROT_PYCNI:
                        dst = f"{msg.get_attr('RTA_DST')}/{msg['dst_len']}"
                        with self.cond:
                            self.seen.setdefault(dst, now)
                            self.cond.notify_all()
                off += (length + 3) & ~3

    def wait(self, dst: str, timeout: float = 10.0) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: dst in self.seen, timeout):
                raise RuntimeError(f"route to {dst} never appeared")
            return self.seen[dst]

    def close(self) -> None:
        self.sock.close()


# ---- the cases -----------------------------------------------------------------------------------

def case_cycle(b: Bench, rounds: int) -> list[Row]:
    node = b.cluster.nodes[0]
    variants = [("go", "ptp"), ("oneshot", "ptp"), ("oneshot", "routed"), ("daemon", "ptp"), ("daemon", "routed")]
    confs = {v: conf(b, v[1], node, f"rcyc{i}", f"10.{130 + i}.0.0/16") for i, v in enumerate(variants)}
    times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    for r in range(rounds + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            pod = new_namespace("pycni-br")
            try:
                t = call(b, v[0], node, "ADD", confs[v], f"cyc{r}", pod)
                t += call(b, v[0], node, "DEL", confs[v], f"cyc{r}", pod)
            finally:
                pod.delete()
            if r:
                times[v].append(t)
    med = {v: statistics.median(xs) for v, xs in times.items()}
    names = {"ptp": "ptp+host-local", "routed": "routed+cluster-ipam"}
    out: list[Row] = [(f"(A) {names[k]} ADD+DEL, {'Go' if var == 'go' else 'ours ' + var}", med[(var, k)], "s")
                      for var, k in variants]
    for var in ("oneshot", "daemon"):
        out.append((f"(A) ratio routed+cluster-ipam / ptp+host-local, ours {var} (target <= 1.3)",
                    med[(var, "routed")] / med[(var, "ptp")], "x"))
    return out


def case_convergence(b: Bench, claims: int) -> list[Row]:
    watches = [RouteWatch(n) for n in b.cluster.nodes[1:]]
    etcd = b.cluster.client(timeout=10)
    lat = []
    try:
        for i in range(claims):
            cidr = f"10.140.{i}.0/26"
            key = cidr.replace("/", "-")
            block, aff = f"{PREFIX}/ipam/blocks/conv/{key}", f"{PREFIX}/ipam/affinity/node1/conv/{key}"
            t0 = time.perf_counter()
            res = etcd.txn([if_absent(block), if_absent(aff)],
                           [op_put(block, json.dumps({"cidr": cidr, "node": "node1", "allocations": {}})),
                            op_put(aff, json.dumps({"cidr": cidr, "node": "node1", "network": "conv"}))])
            assert res.succeeded
            lat.append(max(w.wait(cidr) for w in watches) - t0)
        etcd.delete_prefix(f"{PREFIX}/ipam/affinity/node1/conv/")
        etcd.delete_prefix(f"{PREFIX}/ipam/blocks/conv/")
    finally:
        etcd.close()
        for w in watches:
            w.close()
    lat.sort()
    return [(f"(B) route on both other nodes after a block claim, p50 ({claims} claims)", statistics.median(lat), "s"),
            ("(B) p99 (target < 1 s)", lat[min(len(lat) - 1, int(0.99 * len(lat)))], "s"),
            ("(B) max", lat[-1], "s")]


def case_pod_claims(b: Bench, claims: int) -> list[Row]:
    """(B') The same with real claims: pods ADDed one after another on node1 with cluster-ipam
    blocks of one address, so every ADD claims a block. Measured from the claim's watch event as
    a client of etcd sees it (and, for scale, from the start of the ADD)."""
    node = b.cluster.nodes[0]
    c = conf(b, "routed", node, "claims", "10.160.0.0/16")
    c["ipam"]["blockSize"] = 32
    watches = [RouteWatch(n) for n in b.cluster.nodes[1:]]
    seen: dict[str, float] = {}
    cond = threading.Condition()
    watcher = b.cluster.client(timeout=10)
    rev = watcher.get_prefix(f"{PREFIX}/ipam/affinity/node1/claims/")[1]
    stream = watcher.watch(f"{PREFIX}/ipam/affinity/node1/claims/", prefix=True, start_revision=rev + 1)
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            try:
                batch = stream.next(timeout=0.2)
            except Exception:  # noqa: BLE001 - closed at the end
                return
            now = time.perf_counter()
            for ev in (batch.events if batch else ()):
                if ev.type == "PUT":
                    with cond:
                        seen.setdefault(json.loads(ev.kv.value)["cidr"], now)
                        cond.notify_all()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    from_event, from_add = [], []
    pods = []
    try:
        for i in range(claims):
            pod = new_namespace("pycni-br")
            pods.append(pod)
            t0 = time.perf_counter()
            env = {"PATH": PATH_ENV, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": f"claim{i}", "CNI_NETNS": pod.path,
                   "CNI_IFNAME": "eth0", "CNI_PATH": b.shims, "PYCNI_SOCKET": "off"}
            with netns.enter(node.ns.path):
                proc = subprocess.run([os.path.join(b.shims, "routed")], input=json.dumps(c).encode(), env=env,
                                      capture_output=True)
            if proc.returncode != 0:
                raise RuntimeError(f"claim ADD {i}: {proc.stdout!r}")
            cidr = json.loads(proc.stdout)["ips"][0]["address"]
            routed_at = max(w.wait(cidr) for w in watches)
            with cond:
                cond.wait_for(lambda cidr=cidr: cidr in seen, 10)
                ev_at = seen[cidr]
            from_event.append(routed_at - ev_at)
            from_add.append(routed_at - t0)
        for i, pod in enumerate(pods):
            call(b, "oneshot", node, "DEL", c, f"claim{i}", pod)
    finally:
        stop.set()
        stream.close()
        thread.join(5)
        watcher.close()
        for w in watches:
            w.close()
        for pod in pods:
            pod.delete()
    from_event.sort()
    from_add.sort()

    def p99(xs: list[float]) -> float:
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))]

    return [(f"(B') real claims ({claims} pod ADDs, /32 blocks): claim event -> route on both, p50",
             statistics.median(from_event), "s"), ("(B') p99 (target < 1 s)", p99(from_event), "s"),
            ("(B') ADD started -> route on both, p50", statistics.median(from_add), "s"),
            ("(B') ADD started -> route on both, p99", p99(from_add), "s")]


def case_agent_load(b: Bench, agents: Agents, parallel: int) -> list[Row]:
    idle_s = 10.0
    before = agents.usage()
    time.sleep(idle_s)
    after = agents.usage()
    idle_cpu = max(a[0] - c[0] for a, c in zip(after, before, strict=True)) / idle_s
    rss_idle = max(a[1] for a in after)

    jobs = [(i % 3, i) for i in range(parallel)]
    pods = {j: new_namespace("pycni-br") for j in jobs}
    try:
        def run(command: str, j: tuple[int, int]) -> float:
            node = b.cluster.nodes[j[0]]
            # a hundred interpreters starting at once on a small machine: etcd answers late, not never
            c = conf(b, "routed", node, "load", "10.150.0.0/16", etcd_timeout=120)
            return call(b, "oneshot", node, command, c, f"l{j[1]}", pods[j])

        start_usage = agents.usage()
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(lambda j: run("ADD", j), jobs))
        time.sleep(1.0)  # the agents' last routes
        wall = time.perf_counter() - t
        mid = agents.usage()
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(lambda j: run("DEL", j), jobs))
    finally:
        for pod in pods.values():
            pod.delete()
    busy_cpu = max(m[0] - s[0] for m, s in zip(mid, start_usage, strict=True))
    return [("(C) agent CPU idle (busiest of 3)", 100 * idle_cpu, "%"),
            ("(C) agent resident memory idle (largest of 3)", rss_idle / 1e6, "MB"),
            (f"(C) agent CPU time during {parallel} parallel ADDs across 3 nodes (busiest; ADDs took "
             f"{wall - 1.0:.1f} s)", busy_cpu, "s"),
            ("(C) agent resident memory after them (largest of 3)", max(m[1] for m in mid) / 1e6, "MB")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--claims", type=int, default=100, help="block claims in (B)")
    p.add_argument("--parallel", type=int, default=100, help="pods ADDed at once in (C)")
    p.add_argument("--only", default="A,B,C")
    opts = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it creates network namespaces)")
    only = opts.only.split(",")
    tmp = tempfile.mkdtemp(prefix="pycni-bench-routed-")
    rows: list[Row] = []
    started = time.perf_counter()
    try:
        with EtcdCluster(subnet="10.233.0.0/24", prefix="pycni-br") as cluster:
            b = Bench(cluster, tmp)
            agents = Agents(cluster, tmp)
            try:
                if "A" in only:
                    log("case (A) cycle")
                    rows.extend(case_cycle(b, opts.rounds))
                if "B" in only:
                    log("case (B) convergence")
                    rows.extend(case_convergence(b, opts.claims))
                    rows.extend(case_pod_claims(b, opts.claims))
                if "C" in only:
                    log("case (C) agent load")
                    rows.extend(case_agent_load(b, agents, opts.parallel))
            finally:
                agents.close()
                b.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nrouted + node agent bench ({opts.rounds} rounds, medians; run took "
          f"{time.perf_counter() - started:.0f} s)")
    width = max(len(r[0]) for r in rows)
    for case, value, unit in rows:
        shown = {"s": f"{value * 1000:.0f} ms", "x": f"{value:.2f}", "%": f"{value:.2f} %",
                 "MB": f"{value:.1f} MB"}.get(unit, f"{value:.0f}")
        print(f"{case.ljust(width)}  {shown}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
