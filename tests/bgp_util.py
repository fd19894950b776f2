"""A BGP lab for tests: three nodes (tests/etcd_util.py's, one etcd member each) running
``pycni node --mode bgp`` with their own BIRD, ``routed`` + ``cluster-ipam`` pods on them, a router
namespace on the nodes' underlay running FRR (zebra + bgpd: another BGP implementation than the
nodes', with its own config, pid and socket directory) and an external host behind the router::

    node1 10.x.0.1 ─┐                                        ┌ ext 10.250.0.2 (default via .1)
    node2 10.x.0.2 ─┼─ br0 (underlay ns) ── ul0 10.x.0.250 ─ tor (FRR, AS 65000) ── ext0 10.250.0.1
    node3 10.x.0.3 ─┘

Short BGP timers (hold 3 s, keepalive 1 s, connect retry 1 s). Everything is in throwaway
namespaces named ``pb35-...`` and temporary directories; :meth:`Lab.close` removes it all.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from etcd_util import EtcdCluster, EtcdNode, spawn_agent, stop_agent
from netns_util import Namespace, new_namespace
from plugin_util import ok, run

PREFIX = "pb35"
ROUTER_AS = 65000
EXT_NET = "10.250.0.0/24"
EXT_IP = "10.250.0.2"
EXT_NET6 = "fd50::/64"
EXT_IP6 = "fd50::2"
HOLD = 3
FRR_DIR = "/usr/lib/frr"


def frr_available() -> bool:
    return os.path.exists(f"{FRR_DIR}/bgpd") and os.path.exists("/usr/sbin/bird") and os.geteuid() == 0


def wait(cond: Any, what: str, timeout: float = 30.0, step: float = 0.1) -> float:
    """Until ``cond()``; returns the seconds it took (AssertionError naming ``what`` on timeout)."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(step)
    return time.monotonic() - start


class Router:
    """FRR's zebra and bgpd in their own namespace, on the underlay, with a host behind them."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.ns = new_namespace(PREFIX)
        lab.namespaces.append(self.ns)
        self.ext = new_namespace(PREFIX)
        lab.namespaces.append(self.ext)
        # FRR drops to user frr (root is not in its vty group): a directory it can reach and write
        self.dir = Path(tempfile.mkdtemp(prefix="pb35-frr-"))
        os.chmod(self.dir, 0o755)
        os.chown(self.dir, *_frr_ids())
        self.ip = str(lab.net_base) + ".250"
        ul = lab.cluster.underlay
        assert ul is not None
        ul.run(["ip", "link", "add", "vtor", "type", "veth", "peer", "name", "ul0", "netns", self.ns.name])
        ul.run(["ip", "link", "set", "vtor", "master", "br0", "up"])
        self.ns.run(["ip", "addr", "add", f"{self.ip}/24", "dev", "ul0"])
        self.ns.run(["ip", "link", "set", "ul0", "up"])
        self.ns.run(["ip", "link", "add", "ext0", "type", "veth", "peer", "name", "eth0", "netns", self.ext.name])
        self.ns.run(["ip", "addr", "add", "10.250.0.1/24", "dev", "ext0"])
        self.ns.run(["ip", "link", "set", "ext0", "up"])
        self.ns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        self.ext.run(["ip", "addr", "add", f"{EXT_IP}/24", "dev", "eth0"])
        self.ext.run(["ip", "link", "set", "eth0", "up"])
        self.ext.run(["ip", "route", "add", "default", "via", "10.250.0.1"])
        self.ip6 = "fd32::fa"
        if lab.dual:
            self.ns.run(["ip", "addr", "add", f"{self.ip6}/64", "dev", "ul0", "nodad"])
            self.ns.run(["ip", "addr", "add", "fd50::1/64", "dev", "ext0", "nodad"])
            self.ns.run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])
            self.ext.run(["ip", "addr", "add", f"{EXT_IP6}/64", "dev", "eth0", "nodad"])
            self.ext.run(["ip", "-6", "route", "add", "default", "via", "fd50::1"])
        v6 = ("neighbor NODES6 peer-group\n neighbor NODES6 remote-as 64512\n neighbor NODES6 timers connect 1\n"
              " bgp listen range fd32::/64 peer-group NODES6\n") if lab.dual else ""
        v6af = (" address-family ipv6 unicast\n  network fd50::/64\n  neighbor NODES6 activate\n"
                " exit-address-family\n") if lab.dual else ""
        conf = self.dir / "frr.conf"
        conf.write_text(
            "frr defaults datacenter\nhostname pb35-tor\n"
            f"router bgp {ROUTER_AS}\n bgp router-id {self.ip}\n no bgp ebgp-requires-policy\n"
            " timers bgp 1 3\n"
            " neighbor NODES peer-group\n neighbor NODES remote-as 64512\n"
            " neighbor NODES timers connect 1\n"
            f" bgp listen range {lab.net_base}.0/24 peer-group NODES\n {v6}"
            f" address-family ipv4 unicast\n  network {EXT_NET}\n exit-address-family\n{v6af}")
        d = str(self.dir)
        for daemon in ("zebra", "bgpd"):
            self.ns.run([f"{FRR_DIR}/{daemon}", "-d", "-f", str(conf), "-i", f"{d}/{daemon}.pid",
                         "-z", f"{d}/zserv.api", "--vty_socket", d, "-u", "frr", "-g", "frr", "-P", "0",
                         "--log", f"file:{d}/{daemon}.log"])
            if daemon == "zebra":
                wait(lambda: (self.dir / "zserv.api").exists(), "zebra's socket")

    def vtysh(self, command: str) -> str:
        return self.ns.run(["vtysh", "--vty_socket", str(self.dir), "-c", command]).stdout

    def summary(self) -> dict[str, Any]:
        """bgpd's own view: peer address -> its summary (state, pfxRcd, ...)."""
        out = json.loads(self.vtysh("show bgp ipv4 unicast summary json") or "{}")
        return out.get("peers", {}) if isinstance(out, dict) else {}

    def routes(self) -> str:
        return self.ns.run(["ip", "-4", "route", "show", "proto", "bgp"]).stdout

    def close(self) -> None:
        for daemon in ("bgpd", "zebra"):
            try:
                pid = int((self.dir / f"{daemon}.pid").read_text().strip())
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _frr_ids() -> tuple[int, int]:
    import grp
    import pwd

    return pwd.getpwnam("frr").pw_uid, grp.getgrnam("frr").gr_gid


class Node:
    """One node: its namespace, agent, BIRD and pods."""

    def __init__(self, lab: Lab, node: EtcdNode) -> None:
        self.lab, self.etcd, self.name, self.ns = lab, node, node.name, node.ns
        self.agent: subprocess.Popen[bytes] | None = None
        self.log = lab.tmp / f"agent-{self.name}.log"
        self.pods: dict[str, tuple[Namespace, str]] = {}
        self.pods6: dict[str, str] = {}  # pod name -> its IPv6 address (a dual-stack lab)
        self.ip6 = f"fd32::{node.name[-1]}"
        if lab.dual:
            self.ns.run(["ip", "addr", "add", f"{self.ip6}/64", "dev", node.ifname, "nodad"])
            self.ns.run(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])

    @property
    def state(self) -> Path:
        return self.lab.tmp / "bgp" / self.name

    def pycni(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.ns.run([sys.executable, "-m", "pycni", *args], check=check)

    def start_agent(self, mode: str = "bgp", *extra: str) -> None:
        self.agent = spawn_agent(self.ns.name, self.log, [
            *self.lab.etcd_flags(), "--flows-socket", "", "--node-name", self.name, "--underlay-ip",
            f"{self.etcd.ip},{self.ip6}" if self.lab.dual else self.etcd.ip, "--mode", mode, "--ttl", "30",
            "--bgp-state-dir", str(self.lab.tmp / "bgp"), "--bgp-hold-time", str(HOLD),
            "--bgp-restart-time", "20", *extra])
        wait(lambda: f"registered {self.lab.prefix}/nodes/{self.name}" in self.log_text(),
             f"agent {self.name} registered")

    def stop_agent(self, sig: int = signal.SIGTERM) -> None:
        stop_agent(self.agent, sig)
        self.agent = None

    def bird_pid(self) -> int:
        try:
            return int((self.state / "bird.pid").read_text().strip())
        except (OSError, ValueError):
            return 0

    def kill_bird(self) -> None:
        pid = self.bird_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def status(self) -> list[dict[str, Any]]:
        out = self.pycni("bgp", "status", "--node", self.name, "--bgp-state-dir", str(self.lab.tmp / "bgp"),
                         "-o", "json", check=False)
        assert out.returncode in (0, 3), out.stderr
        rows: list[dict[str, Any]] = json.loads(out.stdout)
        return rows

    def established(self) -> dict[str, dict[str, Any]]:
        try:
            return {r["name"]: r for r in self.status() if r["state"] == "Established"}
        except AssertionError:
            return {}

    def add_pod(self, name: str, block: int = 26, network: str = "podnet", subnet: str = "10.90.0.0/16") -> str:
        ns = new_namespace(PREFIX)
        self.lab.namespaces.append(ns)
        conf = {"cniVersion": "1.1.0", "name": network, "type": "routed",
                "ipam": {"type": "cluster-ipam", "etcdEndpoints": self.lab.cluster.endpoints,
                         "etcdPrefix": self.lab.prefix, "nodeName": self.name,
                         "ranges": [[{"subnet": subnet}]] + ([[{"subnet": "fd90::/112"}]] if self.lab.dual else []),
                         "blockSize": block, "etcdTimeout": 10,
                         "lockDir": str(self.lab.tmp / "locks")}}
        result = ok(run("routed", "ADD", conf, host=self.ns, netns=ns, cni_path=self.lab.plugin_dir, container_id=name))
        ip = result["ips"][0]["address"].split("/")[0]
        self.pods[name] = (ns, ip)
        self.pods6[name] = next((i["address"].split("/")[0] for i in result["ips"] if ":" in i["address"]), "")
        return ip

    def bird_routes(self) -> str:
        return self.ns.run(["ip", "-4", "route", "show", "proto", "bird"]).stdout

    def bird_routes6(self) -> str:
        return self.ns.run(["ip", "-6", "route", "show", "proto", "bird"]).stdout


class Lab:
    def __init__(self, cluster: EtcdCluster, tmp: Path, plugin_dir: str, prefix: str, dual: bool = False) -> None:
        self.cluster, self.tmp, self.plugin_dir, self.prefix = cluster, tmp, plugin_dir, prefix
        self.dual = dual  # IPv6 too: nodes fd32::N, the router fd32::fa, the external host fd50::2
        self.net_base = ".".join(cluster.nodes[0].ip.split(".")[:3])
        self.namespaces: list[Namespace] = []
        self.nodes = [Node(self, n) for n in cluster.nodes]
        self.router: Router | None = None
        try:
            self.router = Router(self)
        except BaseException:
            self.close()
            raise

    @property
    def tor(self) -> Router:
        assert self.router is not None
        return self.router

    def etcd_flags(self) -> list[str]:
        return ["--etcd-endpoints", ",".join(self.cluster.endpoints), "--etcd-prefix", self.prefix]

    def pycni(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A CLI verb run from node1 (it reaches etcd over the underlay)."""
        return self.nodes[0].pycni(*args, *self.etcd_flags(), check=check)

    def pods(self) -> list[tuple[Node, str, Namespace, str]]:
        return [(n, name, ns, ip) for n in self.nodes for name, (ns, ip) in n.pods.items()]

    def ping_pods(self) -> int:
        """Every pod pings every pod on the other nodes; returns the pairs."""
        pairs = 0
        for n1, _, ns1, _ in self.pods():
            targets = [ip for n2, _, _, ip in self.pods() if n2 is not n1]
            ns1.run(["sh", "-c", " && ".join(f"ping -c 1 -W 3 {t} >/dev/null" for t in targets)])
            pairs += len(targets)
        return pairs

    def ext_ping(self, ip: str, count: int = 1) -> bool:
        return self.tor.ext.run(["ping", "-c", str(count), "-W", "2", ip], check=False).returncode == 0

    def close(self) -> None:
        for n in self.nodes:
            n.stop_agent(signal.SIGKILL)
            n.kill_bird()
            for proto in ("bird", "94", "95"):
                for fam in ("-4", "-6"):
                    n.ns.run(["ip", fam, "route", "flush", "proto", proto], check=False)
            n.ns.run(["sh", "-c", "for l in $(ls /sys/class/net | grep ^rtd); do ip link del $l; done"], check=False)
            n.ns.run(["ip", "link", "set", n.etcd.ifname, "up"], check=False)
        if self.router is not None:
            self.router.close()
        ul = self.cluster.underlay
        if ul is not None:
            ul.run(["ip", "link", "del", "vtor"], check=False)
        for ns in self.namespaces:
            ns.delete()
        with self.cluster.client() as etcd:
            etcd.delete_prefix(self.prefix + "/")


class Pinger:
    """A continuous ping (5 a second) from the external host; :meth:`stop` returns (sent, received)."""

    def __init__(self, lab: Lab, target: str) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", lab.tor.ext.name, "ping", "-i", "0.2", "-W", "1",
                                      target], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def stop(self) -> tuple[int, int]:
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=10)
        for line in out.splitlines():
            if "packets transmitted" in line:
                parts = line.split(",")
                return int(parts[0].split()[0]), int(parts[1].split()[0])
        raise AssertionError(f"no ping summary: {out}")


@contextmanager
def running_lab(tmp: Path, plugin_dir: str, subnet: str, prefix: str, dual: bool = False) -> Iterator[Lab]:
    """A three-member etcd on ``subnet`` and a :class:`Lab` on it under the etcd prefix ``prefix``
    (this process's pid appended), closed afterwards."""
    with EtcdCluster(size=3, subnet=subnet, prefix="pb35") as cluster:
        lab = Lab(cluster, tmp, plugin_dir, prefix=f"{prefix}-{os.getpid()}", dual=dual)
        try:
            yield lab
        finally:
            lab.close()
