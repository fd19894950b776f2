"""Where each millisecond of case (a) goes, and the floor: the same cycle's kernel work alone.

Case (a)'s cycle (bridge + host-local + portmap ADD, then DEL) is run here by our runtime
(pycni.runtime) in this process, the plugin calls made three ways:

* ``daemon``   — each plugin call run in this process as the daemon runs it (skel.dispatch,
  our IPAM delegate in-process, iptables through long-lived restore sessions, nftables
  through libnftables): the daemon's
  work without the socket round trip. Per call: Python (user CPU of this process), kernel
  calls (its system CPU), other processes (CPU of the tools it runs and of its restore
  sessions) and waiting (the rest of the wall time: the kernel's deferred work such as RCU
  grace periods on link deletion, sleeps for a port to come up, lock waits);
* ``one-shot`` — each plugin call its own process (our executable, no daemon), as a runtime
  execs it: wall, and CPU of that process and everything it ran (``wait4``) — plus, as
  "other processes", what it left to end alone (bench/orphans.py) — with the interpreter's
  start and the plugin module's imports measured alone beside it;
* ``floor``    — the kernel work of the cycle alone, in one process with no plugin logic:
  create the veth pair into the container, enslave and raise it, address and route it,
  commit the same iptables rules (masquerade + port mapping) through one restore session,
  then delete them and the veth. No implementation can do the cycle faster than this here.

Printed by ``bash scripts/bench`` (case ``p``); ``python bench/breakdown.py`` runs it alone.
Needs root; everything happens in throwaway namespaces, removed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC_ROOT = os.environ.get("PYCNI_BENCH_TREE") or ROOT
sys.path[:0] = [os.path.join(SRC_ROOT, "src"), os.path.join(SRC_ROOT, "tests"), os.path.dirname(__file__)]

import orphans  # noqa: E402

from pycni import invoke  # noqa: E402
from pycni.net import iptables, netns, nft, restore_session  # noqa: E402

CAP = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
Sample = dict[str, float]  # wall, python, kernel, procs (ms)


def _proc_cpu(pid: int) -> float:
    """CPU seconds a live process has used so far (schedstat: nanoseconds, not clock ticks)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _sessions_cpu() -> float:
    with restore_session._lock:
        pids = [s.pid for pool in restore_session._idle.values() for s in pool]
    return sum(_proc_cpu(p) for p in pids)


@contextlib.contextmanager
def _patched_exec(runner: Callable[[str, bytes, Mapping[str, str], float | None], bytes]) -> Iterator[None]:
    saved = invoke.exec_plugin
    invoke.exec_plugin = runner  # type: ignore[assignment]
    try:
        yield
    finally:
        invoke.exec_plugin = saved  # type: ignore[assignment]


def _call_name(path: str, env: Mapping[str, str]) -> str:
    return f"{os.path.basename(path)} {env.get('CNI_COMMAND', '')}"


def in_process_runner(samples: dict[str, list[Sample]]) -> Callable[..., bytes]:
    """exec_plugin's stand-in: the call runs here as in the daemon, and is measured."""
    from pycni.shim import run_delegate

    def run(path: str, stdin: bytes, env: Mapping[str, str], timeout: float | None = None) -> bytes:
        s0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        x0, t0 = _sessions_cpu(), time.perf_counter()
        out = run_delegate(path, stdin, env)
        wall = time.perf_counter() - t0
        s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        procs = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) + max(_sessions_cpu() - x0, 0.0)
        py, kern = s1.ru_utime - s0.ru_utime, s1.ru_stime - s0.ru_stime
        samples.setdefault(_call_name(path, env), []).append(
            {"wall": wall * 1e3, "python": py * 1e3, "kernel": kern * 1e3, "procs": procs * 1e3})
        return out

    return run


_orphans_of: list[tuple[Sample, set[int]]] = []  # one-shot calls' leftovers, not yet counted


def settle_orphans() -> None:
    """Wait for what the one-shot calls left to end alone; add its CPU to their "procs"."""
    for sample, pids in _orphans_of:
        sample["procs"] += orphans.wait(pids) * 1e3
    _orphans_of.clear()


def one_shot_runner(samples: dict[str, list[Sample]]) -> Callable[..., bytes]:
    """exec_plugin's stand-in: the executable as a process (no daemon), measured with wait4."""

    def run(path: str, stdin: bytes, env: Mapping[str, str], timeout: float | None = None) -> bytes:
        ours = orphans.children()  # the daemon, when run.py runs this
        t0 = time.perf_counter()
        proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**env, "PYCNI_SOCKET": "off"})
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        out, err = proc.stdout.read(), proc.stderr.read()
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise invoke.error_from_output(path, proc.returncode, out, err)
        sample = {"wall": wall * 1e3, "python": ru.ru_utime * 1e3, "kernel": ru.ru_stime * 1e3, "procs": 0.0}
        samples.setdefault(_call_name(path, env), []).append(sample)
        # what it left to end alone (a restore after its commit, a link deletion's teardown):
        # counted once the cycle's wall time is taken (settle_orphans), not waited for here
        _orphans_of.append((sample, orphans.children() - ours))
        return out

    return run


def _startup(python: str, code: str, rounds: int) -> Sample:
    """One fresh interpreter running ``code``: medians of wall and CPU."""
    walls, users, syss = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        pid = os.posix_spawn(python, [python, "-IS", "-c", code], os.environ)
        _, _, ru = os.wait4(pid, 0)
        walls.append(time.perf_counter() - t0)
        users.append(ru.ru_utime)
        syss.append(ru.ru_stime)
    return {"wall": statistics.median(walls) * 1e3, "python": statistics.median(users) * 1e3,
            "kernel": statistics.median(syss) * 1e3, "procs": 0.0}


# ---- the floor: the kernel work alone ----------------------------------------------------------
def floor_cycle(host: str, ctr: str, i: int) -> float:
    """The cycle's kernel operations, no plugin logic, in this process: seconds."""
    ip, tag = f"10.59.0.{10 + i % 200}/16", f"FLOOR-{i}"
    return floor_add(host, ctr, ip, "10.59.0.1", tag) + floor_del(host, ctr, ip, tag)


def _floor_rules(ip: str, tag: str) -> tuple[str, str, str]:
    """The masquerade chain, its chain and the hostPort chain an ADD writes (the reference's layout)."""
    from pycni.ipaddr import ip_interface

    iface = ip_interface(ip)
    chain, dn = f"CNI-{tag}", f"CNI-DN-{tag}"
    masq = (f"*nat\n:{chain} - [0:0]\n-A {chain} -d {iface.network} -j ACCEPT\n"
            f"-A {chain} ! -d 224.0.0.0/4 -j MASQUERADE\n-A POSTROUTING -s {iface.ip} -j {chain}\nCOMMIT\n")
    pm = (f"*nat\n:{dn} - [0:0]\n-A {dn} -p tcp --dport 8080 -j DNAT --to-destination {iface.ip}:80\n"
          f"-I CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 8080 -j {dn}\nCOMMIT\n")
    return masq, pm, chain


def floor_add(host: str, ctr: str, ip: str, gw: str, tag: str, bridge: str = "cni0") -> float:
    """An ADD's kernel operations alone (veth into the container, enslave, address, route, the
    masquerade and hostPort commits), in this process: seconds. ``tag`` names its chains."""
    from pycni.ipaddr import ip_interface
    from pycni.net import addr, link, route, veth

    masq, pm, _ = _floor_rules(ip, tag)
    with netns.enter(f"/var/run/netns/{host}"):
        t0 = time.perf_counter()
        veth.setup_veth(f"/var/run/netns/{ctr}", "eth0", master=link.require_link(bridge).index)
        with netns.enter(f"/var/run/netns/{ctr}"):
            addr.add_addr("eth0", ip_interface(ip))
            link.set_link("eth0", up=True)
            route.add_route("0.0.0.0/0", gw=gw, dev="eth0")
        iptables.restore(masq)
        iptables.restore(pm)
        return time.perf_counter() - t0


def floor_del(host: str, ctr: str, ip: str, tag: str) -> float:
    """What undoes :func:`floor_add`: its rules and chains, then the veth. Seconds."""
    from pycni.ipaddr import ip_interface
    from pycni.net import link

    _, _, chain = _floor_rules(ip, tag)
    dn = f"CNI-DN-{tag}"
    with netns.enter(f"/var/run/netns/{host}"):
        t0 = time.perf_counter()
        iptables.restore(f"*nat\n-D CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 8080 -j {dn}\n"
                         f"-F {dn}\n-X {dn}\nCOMMIT\n")
        iptables.restore(f"*nat\n-D POSTROUTING -s {ip_interface(ip).ip} -j {chain}\n-F {chain}\n-X {chain}\nCOMMIT\n")
        with netns.enter(f"/var/run/netns/{ctr}"):
            link.delete_link("eth0")
        return time.perf_counter() - t0


def _floor_setup(host: str) -> None:
    for cmd in ("link add cni0 type bridge", "addr add 10.59.0.1/16 dev cni0", "link set cni0 up"):
        subprocess.run(["ip", "-n", host, *cmd.split()], check=True)
    with netns.enter(f"/var/run/netns/{host}"):
        iptables.restore("*nat\n:CNI-HOSTPORT-DNAT - [0:0]\nCOMMIT\n")


# ---- the report --------------------------------------------------------------------------------
def _median(xs: list[Sample]) -> Sample:
    return {k: statistics.median(x[k] for x in xs) for k in xs[0]}


def _fmt_rows(title: str, calls: dict[str, list[Sample]], extra: list[tuple[str, Sample]] | None = None) -> list[str]:
    lines = [title, f"  {'call':<22}{'wall':>8}{'python':>9}{'kernel':>9}{'procs':>8}{'waiting':>9}   (ms, medians)"]
    total: Sample = {"wall": 0.0, "python": 0.0, "kernel": 0.0, "procs": 0.0}
    for name, xs in [*calls.items()]:
        m = _median(xs)
        for k in total:
            total[k] += m[k]
        lines.append(_fmt_line(name, m))
    lines.append(_fmt_line("cycle (sum)", total))
    lines += [_fmt_line(name, m) for name, m in extra or []]
    return lines


def _fmt_line(name: str, m: Sample) -> str:
    wait = max(m["wall"] - m["python"] - m["kernel"] - m["procs"], 0.0)
    return f"  {name:<22}{m['wall']:8.1f}{m['python']:9.1f}{m['kernel']:9.1f}{m['procs']:8.1f}{wait:9.1f}"


def profile(env: Any, rounds: int) -> str:
    """Run the three profiles in ``env`` (bench/run.py's Env); the report as text."""
    from run import Variant, make_net

    from pycni.runtime import CNI

    out: list[str] = []
    v = Variant("oneshot", env.shims, "off")
    for mode, make_runner in (("daemon", in_process_runner), ("one-shot", one_shot_runner)):
        net = make_net(env, v, "bridge", f"p{mode[0]}", "10.58.0.0/16")
        rt = CNI(conf_dir=net.conf_dir, plugin_path=[env.shims], cache_dir=net.cache, env=v.env())
        conf = rt.load_network(net.name)
        samples: dict[str, list[Sample]] = {}
        walls: list[float] = []
        iptables.keep_sessions(mode == "daemon")  # as the daemon runs them: sessions, libnftables
        nft.use_library(mode == "daemon")
        try:
            for r in range(rounds + 1):
                ctr = env.new_ns("pctr")
                run: dict[str, list[Sample]] = {}
                try:
                    with _patched_exec(make_runner(run)), netns.enter(f"/var/run/netns/{net.host}"):
                        t0 = time.perf_counter()
                        rt.add(conf, f"p{r}", f"/var/run/netns/{ctr}", "eth0", capability_args=CAP)
                        rt.delete(conf, f"p{r}", f"/var/run/netns/{ctr}", "eth0", capability_args=CAP)
                        wall = time.perf_counter() - t0
                    settle_orphans()
                finally:
                    env.del_ns(ctr)
                if r:  # the first round warms up (imports, sessions)
                    walls.append(wall * 1e3)
                    for k, xs in run.items():
                        samples.setdefault(k, []).extend(xs)
        finally:
            iptables.keep_sessions(False)
            nft.use_library(False)
            restore_session.close_idle()
            env.del_ns(net.host)
        extra: list[tuple[str, Sample]] = [("cycle (wall, runtime)", {"wall": statistics.median(walls),
                                                                      "python": 0, "kernel": 0, "procs": 0})]
        if mode == "one-shot":
            py = sys.executable
            base = _startup(py, "pass", rounds * 2)
            extra.append(("  python -IS start", base))
            imp = _startup(py, f"import sys; sys.path[:0] = {json.dumps([os.path.join(SRC_ROOT, 'src')])}; "
                           "import pycni.shim, pycni.skel, pycni.plugins.main.bridge", rounds * 2)
            extra.append(("  + bridge's imports", {k: imp[k] - base[k] for k in imp}))
        title = {"daemon": "daemon: each call in-process as the daemon runs it (no socket round trip)",
                 "one-shot": "one-shot: each call a process (wait4: CPU of it and what it ran; "
                 "procs: what it left to end alone)"}[mode]
        out += _fmt_rows(title, samples, extra) + [""]
    # the floor
    host = env.new_ns("pfloor")
    try:
        _floor_setup(host)
        iptables.keep_sessions()
        times = []
        for r in range(rounds + 1):
            ctr = env.new_ns("pfctr")
            try:
                t = floor_cycle(host, ctr, r)
            finally:
                env.del_ns(ctr)
            if r:
                times.append(t * 1e3)
    finally:
        iptables.keep_sessions(False)
        restore_session.close_idle()
        env.del_ns(host)
    out.append(f"floor: the cycle's kernel work alone in one process (veth into the container, enslave, "
               f"address, route, 4 restore commits, delete): {statistics.median(times):.1f} ms median")
    return "\n".join(out)


def main() -> int:
    from run import bench_env

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    with bench_env() as env:
        print(profile(env, rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
