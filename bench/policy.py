"""Network policy enforcement on a real 3-member etcd with ``pycni node --policy`` on each node.

    .venv/bin/python bench/policy.py [--policies 1000] [--endpoints 1000] [--trials 50] [--iperf 100] [--load N]
                                     [--resync SECONDS] [--foreign]

``--load N`` starts N busy-looping processes for the run (a loaded machine; the load average at
the start and the end is printed, and row (L) the mean count of runnable tasks sampled during
the trials). They compete process by process with everything else (etcd's three members, the
agents, the instruments, all in the root cgroup) unless ``--load-cgroup`` puts them in a cpu
cgroup of their own with the default weight, as a node's workload pods are grouped by kubelet
rather than each competing with the node's services. docs/policy.md has the numbers at
10,000 x 1,000, both ways.

The agents' periodic kernel check (``--resync``, 30 s by default) is what a max-of-50 would catch
if it stalled events, so it can be forced into the trials: ``--resync 5`` has each agent check
every 5 s, and ``--foreign`` starts a "kube-proxy-like" committer in each node namespace (a
change to its own nftables table every second), so every check finds a commit that is not the
agent's and reads its table back (the expensive path). The output says how many read-backs
happened during (A) and (B).

Everything runs in throwaway namespaces (tests/etcd_util.py): three node namespaces with an
etcd member and an agent each, one real routed + cluster-ipam pod per node, and
``--endpoints`` more workload endpoints that exist as etcd records only (spread over the
nodes, each with labels; the agents treat them as pods), then ``--policies`` policies. The
kernel side is observed with ``nft monitor`` in each node (lines timestamped as they arrive).

(A) Enforcement latency: a new policy selecting a pod on every node is written to etcd; the
    time from just before the write until its chain is in the kernel of all three nodes.
    p50/p99 over ``--trials``. Target: p99 < 100 ms. Split out: the etcd write itself, and each
    agent's own share (from its watch delivering the event to the kernel taking the transaction,
    as the agent logs it).
(B) New pod rules: an endpoint record for a pod of node1 is written; the time until node1's
    agent has added its interface to the ``covered`` set (its rules in the same transaction).
    p50/p99 over ``--trials``. Target: < 20 ms. Split out, per trial (the agent's log line is
    stamped when the kernel took the transaction, to the millisecond): the etcd write itself,
    etcd's watch reaching the agent after that, the agent's own share, and the instrument (``nft
    monitor``) printing it; the five slowest trials are printed with their parts.
(F) How many tables the agents' periodic checks read back during (A) and (B).
(D) Where the time goes, in this process (no etcd, no other agents): one agent's view of the
    same records (node1's share), fed the same kinds of change; the agent's computation per policy
    change and per new pod (the patch paths), and the nftables transaction that follows, applied
    in a throwaway namespace holding the whole table.
(E) Memory: the largest resident set of the three agents after (A).
(C) Throughput: iperf3 TCP from the pod on node2 to the pod on node1 (2 s), with no policy
    and with ``--iperf`` policies selecting the destination (one of which admits the source).
    Target: >= 95 % of the no-policy rate.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

from etcd_util import EtcdCluster, EtcdNode  # noqa: E402
from netns_util import Namespace, new_namespace  # noqa: E402
from plugin_util import ok, run  # noqa: E402

from pycni import ipaddr  # noqa: E402
from pycni.cluster.model import Keys, PodMeta, WorkloadEndpoint  # noqa: E402
from pycni.cluster.policy.compile import policy_chain  # noqa: E402
from pycni.cluster.policy.model import parse_policy  # noqa: E402

PREFIX = "/po-bench"
KEYS = Keys(PREFIX)


def log(msg: str) -> None:
    sys.stderr.write(f"[policy bench {time.strftime('%H:%M:%S')}] {msg}\n")


def cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User + system CPU the agents have used so far (``ip netns exec`` execs the agent: same pid)."""
    total = 0
    for p in procs:
        with open(f"/proc/{p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Monitor:
    """``nft monitor`` in one node: every line with the time it arrived."""

    def __init__(self, node: EtcdNode) -> None:
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.proc = subprocess.Popen(["ip", "netns", "exec", node.ns.name, "stdbuf", "-oL", "nft", "monitor"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.perf_counter(), line))

    def drain(self) -> None:
        while not self.lines.empty():
            self.lines.get_nowait()

    def wait_for(self, text: str, timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {text!r} within {timeout}s")
            try:
                t, line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if text in line:
                return t

    def quiet(self, seconds: float) -> bool:
        """Whether nothing of our table arrived for ``seconds`` (consumes what did; a foreign
        committer's lines do not count)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return True
            try:
                _, line = self.lines.get(timeout=left)
            except queue.Empty:
                return True
            if "pycni_policy" in line:
                self.drain()
                return False

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Foreign:
    """A "kube-proxy-like" process in one node: it commits a change to a table of its own
    (``inet psc_kubeproxy``) every second, so the generation id the agent checks keeps moving."""

    def __init__(self, node: EtcdNode) -> None:
        script = ("nft add table inet psc_kubeproxy && nft add set inet psc_kubeproxy s '{ type ipv4_addr; }' && "
                  "i=0; while :; do i=$((i+1)); nft add element inet psc_kubeproxy s "
                  "\"{ 10.$((i/65536%256)).$((i/256%256)).$((i%256)) }\"; sleep 1; done")
        self.proc = subprocess.Popen(["ip", "netns", "exec", node.ns.name, "sh", "-c", script],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # (the shell and its sleep)
        self.proc.wait()


class Runnable:
    """The load while the trials run, sampled: the kernel's count of runnable tasks (the 4th field
    of /proc/loadavg) every 0.2 s — the 1-minute load average lags the spinners by a minute."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.2):
            with open("/proc/loadavg") as f:
                self.samples.append(int(f.read().split()[3].split("/")[0]))

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return statistics.mean(self.samples) if self.samples else 0.0


def settle(monitors: list[Monitor], timeout: float = 300.0) -> None:
    """Until no node's kernel has changed for a second (the agents have caught up)."""
    deadline = time.monotonic() + timeout
    while not all(m.quiet(1.0) for m in monitors):
        if time.monotonic() > deadline:
            raise TimeoutError("the agents did not settle")


def policy(name: str, namespace: str, selector: dict[str, str], from_labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": selector},
                     "ingress": [{"from": [{"podSelector": {"matchLabels": from_labels}}],
                                  "ports": [{"port": 5201}, {"port": "http"}]}]}}


def in_process(opts: argparse.Namespace) -> list[tuple[str, float, str]]:
    """(D): the agent's compute and the nftables transaction, each timed alone."""
    from pycni.cluster.policy.agent import PolicyEnforcer
    from pycni.cluster.policy.nftsync import Kernel, Op, Writer, _commit, batch, diff, diff_script, script
    from pycni.net import nft

    transactions: list[list[Op]] = []

    class Recorder(Writer):
        def write(self, want: Any, dirty: Any) -> tuple[str, bool]:  # the diff only: timed in the kernel below
            have = self.mirror
            ops = diff(have, want, dirty if have is not None else None)
            k = have if have is not None else Kernel()
            _commit(k, want, dirty if have is not None else None)
            self.mirror = k
            transactions.append(ops)
            return script(ops), False

    enf = PolicyEnforcer(KEYS, "node1", lambda m: None, strict=True)
    enf.writer = Recorder()
    for k in range(opts.endpoints):
        node, ns = f"node{k % 3 + 1}", f"ns{k % 20}"
        ep = WorkloadEndpoint(node=node, network="podnet", namespace=ns, pod=f"p{k}", container_id=f"fake{k}",
                              ifname="eth0", interface_name=f"rtdf{k:011x}",
                              ip_networks=[f"{ipaddr.ip_address('10.95.0.0') + k}/32"])
        enf.event("PUT", KEYS.endpoint(node, "podnet", f"fake{k}", "eth0"), ep.to_json())
        enf.event("PUT", KEYS.pod(ns, f"p{k}"), PodMeta(labels={"app": f"app{k % 50}", "tier": ["web", "db"][k % 2]},
                                                       ports=[("http", 8080, "TCP")]).to_json())
    for i in range(3):
        enf.event("PUT", KEYS.pod("bench", f"real{i}"),
                  PodMeta(labels={"bench": "all", "role": f"real{i}"}, ports=[("http", 80, "TCP")]).to_json())
        ep = WorkloadEndpoint(node=f"node{i + 1}", network="podnet", namespace="bench", pod=f"real{i}",
                              container_id=f"real{i}", ifname="eth0", interface_name=f"rtdr{i:011x}",
                              ip_networks=[f"10.94.0.{i + 1}/32"])
        enf.event("PUT", KEYS.endpoint(f"node{i + 1}", "podnet", f"real{i}", "eth0"), ep.to_json())
    for j in range(opts.policies):
        p = policy(f"pol{j}", f"ns{j % 20}", {"app": f"app{j % 50}"}, {"tier": "web"})
        enf.event("PUT", KEYS.policy(p["metadata"]["namespace"], p["metadata"]["name"]), json.dumps(p))
    t0 = time.perf_counter()
    enf.apply()
    initial = time.perf_counter() - t0
    pol_cpu: list[float] = []
    for t in range(opts.trials):
        p = policy(f"trial{t}", "bench", {"bench": "all"}, {"role": f"nobody{t}"})
        t0 = time.perf_counter()
        enf.event("PUT", KEYS.policy("bench", f"trial{t}"), json.dumps(p))
        enf.apply()
        pol_cpu.append(time.perf_counter() - t0)
    pod_cpu: list[float] = []
    for t in range(opts.trials):
        ep = WorkloadEndpoint(node="node1", network="podnet", namespace=f"ns{t % 20}", pod=f"new{t}",
                              container_id=f"new{t}", ifname="eth0", interface_name=f"rtdn{t:011x}",
                              ip_networks=[f"{ipaddr.ip_address('10.96.0.0') + t}/32"])
        t0 = time.perf_counter()
        enf.event("PUT", KEYS.endpoint("node1", "podnet", f"new{t}", "eth0"), ep.to_json())
        enf.apply()
        pod_cpu.append(time.perf_counter() - t0)
    ns = new_namespace("pe34-bench-nft")
    times: list[float] = []
    try:
        with ns.enter():
            nft.use_library()  # as the agent runs it
            nft.run(script(transactions[0]))
            from pycni.net.nftdump import Generation

            kept = Generation()  # (as the writer sends them: as one netlink batch where it can)
            batches = 0
            for ops in transactions[1:]:
                t0 = time.perf_counter()
                b = batch(ops)
                if b is not None:
                    b.commit(kept.socket())
                    batches += 1
                else:
                    nft.run(script(ops))
                times.append(time.perf_counter() - t0)
            kept.close()
            from pycni.cluster.policy.nftsync import read_table

            t0 = time.perf_counter()
            kernel = read_table()
            readback = time.perf_counter() - t0
            t0 = time.perf_counter()
            leftover = diff_script(kernel, enf.index.desired())
            rediff = time.perf_counter() - t0
            assert leftover == "", leftover[:500]
            from pycni.cluster.policy.nftsync import Readback
            from pycni.net import nftdump

            t0 = time.perf_counter()
            nftdump.generation()
            gen_query = time.perf_counter() - t0
            t0 = time.perf_counter()
            rb = Readback("pycni_policy", 0)
            rb.thread.join()
            child_read = time.perf_counter() - t0
            t0 = time.perf_counter()
            taken = rb.snapshot()
            unmarshal = time.perf_counter() - t0  # (only a repair unmarshals the whole)
            assert taken is not None and diff_script(taken, enf.index.desired()) == "", rb.error
            from pycni.cluster.policy.nftsync import Comparison

            mirror = Writer()
            mirror.mirror, mirror.commits = kernel, 0
            comparison = Comparison(mirror, rb)
            steps: list[float] = []
            verdict = None
            while verdict is None:  # (as the agent takes it: a step a loop turn, each with its 0.5 ms budget)
                t0 = time.perf_counter()
                verdict = comparison.step()
                steps.append(time.perf_counter() - t0)
            assert verdict == "equal", verdict
            compare, compare_step = sum(steps), max(steps)
        listing_lines = ns.run(["nft", "list", "table", "inet", "pycni_policy"]).stdout.count("\n")
    finally:
        ns.delete()
    import gc

    t0 = time.perf_counter()
    gc.collect()
    full_gc = time.perf_counter() - t0
    gc.freeze()
    t0 = time.perf_counter()
    gc.collect()
    frozen_gc = time.perf_counter() - t0
    gc.unfreeze()
    n = opts.trials
    return [("(D) agent compute, initial full compile (node1)", initial, "s"),
            ("(D) agent compute per policy change, p50", statistics.median(pol_cpu), "s"),
            ("(D) agent compute per new pod, p50", statistics.median(pod_cpu), "s"),
            ("(D) nft transaction per policy change, p50", statistics.median(times[:n]), "s"),
            ("(D) nft transaction per new pod, p50", statistics.median(times[n:]), "s"),
            ("(D) transactions sent as netlink batches (no libnftables), of all", float(batches), "n"),
            ("(D) reconcile: node1's table read back from the kernel", readback, "s"),
            ("(D) reconcile: compared with the index (nothing to write)", rediff, "s"),
            ("(D) periodic check: the generation id (one netlink request)", gen_query, "s"),
            ("(D) periodic check: the table read back by a child process, wall", child_read, "s"),
            ("(D) periodic check: the snapshot compared with the mirror (equal), in all", compare, "s"),
            ("(D) periodic check: ... its longest step (what an event can wait for)", compare_step, "s"),
            ("(D) periodic check: the whole snapshot unmarshalled (only to repair)", unmarshal, "s"),
            ("(D) a full gc collection over this process's heap", full_gc, "s"),
            ("(D) a full gc collection after gc.freeze()", frozen_gc, "s"),
            ("(D) ruleset of node1: lines of nft list table", float(listing_lines), "n")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--iperf", type=int, default=100)
    ap.add_argument("--in-process-only", action="store_true", help="(D) only")
    ap.add_argument("--keep-logs", action="store_true", help="keep the agents' logs (their directory is printed)")
    ap.add_argument("--load", type=int, default=0,
                    help="start this many busy-looping processes first (a loaded machine: load average ~ N + the rest)")
    ap.add_argument("--resync", type=float, default=0.0,
                    help="the agents' --resync (their periodic kernel check); default: theirs (30 s)")
    ap.add_argument("--foreign", action="store_true",
                    help="a foreign nftables committer in each node (a table of its own changed every second), so "
                         "that the agents' periodic checks read their tables back")
    ap.add_argument("--load-cgroup", action="store_true",
                    help="run the --load processes in a cpu cgroup of their own with the default weight, as a "
                         "node's workload pods are grouped (kubepods) instead of competing process by process with "
                         "the node's services; etcd, the agents and the instruments stay in the root cgroup")
    opts = ap.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(opts.load)]
    group = load_cgroup([sp.pid for sp in spinners]) if spinners and opts.load_cgroup else None
    if spinners:
        log(f"load: {opts.load} busy-looping Python processes (nice 0) for the run"
            + (f", in the cpu cgroup {group} (default weight)" if group else ", in the root cgroup"))
    try:
        if spinners:
            time.sleep(20)  # (the 1-minute load average follows slowly)
        return run_bench(opts)
    finally:
        for sp in spinners:
            sp.kill()
            sp.wait()
        if group:
            os.rmdir(group)


def load_cgroup(pids: list[int]) -> str:
    """A cpu cgroup of default weight (v2: cpu.weight 100; v1: cpu.shares 1024) holding ``pids``;
    the caller removes it once they are gone."""
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    path = f"/sys/fs/cgroup/{'' if v2 else 'cpu/'}pycni-bench-load-{os.getpid()}"
    os.mkdir(path)
    for pid in pids:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    return path


def rss_mb(procs: list[subprocess.Popen[bytes]]) -> float:
    """The largest resident set of ``procs`` (``ip netns exec`` execs the agent in place: same pid)."""
    most = 0
    for p in procs:
        with open(f"/proc/{p.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    most = max(most, int(line.split()[1]))
    return most / 1024


def run_bench(opts: argparse.Namespace) -> int:
    if opts.in_process_only:
        for name, value, unit in in_process(opts):
            print(f"{name:60s} {value:.0f}" if unit == "n" else f"{name:60s} {value * 1000:.2f} ms")
        return 0
    log(f"load average at the start: {os.getloadavg()[0]:.2f}")
    tmp = tempfile.mkdtemp(prefix="po-bench-")
    from pycni.install_plugins import install

    bindir = os.path.join(tmp, "bin")
    os.mkdir(bindir)
    install(bindir)
    rows: list[tuple[str, float, str]] = []
    namespaces: list[Namespace] = []
    agents: list[subprocess.Popen[bytes]] = []
    monitors: list[Monitor] = []
    foreign: list[Foreign] = []
    with EtcdCluster(size=3, subnet="10.233.0.0/24", prefix="pe34-bench") as cluster:
        try:
            etcd = cluster.client(timeout=30)
            for node in cluster.nodes:
                with open(os.path.join(tmp, f"agent-{node.name}.log"), "ab") as lf:
                    agents.append(subprocess.Popen(
                        ["ip", "netns", "exec", node.ns.name, sys.executable, "-m", "pycni", "node", "--policy",
                         "--etcd-endpoints", ",".join(cluster.endpoints), "--etcd-prefix", PREFIX,
                         "--node-name", node.name, "--underlay-ip", node.ip,
                         "--flows-socket", os.path.join(tmp, f"flows-{node.name}.sock"),
                         *(["--resync", f"{opts.resync:g}"] if opts.resync else [])],
                        stdout=lf, stderr=subprocess.STDOUT,
                        env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))))
            monitors = [Monitor(n) for n in cluster.nodes]
            if opts.foreign:
                foreign = [Foreign(n) for n in cluster.nodes]
                log("a foreign nftables committer in each node (table inet psc_kubeproxy, a change a second)")
            for n in cluster.nodes:
                deadline = time.monotonic() + 30
                while subprocess.run(["ip", "netns", "exec", n.ns.name, "nft", "list", "table", "inet",
                                      "pycni_policy"], capture_output=True).returncode != 0:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"agent of {n.name} did not start")
                    time.sleep(0.1)
            # one real pod per node, all labelled bench=all
            pods: list[tuple[Namespace, str]] = []
            for i, node in enumerate(cluster.nodes):
                etcd.put(KEYS.pod("bench", f"real{i}"), PodMeta(labels={"bench": "all", "role": f"real{i}"},
                                                                ports=[("http", 80, "TCP")]).to_json())
                pns = new_namespace("pe34-bench-pod")
                namespaces.append(pns)
                c = {"cniVersion": "1.1.0", "name": "podnet", "type": "routed", "policySetupTimeout": 30,
                     "ipam": {"type": "cluster-ipam", "etcdEndpoints": cluster.endpoints, "etcdPrefix": PREFIX,
                              "nodeName": node.name, "ranges": [[{"subnet": "10.94.0.0/16"}]],
                              "lockDir": os.path.join(tmp, "locks")}}
                res = ok(run("routed", "ADD", c, host=node.ns, netns=pns, cni_path=bindir, container_id=f"real{i}",
                              args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=real{i}"))
                pods.append((pns, res["ips"][0]["address"].split("/")[0]))
            log("3 agents, 3 real pods")
            # record-only endpoints and their labels, then the policies, in batches
            from pycni.cluster.kv import op_put

            ops = []
            for k in range(opts.endpoints):
                node = cluster.nodes[k % 3].name
                ns = f"ns{k % 20}"
                ep = WorkloadEndpoint(node=node, network="podnet", namespace=ns, pod=f"p{k}", container_id=f"fake{k}",
                                      ifname="eth0", interface_name=f"rtdf{k:011x}",
                                      ip_networks=[f"{ipaddr.ip_address('10.95.0.0') + k}/32"], profiles=["podnet"])
                ops.append(op_put(KEYS.endpoint(node, "podnet", f"fake{k}", "eth0"), ep.to_json()))
                meta = PodMeta(labels={"app": f"app{k % 50}", "tier": ["web", "db"][k % 2]},
                               ports=[("http", 8080, "TCP")])
                ops.append(op_put(KEYS.pod(ns, f"p{k}"), meta.to_json()))
            for j in range(opts.policies):
                p = policy(f"pol{j}", f"ns{j % 20}", {"app": f"app{j % 50}"}, {"tier": "web"})
                ops.append(op_put(KEYS.policy(p["metadata"]["namespace"], p["metadata"]["name"]), json.dumps(p)))
            t0 = time.perf_counter()
            for i in range(0, len(ops), 100):
                etcd.txn([], ops[i:i + 100])
            settle(monitors)
            rows.append(("(0) initial load: all records written, all nodes settled", time.perf_counter() - t0 - 1, "s"))
            log(f"{opts.endpoints} record-only endpoints, {opts.policies} policies written")

            def readbacks() -> int:
                return sum(open(os.path.join(tmp, f"agent-{n.name}.log"), errors="replace").read()
                           .count("checked off the event path") for n in cluster.nodes)

            def updates(n: EtcdNode, mark: int) -> list[tuple[float, float]]:
                """(wall time the agent logged it, its own share) of each update ``n``'s agent logged
                since ``mark`` (the log's stamp is taken after the kernel took the transaction)."""
                got: list[tuple[float, float]] = []
                with open(os.path.join(tmp, f"agent-{n.name}.log"), errors="replace") as f:
                    for line in f.read().splitlines()[mark:]:
                        if "policy: updated" in line and " ms after the watch delivered it" in line:
                            stamp = line.split()[0].strip("[]")
                            whole, _, ms = stamp.partition(".")
                            at = time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(ms[:3]) / 1000
                            got.append((at, float(line.rsplit("; ", 1)[1].split(" ms")[0]) / 1000))
                return got

            def agent_side(nodes: list[EtcdNode], marks: list[int]) -> list[float]:
                """Each agent's own share of the changes it logged since ``marks`` (its log's line counts):
                from the watch delivering the event to the kernel taking the transaction."""
                return [own for n, mark in zip(nodes, marks, strict=True) for _at, own in updates(n, mark)]

            def marks() -> list[int]:
                out = []
                for n in cluster.nodes:
                    with open(os.path.join(tmp, f"agent-{n.name}.log"), errors="replace") as f:
                        out.append(len(f.read().splitlines()))
                return out

            checked = readbacks()
            mark_a = marks()
            trials_start = time.monotonic()
            runnable = Runnable()
            # (A) enforcement latency
            lat = []
            cpu0 = cpu_seconds(agents)
            puts_a = []
            for t in range(opts.trials):
                p = policy(f"trial{t}", "bench", {"bench": "all"}, {"role": f"nobody{t}"})
                chain = policy_chain(parse_policy(p), "Ingress")
                for m in monitors:
                    m.drain()
                start = time.perf_counter()
                etcd.put(KEYS.policy("bench", f"trial{t}"), json.dumps(p))
                puts_a.append(time.perf_counter() - start)
                lat.append(max(m.wait_for(f"add chain inet pycni_policy {chain}") for m in monitors) - start)
            own_a = agent_side(cluster.nodes, mark_a)
            log("(A) the 5 slowest trials, ms: " + " ".join(f"{x * 1000:.0f}" for x in sorted(lat)[-5:]))
            rows += [("(A) enforcement, all 3 nodes, p50", statistics.median(lat), "s"),
                     ("(A) enforcement, all 3 nodes, p99", pct(lat, 0.99), "s"),
                     ("(A) agent CPU per policy change, 3 agents together", (cpu_seconds(agents) - cpu0) / opts.trials,
                      "s"),
                     ("(A) of which the etcd write itself, p50", statistics.median(puts_a), "s"),
                     ("(A) of which the etcd write itself, max", max(puts_a), "s"),
                     ("(A) each agent, watch delivery -> kernel took it, p50", statistics.median(own_a), "s"),
                     ("(A) each agent, watch delivery -> kernel took it, max", max(own_a), "s")]
            etcd.delete_prefix(KEYS.policy("bench", "trial"))
            settle(monitors)

            # (B) new pod rules
            new = []
            puts = []
            walls: list[float] = []
            node = cluster.nodes[0]
            mark_b = marks()
            cpu0 = cpu_seconds(agents[:1])
            for t in range(opts.trials):
                iface = f"rtdn{t:011x}"
                ep = WorkloadEndpoint(node=node.name, network="podnet", namespace=f"ns{t % 20}", pod=f"new{t}",
                                      container_id=f"new{t}", ifname="eth0", interface_name=iface,
                                      ip_networks=[f"{ipaddr.ip_address('10.96.0.0') + t}/32"])
                monitors[0].drain()
                walls.append(time.time())
                start = time.perf_counter()
                etcd.put(KEYS.endpoint(node.name, "podnet", f"new{t}", "eth0"), ep.to_json())
                puts.append(time.perf_counter() - start)
                new.append(monitors[0].wait_for(f'covered {{ "{iface}" }}') - start)
            log("(B) the 5 slowest trials, ms: " + " ".join(f"{x * 1000:.0f}" for x in sorted(new)[-5:]))
            logged = updates(node, mark_b[0])
            parts: list[tuple[str, list[float]]] = [("node1's agent, watch delivery -> kernel took it",
                                                     [own for _at, own in logged])]
            # each trial's update: the next one the agent logged after the trial's write began (the log's
            # stamp has ms precision)
            mine: list[tuple[float, float] | None] = []
            at_update = 0
            for t in range(len(new)):
                while at_update < len(logged) and logged[at_update][0] < walls[t] - 0.001:
                    at_update += 1
                mine.append(logged[at_update] if at_update < len(logged) else None)
                at_update += 1
            if all(u is not None for u in mine):
                taken = [u for u in mine if u is not None]
                hop = [at - own - walls[t] - puts[t] for t, (at, own) in enumerate(taken)]
                seen = [walls[t] + new[t] - at for t, (at, _own) in enumerate(taken)]
                own_b = [own for _at, own in taken]
                parts = [("etcd's watch reaching node1's agent after the write returned", hop),
                         ("node1's agent, watch delivery -> kernel took it", own_b),
                         ("nft monitor (the instrument) printing it after the agent's commit", seen)]
                for t in sorted(range(len(new)), key=new.__getitem__)[-5:]:
                    log(f"(B) trial {t}: {new[t] * 1000:.1f} ms = etcd write {puts[t] * 1000:.1f}"
                        f" + watch delivery {hop[t] * 1000:.1f} + agent {own_b[t] * 1000:.1f}"
                        f" + seen by nft monitor {seen[t] * 1000:.1f} (the agent's log stamp has ms precision)")
            rows += [("(E) agent memory, largest VmRSS of the 3", rss_mb(agents), "MB")]
            rows += [("(B) new pod's rules, p50", statistics.median(new), "s"),
                     ("(B) new pod's rules, p99", pct(new, 0.99), "s"),
                     ("(B) of which the etcd write itself, p50", statistics.median(puts), "s"),
                     ("(B) of which the etcd write itself, max", max(puts), "s"),
                     ("(B) of which the etcd write itself, p99", pct(puts, 0.99), "s"),
                     *((f"(B) of which {what}, {q}", pct(values, v) if v < 1 else max(values), "s")
                       for what, values in parts for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))),
                     ("(B) node1's agent CPU per new pod", (cpu_seconds(agents[:1]) - cpu0) / opts.trials, "s")]
            rows += [("(F) tables read back by the periodic check in (A)+(B), 3 agents", readbacks() - checked, "n"),
                     ("(F) seconds of (A)+(B)", time.monotonic() - trials_start, "n"),
                     ("(L) runnable tasks on the machine during (A)+(B), mean of samples", runnable.stop(), "load")]

            # (C) throughput
            if shutil.which("iperf3"):
                def iperf() -> float:
                    (dns, dip), (sns, _) = pods[0], pods[1]
                    server = subprocess.Popen(["ip", "netns", "exec", dns.name, "iperf3", "-s", "-1"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    try:
                        time.sleep(0.5)
                        out = sns.run(["iperf3", "-c", dip, "-t", "2", "-J"], timeout=60).stdout
                    finally:
                        server.kill()
                        server.wait()
                    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"])

                ops = [op_put(KEYS.policy("bench", f"tp{j}"),
                              json.dumps(policy(f"tp{j}", "bench", {"role": "real0"},
                                                {"role": "real1" if j == opts.iperf - 1 else f"x{j}"})))
                       for j in range(opts.iperf)]
                base: list[float] = []
                with_pol: list[float] = []
                for with_policies in (False, True, True, False, False, True):  # ABBA: load and order hit both alike
                    etcd.delete_prefix(KEYS.policy("bench", "tp"))
                    if with_policies:
                        for i in range(0, len(ops), 100):
                            etcd.txn([], ops[i:i + 100])
                    settle(monitors)
                    (with_pol if with_policies else base).append(iperf())
                b, w = statistics.median(base), statistics.median(with_pol)
                log("(C) runs, Gbit/s: no policy " + " ".join(f"{x / 1e9:.2f}" for x in base)
                    + f"; with {opts.iperf} policies " + " ".join(f"{x / 1e9:.2f}" for x in with_pol))
                rows += [("(C) iperf3 no policy", b / 1e9, "Gbit/s"),
                         (f"(C) iperf3 with {opts.iperf} policies on the destination", w / 1e9, "Gbit/s"),
                         ("(C) ratio", 100 * w / b, "%")]
        finally:
            for f in foreign:
                f.close()
            for m in monitors:
                m.close()
            for a in agents:
                a.kill()
                a.wait()
            for ns in namespaces:
                ns.delete()
            if opts.keep_logs:
                log(f"the agents' logs are in {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    rows += in_process(opts)
    rows.append(("load average (1 min) at the end", os.getloadavg()[0], "load"))
    for name, value, unit in rows:
        shown = (f"{value * 1000:.1f} ms" if unit == "s" else f"{value:.1f} %" if unit == "%"
                 else f"{value:.2f}" if unit == "load" else f"{value:.0f}" if unit == "n" else f"{value:.2f} {unit}")
        print(f"{name:60s} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
