"""pycni against the Go reference plugins under a real runtime (podman), in one run.

``bash scripts/bench --runtimes`` (or ``.venv/bin/python bench/runtimes.py``). Three runtime
hosts (tests/runtime_host.py: each its own network, mount and PID namespaces, scratch
/etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /run and container storage) differ only in
what their /opt/cni/bin holds:

* ``go``       — the Go reference plugins (Debian's containernetworking-plugins, /usr/lib/cni);
* ``oneshot``  — ours (``pycni install-plugins``), no daemon: each call a fresh interpreter;
* ``daemon``   — the same, with ``pycni daemon`` listening on its default socket
  /run/pycni/pycni.sock (the host's private /run): no environment tells the plugins where it is.

Cases: podman ``run -d -p`` + ``rm -f`` of one container (a bridge network with portmap,
firewall and tuning, as ``podman network create`` writes it); ``podman network ls`` with 5
networks (podman asks every plugin of every network for VERSION); a plugin's VERSION on its
own. Variants alternate within every round, the first round is discarded, the table reports
medians and ours/Go. Everything is removed at the end, on Ctrl-C and on SIGTERM. Needs root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]

from run import Row, log, paired, table  # noqa: E402
from runtime_host import IMAGE, RuntimeHost, busybox_rootfs, missing  # noqa: E402

PYCNI = os.path.join(os.path.dirname(sys.executable), "pycni")
VARIANTS = ("go", "oneshot", "daemon")


@contextlib.contextmanager
def hosts(tmp: Path) -> Iterator[dict[str, RuntimeHost]]:
    """One runtime host per variant, the image imported in each; all closed at the end."""
    made: dict[str, RuntimeHost] = {}
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        rootfs = busybox_rootfs(tmp)
        for v in VARIANTS:
            scratch = tmp / v
            scratch.mkdir()
            made[v] = host = RuntimeHost(scratch)
            host.podman_import(rootfs)
            if v == "go":
                host.install_go()
            else:
                host.install_ours(PYCNI)
            if v == "daemon":
                start_daemon(host)
        yield made
    finally:
        for host in made.values():
            host.close()
        signal.signal(signal.SIGTERM, old)


def start_daemon(host: RuntimeHost) -> None:
    """``pycni daemon`` on the host (its PID namespace, so peer credentials resolve)."""
    host.popen([PYCNI, "daemon"], host.scratch / "daemon.log")
    deadline = time.monotonic() + 30
    while host.run(["test", "-S", "/run/pycni/pycni.sock"], check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pycni daemon did not start: {(host.scratch / 'daemon.log').read_text()}")
        time.sleep(0.05)


def timed(host: RuntimeHost, *args: str) -> float:
    t0 = time.perf_counter()
    host.podman(*args)
    return time.perf_counter() - t0


def case_cycle(hs: dict[str, RuntimeHost], rounds: int) -> Row:
    for host in hs.values():
        host.podman("network", "create", "--subnet", "10.95.0.0/24", "benchnet")
        host.podman("run", "-d", "--name", "keep", "--network", "benchnet", IMAGE, "sleep", "1000000")

    def step(v: str, r: int) -> float:
        host = hs[v]
        return (timed(host, "run", "-d", "--name", f"cyc{r}", "--network", "benchnet", "-p", "8080:80",
                      IMAGE, "sleep", "1000000")
                + timed(host, "rm", "-f", "-t", "0", f"cyc{r}"))

    values = paired(rounds, list(VARIANTS), step)
    for host in hs.values():
        host.podman("rm", "-f", "-t", "0", "keep")
        host.podman("network", "rm", "benchnet")
    return Row("podman run -d -p + rm -f (bridge, portmap, firewall, tuning)", "s", values,
               "daemon <= 0.8, one-shot <= 1.0")


def case_network_ls(hs: dict[str, RuntimeHost], rounds: int, networks: int) -> Row:
    for host in hs.values():
        for i in range(networks):
            host.podman("network", "create", "--subnet", f"10.96.{i}.0/24", f"lsnet{i}")

    values = paired(rounds, list(VARIANTS), lambda v, r: timed(hs[v], "network", "ls"))
    for host in hs.values():
        for i in range(networks):
            host.podman("network", "rm", f"lsnet{i}")
    return Row(f"podman network ls, {networks} networks", "s", values)


def case_version(hs: dict[str, RuntimeHost], rounds: int, calls: int = 20) -> Row:
    """One plugin's VERSION, as runtimes ask it: the median of ``calls`` execs per round."""
    def step(v: str, r: int) -> float:
        script = ("t0=$(date +%s%N); for i in $(seq " + str(calls) + "); do "
                  "echo '{\"cniVersion\":\"1.0.0\"}' | CNI_COMMAND=VERSION /opt/cni/bin/bridge >/dev/null; done; "
                  "echo $(( $(date +%s%N) - t0 ))")
        return int(hs[v].sh(script).strip()) / 1e9 / calls

    return Row("bridge VERSION (exec)", "s", paired(rounds, list(VARIANTS), step), "<= 1.0")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9, help="measured rounds per case (default 9)")
    p.add_argument("--quick", action="store_true", help="3 rounds")
    p.add_argument("--networks", type=int, default=5, help="networks for `podman network ls` (default 5)")
    p.add_argument("--only", default="cycle,ls,version", help="comma-separated cases (default: all)")
    p.add_argument("--json", help="also write the raw numbers here")
    opts = p.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it creates namespaces)")
    absent = missing("podman", "runc", "conmon", "busybox", "nsenter", "unshare")
    if absent or not os.access("/usr/lib/cni/bridge", os.X_OK):
        sys.exit(f"bench: missing {absent or ['/usr/lib/cni (containernetworking-plugins)']}; run bash scripts/setup")
    rounds = 3 if opts.quick else opts.rounds
    only = set(opts.only.split(","))
    rows: list[Row] = []
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-bench-rt-"))
    try:
        with hosts(tmp) as hs:
            if "cycle" in only:
                log("podman run -d -p + rm -f")
                rows.append(case_cycle(hs, rounds))
            if "ls" in only:
                log(f"podman network ls with {opts.networks} networks")
                rows.append(case_network_ls(hs, rounds, opts.networks))
            if "version" in only:
                log("VERSION")
                rows.append(case_version(hs, rounds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    podman = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout.strip()
    print()
    print(f"pycni vs Go reference plugins under {podman} (CNI backend, runc), medians; ratio = ours / Go; "
          f"{rounds} rounds; run took {time.perf_counter() - started:.0f} s")
    print(table(rows))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump([{"case": r.case, "unit": r.unit, "values": r.values} for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
