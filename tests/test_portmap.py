"""portmap plugin: real TCP/UDP through mapped host ports, in throwaway namespaces.

Topology (all namespaces are throwaway):

    client ns  eth0 192.168.77.2 / fd77::2
        |  veth
    host ns    ext0 192.168.77.1, 192.168.77.10 / fd77::1      <- plugins run here
               br0  10.88.0.1/24 / fd88::1/64
        |  veth per container, host end on br0
    container  eth0 10.88.0.1x / fd88::1x   (runs a server that answers with the peer address)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import plugin_util
import pytest
from netns_util import Namespace
from plugin_util import ok

from pycni.plugins.meta import portmap
from pycni.plugins.meta.portmap import iptables as pm_ipt
from pycni.plugins.meta.portmap import nftables as pm_nft
from pycni.skel import Outcome

HOST_IP = "192.168.77.1"
HOST_IP2 = "192.168.77.10"
HOST_IP6 = "fd77::1"

SERVER = r"""
import socket, sys
port, tag, proto = int(sys.argv[1]), sys.argv[2], sys.argv[3]
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET6, kind)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", port))
if proto == "tcp":
    s.listen(16)
print("ready", flush=True)
while True:
    if proto == "tcp":
        c, addr = s.accept()
        c.sendall(f"{tag} {addr[0].removeprefix('::ffff:')}".encode())
        c.close()
    else:
        data, addr = s.recvfrom(2048)
        s.sendto(f"{tag} {addr[0].removeprefix('::ffff:')}".encode(), addr)
"""

CLIENT = r"""
import socket, sys
host, port, proto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    if proto == "tcp":
        c = socket.create_connection((host, port), timeout=3)
    else:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        c = socket.socket(fam, socket.SOCK_DGRAM)
        c.settimeout(3)
        c.sendto(b"hi", (host, port))
    print(c.recv(2048).decode())
except OSError as e:
    print(f"ERR {type(e).__name__}")
"""


def sh(ns: Namespace, *cmds: str) -> None:
    for cmd in cmds:
        ns.run(cmd.split())


@dataclass
class Topo:
    host: Namespace
    client: Namespace
    containers: list[Namespace]
    servers: list[subprocess.Popen[str]] = field(default_factory=list)

    def cip(self, i: int, v6: bool = False) -> str:
        return f"fd88::{10 + i}" if v6 else f"10.88.0.{10 + i}"

    def prev_result(self, i: int) -> dict[str, Any]:
        return {"cniVersion": "1.0.0",
                "interfaces": [{"name": "br0"}, {"name": f"vc{i}"},
                               {"name": "eth0", "sandbox": self.containers[i].path}],
                "ips": [{"address": f"{self.cip(i)}/24", "gateway": "10.88.0.1", "interface": 2},
                        {"address": f"{self.cip(i, True)}/64", "gateway": "fd88::1", "interface": 2}]}

    def serve(self, i: int | Namespace, port: int, tag: str, proto: str = "tcp") -> None:
        """Start a server in container i (or namespace i) that answers '<tag> <peer address>'."""
        ns = i if isinstance(i, Namespace) else self.containers[i]
        p = subprocess.Popen(["ip", "netns", "exec", ns.name, sys.executable, "-c", SERVER,
                              str(port), tag, proto], stdout=subprocess.PIPE, text=True)
        self.servers.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"


def connect(ns: Namespace, host: str, port: int, proto: str = "tcp") -> str:
    return ns.run([sys.executable, "-c", CLIENT, host, str(port), proto], timeout=20).stdout.strip()


@pytest.fixture
def topo_factory(netns_factory: Callable[[], Namespace]) -> Iterator[Callable[[int], Topo]]:
    made: list[Topo] = []

    def make(n_containers: int = 1) -> Topo:
        host, client = netns_factory(), netns_factory()
        t = Topo(host, client, [netns_factory() for _ in range(n_containers)])
        made.append(t)
        sh(host, "sysctl -qw net.ipv4.ip_forward=1", "sysctl -qw net.ipv6.conf.all.forwarding=1",
           "ip link add br0 type bridge", "ip addr add 10.88.0.1/24 dev br0",
           "ip addr add fd88::1/64 dev br0 nodad", "ip link set br0 up",
           f"ip link add ext0 type veth peer name eth0 netns {client.name}",
           f"ip addr add {HOST_IP}/24 dev ext0", f"ip addr add {HOST_IP2}/24 dev ext0",
           f"ip addr add {HOST_IP6}/64 dev ext0 nodad", "ip link set ext0 up")
        sh(client, "ip addr add 192.168.77.2/24 dev eth0", "ip addr add fd77::2/64 dev eth0 nodad",
           "ip link set eth0 up", f"ip route add default via {HOST_IP}", f"ip -6 route add default via {HOST_IP6}")
        for i, c in enumerate(t.containers):
            # hairpin on: with br_netfilter loaded, a DNAT'd hairpin packet is bridged back out of
            # the port it came in on (the bridge plugin's hairpinMode).
            sh(host, f"ip link add vc{i} type veth peer name eth0 netns {c.name}",
               f"ip link set vc{i} master br0", f"ip link set vc{i} type bridge_slave hairpin on",
               f"ip link set vc{i} up")
            sh(c, f"ip addr add {t.cip(i)}/24 dev eth0", f"ip addr add {t.cip(i, True)}/64 dev eth0 nodad",
               "ip link set eth0 up", "ip route add default via 10.88.0.1", "ip -6 route add default via fd88::1")
        return t

    yield make
    for t in made:
        for p in t.servers:
            p.kill()
            p.wait()


def conf(t: Topo, i: int, mappings: list[dict[str, Any]] | None, backend: str = "nftables",
         **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"cniVersion": "1.0.0", "name": "testnet", "type": "portmap", "backend": backend,
                         "prevResult": t.prev_result(i), **extra}
    if mappings is not None:
        c["runtimeConfig"] = {"portMappings": mappings}
    return c


def call(t: Topo, command: str, i: int, netconf: dict[str, Any] | bytes, container_id: str | None = None,
         via: str = "dispatch", cni_path: str = "/nonexistent") -> Outcome:
    return plugin_util.run("portmap", command, netconf, via=via, host=t.host, container_id=container_id or f"ctr-{i}",
                           netns=t.containers[i], cni_path=cni_path)


def err(outcome: Outcome) -> dict[str, Any]:
    assert outcome.exit_code != 0, outcome.stdout.decode()
    e = json.loads(outcome.stdout)
    assert set(e) >= {"code", "msg"}
    return e


def ruleset(t: Topo) -> str:
    return t.host.run(["nft", "list", "ruleset"]).stdout


def ipt_nat(t: Topo) -> str:
    return t.host.run(["iptables-save", "-t", "nat"]).stdout + t.host.run(["ip6tables-save", "-t", "nat"]).stdout


def our_nft_objects(t: Topo) -> str:
    """Map and set elements left in our table (empty when all is clean: every element belongs
    to one container, none to a network)."""
    listing = json.loads(t.host.run(["nft", "-j", "list", "ruleset"]).stdout)["nftables"]
    left = [f"{o['set'].get('name')}: {o['set']['elem']}" for o in listing if "set" in o and o["set"].get("elem")]
    left += [f"{o['map'].get('name')}: {o['map']['elem']}" for o in listing if "map" in o and o["map"].get("elem")]
    return "\n".join(left)


WEB = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]

BACKENDS = ["nftables", "iptables"]


# ---- traffic ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_tcp_through_host_port(topo_factory: Callable[[int], Topo], backend: str) -> None:
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")  # nothing mapped yet
    nc = conf(t, 0, WEB, backend)
    result = ok(call(t, "ADD", 0, nc))
    assert result == {**t.prev_result(0), "dns": {}} or result["ips"] == t.prev_result(0)["ips"]
    # The external client reaches the container; no masquerade for outside traffic.
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    assert connect(t.client, HOST_IP6, 8080) == "c0 fd77::2"
    ok(call(t, "CHECK", 0, nc))
    ok(call(t, "DEL", 0, nc))
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")


@pytest.mark.parametrize("backend", BACKENDS)
def test_hairpin_and_localhost(topo_factory: Callable[[int], Topo], backend: str) -> None:
    t = topo_factory(2)
    t.serve(0, 80, "c0")
    ok(call(t, "ADD", 0, conf(t, 0, WEB, backend)))
    # The container reaches itself through the host port: masqueraded to the bridge address,
    # otherwise its reply would go straight back to itself and the connection would fail.
    assert connect(t.containers[0], HOST_IP, 8080) == "c0 10.88.0.1"
    # A neighbour on the same bridge, likewise.
    assert connect(t.containers[1], HOST_IP, 8080) == "c0 10.88.0.1"
    assert connect(t.containers[0], HOST_IP6, 8080) == "c0 fd88::1"
    # From the host itself via localhost (route_localnet set on the bridge, as the reference does).
    assert connect(t.host, "127.0.0.1", 8080) == "c0 10.88.0.1"
    assert t.host.run(["sysctl", "-n", "net.ipv4.conf.br0.route_localnet"]).stdout.strip() == "1"
    ok(call(t, "DEL", 0, conf(t, 0, WEB, backend)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_udp_and_host_ip(topo_factory: Callable[[int], Topo], backend: str) -> None:
    t = topo_factory(1)
    t.serve(0, 53, "dns", "udp")
    t.serve(0, 81, "web")
    maps = [{"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
            {"hostPort": 8081, "containerPort": 81, "protocol": "tcp", "hostIP": HOST_IP2}]
    nc = conf(t, 0, maps, backend)
    ok(call(t, "ADD", 0, nc))
    assert connect(t.client, HOST_IP, 5353, "udp") == "dns 192.168.77.2"
    assert connect(t.client, HOST_IP6, 5353, "udp") == "dns fd77::2"
    assert connect(t.client, HOST_IP2, 8081) == "web 192.168.77.2"
    # hostIP restricts the mapping to that address (and to IPv4).
    assert connect(t.client, HOST_IP, 8081).startswith("ERR")
    assert connect(t.client, HOST_IP6, 8081).startswith("ERR")
    ok(call(t, "CHECK", 0, nc))
    ok(call(t, "DEL", 0, nc))
    assert connect(t.client, HOST_IP2, 8081).startswith("ERR")


def test_snat_false_disables_hairpin_masquerade(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    nc = conf(t, 0, WEB, snat=False)
    ok(call(t, "ADD", 0, nc))
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    # No hairpin elements: the container reaching itself through the host port is not
    # masqueraded, so its reply bypasses the NAT and the connection fails.
    targets = t.host.run(["nft", "list", "set", "inet", pm_nft.NFT_TABLE, "masq4"]).stdout
    assert "10.88.0.10" not in targets
    assert connect(t.containers[0], HOST_IP, 8080).startswith("ERR")
    ok(call(t, "DEL", 0, nc))


# ---- DEL -------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_del_without_port_mappings_removes_everything(topo_factory: Callable[[int], Topo], backend: str) -> None:
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    maps = [*WEB, {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
            {"hostPort": 8081, "containerPort": 81, "protocol": "tcp", "hostIP": HOST_IP2}]
    ok(call(t, "ADD", 0, conf(t, 0, maps, backend)))
    before = our_nft_objects(t) if backend == "nftables" else ipt_nat(t)
    assert "id: ctr-0" in before or "CNI-DN-" in before
    # The runtime forgets the capability args (and the prevResult) on DEL.
    bare = conf(t, 0, None, backend)
    del bare["prevResult"]
    ok(call(t, "DEL", 0, bare))
    ok(call(t, "DEL", 0, bare))  # and again: idempotent
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")
    if backend == "nftables":
        assert our_nft_objects(t) == ""
        assert "ctr-0" not in ruleset(t) and "10.88.0.10" not in ruleset(t)
    else:
        nat = ipt_nat(t)
        assert "CNI-DN-" not in nat and "10.88.0.10" not in nat and "fd88::10" not in nat


@pytest.mark.parametrize("backend", BACKENDS)
def test_del_twice_and_before_add(topo_factory: Callable[[int], Topo], backend: str) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, WEB, backend)
    ok(call(t, "DEL", 0, nc))  # nothing was ever added
    ok(call(t, "ADD", 0, nc))
    ok(call(t, "DEL", 0, nc))
    ok(call(t, "DEL", 0, nc))
    assert (our_nft_objects(t) == "") if backend == "nftables" else ("CNI-DN-" not in ipt_nat(t))


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_containers_del_one_keeps_other(topo_factory: Callable[[int], Topo], backend: str) -> None:
    t = topo_factory(2)
    t.serve(0, 80, "c0")
    t.serve(1, 80, "c1")
    ok(call(t, "ADD", 0, conf(t, 0, WEB, backend)))
    ok(call(t, "ADD", 1, conf(t, 1, [{"hostPort": 9090, "containerPort": 80, "protocol": "tcp"}], backend)))
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    assert connect(t.client, HOST_IP, 9090) == "c1 192.168.77.2"
    ok(call(t, "DEL", 0, conf(t, 0, None, backend)))
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")
    assert connect(t.client, HOST_IP, 9090) == "c1 192.168.77.2"
    assert connect(t.containers[1], HOST_IP, 9090) == "c1 10.88.0.1"
    ok(call(t, "CHECK", 1, conf(t, 1, [{"hostPort": 9090, "containerPort": 80, "protocol": "tcp"}], backend)))
    ok(call(t, "DEL", 1, conf(t, 1, None, backend)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_host_port_newest_wins_and_survives_older_del(topo_factory: Callable[[int], Topo],
                                                           backend: str) -> None:
    t = topo_factory(2)
    t.serve(0, 80, "c0")
    t.serve(1, 80, "c1")
    ok(call(t, "ADD", 0, conf(t, 0, WEB, backend)))
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    ok(call(t, "ADD", 1, conf(t, 1, WEB, backend)))
    assert connect(t.client, HOST_IP, 8080) == "c1 192.168.77.2"
    for args in (WEB, None):  # with and without the capability args
        ok(call(t, "DEL", 0, conf(t, 0, args, backend)))
        assert connect(t.client, HOST_IP, 8080) == "c1 192.168.77.2"
    ok(call(t, "CHECK", 1, conf(t, 1, WEB, backend)))
    ok(call(t, "DEL", 1, conf(t, 1, WEB, backend)))
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")


# ---- CHECK -----------------------------------------------------------------------------------
def test_check_detects_missing_rules_nftables(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, WEB)
    ok(call(t, "ADD", 0, nc))
    ok(call(t, "CHECK", 0, nc))
    t.host.run(["nft", "delete", "element", "inet", pm_nft.NFT_TABLE, "hostports4", "{ tcp . 8080 }"])
    e = err(call(t, "CHECK", 0, nc))
    assert "8080" in e.get("details", "")
    ok(call(t, "DEL", 0, nc))
    assert "no element" in err(call(t, "CHECK", 0, nc)).get("details", "")
    # A mapping that was never added is missing too.
    ok(call(t, "ADD", 0, nc))
    e = err(call(t, "CHECK", 0, conf(t, 0, [*WEB, {"hostPort": 1234, "containerPort": 1, "protocol": "udp"}])))
    assert "1234" in e["details"]
    ok(call(t, "DEL", 0, nc))


def test_check_detects_missing_rules_iptables(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, WEB, "iptables")
    ok(call(t, "ADD", 0, nc))
    ok(call(t, "CHECK", 0, nc))
    chain = pm_ipt.dnat_chain_name("testnet", "ctr-0")
    t.host.run(["iptables", "-t", "nat", "-F", chain])
    err(call(t, "CHECK", 0, nc))
    ok(call(t, "DEL", 0, nc))


# ---- config handling -------------------------------------------------------------------------
def test_no_mappings_passes_prev_result_through(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    for nc in (conf(t, 0, None), conf(t, 0, [])):
        result = ok(call(t, "ADD", 0, nc))
        assert result["ips"] == t.prev_result(0)["ips"]
        assert result["interfaces"] == t.prev_result(0)["interfaces"]
    assert pm_nft.NFT_TABLE not in ruleset(t)


def test_result_converted_to_config_version(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, WEB)
    nc["cniVersion"] = "0.4.0"
    nc["prevResult"]["cniVersion"] = "0.4.0"
    for ip in nc["prevResult"]["ips"]:
        ip["version"] = "4" if "." in ip["address"] else "6"
    result = ok(call(t, "ADD", 0, nc))
    assert result["cniVersion"] == "0.4.0"
    assert [ip["version"] for ip in result["ips"]] == ["4", "6"]
    ok(call(t, "DEL", 0, nc))


@pytest.mark.parametrize("extra, mappings, needle", [
    ({}, [{"hostPort": 0, "containerPort": 80, "protocol": "tcp"}], "host port"),
    ({}, [{"hostPort": 80, "containerPort": 70000, "protocol": "tcp"}], "container port"),
    ({}, [{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}], "protocol"),
    ({}, [{"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "nope"}], "hostIP"),
    ({}, [{"hostPort": "80", "containerPort": 80}], "hostPort"),
    ({"backend": "pf"}, WEB, "backend"),
    ({"markMasqBit": 40}, WEB, "MasqMarkBit"),
    ({"markMasqBit": 5, "externalSetMarkChain": "X"}, WEB, "externalSetMarkChain"),
    ({"backend": "iptables", "conditionsV4": ["ip saddr 10.0.0.0/8"]}, WEB, "nftables-specific"),
    ({"backend": "nftables", "externalSetMarkChain": "X"}, WEB, "iptables-specific"),
    ({"snat": "yes"}, WEB, "snat"),
])
def test_invalid_config(topo_factory: Callable[[int], Topo], extra: dict[str, Any],
                        mappings: list[dict[str, Any]], needle: str) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, mappings, **extra)
    if "backend" in extra:
        nc["backend"] = extra["backend"]
    else:
        nc.pop("backend")
    e = err(call(t, "ADD", 0, nc))
    assert e["code"] == 7, e
    assert needle in e["msg"] + e.get("details", ""), e
    assert pm_nft.NFT_TABLE not in ruleset(t) and "CNI-" not in ipt_nat(t)


def test_not_chained_and_bad_json(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, WEB)
    del nc["prevResult"]
    e = err(call(t, "ADD", 0, nc))
    assert e["code"] == 7 and "chained" in e["msg"]
    assert err(call(t, "CHECK", 0, nc))["code"] == 7
    assert err(call(t, "ADD", 0, b"{not json", container_id="x"))["code"] == 6


def test_bad_nft_conditions_roll_back(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, WEB, conditionsV4=["ip frobnicate 1"])
    e = err(call(t, "ADD", 0, nc))
    assert e["code"] == 7 and "frobnicate" in e["details"]
    assert pm_nft.NFT_TABLE not in ruleset(t)  # one transaction: nothing half-made


def test_nft_conditions_restrict_mapping(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    nc = conf(t, 0, WEB, conditionsV4=["ip saddr 192.168.77.99"], conditionsV6=["ip6 saddr fd77::2"])
    ok(call(t, "ADD", 0, nc))
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")   # v4 client not allowed
    assert connect(t.client, HOST_IP6, 8080) == "c0 fd77::2"    # v6 client allowed
    ok(call(t, "DEL", 0, nc))


def test_iptables_conditions_and_mark_bit(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    nc = conf(t, 0, WEB, "iptables", conditionsV4=["-s", "192.168.77.99"], markMasqBit=5)
    ok(call(t, "ADD", 0, nc))
    nat = ipt_nat(t)
    assert "--set-xmark 0x20/0x20" in nat and "-s 192.168.77.99/32" in nat
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")
    assert connect(t.client, HOST_IP6, 8080) == "c0 fd77::2"
    ok(call(t, "DEL", 0, nc))


# ---- the executable, and the Go reference ----------------------------------------------------
def test_installed_executable(topo_factory: Callable[[int], Topo], plugin_dir: str) -> None:
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    nc = conf(t, 0, WEB)
    out = ok(call(t, "ADD", 0, nc, container_id="exe-1", via="exec", cni_path=plugin_dir))
    assert out["ips"][0]["address"] == "10.88.0.10/24"
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    ok(call(t, "DEL", 0, nc, container_id="exe-1", via="exec", cni_path=plugin_dir))
    assert our_nft_objects(t) == ""


GO_DIR = "/usr/lib/cni"
GO_PORTMAP = GO_DIR + "/portmap"


def _normalize(save: str) -> list[str]:
    return sorted(line for line in save.splitlines() if line.startswith(("-A", ":CNI")))


@pytest.mark.skipif(not __import__("os").path.exists(GO_PORTMAP), reason="Go reference plugins not installed")
def test_iptables_layout_matches_go_reference(topo_factory: Callable[[int], Topo]) -> None:
    """Same input to the Go plugin (v1.1.1: iptables only) and to ours: same nat rules."""
    ours, theirs = topo_factory(1), topo_factory(1)
    maps = [*WEB, {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
            {"hostPort": 8081, "containerPort": 81, "protocol": "tcp", "hostIP": HOST_IP2}]
    nc = conf(ours, 0, maps, "iptables")
    ok(call(ours, "ADD", 0, nc))
    go_conf = conf(theirs, 0, maps)
    go_conf.pop("backend")
    out = ok(call(theirs, "ADD", 0, go_conf, via="exec", cni_path=GO_DIR))
    assert out["ips"] == json.loads(json.dumps(ours.prev_result(0)["ips"]))
    # Our prevResult names a different netns path; the rules do not depend on it.
    assert _normalize(ipt_nat(ours)) == _normalize(ipt_nat(theirs))
    # Our DEL removes what the Go plugin made, even without the capability args.
    bare = conf(theirs, 0, None, "iptables")
    ok(call(theirs, "DEL", 0, bare))
    assert "CNI-DN-" not in ipt_nat(theirs)
    ok(call(ours, "DEL", 0, nc))


# ---- concurrency -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_add_and_del(topo_factory: Callable[[int], Topo], backend: str) -> None:
    """Parallel invocations (threads, as in the daemon) neither lose nor duplicate rules."""
    import concurrent.futures

    n = 6
    t = topo_factory(n)
    for i in range(n):
        t.serve(i, 80, f"c{i}")

    def mapping(i: int) -> list[dict[str, Any]]:
        return [{"hostPort": 8000 + i, "containerPort": 80, "protocol": "tcp"}]

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        outcomes = list(pool.map(lambda i: call(t, "ADD", i, conf(t, i, mapping(i), backend)), range(n)))
    for o in outcomes:
        ok(o)
    for i in range(n):
        assert connect(t.client, HOST_IP, 8000 + i) == f"c{i} 192.168.77.2"
        ok(call(t, "CHECK", i, conf(t, i, mapping(i), backend)))
    if backend == "iptables":
        nat = t.host.run(["iptables-save", "-t", "nat"]).stdout
        assert nat.count("-j CNI-HOSTPORT-DNAT") == 2  # PREROUTING and OUTPUT, once each
        assert nat.count("-j CNI-HOSTPORT-MASQ") == 1
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        outcomes = list(pool.map(lambda i: call(t, "DEL", i, conf(t, i, None, backend)), range(n)))
    for o in outcomes:
        ok(o)
    if backend == "nftables":
        assert our_nft_objects(t) == ""
    else:
        assert "CNI-DN-" not in ipt_nat(t)


# ---- end to end: our bridge + host-local + portmap -------------------------------------------
def test_end_to_end_bridge_host_local_portmap(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                              tmp_path: Any) -> None:
    import os

    for name in ("bridge", "host-local", "portmap"):
        if not os.path.exists(f"{plugin_dir}/{name}"):
            pytest.skip(f"our {name} plugin is not available")
    host, client, ctr = netns_factory(), netns_factory(), netns_factory()
    t = Topo(host, client, [ctr])
    sh(host, "sysctl -qw net.ipv4.ip_forward=1", f"ip link add ext0 type veth peer name eth0 netns {client.name}",
       f"ip addr add {HOST_IP}/24 dev ext0", "ip link set ext0 up")
    sh(client, "ip addr add 192.168.77.2/24 dev eth0", "ip link set eth0 up", f"ip route add default via {HOST_IP}")
    try:
        t.serve(t.client, 7000, "far")
        bridge = {"cniVersion": "1.0.0", "name": "e2enet", "type": "bridge", "bridge": "cni0", "isGateway": True,
                  "ipMasq": True, "ipMasqBackend": "nftables", "hairpinMode": True,
                  "ipam": {"type": "host-local", "subnet": "10.99.0.0/24", "routes": [{"dst": "0.0.0.0/0"}],
                           "dataDir": str(tmp_path / "ipam")}}
        ours = {"via": "exec", "host": host, "cni_path": plugin_dir, "container_id": "e2e-1", "netns": ctr}
        result = ok(plugin_util.run("bridge", "ADD", bridge, **ours))
        cip = result["ips"][0]["address"].split("/")[0]
        pm = {"cniVersion": "1.0.0", "name": "e2enet", "type": "portmap", "prevResult": result,
              "runtimeConfig": {"portMappings": WEB}}
        out = ok(plugin_util.run("portmap", "ADD", pm, **ours))
        assert out["ips"] == result["ips"]
        t.serve(0, 80, "c0")
        assert connect(client, HOST_IP, 8080) == "c0 192.168.77.2"       # port mapping
        assert connect(ctr, HOST_IP, 8080) == "c0 10.99.0.1"             # hairpin
        assert connect(host, "127.0.0.1", 8080) == "c0 10.99.0.1"        # localhost
        assert connect(ctr, "192.168.77.2", 7000) == f"far {HOST_IP}"    # ipMasq
        ok(plugin_util.run("portmap", "CHECK", pm, **ours))
        for plugin, conf_ in (("portmap", pm), ("bridge", bridge)):
            ok(plugin_util.run(plugin, "DEL", conf_, **ours))
        assert connect(client, HOST_IP, 8080).startswith("ERR")
        text = host.run(["nft", "list", "ruleset"]).stdout
        assert cip not in text and "e2e-1" not in text
    finally:
        for p in t.servers:
            p.kill()
            p.wait()


def test_gc_removes_only_stale_containers(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(2)
    t.serve(0, 80, "c0")
    t.serve(1, 80, "c1")
    ports = {0: 8080, 1: 9090}
    for i in (0, 1):
        ok(call(t, "ADD", i, conf(t, i, [{"hostPort": ports[i], "containerPort": 80, "protocol": "tcp"}])))
    gc = {"cniVersion": "1.1.0", "name": "testnet", "type": "portmap",
          "cni.dev/valid-attachments": [{"containerID": "ctr-1", "ifname": "eth0"}]}
    ok(plugin_util.run("portmap", "GC", gc, host=t.host, cni_path="/x"))
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")
    assert connect(t.client, HOST_IP, 9090) == "c1 192.168.77.2"
    assert "ctr-0" not in ruleset(t) and "ctr-1" in ruleset(t)
    # Another network's GC leaves this network's mappings alone.
    ok(plugin_util.run("portmap", "GC", {**gc, "name": "othernet", "cni.dev/valid-attachments": []}, host=t.host,
                       cni_path="/x"))
    assert connect(t.client, HOST_IP, 9090) == "c1 192.168.77.2"
    ok(call(t, "DEL", 1, conf(t, 1, None)))


def test_iptables_external_set_mark_chain(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    t.host.run(["iptables", "-t", "nat", "-N", "MY-MARK"])
    t.host.run(["iptables", "-t", "nat", "-A", "MY-MARK", "-j", "MARK", "--set-xmark", "0x4000/0x4000"])
    t.host.run(["ip6tables", "-t", "nat", "-N", "MY-MARK"])
    nc = conf(t, 0, WEB, externalSetMarkChain="MY-MARK")
    nc.pop("backend")  # externalSetMarkChain alone selects the iptables backend
    ok(call(t, "ADD", 0, nc))
    nat = ipt_nat(t)
    assert "-j MY-MARK" in nat and "CNI-HOSTPORT-SETMARK" not in nat and "CNI-HOSTPORT-MASQ" not in nat
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    ok(call(t, "DEL", 0, nc))
    assert "CNI-DN-" not in ipt_nat(t)


UDP_FIXED_SOURCE = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 40404))  # the same flow (5-tuple) every time
s.settimeout(2)
s.sendto(b"hi", (host, port))
try:
    print(s.recv(2048).decode())
except OSError as e:
    print(f"ERR {type(e).__name__}")
"""


def test_add_forgets_stale_udp_flows(topo_factory: Callable[[int], Topo]) -> None:
    """A UDP flow that hit the host port before the mapping existed is DNAT'd after ADD."""
    t = topo_factory(2)
    t.serve(0, 53, "dns", "udp")
    # Another mapping first, so the nat hooks (and conntrack) are active in the host.
    ok(call(t, "ADD", 1, conf(t, 1, [{"hostPort": 9999, "containerPort": 9, "protocol": "udp"}])))
    before = t.client.run([sys.executable, "-c", UDP_FIXED_SOURCE, HOST_IP, "5353"]).stdout.strip()
    assert before.startswith("ERR")
    ok(call(t, "ADD", 0, conf(t, 0, [{"hostPort": 5353, "containerPort": 53, "protocol": "udp"}])))
    after = t.client.run([sys.executable, "-c", UDP_FIXED_SOURCE, HOST_IP, "5353"]).stdout.strip()
    assert after == "dns 192.168.77.2"
    for i in (0, 1):
        ok(call(t, "DEL", i, conf(t, i, None)))


def test_conntrack_delete_by_dst_port(host_ns: Namespace) -> None:
    import socket as s

    from pycni.net import conntrack

    host_ns.run(["nft", "add table ip cttest; add chain ip cttest out { type filter hook output priority 0; }; "
                 "add rule ip cttest out ct state new counter"])
    for port in (5353, 5354):
        host_ns.run([sys.executable, "-c", f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                     f".sendto(b'x', ('127.0.0.1', {port}))"])
    with host_ns.enter():
        assert conntrack.delete_by_dst_port(s.IPPROTO_UDP, 5353, s.AF_INET) == 1
        assert conntrack.delete_by_dst_port(s.IPPROTO_UDP, 5353, s.AF_INET) == 0
        assert conntrack.delete_by_dst_port(s.IPPROTO_TCP, 5354, s.AF_INET) == 0
        assert conntrack.delete_by_dst_port(s.IPPROTO_UDP, 5354, s.AF_INET) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_sctp_mapping_rules(topo_factory: Callable[[int], Topo], backend: str) -> None:
    t = topo_factory(1)
    nc = conf(t, 0, [{"hostPort": 3868, "containerPort": 3868, "protocol": "SCTP"}], backend)
    ok(call(t, "ADD", 0, nc))
    text = ruleset(t) if backend == "nftables" else ipt_nat(t)
    assert "sctp" in text and "3868" in text
    ok(call(t, "CHECK", 0, nc))
    ok(call(t, "DEL", 0, nc))
    assert "3868" not in (our_nft_objects(t) if backend == "nftables" else ipt_nat(t))


def test_container_addresses_picked_as_the_reference_does() -> None:
    from pycni.skel import CmdArgs

    prev = {"cniVersion": "1.0.0",
            "interfaces": [{"name": "br0"}, {"name": "eth0", "sandbox": "/var/run/netns/x"},
                           {"name": "eth1", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": "10.0.0.1/24", "interface": 0},        # the host's bridge: skipped
                    {"address": "10.0.1.5/24", "interface": 2},        # another container interface
                    {"address": "10.0.2.5/24", "interface": 1},
                    {"address": "10.0.3.5/24", "interface": 1},        # only the first of a family
                    {"address": "fd00::5/64"}]}                        # no interface: taken
    raw = {"cniVersion": "1.0.0", "name": "n", "type": "portmap", "prevResult": prev}
    args = CmdArgs(command="ADD", container_id="c", ifname="eth0", stdin_data=json.dumps(raw).encode())
    c = portmap.parse_conf(args)
    assert str(c.cont_v4) == "10.0.2.5/24" and str(c.cont_v6) == "fd00::5/64"
    assert c.backend == "iptables" and c.auto and c.snat and c.mark_masq_bit == 13  # the reference's default


def test_no_per_network_leftovers_once_every_container_is_gone(topo_factory: Callable[[int], Topo]) -> None:
    """Two networks with overlapping subnets (earlier versions kept their subnets in a shared
    set forever): once their containers are deleted, no element of either is left."""
    t = topo_factory(2)

    def on(i: int, plen: int, net: str) -> dict[str, Any]:
        c = conf(t, i, WEB if i == 0 else [{"hostPort": 8081, "containerPort": 80, "protocol": "tcp"}], name=net)
        c["prevResult"]["ips"][0]["address"] = f"{t.cip(i)}/{plen}"
        return c

    t.serve(0, 80, "c0")
    ok(call(t, "ADD", 0, on(0, 24, "net-a")))
    ok(call(t, "ADD", 1, on(1, 16, "net-b")))
    assert connect(t.containers[0], HOST_IP, 8080) == "c0 10.88.0.1"  # hairpin: masqueraded
    assert "10.88.0.0/24 . 10.88.0.10" in ruleset(t) and "10.88.0.0/16 . 10.88.0.11" in ruleset(t)
    ok(call(t, "DEL", 0, on(0, 24, "net-a")))
    ok(call(t, "DEL", 1, {**on(1, 16, "net-b"), "runtimeConfig": {}}))
    assert our_nft_objects(t) == ""
    assert "10.88." not in ruleset(t)


# ---- every layout, whatever the configured backend -------------------------------------------
@pytest.mark.parametrize("added, deleted", [("nftables", "iptables"), ("iptables", "nftables"),
                                            ("nftables", None), ("iptables", None)])
def test_del_cleans_every_layout(topo_factory: Callable[[int], Topo], added: str, deleted: str | None) -> None:
    """A container mapped under one backend is unmapped by a DEL configured for the other (or
    for none): a node may change its config, or swap implementations, under live containers."""
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    ok(call(t, "ADD", 0, conf(t, 0, WEB, added)))
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    nc = conf(t, 0, WEB, deleted or "")
    if deleted is None:
        nc.pop("backend")
    ok(call(t, "DEL", 0, nc))
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")
    assert our_nft_objects(t) == "" and "CNI-DN-" not in ipt_nat(t) and "10.88.0.10" not in ipt_nat(t)


def test_gc_cleans_every_layout(topo_factory: Callable[[int], Topo]) -> None:
    t = topo_factory(3)
    for i, backend in ((0, "nftables"), (1, "iptables"), (2, "iptables")):
        ok(call(t, "ADD", i, conf(t, i, [{"hostPort": 8080 + i, "containerPort": 80, "protocol": "tcp"}], backend)))
    t.serve(2, 80, "c2")
    gc = {"cniVersion": "1.1.0", "name": "testnet", "type": "portmap",
          "cni.dev/valid-attachments": [{"containerID": "ctr-2", "ifname": "eth0"}]}
    ok(plugin_util.run("portmap", "GC", gc, host=t.host, cni_path="/x"))
    assert our_nft_objects(t) == ""
    nat = ipt_nat(t)
    assert "ctr-0" not in nat and "ctr-1" not in nat and pm_ipt.dnat_chain_name("testnet", "ctr-1") not in nat
    assert pm_ipt.dnat_chain_name("testnet", "ctr-2") in nat
    assert connect(t.client, HOST_IP, 8082) == "c2 192.168.77.2"
    ok(call(t, "DEL", 2, conf(t, 2, None, "iptables")))


@pytest.mark.parametrize("attachments", [None, "x", [{}], [None], [{"containerID": 1, "ifname": "eth0"}],
                                         [{"containerID": "ctr-0"}]])
def test_gc_refuses_a_missing_or_malformed_list(topo_factory: Callable[[int], Topo], attachments: Any) -> None:
    """A list GC cannot read is code 7 and unmaps nothing (missing would mean 'nothing is valid')."""
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    ok(call(t, "ADD", 0, conf(t, 0, WEB, "iptables")))
    gc: dict[str, Any] = {"cniVersion": "1.1.0", "name": "testnet", "type": "portmap"}
    if attachments is not None:
        gc["cni.dev/valid-attachments"] = attachments
    e = err(plugin_util.run("portmap", "GC", gc, host=t.host, cni_path="/x"))
    assert e["code"] == 7 and "valid-attachments" in e["msg"], e
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    ok(call(t, "DEL", 0, conf(t, 0, None, "iptables")))


# ---- iptables: refused input changes nothing; the shared chains come back --------------------
@pytest.mark.parametrize("chain", ["../x", "-j ACCEPT", "INPUT", "x" * 29, "NO-SUCH-CHAIN"])
def test_bad_external_set_mark_chain_leaves_nothing(topo_factory: Callable[[int], Topo], chain: str) -> None:
    def nat_rules() -> list[str]:  # without iptables-save's dated header and packet counters
        return [re.sub(r"\[\d+:\d+\]", "", line) for line in ipt_nat(t).splitlines() if not line.startswith("#")]

    t = topo_factory(1)
    before = nat_rules()
    e = err(call(t, "ADD", 0, conf(t, 0, WEB, "iptables", externalSetMarkChain=chain)))
    assert e["code"] == 7 and "externalSetMarkChain" in e["msg"], e
    assert nat_rules() == before and "CNI-HOSTPORT-DNAT" not in ipt_nat(t)


def test_iptables_add_restores_removed_shared_chains(topo_factory: Callable[[int], Topo]) -> None:
    """An ADD whose one-transaction fast path finds the shared chains gone (a flushed nat
    table) rebuilds them, as the reference's ADD does."""
    t = topo_factory(2)
    t.serve(0, 80, "c0")
    t.serve(1, 80, "c1")
    ok(call(t, "ADD", 0, conf(t, 0, WEB, "iptables")))
    for tool in ("iptables", "ip6tables"):
        t.host.run([tool, "-t", "nat", "-F"])
        t.host.run([tool, "-t", "nat", "-X"])
    ok(call(t, "ADD", 1, conf(t, 1, [{"hostPort": 9090, "containerPort": 80, "protocol": "tcp"}], "iptables")))
    assert connect(t.client, HOST_IP, 9090) == "c1 192.168.77.2"
    assert connect(t.containers[1], HOST_IP, 9090) == "c1 10.88.0.1"
    ok(call(t, "CHECK", 1, conf(t, 1, [{"hostPort": 9090, "containerPort": 80, "protocol": "tcp"}], "iptables")))
    nat = t.host.run(["iptables-save", "-t", "nat"]).stdout
    assert nat.count("-j CNI-HOSTPORT-DNAT") == 2 and nat.count("-j CNI-HOSTPORT-MASQ") == 1
    for i in (0, 1):
        ok(call(t, "DEL", i, conf(t, i, None, "iptables")))
    assert "CNI-DN-" not in ipt_nat(t)


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_many_mappings(topo_factory: Callable[[int], Topo], backend: str) -> None:
    """CHECK compares one listing per chain or table (it used to ask once per mapping)."""
    t = topo_factory(1)
    maps = [{"hostPort": 20000 + i, "containerPort": 1000 + i, "protocol": "tcp" if i % 2 else "udp"}
            for i in range(300)]
    nc = conf(t, 0, maps, backend)
    ok(call(t, "ADD", 0, nc))
    ok(call(t, "CHECK", 0, nc))
    missing = conf(t, 0, [*maps, {"hostPort": 30999, "containerPort": 1, "protocol": "tcp"}], backend)
    assert "30999" in err(call(t, "CHECK", 0, missing))["details"]
    ok(call(t, "DEL", 0, nc))
    assert our_nft_objects(t) == "" and "CNI-DN-" not in ipt_nat(t)


def test_default_backend_falls_back_to_nftables_where_iptables_is_unusable(
        topo_factory: Callable[[int], Topo], plugin_dir: str) -> None:
    """No backend key: iptables, as the reference; where iptables cannot work (here: every
    xtables tool made to fail, in a private mount namespace) nftables instead, as the reference."""
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    nc = conf(t, 0, WEB)
    nc.pop("backend")
    env = plugin_util.env("ADD", "ctr-0", t.containers[0], cni_path=plugin_dir)
    legacy = "/usr/sbin/xtables-legacy-multi"
    broken = ("mount --bind /bin/false /usr/sbin/xtables-nft-multi && "
              f"{{ [ ! -e {legacy} ] || mount --bind /bin/false {legacy}; }} && "
              f"exec ip netns exec {t.host.name} {plugin_dir}/portmap")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", broken],
                          input=json.dumps(nc), env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "10.88.0.10 . 80" in ruleset(t) and "CNI-DN-" not in ipt_nat(t)
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    ok(call(t, "DEL", 0, conf(t, 0, WEB, "iptables")))  # DEL cleans every layout
    assert our_nft_objects(t) == ""


# What the Go plugin's nftables backend (from 1.5; Debian's 1.1.1 has none) writes for ctr-0 and
# another container, as its portmap_nftables.go builds it.
REFERENCE_NFT = """add table ip cni_hostport { comment "CNI portmap plugin"; }
add chain ip cni_hostport hostports
add chain ip cni_hostport hostip_hostports
add chain ip cni_hostport hostports_all
add rule ip cni_hostport hostports_all jump hostip_hostports
add rule ip cni_hostport hostports_all jump hostports
add chain ip cni_hostport prerouting { type nat hook prerouting priority dstnat; }
add rule ip cni_hostport prerouting fib daddr type local jump hostports_all
add chain ip cni_hostport output { type nat hook output priority -100; }
add rule ip cni_hostport output fib daddr type local jump hostports_all
add chain ip cni_hostport masquerading { type nat hook postrouting priority srcnat; }
add rule ip cni_hostport hostports tcp dport 8080 dnat to 10.88.0.10:80 comment "ctr-0"
add rule ip cni_hostport hostports ip daddr 192.168.77.10 tcp dport 8081 dnat to 10.88.0.10:81 comment "ctr-0"
add rule ip cni_hostport masquerading ip saddr 10.88.0.10 ip daddr 10.88.0.10 masquerade comment "ctr-0"
add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr 10.88.0.10 masquerade comment "ctr-0"
add rule ip cni_hostport hostports tcp dport 9999 dnat to 10.88.0.99:80 comment "ctr-9"
"""


def test_nftables_del_removes_the_reference_nftables_layout(topo_factory: Callable[[int], Topo]) -> None:
    """Configured for nftables, our DEL also removes what the Go plugin's nftables backend made
    for the container (rules commented with its ID), and nothing of another container's."""
    t = topo_factory(1)
    t.serve(0, 80, "c0")
    t.host.run(["nft", "-f", "-"], input=REFERENCE_NFT)
    assert connect(t.client, HOST_IP, 8080) == "c0 192.168.77.2"
    ok(call(t, "DEL", 0, conf(t, 0, WEB, "nftables")))
    assert connect(t.client, HOST_IP, 8080).startswith("ERR")
    left = t.host.run(["nft", "list", "table", "ip", "cni_hostport"]).stdout
    assert "ctr-0" not in left and "10.88.0.10" not in left and 'comment "ctr-9"' in left
