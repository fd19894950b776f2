"""Three nodes on one machine: etcd, a node agent per node, routed pods pinging across nodes.

Run through ``bash scripts/cluster-demo [--mode host-gw|vxlan] [--pods N]``. Everything lives
in throwaway network namespaces named ``pycni-demo-...`` (an underlay bridge and three "nodes",
each with an etcd member and a ``pycni node`` agent) and a temporary directory (etcd data, CNI
configs, plugin executables, logs); all of it is removed at the end, on Ctrl-C and on SIGTERM.
The pods are attached the way a runtime would, with ``pycni add`` run inside their node.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

from etcd_util import EtcdCluster  # noqa: E402  (the test fixture: one etcd member per node namespace)
from netns_util import Namespace, new_namespace  # noqa: E402

from pycni.cluster.node import RTPROT_PYCNI  # noqa: E402
from pycni.install_plugins import install  # noqa: E402

PREFIX = "pycni-demo"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def show(ns: Namespace, cmd: list[str]) -> str:
    out = ns.run(cmd, check=False)
    text = (out.stdout + out.stderr).rstrip()
    print("   $ " + " ".join(cmd) + ("\n     " + text.replace("\n", "\n     ") if text else ""))
    return out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("host-gw", "vxlan"), default="host-gw")
    ap.add_argument("--pods", type=int, default=2, help="pods per node (default 2)")
    opts = ap.parse_args()
    if os.geteuid() != 0:
        print("cluster-demo: needs root (network namespaces)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tmp = tempfile.mkdtemp(prefix="pycni-cluster-demo-")
    bindir = os.path.join(tmp, "bin")
    agents: list[subprocess.Popen[bytes]] = []
    pods: list[tuple[Namespace, Namespace, str]] = []  # (node ns, pod ns, conf dir)
    py = sys.executable
    try:
        os.makedirs(bindir)
        install(bindir)
        say("etcd: a 3-member cluster, one member in each node namespace, on an underlay bridge")
        cluster = EtcdCluster(size=3, subnet="10.232.0.0/24", prefix=PREFIX)
        cluster.__enter__()
        endpoints = ",".join(cluster.endpoints)
        print(f"   endpoints {endpoints}")
        try:
            say(f"node agents (--mode {opts.mode})")
            for node in cluster.nodes:
                log = open(os.path.join(tmp, f"agent-{node.name}.log"), "ab")
                cmd = [py, "-m", "pycni", "node", "--etcd-endpoints", endpoints, "--etcd-prefix", "/pycni",
                       "--node-name", node.name, "--underlay-ip", node.ip, "--mode", opts.mode, "--ttl", "30",
                       # its flows socket in the demo's directory, never the machine's /run/pycni
                       "--flows-socket", os.path.join(tmp, f"flows-{node.name}.sock")]
                print("   " + node.name + ": pycni " + " ".join(cmd[3:]))
                agents.append(subprocess.Popen(["ip", "netns", "exec", node.ns.name, *cmd], stdout=log,
                                               stderr=subprocess.STDOUT))
                log.close()
            time.sleep(1.0)

            say("pods: routed + cluster-ipam, attached with `pycni add` inside each node")
            for node in cluster.nodes:
                confdir = os.path.join(tmp, f"net.d-{node.name}")
                os.makedirs(confdir)
                conf = {"cniVersion": "1.1.0", "name": "podnet", "type": "routed",
                        "mtu": 1450 if opts.mode == "vxlan" else 1500,
                        "ipam": {"type": "cluster-ipam", "etcdEndpoints": cluster.endpoints,
                                 "etcdPrefix": "/pycni", "nodeName": node.name,
                                 "ranges": [[{"subnet": "10.90.0.0/16"}]],
                                 "lockDir": os.path.join(tmp, "locks")}}
                with open(os.path.join(confdir, "10-podnet.conf"), "w") as f:
                    json.dump(conf, f, indent=2)
                for _ in range(opts.pods):
                    pod = new_namespace(PREFIX)
                    pods.append((node.ns, pod, confdir))
                    out = node.ns.run(["env", f"CNI_PATH={bindir}", py, "-m", "pycni", "add", "podnet", pod.path,
                                       "--conf-dir", confdir, "--cache-dir", os.path.join(tmp, "cache")])
                    ip = json.loads(out.stdout)["ips"][0]["address"]
                    print(f"   {node.name}: pod {pod.name} {ip}")
            time.sleep(0.5)

            say("what each agent programmed (routes marked proto 94) and `pycni node status`")
            for node in cluster.nodes:
                print(f" [{node.name}]")
                show(node.ns, ["ip", "route", "show", "proto", str(RTPROT_PYCNI)])
            show(cluster.nodes[0].ns, [py, "-m", "pycni", "node", "status", "--etcd-endpoints", endpoints,
                                       "--node-name", cluster.nodes[0].name, "--mode", opts.mode])

            say("every pod pings every pod on the other nodes")
            addrs = []
            for node_ns, pod, _ in pods:
                out = pod.run(["ip", "-j", "-4", "addr", "show", "eth0"]).stdout
                addrs.append((node_ns, pod, json.loads(out)[0]["addr_info"][0]["local"]))
            failures = 0
            for n1, p1, a1 in addrs:
                for n2, _, a2 in addrs:
                    if n1.name == n2.name:
                        continue
                    ok = p1.run(["ping", "-c", "1", "-W", "2", a2], check=False).returncode == 0
                    failures += not ok
                    print(f"   {a1:>12} -> {a2:<12} {'ok' if ok else 'FAILED'}")
            say("agent logs (one line per change)")
            for node in cluster.nodes:
                with open(os.path.join(tmp, f"agent-{node.name}.log")) as f:
                    print("   " + f.read().rstrip().replace("\n", "\n   "))
            print(f"\n{'all pings answered' if not failures else f'{failures} pings FAILED'}")
            return 1 if failures else 0
        finally:
            say("teardown: pycni del, agents stopped, etcd and every namespace removed")
            for node_ns, pod, confdir in pods:
                node_ns.run(["env", f"CNI_PATH={bindir}", py, "-m", "pycni", "del", "podnet", pod.path,
                             "--conf-dir", confdir, "--cache-dir", os.path.join(tmp, "cache")], check=False)
                pod.delete()
            for a in agents:
                a.send_signal(signal.SIGTERM)
                a.wait(timeout=20)
            cluster.__exit__(None, None, None)
    except KeyboardInterrupt:
        return 130
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    sys.exit(main())
