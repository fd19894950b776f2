"""pycni against the Go reference plugins, on this machine, in one run: ``bash scripts/bench``.

Every case drives the plugins through the same runtime, the Go libcni (tests/interop/gocnitool,
built offline), so only the plugins differ:

* ``go``       — Go reference plugins (Debian's containernetworking-plugins, /usr/lib/cni);
* ``oneshot``  — our shims with ``PYCNI_SOCKET=off`` (each call a fresh interpreter);
* ``daemon``   — our shims forwarding to a ``pycni daemon`` on a temporary socket.

Variants alternate within every round (A B C A B C ...), the first round is a discarded
warm-up, and the table reports medians and the ratio ours/Go of the medians. Everything runs
in throwaway namespaces this script makes (one "host" namespace per variant, where plugins run
and bridges/rules live; fresh container namespaces), with state in a temporary directory; all
of it is removed at the end, on Ctrl-C and on SIGTERM. Needs root.

Cases: (a) bridge+host-local+portmap ADD+DEL cycle, (b) the same with ptp and macvlan,
(c) 32 containers ADDed in parallel, (d) host-local allocation with many addresses already
reserved in a /16, (e) ADD latency of the Nth container on one bridge (N port mappings
present) against the 1st, (v) VERSION: the plugin exec'd alone, and libcni's
ValidateNetworkList of podman's default chain (what podman asks before every use of a network),
(p) where (a)'s milliseconds go, per call, and the floor (bench/breakdown.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --snapshot runs the committed tree (git HEAD), exported here, instead of the working tree.
SRC_ROOT = os.environ.get("PYCNI_BENCH_TREE") or ROOT
sys.path[:0] = [os.path.join(SRC_ROOT, "src"), os.path.join(SRC_ROOT, "tests")]

from pycni.install_plugins import install  # noqa: E402
from pycni.net import iptables, netns, restore_session  # noqa: E402

GO_PLUGINS = "/usr/lib/cni"
# ipMasqBackend written into the bench configs (None: the plugin's default). The Go 1.1.1
# plugins do not know the key and always use iptables; ours default to iptables as well when
# it works (as the reference does) and take "nftables" for one-transaction masquerading.
MASQ_BACKEND: str | None = None
PATH_ENV = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")


# ---- environment -------------------------------------------------------------------------------

@dataclass
class Variant:
    name: str
    cni_path: str
    socket: str  # "off" for one-shot

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": PATH_ENV, "PYCNI_SOCKET": self.socket, **extra}


@dataclass
class Env:
    """Namespaces, directories and processes of one bench run; :meth:`close` removes them all."""

    tmp: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    namespaces: list[str] = field(default_factory=list)
    daemon: subprocess.Popen[bytes] | None = None
    tool: str = ""
    shims: str = ""
    socket: str = ""
    _count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def new_ns(self, role: str) -> str:
        with self._lock:
            self._count += 1
            name = f"pycni-b{self.run_id}-{role}{self._count}"
            self.namespaces.append(name)
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True)
        return name

    def del_ns(self, name: str) -> None:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        with self._lock:
            if name in self.namespaces:
                self.namespaces.remove(name)

    def close(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
        for name in list(reversed(self.namespaces)):
            self.del_ns(name)
        # anything of this run left by an interrupted step
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in listing.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(f"pycni-b{self.run_id}-"):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_daemon(self, workers: int | None = None) -> None:
        dns = self.new_ns("daemon")  # its own namespace: it must act in each caller's, never its own
        self.socket = os.path.join(self.tmp, "pycni.sock")
        self.daemon = subprocess.Popen(["ip", "netns", "exec", dns, sys.executable, "-m", "pycni.daemon",
                                        "--socket", self.socket, "--log-file", os.path.join(self.tmp, "daemon.log"),
                                        *([] if workers is None else ["--workers", str(workers)])],
                                       env=dict(os.environ, PYTHONPATH=os.path.join(SRC_ROOT, "src")))
        for _ in range(600):
            if os.path.exists(self.socket):
                return
            if self.daemon.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("pycni daemon did not start")

    def cpu_seconds(self, variant: Variant) -> float:
        """CPU used so far by the processes a call runs: this process's reaped children (the
        runtime and everything it waited for) and, for the daemon variant, the daemon, its
        workers and their children (restore sessions, tools), read from /proc (schedstat)."""
        import resource

        import orphans

        # what one-shot plugins left to end alone (adopted: see bench/orphans.py), counted here
        orphans.reap(keep={self.daemon.pid} if self.daemon is not None else set())
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = ru.ru_utime + ru.ru_stime
        if variant.socket != "off" and self.daemon is not None:
            total += _tree_cpu(self.daemon.pid)
        return total

    def variants(self) -> list[Variant]:
        return [Variant("go", GO_PLUGINS, "off"), Variant("oneshot", self.shims, "off"),
                Variant("daemon", self.shims, self.socket)]


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (threads included), from schedstat."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        with open(f"/proc/{pid}/stat") as f:  # children it reaped (sessions ended, tools): cutime + cstime
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return total
    children: list[str] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children += f.read().split()
        except (OSError, ValueError, IndexError):
            continue
    return total + sum(_tree_cpu(int(c)) for c in children)


@contextlib.contextmanager
def bench_env(daemon_workers: int | None = None) -> Iterator[Env]:
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it creates network namespaces)")
    import orphans

    orphans.adopt()  # the CPU of what one-shot calls leave to finish alone is theirs (bench/orphans.py)
    env = Env(tempfile.mkdtemp(prefix="pycni-bench-"))
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        from interop.gobuild import build

        env.tool = build("gocnitool", env.tmp)
        env.shims = os.path.join(env.tmp, "bin")
        install(env.shims, daemon=True)
        env.start_daemon(daemon_workers)
        yield env
    finally:
        env.close()
        signal.signal(signal.SIGTERM, old)


# ---- driving the Go libcni ---------------------------------------------------------------------

def conflist(conf_dir: str, name: str, plugins: list[dict[str, Any]]) -> str:
    os.makedirs(conf_dir, exist_ok=True)
    with open(os.path.join(conf_dir, f"10-{name}.conflist"), "w") as f:
        json.dump({"cniVersion": "1.0.0", "name": name, "plugins": plugins}, f)
    return conf_dir


def chain(kind: str, data_dir: str, subnet: str, routes: bool = True) -> list[dict[str, Any]]:
    ipam: dict[str, Any] = {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": data_dir}
    if routes:
        ipam["routes"] = [{"dst": "0.0.0.0/0"}]
    main: dict[str, Any]
    masq: dict[str, Any] = {"ipMasq": True}
    if MASQ_BACKEND:
        masq["ipMasqBackend"] = MASQ_BACKEND
    if kind == "bridge":
        main = {"type": "bridge", "bridge": "cni0", "isGateway": True, **masq, "ipam": ipam}
    elif kind == "ptp":
        main = {"type": "ptp", **masq, "ipam": ipam}
    elif kind == "macvlan":
        main = {"type": "macvlan", "master": "bmaster0", "mode": "bridge", "ipam": ipam}
    else:
        raise ValueError(kind)
    return [main, {"type": "portmap", "capabilities": {"portMappings": True}}]


@dataclass
class Net:
    """One network as one variant sees it: its host namespace, configs, cache."""

    env: Env
    variant: Variant
    host: str
    conf_dir: str
    cache: str
    name: str
    cpu: float = 0.0  # CPU seconds of the calls made with run(): the runtime's process tree, and the daemon's

    def cmd(self, verb: str, cid: str, ctr: str, ifname: str = "eth0", port: int | None = None) -> list[str]:
        c = [self.env.tool, "-confdir", self.conf_dir, "-net", self.name, "-path", self.variant.cni_path,
             "-cachedir", self.cache, "-cid", cid, "-netns", f"/var/run/netns/{ctr}", "-ifname", ifname]
        if port is not None:
            c += ["-cap", json.dumps({"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]})]
        return [*c, verb]

    def run(self, verb: str, cid: str, ctr: str, ifname: str = "eth0", port: int | None = None) -> float:
        """One libcni call from inside the host namespace (no `ip netns exec` in the timing)."""
        with netns.enter(f"/var/run/netns/{self.host}"):
            cpu0 = self.env.cpu_seconds(self.variant)
            t = time.perf_counter()
            proc = subprocess.run(self.cmd(verb, cid, ctr, ifname, port), env=self.variant.env(),
                                  capture_output=True)
            elapsed = time.perf_counter() - t
            self.cpu += self.env.cpu_seconds(self.variant) - cpu0
        if proc.returncode != 0:
            raise RuntimeError(f"{self.variant.name} {verb} {cid} failed: {proc.stdout!r} {proc.stderr!r}")
        return elapsed

    def run_parallel(self, verb: str, jobs: Sequence[tuple[str, str]], port_base: int | None = None) -> float:
        """Start one libcni call per (cid, ctr) at once; wall time until the last finishes."""
        with netns.enter(f"/var/run/netns/{self.host}"):
            t = time.perf_counter()
            procs = [subprocess.Popen(self.cmd(verb, cid, ctr, "eth0",
                                               None if port_base is None else port_base + i),
                                      env=self.variant.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for i, (cid, ctr) in enumerate(jobs)]
            outs = [p.communicate() for p in procs]
            elapsed = time.perf_counter() - t
        bad = [(p.returncode, o) for p, o in zip(procs, outs, strict=True) if p.returncode != 0]
        if bad:
            raise RuntimeError(f"{self.variant.name} parallel {verb}: {len(bad)} failed, first: {bad[0]!r}")
        return elapsed


def make_net(env: Env, variant: Variant, kind: str, tag: str, subnet: str, host: str | None = None,
             routes: bool = True) -> Net:
    host = host or env.new_ns(f"{tag}h")
    if kind == "macvlan":
        # a veth pair stands in for the uplink (no dummy module on every kernel)
        subprocess.run(["ip", "-n", host, "link", "add", "bmaster0", "type", "veth", "peer", "name", "bmaster0p"],
                       check=True)
        for dev in ("bmaster0", "bmaster0p"):
            subprocess.run(["ip", "-n", host, "link", "set", dev, "up"], check=True)
    base = os.path.join(env.tmp, tag, variant.name)
    name = f"b{kind}"
    conflist(os.path.join(base, "net.d"), name, chain(kind, os.path.join(base, "ipam"), subnet, routes))
    return Net(env, variant, host, os.path.join(base, "net.d"), os.path.join(base, "cache"), name)


# ---- statistics and the table ------------------------------------------------------------------

@dataclass
class Row:
    case: str
    unit: str
    values: dict[str, list[float]]
    target: str = ""
    note: str = ""

    def median(self, v: str) -> float | None:
        xs = self.values.get(v)
        return statistics.median(xs) if xs else None

    def ratio(self, v: str, base: str = "go") -> float | None:
        a, b = self.median(v), self.median(base)
        return a / b if a is not None and b else None


def paired(rounds: int, variants: list[str], step: Callable[[str, int], float],
           warmup: int = 1) -> dict[str, list[float]]:
    """Run ``step`` for each variant, alternating (A B C, then B C A, ...); drop warm-up rounds."""
    out: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds + warmup):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            x = step(v, r)
            if r >= warmup:
                out[v].append(x)
    return out


def fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "s" and x < 0.01:  # short calls (VERSION): keep decimals
        return f"{x * 1000:.2f} ms"
    return f"{x * 1000:.0f} ms" if unit == "s" else f"{x:.2f}"


def table(rows: list[Row]) -> str:
    head = ["case", "Go", "ours one-shot", "ratio", "ours daemon", "ratio", "target"]
    lines = [head]
    for r in rows:
        lines.append([r.case, fmt(r.median("go"), r.unit), fmt(r.median("oneshot"), r.unit),
                      fmt(r.ratio("oneshot"), "x"), fmt(r.median("daemon"), r.unit), fmt(r.ratio("daemon"), "x"),
                      r.target])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    notes = [f"  {r.case}: {r.note}" for r in rows if r.note]
    return "\n".join(out + ([""] + notes if notes else []))


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the cases ---------------------------------------------------------------------------------

def case_cycle(env: Env, kind: str, rounds: int, subnet: str) -> list[Row]:
    """(a)/(b): one ADD+DEL through the Go libcni, one port mapping, a fresh container namespace each time."""
    nets = {v.name: make_net(env, v, kind, f"c{kind[:2]}{v.name[:2]}", subnet) for v in env.variants()}

    def step(v: str, r: int) -> float:
        ctr = env.new_ns("ctr")
        try:
            return nets[v].run("add", f"cyc{r}", ctr, port=8080) + nets[v].run("del", f"cyc{r}", ctr, port=8080)
        finally:
            env.del_ns(ctr)

    values = paired(rounds, list(nets), step)
    for n in nets.values():
        env.del_ns(n.host)
    case = f"({'a' if kind == 'bridge' else 'b'}) {kind}+host-local+portmap ADD+DEL"
    return [Row(case, "s", values, "daemon <= 0.2, one-shot <= 0.9" if kind == "bridge" else "one-shot <= 0.9"),
            cpu_row(f"({case[1]}) {kind}", nets, rounds + 1)]


def cpu_row(case: str, nets: dict[str, Net], cycles: int) -> Row:
    """CPU per cycle of each variant (all rounds, warm-up included): steadier than wall time on a
    loaded machine, where the CPU-heavier side also waits longer for a CPU."""
    return Row(f"{case}, CPU per cycle", "s", {v: [n.cpu / cycles] for v, n in nets.items()},
               note="runtime + plugins + their tools (+ the daemon's process tree for the daemon variant)")


def case_runtime_cycle(env: Env, rounds: int) -> Row:
    """Our own runtime (pycni.runtime, in this process) with the daemon: no runtime start-up at all."""
    from pycni.runtime import CNI

    v = Variant("daemon", env.shims, env.socket)
    net = make_net(env, v, "bridge", "rt", "10.61.0.0/16")
    rt = CNI(conf_dir=net.conf_dir, plugin_path=[env.shims], cache_dir=net.cache, env=v.env())
    conf = rt.load_network(net.name)
    cap = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
    times: list[float] = []
    for r in range(rounds + 1):
        ctr = env.new_ns("ctr")
        try:
            with netns.enter(f"/var/run/netns/{net.host}"):
                t = time.perf_counter()
                rt.add(conf, f"rt{r}", f"/var/run/netns/{ctr}", "eth0", capability_args=cap)
                rt.delete(conf, f"rt{r}", f"/var/run/netns/{ctr}", "eth0", capability_args=cap)
                if r:
                    times.append(time.perf_counter() - t)
        finally:
            env.del_ns(ctr)
    env.del_ns(net.host)
    return Row("(a') bridge cycle, pycni.runtime + daemon", "s", {"daemon": times},
               note="ours only: our runtime in-process driving the daemon (no runtime process start)")


def case_parallel(env: Env, rounds: int, n: int) -> list[Row]:
    """(c): n containers ADDed at once (wall time); DELs afterwards are not timed."""
    nets = {v.name: make_net(env, v, "bridge", f"par{v.name[:2]}", "10.62.0.0/16") for v in env.variants()}
    # One container first: the bridge and the top-level chains exist before the stampede (Go's
    # portmap 1.1.1 races creating CNI-HOSTPORT-DNAT under iptables-nft otherwise).
    warm = env.new_ns("pw")
    for net in nets.values():
        net.run("add", "warm", warm, port=29999)
        net.run("del", "warm", warm, port=29999)
    env.del_ns(warm)

    cpu: dict[str, list[float]] = {v: [] for v in nets}

    def step(v: str, r: int) -> float:
        ctrs = [env.new_ns("p") for _ in range(n)]
        jobs = [(f"par{r}-{i}", c) for i, c in enumerate(ctrs)]
        try:
            cpu0 = env.cpu_seconds(nets[v].variant)
            took = nets[v].run_parallel("add", jobs, port_base=30000)
            if r:  # after the timing: what the ADDs left to end alone is waited for and counted
                cpu[v].append((env.cpu_seconds(nets[v].variant) - cpu0) / n)
            nets[v].run_parallel("del", jobs, port_base=30000)
            # The DELs are not timed: what ours left to end alone (the kernel's teardown of 32
            # links, restores' exits) ends before the next timed ADDs, as Go's DELs have waited.
            env.cpu_seconds(nets[v].variant)
            return took
        finally:
            for c in ctrs:
                env.del_ns(c)

    values = paired(rounds, list(nets), step)
    for net in nets.values():
        env.del_ns(net.host)
    return [Row(f"(c) {n} parallel ADDs, wall", "s", values, "one-shot <= 1.0, daemon <= 0.6"),
            Row("(c) CPU per ADD", "s", cpu, note="runtime + plugins + their tools and what they left to end "
                "alone (+ the daemon's process tree for the daemon variant)")]


def case_host_local(env: Env, rounds: int, reserved: int) -> Row:
    """(d): host-local ADD with ``reserved`` addresses taken in a /16, scanning from the range start.

    Every variant works on the same data directory (the on-disk format is shared); the
    last-reserved marker is removed before each ADD so each allocation walks the taken block.
    """
    host, ctr = env.new_ns("hlh"), env.new_ns("hlc")
    data = os.path.join(env.tmp, "hl-data")
    netdir = os.path.join(data, "bhl")
    os.makedirs(netdir)
    for i in range(reserved):
        ip = 0x0A400002 + i  # 10.64.0.2 upwards
        name = f"{ip >> 24}.{(ip >> 16) & 255}.{(ip >> 8) & 255}.{ip & 255}"
        with open(os.path.join(netdir, name), "wb") as f:
            f.write(f"fill{i}\r\neth0".encode())
    conf = json.dumps({"cniVersion": "1.0.0", "name": "bhl", "type": "bridge",
                       "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.64.0.0/16"}]],
                                "dataDir": data}}).encode()
    plugin = {"go": os.path.join(GO_PLUGINS, "host-local"), "oneshot": os.path.join(env.shims, "host-local"),
              "daemon": os.path.join(env.shims, "host-local")}
    variants = {v.name: v for v in env.variants()}

    def call(v: str, command: str, cid: str) -> tuple[float, bytes]:
        e = variants[v].env(CNI_COMMAND=command, CNI_CONTAINERID=cid, CNI_NETNS=f"/var/run/netns/{ctr}",
                            CNI_IFNAME="eth0", CNI_PATH=variants[v].cni_path)
        with netns.enter(f"/var/run/netns/{host}"):
            t = time.perf_counter()
            proc = subprocess.run([plugin[v]], input=conf, env=e, capture_output=True)
            took = time.perf_counter() - t
        if proc.returncode != 0:
            raise RuntimeError(f"{v} host-local {command}: {proc.stdout!r} {proc.stderr!r}")
        return took, proc.stdout

    def step(v: str, r: int) -> float:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(netdir, "last_reserved_ip.0"))
        took, out = call(v, "ADD", f"hl{r}")
        got = json.loads(out)["ips"][0]["address"]
        want = 0x0A400002 + reserved
        assert got.split("/")[0] == f"{want >> 24}.{(want >> 16) & 255}.{(want >> 8) & 255}.{want & 255}", got
        call(v, "DEL", f"hl{r}")
        return took

    values = paired(rounds, list(variants), step)
    env.del_ns(ctr)
    env.del_ns(host)
    shutil.rmtree(data, ignore_errors=True)
    return Row(f"(d) host-local ADD, {reserved} taken in a /16", "s", values, "one-shot <= 0.9")


def settle(namespaces: list[str], quiet: float = 10.0, limit: float = 180.0) -> None:
    """Wait for the kernel to finish with freshly made interfaces before timing anything.

    Each new interface starts IPv6 duplicate address detection, router solicitations and MLD
    reports; their timers take the RTNL lock, so for some seconds after a thousand interfaces
    appear every netlink request waits behind them. The probe should see 1,000 containers
    present, not 1,000 containers still settling — and Go's fill would otherwise have had our
    fill's duration to settle while ours had none. Done when no address is tentative anywhere,
    plus ``quiet`` seconds for the solicitation and report timers.
    """
    t = time.perf_counter()
    while time.perf_counter() - t < limit:
        busy = [ns for ns in namespaces if subprocess.run(["ip", "-n", ns, "-6", "addr", "show", "tentative"],
                                                           capture_output=True, text=True).stdout.strip()]
        if not busy:
            break
        time.sleep(1)
    time.sleep(quiet)
    log(f"(e) interfaces settled after {time.perf_counter() - t:.0f} s")


def case_scale(env: Env, n: int, rounds: int, workers: int) -> list[Row]:
    """(e): ADD latency with n-1 containers (and as many port mappings) on the bridge vs with none."""
    vs = {v.name: v for v in env.variants()}
    go_net = make_net(env, vs["go"], "bridge", "scgo", "10.65.0.0/16")
    ours_host = env.new_ns("scoursh")
    ours = {name: make_net(env, vs[name], "bridge", "scours", "10.65.0.0/16", host=ours_host)
            for name in ("oneshot", "daemon")}
    # one-shot and daemon share the host namespace and the state (our plugins either way)
    ours["daemon"].conf_dir = ours["oneshot"].conf_dir
    ours["daemon"].cache = ours["oneshot"].cache
    nets = {"go": go_net, **ours}
    warm_ctr = env.new_ns("scwarm")
    for name in ("go", "oneshot"):  # bridge creation and first-use costs out of the way
        nets[name].run("add", "warm", warm_ctr, port=9999)
        nets[name].run("del", "warm", warm_ctr, port=9999)
    env.del_ns(warm_ctr)

    probed: list[str] = []

    def probe(v: str, r: int) -> float:
        # A new container is a new namespace. (Reusing one old namespace would also time the
        # kernel's sysctl lookups there, which walk past the /proc/sys entries of every
        # namespace made since: ~0.15 ms per open with 1,000 containers, for any plugin.)
        # They are deleted after the round of probes: the kernel tears a namespace down in
        # the background, holding the RTNL lock the next probe needs.
        ctr = env.new_ns("scprobe")
        probed.append(ctr)
        took = nets[v].run("add", f"probe{r}", ctr, "eth0", port=9998)
        nets[v].run("del", f"probe{r}", ctr, "eth0", port=9998)
        return took

    def delete_probed() -> None:
        for ctr in probed:
            env.del_ns(ctr)
        probed.clear()

    def floor(phase: str) -> list[float]:
        # The same ADD's kernel work alone (bench/breakdown.py) in our host namespace, beside
        # what the containers there put in the kernel: what no implementation can avoid.
        from breakdown import floor_add, floor_del

        iptables.keep_sessions()
        try:
            times = []
            for r in range(rounds):
                ctr = env.new_ns("scfloor")
                probed.append(ctr)
                ip, tag = f"10.65.250.{10 + r}/16", f"SCFLOOR-{phase}-{r}"
                # The first NAT rule after the last one went waits ~10 ms in the kernel (its NAT
                # hooks are registered again) unless ~10 ms have passed: not work, so not timed.
                time.sleep(0.05)
                times.append(floor_add(ours_host, ctr, ip, "10.65.0.1", tag))
                floor_del(ours_host, ctr, ip, tag)
            return times
        finally:
            iptables.keep_sessions(False)
            restore_session.close_idle()

    first = paired(rounds, list(nets), probe)
    floor_first = floor("first")
    delete_probed()
    log(f"(e) filling {n - 1} containers per implementation ({workers} at a time)")
    bulk: list[str] = []

    def fill(net: Net) -> None:
        # One namespace per container, as on a real node. (Hundreds of interfaces in one
        # namespace would make every broadcast the bridge floods cost a route lookup past all
        # of them there: load no real node has, for any plugin.)
        def one(i: int) -> None:
            ctr = env.new_ns("bulk")
            bulk.append(ctr)
            net.run("add", f"fill{i}", ctr, "eth0", port=20000 + i)
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, range(n - 1)))

    t = time.perf_counter()
    fill(nets["go"])
    log(f"(e) Go fill took {time.perf_counter() - t:.0f} s")
    t = time.perf_counter()
    fill(nets["daemon"])
    log(f"(e) ours (daemon) fill took {time.perf_counter() - t:.0f} s")
    settle([go_net.host, ours_host, *bulk])
    nth = paired(rounds, list(nets), probe)
    floor_nth = floor("nth")
    delete_probed()
    rows = [Row("(e) ADD latency, 1st container", "s", first),
            Row(f"(e) ADD latency, {n}th container ({n - 1} port mappings)", "s", nth)]
    growth = {v: [statistics.median(nth[v]) / statistics.median(first[v])] for v in nets}
    f1, fn = statistics.median(floor_first) * 1e3, statistics.median(floor_nth) * 1e3
    d1 = statistics.median(first["daemon"]) * 1e3
    rows.append(Row(f"(e) {n}th / 1st (growth, not ours/Go)", "x", growth, "ours <= 1.2",
                    note="the growth row's 'ratio' columns divide by Go's growth. The same ADD's kernel "
                    f"work alone (the floor, in our host namespace): {f1:.1f} ms at the 1st container, "
                    f"{fn:.1f} ms at the {n}th: +{fn - f1:.1f} ms, {(fn - f1) / d1:.2f} of our daemon's "
                    f"1st ADD ({d1:.1f} ms)"))
    for b in bulk:
        env.del_ns(b)
    env.del_ns(go_net.host)
    env.del_ns(ours_host)
    return rows


def case_version(env: Env, rounds: int, calls: int = 50) -> list[Row]:
    """(v) VERSION, which runtimes ask of every plugin before using a network: per call, the
    bridge executable spawned with the stdin the Go libcni sends (no runtime in the timing),
    then the Go libcni's ValidateNetworkList over podman's default chain (4 plugins)."""
    stdin_file = os.path.join(env.tmp, "version-stdin.json")
    with open(stdin_file, "w") as f:
        f.write('{"cniVersion":"1.0.0"}')
    variants = {v.name: v for v in env.variants()}

    def spawn_version(v: str, r: int) -> float:
        exe = os.path.join(variants[v].cni_path, "bridge")
        envb = {**variants[v].env(), "CNI_COMMAND": "VERSION", "CNI_NETNS": "dummy", "CNI_IFNAME": "dummy",
                "CNI_PATH": "dummy"}
        total = 0.0
        with open(stdin_file, "rb") as stdin, open(os.devnull, "wb") as out:
            for _ in range(calls):
                stdin.seek(0)
                actions = [(os.POSIX_SPAWN_DUP2, stdin.fileno(), 0), (os.POSIX_SPAWN_DUP2, out.fileno(), 1)]
                t = time.perf_counter()
                pid = os.posix_spawn(exe, [exe], envb, file_actions=actions)
                _, status = os.waitpid(pid, 0)
                total += time.perf_counter() - t
                if status != 0:
                    raise RuntimeError(f"{v} VERSION failed (status {status:#x})")
        return total / calls

    conf_dir = conflist(os.path.join(env.tmp, "version", "net.d"), "podman", [
        {"type": "bridge", "bridge": "cni-podman0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]]}},
        {"type": "portmap", "capabilities": {"portMappings": True}}, {"type": "firewall"}, {"type": "tuning"}])

    def validate(v: str, r: int) -> float:
        cmd = [env.tool, "-confdir", conf_dir, "-net", "podman", "-path", variants[v].cni_path, "validate"]
        total = 0.0
        for _ in range(calls // 5):
            t = time.perf_counter()
            proc = subprocess.run(cmd, env=variants[v].env(), capture_output=True)
            total += time.perf_counter() - t
            if proc.returncode != 0:
                raise RuntimeError(f"{v} validate failed: {proc.stdout!r} {proc.stderr!r}")
        return total / (calls // 5)

    names = list(variants)
    return [Row("(v) VERSION of bridge, spawned alone", "s", paired(rounds, names, spawn_version), "<= 0.5"),
            Row("(v) libcni ValidateNetworkList, 4 plugins", "s", paired(rounds, names, validate))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and smaller sizes (a couple of minutes)")
    p.add_argument("--rounds", type=int, help="measured rounds per case (default 9, quick 3)")
    p.add_argument("--only", default="a,b,c,d,e,v,p", help="comma-separated cases to run (default: all)")
    p.add_argument("--parallel", type=int, default=32, help="containers in case (c) (default 32)")
    p.add_argument("--reserved", type=int, help="addresses taken in case (d) (default 20000; full: 60000)")
    p.add_argument("--containers", type=int, help="containers on the bridge in case (e) (default 200; full: 1000)")
    p.add_argument("--full", action="store_true", help="full sizes: --reserved 60000 --containers 1000")
    p.add_argument("--fill-workers", type=int, default=4, help="concurrent ADDs while filling case (e)")
    p.add_argument("--json", help="also write the raw numbers here")
    p.add_argument("--masq-backend", choices=("iptables", "nftables"),
                   help="ipMasqBackend for our bridge/ptp (default: the plugin's own choice; Go ignores it)")
    p.add_argument("--daemon-workers", type=int, help="pycni daemon --workers (default: its own, one per CPU)")
    p.add_argument("--snapshot", action="store_true",
                   help="benchmark the committed tree (git HEAD) rather than the working tree")
    opts = p.parse_args(argv)
    global MASQ_BACKEND
    MASQ_BACKEND = opts.masq_backend
    rounds = opts.rounds or (3 if opts.quick else 9)
    reserved = opts.reserved or (60000 if opts.full else 2000 if opts.quick else 20000)
    containers = opts.containers or (1000 if opts.full else 50 if opts.quick else 200)
    only = set(opts.only.split(","))
    rows: list[Row] = []
    started = time.perf_counter()
    with bench_env(opts.daemon_workers) as env:
        log(f"Go libcni driver {env.tool}; our shims in {env.shims}; daemon on {env.socket}")
        if "a" in only:
            log("(a) bridge cycle")
            rows.extend(case_cycle(env, "bridge", rounds, "10.60.0.0/16"))
            rows.append(case_runtime_cycle(env, rounds))
        if "b" in only:
            for kind, net in (("ptp", "10.66.0.0/16"), ("macvlan", "10.67.0.0/16")):
                log(f"(b) {kind} cycle")
                rows.extend(case_cycle(env, kind, rounds, net))
        if "c" in only:
            log(f"(c) {opts.parallel} parallel ADDs")
            rows.extend(case_parallel(env, max(2, rounds // 3), opts.parallel))
        if "d" in only:
            log(f"(d) host-local with {reserved} taken")
            rows.append(case_host_local(env, rounds, reserved))
        if "e" in only:
            log(f"(e) {containers} containers on one bridge")
            rows.extend(case_scale(env, containers, rounds, opts.fill_workers))
        if "v" in only:
            log("(v) VERSION")
            rows.extend(case_version(env, rounds))
        if "p" in only:
            log("(p) profile of (a) and its floor")
            from breakdown import profile

            report = profile(env, rounds)
    print()
    print(f"pycni vs Go reference plugins (both under the Go libcni), medians; ratio = ours / Go; "
          f"{rounds} rounds; our ipMasqBackend: {MASQ_BACKEND or 'default'}; "
          f"run took {time.perf_counter() - started:.0f} s")
    print(table(rows))
    if "p" in only:
        print("\nWhere (a)'s milliseconds go (bench/breakdown.py):\n" + report)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump([{"case": r.case, "unit": r.unit, "values": r.values} for r in rows], f, indent=1)
    return 0


def run_snapshot(argv: list[str]) -> int:
    """Export git HEAD's src/ and tests/ to a temporary tree and run the bench from it."""
    tree = tempfile.mkdtemp(prefix="pycni-bench-tree-")
    try:
        archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD", "src", "tests"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        args = [a for a in argv if a != "--snapshot"]
        return subprocess.run([sys.executable, os.path.abspath(__file__), *args],
                              env=dict(os.environ, PYCNI_BENCH_TREE=tree)).returncode
    finally:
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    try:
        if "--snapshot" in sys.argv[1:] and not os.environ.get("PYCNI_BENCH_TREE"):
            sys.exit(run_snapshot(sys.argv[1:]))
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
