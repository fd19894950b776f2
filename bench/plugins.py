"""Per plugin and command: CPU time of ours one-shot against the Go plugin, same call, one run.

``sudo .venv/bin/python bench/plugins.py [--rounds N]``. Drives podman's default chain
(bridge with host-local, portmap, firewall, tuning, as ``podman network create`` writes it)
plugin by plugin, ADD then CHECK then DEL (each with the previous plugin's result), in a
throwaway host namespace per variant. Every call is one process tree; the table reports the
median CPU time (user+sys of the tree, which a loaded machine distorts much less than wall
time) and ours/Go. Variants alternate within a round; the first round is discarded. A bare
``python -IS -c pass`` is measured beside them as the floor of any one-shot Python call.
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
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src")]

from pycni.install_plugins import install  # noqa: E402

GO_PLUGINS = "/usr/lib/cni"
PATH_ENV = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")


def podman_chain(data_dir: str) -> list[dict[str, Any]]:
    return [{"type": "bridge", "bridge": "cni-podman0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}], "dataDir": data_dir,
                      "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "firewall", "backend": ""},
            {"type": "tuning"}]


def spawn(argv: list[str], env: dict[str, str], stdin: bytes) -> tuple[int, bytes, float, float]:
    """Run one call; (exit code, stdout, wall s, CPU s of the whole process tree)."""
    import time

    r_out, w_out = os.pipe()
    r_in, w_in = os.pipe()
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.dup2(r_in, 0)
        os.dup2(w_out, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.closerange(3, 256)
        os.execve(argv[0], argv, env)
    os.close(r_in)
    os.close(w_out)
    os.write(w_in, stdin)
    os.close(w_in)
    chunks = []
    while chunk := os.read(r_out, 65536):
        chunks.append(chunk)
    os.close(r_out)
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter() - t
    return os.waitstatus_to_exitcode(status), b"".join(chunks), wall, ru.ru_utime + ru.ru_stime


class PerCallBench:
    """What the per-call CPU benchmarks share (this file's podman chain, bench/cri_calls.py's CRI
    pod cycle): the options, our shims beside Go's plugins (and any --variant), one host
    namespace per variant, and cleaning up every namespace and the temporary directory."""

    def __init__(self, description: str, prefix: str, argv: list[str] | None) -> None:
        ap = argparse.ArgumentParser(description=description.split("\n\n")[0])
        ap.add_argument("--rounds", type=int, default=7)
        ap.add_argument("--socket", default="off", help="PYCNI_SOCKET for ours (default: one-shot)")
        ap.add_argument("--wall", action="store_true",
                        help="report wall time instead of CPU (a daemon's work is not in the caller's CPU)")
        ap.add_argument("--variant", action="append", default=[], metavar="NAME=BINDIR",
                        help="another plugin directory to measure beside (e.g. an older tree's executables)")
        self.opts = ap.parse_args(argv)
        if os.geteuid() != 0:
            sys.exit("needs root (network namespaces)")
        self.prefix = f"{prefix}{uuid.uuid4().hex[:6]}"
        self.run_id = self.prefix[-6:]
        self.tmp = tempfile.mkdtemp(prefix="pycni-bench-percall-")
        shims = os.path.join(self.tmp, "bin")
        install(shims, daemon=True)
        self.variants = {"go": GO_PLUGINS, "ours": shims, **dict(v.split("=", 1) for v in self.opts.variant)}
        self.namespaces: list[str] = []
        self.hosts = {v: self.new_ns(v) for v in self.variants}

    def new_ns(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.namespaces.append(name)
        return name

    def del_ns(self, name: str) -> None:
        subprocess.run(["ip", "netns", "del", name], check=True)
        self.namespaces.remove(name)

    def __enter__(self) -> PerCallBench:
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    cpu: dict[tuple[str, str, str], list[float]] = {}
    failed: set[tuple[str, str, str]] = set()
    with PerCallBench(__doc__ or "", "pycni-bp", argv) as bench:
        opts, run_id, variants, hosts = bench.opts, bench.run_id, bench.variants, bench.hosts
        for r in range(opts.rounds + 1):
            for v, path in variants.items():
                ctr = bench.new_ns(f"c{v}{r}")
                chain = podman_chain(os.path.join(bench.tmp, v, "ipam"))
                base_env = {"PATH": PATH_ENV, "CNI_PATH": path, "CNI_CONTAINERID": f"c{r}x{run_id}",
                            "CNI_NETNS": f"/var/run/netns/{ctr}", "CNI_IFNAME": "eth0",
                            "PYCNI_SOCKET": opts.socket}
                results: list[bytes | None] = []
                prev: bytes | None = None
                for command in ("ADD", "CHECK", "DEL"):
                    order = list(range(len(chain))) if command != "DEL" else list(reversed(range(len(chain))))
                    if command == "ADD":
                        prev = None
                    for i in order:
                        conf = dict(chain[i], cniVersion="1.0.0", name="podman")
                        if chain[i]["type"] == "portmap":
                            conf["runtimeConfig"] = {"portMappings": [
                                {"hostPort": 8080 + r, "containerPort": 80, "protocol": "tcp"}]}
                        if command == "ADD":
                            if prev is not None:
                                conf["prevResult"] = json.loads(prev)
                        else:
                            conf["prevResult"] = json.loads(results[-1] or b"{}")
                        argv_ = ["/usr/bin/ip", "netns", "exec", hosts[v], os.path.join(path, chain[i]["type"])]
                        code, out, _wall, t_cpu = spawn(argv_, dict(base_env, CNI_COMMAND=command),
                                                        json.dumps(conf).encode())
                        if code != 0 and command == "CHECK":
                            failed.add((chain[i]["type"], command, v))
                        elif code != 0:
                            raise RuntimeError(f"{v} {chain[i]['type']} {command}: {out!r}")
                        if command == "ADD":
                            prev = out
                            results.append(out)
                        if r:
                            cpu.setdefault((chain[i]["type"], command, v), []).append(t_cpu)
                # the netns exec wrapper itself, to subtract
                _, _, _, t_cpu = spawn(["/usr/bin/ip", "netns", "exec", hosts[v], "/bin/true"], base_env, b"")
                if r:
                    cpu.setdefault(("(ip netns exec)", "-", v), []).append(t_cpu)
                _, _, _, t_cpu = spawn(["/usr/bin/ip", "netns", "exec", hosts[v], sys.executable, "-IS", "-c",
                                        "pass"], base_env, b"")
                if r:
                    cpu.setdefault(("(python -IS -c pass)", "-", v), []).append(t_cpu)
                bench.del_ns(ctr)
        wrap = statistics.median(cpu[("(ip netns exec)", "-", "go")] + cpu[("(ip netns exec)", "-", "ours")])
        print(f"CPU ms per call, median of {opts.rounds}, `ip netns exec` ({wrap * 1e3:.1f} ms) subtracted")
        others = [v for v in variants if v != "go"]
        print(f"{'plugin':22} {'cmd':6} {'go':>7} " + " ".join(f"{v:>7} {v + '/go':>9}" for v in others))
        keys = sorted({(p, c) for p, c, _ in cpu}, key=lambda k: (k[0].startswith("("), k[0], k[1]))
        tot = dict.fromkeys(variants, 0.0)
        for p, c in keys:
            if p == "(ip netns exec)":
                continue
            ms = {v: statistics.median(cpu[(p, c, v)]) - wrap for v in variants}
            if not p.startswith("("):
                for v in variants:
                    tot[v] += ms[v]
            bad = "".join(f"  ({v} exits non-zero)" for v in variants if (p, c, v) in failed)
            print(f"{p:22} {c:6} {ms['go'] * 1e3:7.1f} "
                  + " ".join(f"{ms[v] * 1e3:7.1f} {ms[v] / ms['go'] if ms['go'] > 0 else float('nan'):9.2f}"
                             for v in others) + bad)
        print(f"{'total':22} {'':6} {tot['go'] * 1e3:7.1f} "
              + " ".join(f"{tot[v] * 1e3:7.1f} {tot[v] / tot['go']:9.2f}" for v in others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
