"""The plugin calls of one CRI pod cycle, replayed without containerd: CPU per call, Go vs ours.

``sudo .venv/bin/python bench/cri_calls.py [--rounds N] [--variant NAME=BINDIR]``. bench/cri.py
times the whole cycle under containerd (wall time, distorted by a loaded machine); this replays
the twelve plugin calls go-cni makes for a plain pod on the kubeadm-like conflist
(tests/cri/kubeadm.py) exactly as containerd 1.6 makes them, and reports the CPU time (user+sys
of the process tree) of each, which load distorts much less:

* RunPodSandbox: loopback ADD (network ``cni-loopback``, 0.3.1, CNI_IFNAME=lo) and the main
  chain's ADD (bridge with host-local, portmap, bandwidth; a plain pod sends neither
  capability, so neither gets a runtimeConfig);
* StopPodSandbox: the main chain's DEL in reverse with the cached result as prevResult, and
  loopback's DEL, the netns still there; then the netns goes;
* RemovePodSandbox: every DEL again with CNI_NETNS empty (the netns is closed) and no prevResult
  (libcni dropped the cache entry on the first DEL).

Variants alternate within a round, the first round is discarded; ``--variant base=DIR`` adds
another tree's executables (``pycni install-plugins`` of an older checkout) beside Go and ours.
Each variant runs in its own throwaway host namespace.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests"), os.path.dirname(os.path.abspath(__file__))]

from cri.kubeadm import kubeadm_conflist  # noqa: E402
from plugins import PATH_ENV, PerCallBench, spawn  # noqa: E402

LOOPBACK_NET = {"cniVersion": "0.3.1", "name": "cni-loopback", "type": "loopback"}


def chain(data_dir: str) -> list[dict[str, Any]]:
    """The kubeadm-like conflist's plugins, each as libcni hands it over (name, cniVersion set)."""
    net = json.loads(kubeadm_conflist(bridge="ccbr0"))
    plugins: list[dict[str, Any]] = net["plugins"]
    plugins[0]["ipam"]["dataDir"] = data_dir
    return [dict(p, cniVersion=net["cniVersion"], name=net["name"]) for p in plugins]


def main(argv: list[str] | None = None) -> int:
    cpu: dict[tuple[str, str, str], list[float]] = {}
    order: list[tuple[str, str]] = []
    with PerCallBench(__doc__ or "", "cc-bc", argv) as bench:
        opts, variants, hosts = bench.opts, bench.variants, bench.hosts
        for r in range(opts.rounds + 1):
            for v, path in variants.items():
                ctr = bench.new_ns(f"c{v}{r}")
                plugins = chain(os.path.join(bench.tmp, v, "ipam"))
                cid = f"{uuid.uuid4().hex}{r}"
                cni_args = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=bench{r};"
                            f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uuid.uuid4()}")
                base_env = {"PATH": PATH_ENV, "CNI_PATH": path, "CNI_CONTAINERID": cid, "CNI_ARGS": cni_args,
                            "PYCNI_SOCKET": opts.socket}

                def call(phase: str, conf: dict[str, Any], command: str, netns: str, ifname: str,
                         v: str = v, path: str = path, env0: dict[str, str] = base_env, r: int = r) -> bytes:
                    env = dict(env0, CNI_COMMAND=command, CNI_NETNS=netns, CNI_IFNAME=ifname)
                    argv_ = ["/usr/bin/ip", "netns", "exec", hosts[v], os.path.join(path, conf["type"])]
                    code, out, t_wall, t_cpu = spawn(argv_, env, json.dumps(conf).encode())
                    if code != 0:
                        raise RuntimeError(f"{v} {phase} {conf['type']} {command}: {out!r}")
                    key = (phase, f"{conf['type']} {command}")
                    if key not in order:
                        order.append(key)
                    if r:
                        cpu.setdefault((*key, v), []).append(t_wall if opts.wall else t_cpu)
                    return out

                nspath = f"/var/run/netns/{ctr}"
                call("Run", LOOPBACK_NET, "ADD", nspath, "lo")
                prev: Any = None
                for p in plugins:
                    out = call("Run", dict(p, prevResult=prev) if prev is not None else p, "ADD", nspath, "eth0")
                    prev = json.loads(out)
                for p in reversed(plugins):
                    call("Stop", dict(p, prevResult=prev), "DEL", nspath, "eth0")
                call("Stop", LOOPBACK_NET, "DEL", nspath, "lo")
                bench.del_ns(ctr)
                for p in reversed(plugins):
                    call("Remove", p, "DEL", "", "eth0")
                call("Remove", LOOPBACK_NET, "DEL", "", "lo")
                _, _, t_wall, t_cpu = spawn(["/usr/bin/ip", "netns", "exec", hosts[v], "/bin/true"], base_env, b"")
                if r:
                    cpu.setdefault(("", "(ip netns exec)", v), []).append(t_wall if opts.wall else t_cpu)
        wrap = statistics.median(x for v in variants for x in cpu[("", "(ip netns exec)", v)])
        print(f"{'wall' if opts.wall else 'CPU'} ms per call of a plain pod's cycle, median of {opts.rounds}, "
              f"`ip netns exec` "
              f"({wrap * 1e3:.1f} ms) subtracted")
        others = [v for v in variants if v != "go"]
        print(f"{'CRI call':8} {'plugin call':16} {'go':>7} " + " ".join(f"{v:>7} {v + '/go':>9}" for v in others))
        tot = dict.fromkeys(variants, 0.0)
        phase_tot: dict[tuple[str, str], float] = {}
        for phase, what in order:
            ms = {v: statistics.median(cpu[(phase, what, v)]) - wrap for v in variants}
            for v in variants:
                tot[v] += ms[v]
                phase_tot[(phase, v)] = phase_tot.get((phase, v), 0.0) + ms[v]
            print(f"{phase:8} {what:16} {ms['go'] * 1e3:7.1f} "
                  + " ".join(f"{ms[v] * 1e3:7.1f} {ms[v] / ms['go'] if ms['go'] > 0 else float('nan'):9.2f}"
                             for v in others))
        for phase in ("Run", "Stop", "Remove"):
            go = phase_tot[(phase, "go")]
            print(f"{phase:8} {'(sum)':16} {go * 1e3:7.1f} "
                  + " ".join(f"{phase_tot[(phase, v)] * 1e3:7.1f} {phase_tot[(phase, v)] / go:9.2f}" for v in others))
        print(f"{'total':8} {'':16} {tot['go'] * 1e3:7.1f} "
              + " ".join(f"{tot[v] * 1e3:7.1f} {tot[v] / tot['go']:9.2f}" for v in others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
