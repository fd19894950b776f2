"""A reused address must be reachable as soon as its new pod's ADD returns (issue 23, item 4).

What made it sometimes take a second: a freed address is reused where every node already routes
to it, so the first packet reaches the new pod's node at once — while the fresh veth may still be
dropping what the host sends on it (its queue is activated by the kernel's linkwatch work, late
on a busy host). A lost ARP request or neighbour solicitation is retried only after 1 s. ``routed``
now writes a permanent neighbour entry for each pod address (the pod's MAC is known), so the host
never resolves its pods. A second, rarer cause of the same symptom: an agent whose view of etcd
lags could re-route a reused address to its previous holder over the new local pod's route (and
then delete it, cutting the pod off for good); the agent now leaves a local pod's route alone.

Latencies are printed (bench/cluster.py reports them as numbers); the tests assert behaviour.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_util import EtcdCluster, etcd_available
from netns_util import Namespace, have_root, new_namespace
from plugin_util import ok, run

from pycni.cluster.node import RTPROT_PYCNI

PREFIX = "sf"


def _reach(src: Namespace, ip: str, limit: float = 5.0) -> float:
    """Seconds until ``src`` gets an echo reply from ``ip`` (one 50 ms probe after another)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if src.run(["ping", "-6" if ":" in ip else "-4", "-n", "-c", "1", "-W", "0.05", ip],
                   check=False).returncode == 0:
            return time.monotonic() - start
    raise AssertionError(f"{ip} unreachable from {src.name} for {limit:g}s")


def _neighbours(ns: Namespace, dev: str) -> list[dict[str, Any]]:
    out = []
    for fam in ("-4", "-6"):
        out += json.loads(ns.run(["ip", "-j", fam, "neigh", "show", "dev", dev]).stdout or "[]")
    return out


@pytest.mark.skipif(not have_root(), reason="network namespaces need root")
def test_host_never_resolves_its_pods(plugin_dir: str) -> None:
    """Each pod address has a permanent neighbour entry on its host end (the pod's MAC), from the
    moment ADD returns: the first packet to a new pod needs no ARP/NDP that a young veth may drop."""
    host = new_namespace(PREFIX)
    made = [host]
    try:
        probe = new_namespace(PREFIX)
        made.append(probe)

        def conf(*addrs: str) -> dict[str, Any]:
            return {"cniVersion": "1.1.0", "name": "reuse", "type": "routed",
                    "ipam": {"type": "static", "addresses": [{"address": a} for a in addrs]}}

        ok(run("routed", "ADD", conf("10.97.0.1/24", "fd97::1/64"), host=host, netns=probe, cni_path=plugin_dir,
               container_id="probe"))
        times = []
        for i in range(12):
            pod = new_namespace(PREFIX)
            made.append(pod)
            v4, v6 = "10.97.1.5", "fd97:1::5"  # the same addresses every round: reused at once
            res = ok(run("routed", "ADD", conf(f"{v4}/24", f"{v6}/64"), host=host, netns=pod, cni_path=plugin_dir,
                         container_id=f"pod{i}"))
            host_end = res["interfaces"][0]["name"]
            pod_mac = res["interfaces"][1]["mac"]
            entries = {n["dst"]: n for n in _neighbours(host, host_end)}
            for ip in (v4, v6):
                assert entries[ip]["lladdr"] == pod_mac and "PERMANENT" in entries[ip]["state"], entries
            times += [_reach(probe, v6), _reach(probe, v4)]
            # reaching the pod created no neighbour resolution on its host end
            assert all("PERMANENT" in n["state"] or n["dst"].startswith("fe80:")
                       for n in _neighbours(host, host_end)), _neighbours(host, host_end)
            ok(run("routed", "DEL", conf(f"{v4}/24", f"{v6}/64"), host=host, netns=pod, cni_path=plugin_dir,
                   container_id=f"pod{i}"))
            assert host.run(["ip", "link", "show", host_end], check=False).returncode != 0
        print(f"\nfirst reply from a pod whose address was just freed: max {max(times) * 1000:.0f} ms "
              f"over {len(times)} (IPv4 and IPv6)")
    finally:
        for ns in made:
            ns.delete()


# ---- three nodes, agents, addresses moving between nodes ------------------------------------------

pytestmark_cluster = pytest.mark.skipif(not etcd_available(), reason="needs root and etcd (Debian's etcd-server)")


class Cluster:
    def __init__(self, etcd: EtcdCluster, tmp: Path, plugin_dir: str, mode: str = "vxlan") -> None:
        self.etcd, self.tmp, self.plugin_dir, self.mode = etcd, tmp, plugin_dir, mode
        self.prefix = f"/sf-reuse-{os.getpid()}"
        self.agents: list[subprocess.Popen[bytes]] = []
        self.namespaces: list[Namespace] = []

    def start_agents(self) -> None:
        for n in self.etcd.nodes:
            log = self.tmp / f"agent-{n.name}.log"
            with open(log, "ab") as f:
                self.agents.append(subprocess.Popen(
                    ["ip", "netns", "exec", n.ns.name, sys.executable, "-m", "pycni", "node", "--etcd-endpoints",
                     ",".join(self.etcd.endpoints), "--etcd-prefix", self.prefix, "--node-name", n.name,
                     "--underlay-ip", n.ip, "--mode", self.mode, "--ttl", "30", "--flows-socket", ""],
                    stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        for n in self.etcd.nodes:
            log = self.tmp / f"agent-{n.name}.log"
            while f"registered {self.prefix}/nodes/{n.name}" not in (log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, f"agent {n.name} did not register"
                time.sleep(0.1)

    def conf(self, node: str, network: str, v4: str, v6: str, bits: tuple[int, int]) -> dict[str, Any]:
        return {"cniVersion": "1.1.0", "name": network, "type": "routed", "mtu": 1450 if self.mode == "vxlan" else 1500,
                "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.etcd.endpoints, "etcdPrefix": self.prefix,
                         "nodeName": node, "ranges": [[{"subnet": v4}], [{"subnet": v6}]],
                         "blockSize": bits[0], "blockSizeV6": bits[1], "lockDir": str(self.tmp / "locks")}}

    def add(self, index: int, cid: str, conf: dict[str, Any]) -> tuple[Namespace, list[str]]:
        node = self.etcd.nodes[index]
        pod = new_namespace(PREFIX)
        self.namespaces.append(pod)
        res = ok(run("routed", "ADD", conf, host=node.ns, netns=pod, cni_path=self.plugin_dir, container_id=cid))
        return pod, [i["address"].split("/")[0] for i in res["ips"]]

    def delete(self, index: int, cid: str, conf: dict[str, Any], pod: Namespace) -> None:
        ok(run("routed", "DEL", conf, host=self.etcd.nodes[index].ns, netns=pod, cni_path=self.plugin_dir,
               container_id=cid))

    def barrier(self, index: int, n: int) -> None:
        """Wait until node ``index``'s agent has handled every event before this call: a block
        claimed for another node is logged by it once it got there (events come in order)."""
        owner = self.etcd.nodes[(index + 1) % 3].name
        cidr = f"10.199.{n}.0/26"
        with self.etcd.client() as etcd:
            etcd.put(f"{self.prefix}/ipam/affinity/{owner}/marker/10.199.{n}.0-26",
                     json.dumps({"cidr": cidr, "node": owner, "network": "marker"}))
        log = self.tmp / f"agent-{self.etcd.nodes[index].name}.log"
        deadline = time.monotonic() + 30
        while f"route add {cidr}" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    def close(self) -> None:
        for a in self.agents:
            a.send_signal(signal.SIGKILL)
            a.wait()
        for n in self.etcd.nodes:
            for fam in ("-4", "-6"):
                n.ns.run(["ip", fam, "route", "flush", "proto", str(RTPROT_PYCNI)], check=False)
            n.ns.run(["ip", "link", "del", "pycni.vxlan"], check=False)
            n.ns.run(["sh", "-c", "for l in $(ls /sys/class/net | grep ^rtd); do ip link del $l; done"], check=False)
        for ns in self.namespaces:
            ns.delete()
        with self.etcd.client() as etcd:
            etcd.delete_prefix(self.prefix + "/")


@pytest.fixture(scope="module")
def etcd3() -> Iterator[EtcdCluster]:
    if not etcd_available():
        pytest.skip("needs root and etcd (Debian's etcd-server)")
    with EtcdCluster(size=3, subnet="10.242.0.0/24", prefix=f"{PREFIX}-t") as c:
        yield c


@pytestmark_cluster
def test_reused_address_moves_between_nodes(etcd3: EtcdCluster, tmp_path: Path, plugin_dir: str) -> None:
    """A pool with one free address: every round it goes to a pod on another node (its block's
    owner, or a borrower), and a probe pod on every node reaches it over IPv4 and IPv6."""
    c = Cluster(etcd3, tmp_path, plugin_dir)
    try:
        c.start_agents()
        probe_conf = [c.conf(n.name, "probes", "10.96.0.0/24", "fd96::/120", (26, 122)) for n in etcd3.nodes]
        probes = [c.add(i, f"probe{i}", probe_conf[i])[0] for i in range(3)]
        # 10.95.0.0/29: two /30 blocks, five usable addresses (.1 is the gateway); four fillers
        tiny = [c.conf(n.name, "tiny", "10.95.0.0/29", "fd95::/125", (30, 126)) for n in etcd3.nodes]
        for k, i in enumerate((0, 1, 2, 0)):
            c.add(i, f"filler{k}", tiny[i])
        times: list[float] = []
        seen: dict[str, set[int]] = {}
        for r, i in enumerate((0, 1, 2, 2, 0, 1, 1, 0, 2)):
            pod, ips = c.add(i, f"mover{r}", tiny[i])
            for ip in ips:
                seen.setdefault(ip, set()).add(i)
                times += [_reach(p, ip) for p in probes]
            c.delete(i, f"mover{r}", tiny[i], pod)
        assert any(len(nodes) == 3 for nodes in seen.values()), seen  # one address held on every node in turn
        print(f"\nreused address reachable from every node after its ADD: max {max(times) * 1000:.0f} ms, "
              f"over {len(times)} probes")
    finally:
        c.close()


@pytestmark_cluster
def test_lagging_view_leaves_local_pod_route(etcd3: EtcdCluster, tmp_path: Path, plugin_dir: str) -> None:
    """An agent that learns late that another node held an address (the handle's PUT and DELETE
    reach it after a local pod got the address) must not route the address away from that pod."""
    c = Cluster(etcd3, tmp_path, plugin_dir)
    try:
        c.start_agents()
        conf = [c.conf(n.name, "podnet", "10.94.0.0/16", "fd94::/112", (26, 122)) for n in etcd3.nodes]
        _, (v4, v6) = c.add(0, "local", conf[0])
        probe, _ = c.add(1, "probe", conf[1])
        _reach(probe, v4)
        n1 = etcd3.nodes[0]
        key = f"{c.prefix}/ipam/handles/podnet/ghost/eth0"
        with etcd3.client() as etcd:
            etcd.put(key, json.dumps({"network": "podnet", "containerID": "ghost", "ifname": "eth0", "node": "node3",
                                      "ips": [f"{v4}/16", f"{v6}/112"], "blocks": []}))
            c.barrier(1, 1)
            assert f"{v4}/32 via" in (tmp_path / "agent-node2.log").read_text()  # node2 follows etcd
            c.barrier(0, 2)  # node1's agent has seen the stale handle too
            for ip in (v4, v6):
                route = n1.ns.run(["ip", "-6" if ":" in ip else "-4", "route", "show", ip]).stdout
                assert "dev rtd" in route, route  # still the pod's route, not one to node3
            status = n1.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints",
                                ",".join(etcd3.endpoints), "--etcd-prefix", c.prefix, "--node-name", "node1"],
                               check=False).stdout
            assert f"{v4}/32" in status and "LOCAL (a pod of this node holds it" in status, status
            etcd.delete(key)
        c.barrier(0, 3)  # ... and its withdrawal
        for ip in (v4, v6):
            route = n1.ns.run(["ip", "-6" if ":" in ip else "-4", "route", "show", ip]).stdout
            assert "dev rtd" in route, route  # the pod's route survived the stale one's withdrawal
        _reach(probe, v4)
        _reach(probe, v6)
    finally:
        c.close()
