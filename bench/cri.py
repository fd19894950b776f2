"""The Kubernetes pod cycle under containerd's CRI: pycni against the Go reference plugins, in one run.

``bash scripts/bench --cri`` (or ``.venv/bin/python bench/cri.py``). A CRI v1 client
(tests/cri/) plays kubelet: RunPodSandbox, StopPodSandbox, RemovePodSandbox of one pod, over
containerd 1.6's CRI socket. Three runtime hosts (tests/runtime_host.py: each its own
network, mount and PID namespaces, scratch /etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /run
and containerd state, a containerd with its CRI plugin) differ only in /opt/cni/bin:

* ``go``       — the Go reference plugins (Debian's containernetworking-plugins, /usr/lib/cni);
* ``oneshot``  — ours (``pycni install-plugins``), no daemon;
* ``daemon``   — the same, with ``pycni daemon`` on its default socket /run/pycni/pycni.sock;
* with ``--base PYCNI``, ``base`` and ``base-daemon`` — the same two with another tree's pycni
  command, so a change is measured against the tree it started from in one run.

The network is the kubeadm-like conflist of tests/test_cri.py (bridge + host-local v4/v6,
portmap, bandwidth); go-cni also runs the loopback network, at the same time as it. A pod is
plain (as most pods: portmap and bandwidth are called with no capability), then one with a
hostPort and bandwidth annotations (``--pods`` chooses). Variants alternate within every
round, the first round is discarded; the table reports medians and ours/Go.

Then, unless ``--no-calls``, a separate pass wraps every plugin in /opt/cni/bin in a shell
script that logs when each call starts and ends (it adds a fork of ``date`` on each side, so
these passes are not timed in the table): each plugin call a pod cycle makes, how many, and
its median wall time, per variant. IPAM is not wrapped (the daemon runs a delegate in-process
only when the executable is ours): bridge's time includes its host-local. Needs root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]

from cri.client import CRIClient, Pod, Port  # noqa: E402
from cri.kubeadm import CONFLIST, SANDBOX_CMD, SANDBOX_IMAGE, kubeadm_conflist  # noqa: E402
from run import Row, fmt, log, paired, table  # noqa: E402
from runtime_host import RuntimeHost, busybox_rootfs, missing  # noqa: E402

PYCNI = os.path.join(os.path.dirname(sys.executable), "pycni")
CALL_LOG = "/run/cr-calls.log"
# a plugin wrapped for the calls pass: the real one moved to /opt/cni/real (same base name)
WRAPPER = """#!/bin/sh
s=$(date +%%s%%N)
/opt/cni/real/%(name)s "$@"
rc=$?
e=$(date +%%s%%N)
echo "%(name)s $CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $s $e $rc" >> """ + CALL_LOG + """
exit $rc
"""


class Node:
    """One runtime host with containerd's CRI, the sandbox image and the network."""

    def __init__(self, host: RuntimeHost, variant: str) -> None:
        self.host, self.variant = host, variant
        self.cri = CRIClient(host.outside_path("/run/containerd/containerd.sock"))

    def pod(self, name: str, hostport: bool) -> Pod:
        if not hostport:
            return Pod(name=name, cgroup_parent=f"/{self.host.ctr_namespace}")
        return Pod(name=name, cgroup_parent=f"/{self.host.ctr_namespace}", ports=[Port(80, 18080)],
                   annotations={"kubernetes.io/ingress-bandwidth": "100M", "kubernetes.io/egress-bandwidth": "100M"})


@contextlib.contextmanager
def nodes(tmp: Path, pycni: dict[str, str]) -> Iterator[dict[str, Node]]:
    """One CRI host per variant (``pycni``: the pycni command of each of ours); all closed at the
    end (also on Ctrl-C and SIGTERM)."""
    made: dict[str, Node] = {}
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        rootfs = busybox_rootfs(tmp)
        for v in ("go", *pycni):
            scratch = tmp / v
            scratch.mkdir()
            host = RuntimeHost(scratch)
            try:
                if v == "go":
                    host.install_go()
                else:
                    host.install_ours(pycni[v])
                host.path(CONFLIST).write_text(kubeadm_conflist())
                host.start_containerd(host.cri_config(SANDBOX_IMAGE))
                host.import_image(rootfs, SANDBOX_IMAGE, SANDBOX_CMD)
                if v.endswith("daemon"):
                    host.start_pycni_daemon(pycni[v])
                made[v] = Node(host, v)
            except BaseException:
                host.close()
                raise
            made[v].cri.wait_ready()
        yield made
    finally:
        for node in made.values():
            with contextlib.suppress(Exception):
                for sandbox in node.cri.list():
                    node.cri.stop_remove(sandbox.id)
            node.cri.close()
            node.host.close()
        signal.signal(signal.SIGTERM, old)


def case_cycle(ns: dict[str, Node], rounds: int, hostport: bool) -> list[Row]:
    """RunPodSandbox + StopPodSandbox + RemovePodSandbox of one pod (with one pod kept running)."""
    for node in ns.values():
        if not node.cri.list():
            node.cri.run_pod(node.pod("keep", False))
    phases: dict[str, dict[str, list[float]]] = {p: {v: [] for v in ns} for p in ("run", "stop", "remove")}

    def step(v: str, r: int) -> float:
        node = ns[v]
        t0 = time.perf_counter()
        sid = node.cri.run_pod(node.pod(f"cyc{r}{'h' if hostport else ''}", hostport))
        t1 = time.perf_counter()
        node.cri.stop(sid)
        t2 = time.perf_counter()
        node.cri.remove(sid)
        t3 = time.perf_counter()
        if r >= 1:  # paired's warm-up round
            for p, x in zip(("run", "stop", "remove"), (t1 - t0, t2 - t1, t3 - t2), strict=True):
                phases[p][v].append(x)
        return t3 - t0

    values = paired(rounds, list(ns), step)
    what = "pod with hostPort + bandwidth annotations" if hostport else "plain pod"
    return [Row(f"CRI RunPodSandbox+Stop+Remove ({what})", "s", values, "daemon <= 0.6, one-shot <= 1.0"),
            Row("  of which RunPodSandbox", "s", phases["run"]),
            Row("  of which StopPodSandbox", "s", phases["stop"]),
            Row("  of which RemovePodSandbox", "s", phases["remove"])]


CHAIN = ("loopback", "bridge", "portmap", "bandwidth")  # what go-cni runs; IPAM stays unwrapped


def wrap_plugins(host: RuntimeHost) -> None:
    """The chain's plugins in /opt/cni/bin replaced by WRAPPER around themselves (moved to
    /opt/cni/real). IPAM is left alone: the daemon runs a delegate in-process only when the
    executable is ours, so a wrapped host-local would change what is measured."""
    script = " && ".join(
        ["mkdir -p /opt/cni/real"]
        + [f"cp -a /opt/cni/bin/{n} /opt/cni/real/{n} && cat > /opt/cni/bin/{n} <<'EOF'\n{WRAPPER % {'name': n}}EOF\n"
           f"chmod 755 /opt/cni/bin/{n}" for n in CHAIN])
    host.sh(script)


PHASES = ("RunPodSandbox", "StopPodSandbox", "RemovePodSandbox")


def case_calls(ns: dict[str, Node], rounds: int, hostport: bool) -> str:
    """Each plugin call of a pod cycle, by the CRI call it happened in: count per cycle, median
    wall time; and how many loopback calls overlapped the main network's (go-cni runs them at
    once)."""
    lines = ["| variant | CRI call | plugin call | calls per cycle | median wall time | total per cycle |",
             "|---|---|---|---|---|---|"]
    for v, node in ns.items():
        wrap_plugins(node.host)
        node.host.sh(f"rm -f {CALL_LOG}")
        bounds: list[tuple[int, str]] = []  # (end of a CRI call, its name), wall clock of every namespace
        for r in range(rounds):
            sid = node.cri.run_pod(node.pod(f"calls{r}", hostport))
            bounds.append((time.time_ns(), PHASES[0]))
            node.cri.stop(sid)
            bounds.append((time.time_ns(), PHASES[1]))
            node.cri.remove(sid)
            bounds.append((time.time_ns(), PHASES[2]))
        calls: dict[tuple[str, str, str], list[float]] = {}
        spans: list[tuple[str, int, int]] = []
        for line in node.host.sh(f"cat {CALL_LOG}").splitlines():
            name, cmd, _cid, ifname, s, e, _rc = line.split()
            phase = next((p for end, p in bounds if int(e) <= end), "?")
            calls.setdefault((phase, name, cmd), []).append((int(e) - int(s)) / 1e9)
            spans.append((ifname, int(s), int(e)))
        order = {p: i for i, p in enumerate(PHASES)}
        for (phase, name, cmd), xs in sorted(calls.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1])):
            label = f"{name} {cmd}" + (" (+ host-local)" if name == "bridge" and not v.endswith("daemon") else "")
            lines.append(f"| {v} | {phase} | {label} | {len(xs) / rounds:g} | {statistics.median(xs) * 1000:.1f} ms | "
                         f"{sum(xs) / rounds * 1000:.0f} ms |")
        lo = [(s, e) for i, s, e in spans if i == "lo"]
        main = [(s, e) for i, s, e in spans if i != "lo"]
        overlapping = sum(1 for s, e in lo if any(ms < e and s < me for ms, me in main))
        total = sum(sum(xs) for xs in calls.values()) / rounds
        lines.append(f"| {v} | all | every plugin call (loopback overlapping the main network: {overlapping} of "
                     f"{len(lo)}) | | | {total * 1000:.0f} ms |")
    return "\n".join(lines)


def base_table(rows: list[Row]) -> str:
    """Ours and the base tree's, one-shot and daemon, each as a ratio to Go's (medians)."""
    head = "| case | Go | base one-shot | ours one-shot | base daemon | ours daemon |"
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        cells = [fmt(r.median("go"), r.unit)] + [f"{fmt(r.median(v), r.unit)} ({fmt(r.ratio(v), 'x')})"
                                                 for v in ("base", "oneshot", "base-daemon", "daemon")]
        lines.append(f"| {r.case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="measured pod cycles per variant (default 20)")
    p.add_argument("--quick", action="store_true", help="5 rounds, 3 in the calls pass")
    p.add_argument("--pods", default="plain,hostport",
                   help="pod kinds, comma-separated: plain, hostport (a hostPort and bandwidth annotations); "
                   "the calls pass uses the first (default: plain,hostport)")
    p.add_argument("--no-calls", action="store_true", help="skip the per-plugin-call pass")
    p.add_argument("--call-rounds", type=int, default=5, help="pod cycles in the calls pass (default 5)")
    p.add_argument("--json", help="also write the raw numbers here")
    p.add_argument("--base", metavar="PYCNI",
                   help="also measure another tree's pycni command (one-shot and daemon: variants base, "
                   "base-daemon), e.g. a script running `python -m pycni` with that tree's src on PYTHONPATH")
    opts = p.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench: needs root (it creates namespaces)")
    absent = missing("containerd", "ctr", "containerd-shim-runc-v2", "runc", "podman", "busybox", "nsenter", "unshare")
    if absent or not os.access("/usr/lib/cni/bridge", os.X_OK):
        sys.exit(f"bench: missing {absent or ['/usr/lib/cni (containernetworking-plugins)']}; run bash scripts/setup")
    rounds = 5 if opts.quick else opts.rounds
    call_rounds = 3 if opts.quick else opts.call_rounds
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="pycni-bench-cri-"))
    calls = ""
    try:
        pycni = {"oneshot": PYCNI, "daemon": PYCNI}
        if opts.base:
            pycni.update({"base": opts.base, "base-daemon": opts.base})
        with nodes(tmp, pycni) as ns:
            version = ns["go"].cri.version()
            rows: list[Row] = []
            kinds = [k == "hostport" for k in opts.pods.split(",")]
            for hostport in kinds:
                kind = "hostport" if hostport else "plain"
                log(f"{rounds} x RunPodSandbox + StopPodSandbox + RemovePodSandbox, {kind} pod")
                rows += case_cycle(ns, rounds, hostport)
            if not opts.no_calls:
                log(f"plugin calls of {call_rounds} pod cycles")
                calls = case_calls(ns, call_rounds, kinds[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"pycni vs Go reference plugins under {version.runtime_name} {version.runtime_version} (CRI "
          f"{version.runtime_api_version}, runc), medians; ratio = ours / Go; {rounds} rounds; "
          f"run took {time.perf_counter() - started:.0f} s")
    print(table(rows))
    if opts.base:
        print()
        print(f"the same run, {opts.base} (base) beside this tree (ours):")
        print(base_table(rows))
    if calls:
        print()
        print(f"plugin calls per pod cycle ({call_rounds} cycles; each plugin wrapped, each time includes ~1 ms "
              "of wrapper)")
        print(calls)
    if opts.json:
        out: list[dict[str, Any]] = [{"case": r.case, "unit": r.unit, "values": r.values} for r in rows]
        with open(opts.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
