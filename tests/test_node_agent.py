"""Routed pods across nodes: ``routed`` + ``cluster-ipam`` pods on three node namespaces, a real
3-member etcd (one member per node), a ``pycni node`` agent per node — host-gw (dual stack) and
vxlan — and the faults the agent must ride out: its own SIGKILL and restart, a lease that lapses,
an etcd member lost, a node removed. Throughput pod to pod across nodes is printed (iperf3)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_util import EtcdCluster, EtcdNode, etcd_available, spawn_agent, stop_agent
from netns_util import Namespace, new_namespace
from plugin_util import ok, run

from pycni.cluster.node import RTPROT_PYCNI

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and etcd (Debian's etcd-server)")

SUBNET_V4 = "10.90.0.0/16"
SUBNET_V6 = "fd90::/112"


class Node:
    """One node: its namespace (from the etcd fixture), its agent, its pods."""

    def __init__(self, env: Env, node: EtcdNode, index: int) -> None:
        self.env, self.etcd, self.index = env, node, index
        self.name, self.ns = node.name, node.ns
        self.agent: subprocess.Popen[bytes] | None = None
        self.log = env.tmp / f"agent-{self.name}.log"
        self.pods: dict[str, tuple[Namespace, dict[str, Any]]] = {}
        self.v6 = f"fd31::{index + 1}"

    def underlay(self) -> str:
        return f"{self.etcd.ip},{self.v6}" if self.env.dual else self.etcd.ip

    def start_agent(self, ttl: int = 30) -> None:
        self.agent = spawn_agent(self.ns.name, self.log, [
            "--etcd-endpoints", ",".join(self.env.cluster.endpoints), "--etcd-prefix", self.env.prefix,
            "--node-name", self.name, "--underlay-ip", self.underlay(), "--mode", self.env.mode,
            "--ttl", str(ttl), "--flows-socket", ""])
        self.env.wait(lambda: f"registered {self.env.prefix}/nodes/{self.name}" in self.log_text(),
                      f"agent {self.name} registered")

    def stop_agent(self, sig: int = signal.SIGTERM) -> None:
        stop_agent(self.agent, sig)
        self.agent = None

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def conf(self, network: str = "podnet", subnet: str = SUBNET_V4, block: int = 26) -> dict[str, Any]:
        dual = self.env.dual and network == "podnet"  # (one network per IPv6 pool)
        ranges = [[{"subnet": subnet}]] + ([[{"subnet": SUBNET_V6}]] if dual else [])
        return {"cniVersion": "1.1.0", "name": network, "type": "routed", "mtu": self.env.pod_mtu,
                "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.env.cluster.endpoints,
                         "etcdPrefix": self.env.prefix, "nodeName": self.name, "ranges": ranges,
                         "blockSize": block, "etcdTimeout": 10, "lockDir": str(self.env.tmp / "locks")}}

    def add_pod(self, name: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
        ns = new_namespace("pycni-t")
        self.env.namespaces.append(ns)
        result = ok(run("routed", "ADD", conf or self.conf(), host=self.ns, netns=ns, cni_path=self.env.plugin_dir,
                        container_id=name))
        self.pods[name] = (ns, result)
        return result

    def del_pod(self, name: str, conf: dict[str, Any] | None = None) -> None:
        ns, _ = self.pods.pop(name)
        ok(run("routed", "DEL", conf or self.conf(), host=self.ns, netns=ns, cni_path=self.env.plugin_dir,
               container_id=name))

    def routes(self) -> str:
        out = self.ns.run(["ip", "-4", "route", "show", "proto", str(RTPROT_PYCNI)]).stdout
        return out + self.ns.run(["ip", "-6", "route", "show", "proto", str(RTPROT_PYCNI)]).stdout


class Env:
    def __init__(self, cluster: EtcdCluster, tmp: Path, plugin_dir: str, mode: str, prefix: str,
                 dual: bool = False) -> None:
        self.cluster, self.tmp, self.plugin_dir = cluster, tmp, plugin_dir
        self.mode, self.prefix, self.dual = mode, prefix, dual
        self.pod_mtu = 1450 if mode == "vxlan" else 1500
        self.namespaces: list[Namespace] = []
        self.nodes = [Node(self, n, i) for i, n in enumerate(cluster.nodes)]

    @staticmethod
    def wait(cond: Any, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for: {what}")
            time.sleep(0.1)

    def pods(self) -> list[tuple[Node, str, Namespace, dict[str, Any]]]:
        return [(n, name, ns, r) for n in self.nodes for name, (ns, r) in n.pods.items()]

    def expected_routes(self, node: Node) -> int:
        """Every block, as etcd says: the other nodes' routed to them, ``node``'s own blackholed
        (what its agent must program, without borrowing)."""
        with self.cluster.client() as etcd:
            kvs, _ = etcd.get_prefix(f"{self.prefix}/ipam/affinity/")
        return len(kvs)

    def converged(self) -> None:
        for n in self.nodes:
            self.wait(lambda n=n: len(n.routes().splitlines()) == self.expected_routes(n),
                      f"{n.name} routes every other node's blocks")

    def ping_all(self, version: int = 4) -> int:
        """Every pod pings every pod on every other node; returns how many pairs."""
        pairs = 0
        for n1, _, ns1, _ in self.pods():
            targets = [_addr(r, version) for n2, _, _, r in self.pods() if n2 is not n1]
            script = " && ".join(f"ping -{version} -c 1 -W 3 {t} >/dev/null" for t in targets if t)
            if script:
                ns1.run(["sh", "-c", script])
                pairs += len(targets)
        return pairs

    def cross_pairs(self) -> int:
        """(pod, pod on another node) pairs."""
        return sum(len(self.pods()) - len(n.pods) for n, _, _, _ in self.pods())

    def cleanup(self) -> None:
        for n in self.nodes:
            n.stop_agent(signal.SIGKILL)
            # what the agent leaves by design (routes, the vxlan device), taken away for the next test
            for fam in ("-4", "-6"):
                n.ns.run(["ip", fam, "route", "flush", "proto", str(RTPROT_PYCNI)], check=False)
            n.ns.run(["ip", "link", "del", "pycni.vxlan"], check=False)
            n.ns.run(["sh", "-c", "for l in $(ls /sys/class/net | grep ^rtd); do ip link del $l; done"],
                     check=False)
        for ns in self.namespaces:
            ns.delete()
        with self.cluster.client() as etcd:
            etcd.delete_prefix(self.prefix + "/")


def _addr(result: dict[str, Any], version: int) -> str:
    return next((i["address"].split("/")[0] for i in result["ips"] if (":" in i["address"]) == (version == 6)), "")


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=3, subnet="10.231.0.0/24") as c:
        yield c


def _env(cluster: EtcdCluster, tmp_path: Path, plugin_dir: str, mode: str, dual: bool = False) -> Env:
    env = Env(cluster, tmp_path, plugin_dir, mode, prefix=f"/t-{mode}-{os.getpid()}", dual=dual)
    if dual:
        for n in env.nodes:
            n.ns.run(["ip", "addr", "replace", f"{n.v6}/64", "dev", n.etcd.ifname, "nodad"])
    return env


def _iperf(env: Env, src: Node, dst: Node) -> str:
    if shutil.which("iperf3") is None:
        return "iperf3 not installed (scripts/setup --test installs it): throughput not measured"
    (sns, _), (dns, dres) = next(iter(src.pods.values())), next(iter(dst.pods.values()))
    server = subprocess.Popen(["ip", "netns", "exec", dns.name, "iperf3", "-s", "-1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = sns.run(["iperf3", "-c", _addr(dres, 4), "-t", "2", "-J"], timeout=30).stdout
    finally:
        server.kill()
        server.wait()
    bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
    return f"{env.mode}: pod {src.name} -> pod {dst.name} TCP {bps / 1e9:.2f} Gbit/s (iperf3, 2 s)"


def test_host_gw_dual_stack_and_faults(cluster: EtcdCluster, tmp_path: Path, plugin_dir: str) -> None:
    env = _env(cluster, tmp_path, plugin_dir, "host-gw", dual=True)
    try:
        n1, n2, n3 = env.nodes
        for n in env.nodes:
            n.start_agent(ttl=30 if n is not n3 else 3)
        for n in env.nodes:
            for k in range(2):
                n.add_pod(f"{n.name}-pod{k}")
        env.converged()
        # host-gw: another node's block goes straight to that node's underlay address
        block1 = n2.routes()
        assert f"via {n1.etcd.ip} dev ul0" in block1 and f"via {n1.v6} dev ul0" in block1
        assert env.ping_all(4) == env.cross_pairs() and env.ping_all(6) == env.cross_pairs()
        status = n1.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints",
                            ",".join(cluster.endpoints), "--etcd-prefix", env.prefix, "--node-name", n1.name,
                            "--mode", "host-gw"])
        assert "MISSING" not in status.stdout, status.stdout
        assert status.stdout.count(": programmed") == env.expected_routes(n1) == 6, status.stdout
        # its own blocks blackholed: an address without a pod goes nowhere, not out a default route
        own = n1.ns.run(["ip", "route", "show", "proto", str(RTPROT_PYCNI), "type", "blackhole"]).stdout
        assert own.count("blackhole") == 1 and "10.90." in own
        print("\n" + _iperf(env, n1, n2))

        # An agent SIGKILLed: the data plane goes on; a block claimed meanwhile (a new pod on
        # node1 in a block of its own) is routed by the restarted agent, and so is a new pod behind it.
        n2.stop_agent(signal.SIGKILL)
        before = n2.routes()
        assert env.ping_all(4) == env.cross_pairs()
        with cluster.client() as etcd:
            # a new block for node1 without a pod: what a claim looks like to the agents
            etcd.put(f"{env.prefix}/ipam/affinity/{n1.name}/podnet/10.90.200.0-26",
                     json.dumps({"cidr": "10.90.200.0/26", "node": n1.name, "network": "podnet"}))
        env.wait(lambda: "10.90.200.0/26" in n3.routes(), "node3 routes node1's new block")
        assert n2.routes() == before  # nobody programs node2 while its agent is down
        n2.start_agent()
        env.wait(lambda: "10.90.200.0/26" in n2.routes(), "restarted agent converges")
        n2.add_pod("node2-late")
        env.converged()
        assert env.ping_all(4) == env.cross_pairs()
        restart_log = n2.log_text().split("starting:")[-1]
        assert "route del" not in restart_log  # converging did not take down what was right

        # An etcd member lost: watches move to other members, no route changes anywhere.
        logs = {n.name: n.log_text().count(": route ") for n in env.nodes}
        routes = {n.name: n.routes() for n in env.nodes}
        cluster.kill(1)
        time.sleep(3)
        n1.add_pod("node1-during-loss")  # the cluster still works with two members
        env.converged()
        assert {n.name: n.routes() for n in env.nodes} == routes
        assert {n.name: n.log_text().count(": route ") for n in env.nodes} == logs
        cluster.restart(1)
        cluster.wait_ready()
        assert env.ping_all(4) == env.cross_pairs()

        # The whole etcd cluster down and back: the data plane carries on meanwhile, the agents
        # retry, resync from a full read, and follow a claim made after the restart.
        cluster.kill_all()
        assert env.ping_all(4) == env.cross_pairs()
        cluster.restart_all()
        with cluster.client() as etcd:
            etcd.put(f"{env.prefix}/ipam/affinity/{n2.name}/podnet/10.90.201.0-26",
                     json.dumps({"cidr": "10.90.201.0/26", "node": n2.name, "network": "podnet"}))
        env.wait(lambda: "10.90.201.0/26 via" in n1.routes() and "10.90.201.0/26 via" in n3.routes(),
                 "a claim after etcd's restart routed")
        assert "resyncing" in n1.log_text() or "retrying" in n1.log_text()

        # node3's agent gone past its TTL (3 s): the others drop its blocks.
        n3_blocks = [ln.split()[0] for ln in n1.routes().splitlines() if f"via {n3.etcd.ip}" in ln]
        assert n3_blocks
        n3.stop_agent(signal.SIGKILL)
        env.wait(lambda: all(b not in n.routes() for n in (n1, n2) for b in n3_blocks), "node3 dropped", 30)
        assert f"route del {n3_blocks[0]}" in n1.log_text()

        # `pycni node remove`: node2 leaves for good; node1 drops its routes.
        n2.stop_agent(signal.SIGTERM)
        assert "stopped (routes left in place)" in n2.log_text() and n2.routes() != ""
        out = n1.ns.run([sys.executable, "-m", "pycni", "node", "remove", n2.name, "--etcd-endpoints",
                         ",".join(cluster.endpoints), "--etcd-prefix", env.prefix]).stdout
        assert "removed" in out
        env.wait(lambda: f"via {n2.etcd.ip}" not in n1.routes(), "node2 removed from node1's routes")

        # node1's key deleted by hand while its agent runs: the agent registers again.
        with cluster.client() as etcd:
            etcd.delete(f"{env.prefix}/nodes/{n1.name}")
            env.wait(lambda: etcd.get(f"{env.prefix}/nodes/{n1.name}") is not None, "node1 registered again")
        assert "registration gone while running" in n1.log_text()

        # A route the kernel refuses (a node whose underlay address is off this L2): logged, retried,
        # shown as MISSING by status (exit 3) — and nothing else disturbed.
        with cluster.client() as etcd:
            etcd.put(f"{env.prefix}/nodes/ghost", json.dumps({"name": "ghost", "underlayIP": "198.51.100.7"}))
            etcd.put(f"{env.prefix}/ipam/affinity/ghost/podnet/10.90.250.0-26",
                     json.dumps({"cidr": "10.90.250.0/26", "node": "ghost", "network": "podnet"}))
        env.wait(lambda: "FAILED route add 10.90.250.0/26 via 198.51.100.7" in n1.log_text(), "refusal logged")
        status = n1.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints",
                            ",".join(cluster.endpoints), "--etcd-prefix", env.prefix, "--node-name", n1.name],
                           check=False)
        assert status.returncode == 3 and "10.90.250.0/26 via 198.51.100.7 (node ghost): MISSING" in status.stdout
    finally:
        env.cleanup()


def test_vxlan_mode(cluster: EtcdCluster, tmp_path: Path, plugin_dir: str) -> None:
    env = _env(cluster, tmp_path, plugin_dir, "vxlan", dual=True)
    try:
        for n in env.nodes:
            n.start_agent()
        for n in env.nodes:
            for k in range(2):
                n.add_pod(f"{n.name}-vx{k}")
        env.converged()
        n1, n2, n3 = env.nodes
        dev = json.loads(n1.ns.run(["ip", "-d", "-j", "link", "show", "pycni.vxlan"]).stdout)[0]
        assert dev["mtu"] == 1450 and dev["linkinfo"]["info_data"]["port"] == 4789
        assert dev["linkinfo"]["info_data"].get("learning") is False
        routes = n1.routes()
        assert f"via {n2.etcd.ip} dev pycni.vxlan onlink" in routes and "ul0" not in routes
        status = n1.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints",
                            ",".join(cluster.endpoints), "--etcd-prefix", env.prefix, "--node-name",
                            n1.name]).stdout  # the mode as the node registered it
        assert status.count(": programmed") == 6 + 2 and "MISSING" not in status, status  # 3+3 blocks, 2 VTEPs
        fdb = n1.ns.run(["bridge", "fdb", "show", "dev", "pycni.vxlan"]).stdout
        assert f"dst {n2.etcd.ip}" in fdb and f"dst {n3.etcd.ip}" in fdb
        # pod blocks are not routed over the underlay directly: the kernel picks the vxlan device
        target = _addr(next(iter(n2.pods.values()))[1], 4)
        assert "dev pycni.vxlan" in n1.ns.run(["ip", "route", "get", target]).stdout
        assert env.ping_all(4) == env.cross_pairs()
        # IPv6 pods over the IPv4 overlay, via the peers' VTEP link-local addresses
        assert "dev pycni.vxlan" in n1.ns.run(["ip", "-6", "route", "get", _addr(next(iter(n2.pods.values()))[1],
                                                                                  6)]).stdout
        assert env.ping_all(6) == env.cross_pairs()
        # and the packets really are encapsulated: count UDP 4789 on the underlay while pinging
        udp_before = _udp_in(n2.ns)
        next(iter(n1.pods.values()))[0].run(["ping", "-c", "3", "-i", "0.2", target])
        assert _udp_in(n2.ns) >= udp_before + 3
        print("\n" + _iperf(env, n1, n3))

        # A pool of two blocks for three nodes: node3 must borrow an address from a block another
        # node owns; the agents route that one address (a /32) to node3, ahead of the block.
        tiny = [n.add_pod(f"{n.name}-tiny", n.conf("tinynet", "10.91.0.0/26", 27)) for n in env.nodes]
        borrowed = _addr(tiny[2], 4)
        env.wait(lambda: f"{borrowed} via {n3.etcd.ip}" in n1.routes() and f"{borrowed} via {n3.etcd.ip}"
                 in n2.routes(), "the borrowed address routed to node3")
        n1.pods[f"{n1.name}-tiny"][0].run(["ping", "-c", "1", "-W", "3", borrowed])
        n2.pods[f"{n2.name}-tiny"][0].run(["ping", "-c", "1", "-W", "3", borrowed])
        n3.pods[f"{n3.name}-tiny"][0].run(["ping", "-c", "1", "-W", "3", _addr(tiny[0], 4)])
        n3.del_pod(f"{n3.name}-tiny", n3.conf("tinynet", "10.91.0.0/26", 27))
        env.wait(lambda: f"{borrowed} via" not in n1.routes(), "the borrowed address's route gone with its pod")

        # Blocks of one address: node1's blackhole for its block and its pod's route have the
        # same prefix; the pod's (metric 0) must stay and win, whatever order they came in.
        one = _addr(n1.add_pod("n1-one", n1.conf("onenet", "10.92.0.0/28", 32)), 4)
        env.wait(lambda: f"{one} via {n1.etcd.ip}" in n2.routes(), "node2 routes node1's /32 block")
        env.wait(lambda: f"blackhole {one} " in n1.routes(), "node1 blackholes its /32 block")
        n2.pods[f"{n2.name}-tiny"][0].run(["ping", "-c", "1", "-W", "3", one])
        n1.stop_agent(signal.SIGKILL)  # a restart's full convergence leaves the pod's route alone too
        n1.start_agent()
        n2.pods[f"{n2.name}-tiny"][0].run(["ping", "-c", "1", "-W", "3", one])
        assert f"{one} dev rtd" in n1.ns.run(["ip", "route", "show", one]).stdout
        # a restart changes nothing that is right
        n1.stop_agent(signal.SIGKILL)
        n1.start_agent()
        time.sleep(1)
        env.converged()
        tail = n1.log_text().split("starting:")[-1]
        assert ": route " not in tail and ": fdb" not in tail and "vxlan device" not in tail
    finally:
        env.cleanup()


def _udp_in(ns: Namespace) -> int:
    """UDP datagrams received in ``ns`` so far (VXLAN arrives as UDP)."""
    lines = [ln.split() for ln in ns.run(["cat", "/proc/net/snmp"]).stdout.splitlines() if ln.startswith("Udp:")]
    return int(lines[1][lines[0].index("InDatagrams")])


def test_agents_over_tls(tmp_path: Path) -> None:
    """etcd with https and client certificates required: the agents register, watch and route."""
    with EtcdCluster(size=2, subnet="10.235.0.0/24", tls=True) as c:
        tls = ["--etcd-ca-cert", c.ca_cert, "--etcd-cert", c.client_cert, "--etcd-key", c.client_key]
        procs = []
        try:
            for node in c.nodes:
                log = open(tmp_path / f"{node.name}.log", "wb")
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", node.ns.name, sys.executable, "-m", "pycni", "node", "--etcd-endpoints",
                     ",".join(c.endpoints), "--node-name", node.name, "--underlay-ip", node.ip,
                     "--flows-socket", "", *tls],
                    stdout=log, stderr=subprocess.STDOUT))
                log.close()
            with c.client() as etcd:
                for i, node in enumerate(c.nodes):
                    etcd.put(f"/pycni/ipam/affinity/{node.name}/podnet/10.93.{i}.0-26",
                             json.dumps({"cidr": f"10.93.{i}.0/26", "node": node.name, "network": "podnet"}))
            n1, n2 = c.nodes
            Env.wait(lambda: "10.93.1.0/26 via 10.235.0.2" in n1.ns.run(["ip", "route"]).stdout
                     and "10.93.0.0/26 via 10.235.0.1" in n2.ns.run(["ip", "route"]).stdout, "routes over TLS")
            status = n1.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints",
                                ",".join(c.endpoints), "--node-name", n1.name, *tls]).stdout
            assert "10.93.1.0/26 via 10.235.0.2 (node node2): programmed" in status
            # without the client certificate etcd refuses: code 11 naming the endpoints
            bare = n1.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints", c.endpoints[0],
                              "--node-name", n1.name, "--etcd-ca-cert", c.ca_cert], check=False)
            assert bare.returncode == 1 and "(code 11)" in bare.stderr and c.endpoints[0] in bare.stderr
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=20)
