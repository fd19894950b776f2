"""BGP mode's convergence: from a new pod's ADD (on a block of its own) to the first reply it
gets, from a host outside the cluster (behind an FRR router) and from a pod on another node;
beside host-gw's convergence on the same machine (pod on another node only: in host-gw mode an
outside host has no route to pods at all).

    .venv/bin/python bench/bgp.py [--rounds 20]

Everything runs in throwaway namespaces (tests/bgp_util.py's lab: three nodes with one etcd
member each, FRR as the top-of-rack, an external host). Each round ADDs a routed +
cluster-ipam pod with a block size of one address, so every ADD claims a new block that must
travel etcd -> agents -> (bgp) BIRD -> BGP -> the router's kernel. The clock starts just before
the ADD; the probe is a ping every 5 ms started when the ADD returns, and the first reply's
kernel timestamp (``ping -D``) ends it. The BGP timers are the tests' (keepalive 1 s, hold 3 s;
FRR's datacenter defaults: no advertisement interval).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

from bgp_util import ROUTER_AS, running_lab, wait  # noqa: E402

from pycni.install_plugins import install  # noqa: E402


def first_reply(ns: str, ip: str, timeout: float = 10.0) -> float:
    """Wall-clock time of the first echo reply ``ip`` sends to a ping from namespace ``ns`` (a ping
    every 5 ms; ping gives up at the first "unreachable" the router answers while it has no route
    yet, so it is started again until the deadline)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "ping", "-D", "-n", "-i", "0.005", "-w",
                                 str(int(timeout)), ip], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if "bytes from" in line:
                    return float(line.split("]")[0].lstrip("["))
        finally:
            proc.kill()
            proc.wait()
    raise RuntimeError(f"no reply from {ip} within {timeout:g}s")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def run_mode(mode: str, rounds: int, subnet: str, plugin_dir: str) -> dict[str, list[float]]:
    tmp = Path(tempfile.mkdtemp(prefix="pb35-bench-"))
    out: dict[str, list[float]] = {"external": [], "pod": []}
    try:
        with running_lab(tmp, plugin_dir, subnet, "/pb35bench") as lab:
            n1, n2, _ = lab.nodes
            if mode == "bgp":
                lab.pycni("bgp", "peer", "add", "tor", "--peer-ip", lab.tor.ip, "--as-number", str(ROUTER_AS))
            for n in lab.nodes:
                n.start_agent(mode)
            if mode == "bgp":
                for n in lab.nodes:
                    wait(lambda n=n: len(n.established()) == 3, f"{n.name} sessions", timeout=60)
            n2.add_pod("probe", block=32)
            probe_ns = n2.pods["probe"][0].name
            time.sleep(2)
            for i in range(rounds + 1):
                t0 = time.time()
                ip = n1.add_pod(f"p{i}", block=32)
                with ThreadPoolExecutor(2) as pool:  # both probes at once
                    pod_f = pool.submit(first_reply, probe_ns, ip)
                    ext_f = pool.submit(first_reply, lab.tor.ext.name, ip) if mode == "bgp" else None
                    pod = pod_f.result() - t0
                    ext = ext_f.result() - t0 if ext_f is not None else 0.0
                if i:  # the first round warms caches: discarded
                    out["pod"].append(pod)
                    if mode == "bgp":
                        out["external"].append(ext)
                print(f"  {mode} round {i}: pod on another node {pod * 1000:.0f} ms"
                      + (f", external host {ext * 1000:.0f} ms" if mode == "bgp" else ""), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    plugin_dir = tempfile.mkdtemp(prefix="pb35-bench-bin-")
    try:
        install(plugin_dir)
        bgp = run_mode("bgp", args.rounds, "10.234.0.0/24", plugin_dir)
        hgw = run_mode("host-gw", args.rounds, "10.235.0.0/24", plugin_dir)
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"\nADD started -> first reply, {args.rounds} pods each on a new block (load average {load:.1f}):")
    print(f"{'':40} {'p50':>8} {'p99':>8} {'max':>8}")
    for label, values in (("bgp: external host (behind FRR)", bgp["external"]),
                          ("bgp: pod on another node", bgp["pod"]),
                          ("host-gw: pod on another node", hgw["pod"])):
        print(f"{label:40} {pct(values, 0.5) * 1000:7.0f}ms {pct(values, 0.99) * 1000:7.0f}ms "
              f"{max(values) * 1000:7.0f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
