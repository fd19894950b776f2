"""Flows: what logging costs the collector and the forwarding path (docs/flows.md, issue 36).

    .venv/bin/python bench/flows.py [--rates 1000,5000] [--seconds 5] [--iperf-runs 3]

Everything runs in throwaway namespaces (tests/flows_util.py): client A, router R, server B;
R's forward hook holds the flows table of the tests (``ct state established,related accept``
first, then rules that ``log group N`` with a ``limit rate`` and accept or drop).

(A) Collector CPU per 1,000 logged flows a second: a process in A sends UDP datagrams to a
    logged-and-dropped port of B at a paced rate (each one a new flow: conntrack never confirms
    a dropped packet); the collector (NFLOG reader + resolver + ring, in this process, with a
    test resolver as the engine would give) reads them. Measured: this process's CPU (user +
    system) over the run divided by thousands of flows kept: the share of a CPU the collector
    keeps busy at 1,000 flows a second (the sender is another process). The ring's
    rate limit is set above the offered rate, so every flow takes the whole path.
(B) Forwarding throughput with and without the logging rules: iperf3 TCP from A to B through
    R, 2 s a run, three variants alternated (none, the table without its log rules, the table
    with them; then backwards) so load hits all alike; the median of each. What logging costs is
    the last against the second; the first shows what any table (and conntrack) costs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

from flows_util import A4, B4, TABLE, Trio, log_table, trio  # noqa: E402

from pycni.cluster.flows.collector import Collector  # noqa: E402
from pycni.cluster.flows.model import Resolver, Ring  # noqa: E402

GROUP = 38


def log(msg: str) -> None:
    sys.stderr.write(f"[flows bench {time.strftime('%H:%M:%S')}] {msg}\n")


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def generate(net: Trio, rate: int, seconds: float) -> subprocess.Popen[str]:
    """A sender in A: ``rate`` new UDP flows a second to B:5353 (logged, then dropped) for ``seconds``."""
    code = f"""
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rate, total = {rate}, int({rate} * {seconds})
start = time.monotonic()
for i in range(total):
    s.sendto(b"x", ("{B4}", 5353))
    if i % 20 == 19:
        ahead = start + (i + 1) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
print(time.monotonic() - start)
"""
    return subprocess.Popen(["ip", "netns", "exec", net.a.name, sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True)


def collector_cpu(net: Trio, rate: int, seconds: float) -> tuple[float, int, int]:
    """(CPU seconds per 1,000 flows, flows kept, kernel overruns) at ``rate`` flows/s."""
    ring = Ring(capacity=10_000, rate=rate * 4.0)
    pods = {A4: "client/a", B4: "prod/b"}
    col = Collector(ring, Resolver(policy={"p_0123456789_in": "prod/allow-web"}.get, pod=pods.get), GROUP,
                    netns=net.r.path)
    col.start()
    try:
        time.sleep(0.5)
        c0, t0 = cpu(), time.monotonic()
        sender = generate(net, rate, seconds)
        out, _ = sender.communicate(timeout=seconds * 10 + 30)
        time.sleep(0.6)  # the last batch (the reader's batch timeout is 0.1 s)
        c1, t1 = cpu(), time.monotonic()
    finally:
        col.stop()
    sent_for = float(out.strip() or seconds)
    kept = ring.dropped + len(ring)
    achieved = kept / sent_for
    log(f"(A) offered {rate}/s for {sent_for:.2f} s; kept {kept} flows ({achieved:.0f}/s), "
        f"{col.packets} read, {col.overruns} overruns; CPU {c1 - c0:.3f} s over {t1 - t0:.2f} s")
    return (c1 - c0) / kept * 1000, kept, col.overruns  # CPU seconds per 1,000 flows = CPUs busy at 1,000/s


def iperf(net: Trio) -> float:
    server = subprocess.Popen(["ip", "netns", "exec", net.b.name, "iperf3", "-s", "-1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = net.a.run(["iperf3", "-c", B4, "-t", "2", "-J"], timeout=60).stdout
    finally:
        server.kill()
        server.wait()
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"])


def _without_log(table: str) -> str:
    """The same table with its log rules left out: what the rules alone cost, logging aside."""
    return "\n".join(line for line in table.splitlines() if " log group " not in line)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="1000,5000", help="flows a second offered in (A), comma-separated")
    p.add_argument("--seconds", type=float, default=5.0, help="how long each rate of (A) is offered")
    p.add_argument("--iperf-runs", type=int, default=3, help="iperf3 runs with and without logging in (B)")
    opts = p.parse_args()
    rows: list[tuple[str, str]] = []
    with trio() as net:
        net.nft(log_table(GROUP, rate="100000/second"))
        for rate in (int(r) for r in opts.rates.split(",")):
            per_k, _kept, overruns = collector_cpu(net, rate, opts.seconds)
            rows.append((f"(A) collector CPU per 1,000 flows/s, offered {rate}/s",
                         f"{per_k * 100:.1f} % of a CPU" + (f" ({overruns} overruns)" if overruns else "")))
        base: list[float] = []
        logged: list[float] = []
        col = Collector(Ring(), Resolver(), GROUP, netns=net.r.path)  # bound, as on a node: the log path is live
        col.start()
        try:
            plain: list[float] = []
            tables = {"none": ("", base), "plain": (_without_log(log_table(GROUP)), plain),
                      "logging": (log_table(GROUP), logged)}
            order = ["none", "plain", "logging", "logging", "plain", "none"] * ((opts.iperf_runs + 1) // 2)
            for variant in order[:opts.iperf_runs * 3]:
                net.r.run(["nft", "delete", "table", "inet", TABLE], check=False)
                text, into = tables[variant]
                if text:
                    net.nft(text)
                into.append(iperf(net))
        finally:
            col.stop()
        b, pl, w = statistics.median(base), statistics.median(plain), statistics.median(logged)
        log("(B) runs, Gbit/s: no table " + " ".join(f"{x / 1e9:.2f}" for x in base)
            + "; table without log rules " + " ".join(f"{x / 1e9:.2f}" for x in plain)
            + "; logging table " + " ".join(f"{x / 1e9:.2f}" for x in logged))
        rows += [("(B) iperf3 A -> B through R, no table", f"{b / 1e9:.2f} Gbit/s"),
                 ("(B) iperf3, the table without its log rules", f"{pl / 1e9:.2f} Gbit/s"),
                 ("(B) iperf3 with the logging table", f"{w / 1e9:.2f} Gbit/s"),
                 ("(B) logging / the same table without it", f"{100 * w / pl:.1f} %"),
                 ("(B) logging table / no table", f"{100 * w / b:.1f} %")]
    rows.append(("load average (1 min) at the end", f"{os.getloadavg()[0]:.1f}"))
    width = max(len(n) for n, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
