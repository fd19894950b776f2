"""Chaos: cluster-ipam under churn and faults on three nodes (issue 23).

Three node namespaces with a 3-member etcd; on every node, workers attach and detach
"pods" as a runtime would (the cluster-ipam executable, one process per command), while

* plugins are SIGKILLed at random points of their ADD (and the runtime DELs right after, as
  kubelet does when an ADD times out or fails),
* one etcd member is killed and restarted,
* one node is cut off from the others (its underlay port down) for a while, then rejoins.

Asserted all along: no address is ever held by two live pods (an ADD that succeeded hands out
an address no other live pod holds). At the end, once every pod is DELeted (DELs that failed
during the faults are retried) and each node has run GC: ``pycni ipam list`` is empty and
``pycni ipam check`` finds nothing — in particular no address outlived the DEL of its killed ADD.

Bounded for CI (about a minute of churn, a few minutes at most on a loaded machine);
``PYCNI_CHAOS_SECONDS=600`` makes it a soak. ``PYCNI_CHAOS_SEED`` replays a run's choices.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_util import EtcdCluster, EtcdNode, etcd_available
from plugin_util import env

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and etcd (Debian's etcd-server)")

SECONDS = float(os.environ.get("PYCNI_CHAOS_SECONDS", "50"))
SEED = int(os.environ.get("PYCNI_CHAOS_SEED", str(int(time.time()))))
WORKERS_PER_NODE = 2
NETWORK = "chaos"
PREFIX = "/sf-chaos"


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=3, subnet="10.245.0.0/24", prefix="sf-ch") as c:
        yield c


class Chaos:
    def __init__(self, cluster: EtcdCluster, bin_dir: str, tmp: Path) -> None:
        self.cluster, self.bin_dir, self.tmp = cluster, bin_dir, tmp
        self.lock = threading.Lock()
        self.live: dict[str, tuple[str, str]] = {}  # address -> (pod, node) for pods whose ADD succeeded
        self.pending_del: list[tuple[int, str]] = []  # (node index, pod) whose DEL failed: retried at the end
        self.violations: list[str] = []
        self.stats = {"add ok": 0, "add failed": 0, "killed": 0, "del ok": 0, "del failed": 0}
        self.stop = threading.Event()
        self.conf_dir = tmp / "net.d"
        self.conf_dir.mkdir()
        (self.conf_dir / f"{NETWORK}.conflist").write_text(json.dumps({
            "cniVersion": "1.1.0", "name": NETWORK,
            "plugins": [{"type": "macvlan", "master": "ul0", "ipam": self.ipam(cluster.nodes[0])}]}))

    def ipam(self, node: EtcdNode) -> dict[str, Any]:
        # the node's own member first, as docs/cluster.md advises; a small pool: addresses are reused
        eps = [node.client_url] + [e for e in self.cluster.endpoints if e != node.client_url]
        return {"type": "cluster-ipam", "etcdEndpoints": eps, "etcdPrefix": PREFIX, "nodeName": node.name,
                "etcdTimeout": 3, "lockDir": str(self.tmp / f"locks-{node.name}"), "blockSize": 28,
                "ranges": [[{"subnet": "10.87.0.0/25"}]]}

    def conf(self, node: EtcdNode) -> bytes:
        return json.dumps({"cniVersion": "1.1.0", "name": NETWORK, "ipam": self.ipam(node)}).encode()

    def spawn(self, i: int, command: str, pod: str) -> subprocess.Popen[bytes]:
        node = self.cluster.nodes[i]
        ipam_env = env(command, pod, "/var/run/netns/none", cni_path=self.bin_dir)  # IPAM alone never enters it
        proc = subprocess.Popen(["ip", "netns", "exec", node.ns.name, os.path.join(self.bin_dir, "cluster-ipam")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ipam_env)
        assert proc.stdin is not None
        proc.stdin.write(self.conf(node))
        proc.stdin.close()
        proc.stdin = None  # (communicate() would flush it)
        return proc

    def delete(self, i: int, pod: str) -> bool:
        proc = self.spawn(i, "DEL", pod)
        out, _ = proc.communicate(timeout=120)
        with self.lock:
            self.stats["del ok" if proc.returncode == 0 else "del failed"] += 1
            if proc.returncode != 0:
                self.pending_del.append((i, pod))
        return proc.returncode == 0

    def worker(self, i: int, w: int, seed: int) -> None:
        rng = random.Random(seed)
        n = 0
        mine: list[tuple[str, str]] = []  # (pod, address) alive
        while not self.stop.is_set():
            n += 1
            pod = f"n{i}w{w}c{n}"
            proc = self.spawn(i, "ADD", pod)
            killed = False
            if rng.random() < 0.3:  # SIGKILL somewhere in start-up, the reads, the transaction, or after
                time.sleep(rng.uniform(0.0, 0.25))
                if proc.poll() is None:
                    proc.kill()
                    killed = True
            out, _ = proc.communicate(timeout=120)
            if killed or proc.returncode != 0:
                with self.lock:
                    self.stats["killed" if killed else "add failed"] += 1
                self.delete(i, pod)  # the runtime's DEL after a failed or timed-out ADD
            else:
                ip = json.loads(out)["ips"][0]["address"].split("/")[0]
                with self.lock:
                    self.stats["add ok"] += 1
                    if ip in self.live:
                        self.violations.append(f"{ip} handed to {pod} on node{i + 1} while {self.live[ip]} holds it")
                    self.live[ip] = (pod, f"node{i + 1}")
                mine.append((pod, ip))
            while mine and (len(mine) > 3 or rng.random() < 0.4):
                pod, ip = mine.pop(rng.randrange(len(mine)))
                with self.lock:
                    if self.live.get(ip, ("", ""))[0] == pod:
                        del self.live[ip]  # no longer live once its DEL starts
                self.delete(i, pod)
        for pod, ip in mine:
            with self.lock:
                if self.live.get(ip, ("", ""))[0] == pod:
                    del self.live[ip]
            self.delete(i, pod)

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        assert self.cluster.underlay is not None
        return self.cluster.underlay.run([sys.executable, "-m", "pycni", *argv, "--conf-dir", str(self.conf_dir)],
                                         check=False, timeout=120)


def test_churn_kills_member_restart_and_partition(cluster: EtcdCluster, plugin_dir: str, tmp_path: Path) -> None:
    print(f"\nchaos: {SECONDS:g}s of churn, seed {SEED} (PYCNI_CHAOS_SEED={SEED} replays its choices)")
    chaos = Chaos(cluster, plugin_dir, tmp_path)
    rng = random.Random(SEED)
    threads = [threading.Thread(target=chaos.worker, args=(i, w, rng.randrange(1 << 30)), daemon=True)
               for i in range(3) for w in range(WORKERS_PER_NODE)]
    start = time.monotonic()
    for t in threads:
        t.start()
    faults: list[str] = []
    try:
        cycle = 0
        while time.monotonic() - start < SECONDS:
            cycle += 1
            time.sleep(min(SECONDS / 6, 10))
            victim = rng.randrange(3)
            cluster.kill(victim)  # an etcd member killed and restarted
            faults.append(f"member node{victim + 1} killed")
            time.sleep(min(SECONDS / 12, 4))
            cluster.restart(victim)
            time.sleep(min(SECONDS / 6, 8))
            cut = rng.randrange(3)
            assert cluster.underlay is not None
            cluster.underlay.run(["ip", "link", "set", f"vnode{cut + 1}", "down"])  # node cut off
            faults.append(f"node{cut + 1} partitioned")
            time.sleep(min(SECONDS / 6, 8))
            cluster.underlay.run(["ip", "link", "set", f"vnode{cut + 1}", "up"])
    finally:
        chaos.stop.set()
        assert cluster.underlay is not None
        for k in range(3):
            cluster.underlay.run(["ip", "link", "set", f"vnode{k + 1}", "up"], check=False)
        cluster.restart_all()
        for t in threads:
            t.join(300)
    cluster.wait_ready()
    # the DELs that failed during the faults, again, until they pass (the runtime keeps retrying)
    for _ in range(5):
        with chaos.lock:
            todo, chaos.pending_del = chaos.pending_del, []
        for i, pod in todo:
            chaos.delete(i, pod)
        if not chaos.pending_del:
            break
        time.sleep(2)
    print(f"chaos: {chaos.stats}, faults: {', '.join(faults)}")
    assert chaos.violations == [], chaos.violations
    assert not chaos.pending_del, chaos.pending_del
    assert chaos.stats["add ok"] > 20 and chaos.stats["killed"] > 5, chaos.stats
    # every pod DELeted: nothing may be left — not even by an ADD killed with its request in flight
    listed = chaos.cli("ipam", "list", NETWORK)
    assert listed.returncode == 0 and listed.stdout.strip() == "", listed.stdout + listed.stderr
    # GC on each node (valid list empty) finds nothing more to release, and the store is consistent
    for node in cluster.nodes:
        gc = node.ns.run([os.path.join(plugin_dir, "cluster-ipam")], check=False, env=env("GC", cni_path=plugin_dir),
                         input=json.dumps(
            {"cniVersion": "1.1.0", "name": NETWORK, "ipam": chaos.ipam(node), "cni.dev/valid-attachments": []}))
        assert gc.returncode == 0, gc.stdout + gc.stderr
    check = chaos.cli("ipam", "check", NETWORK)
    assert check.returncode == 0 and check.stdout.strip() == "", check.stdout + check.stderr
    with cluster.client() as etcd:
        etcd.delete_prefix(PREFIX + "/")
