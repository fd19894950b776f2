"""BGP mode without a network: what a node announces and whom it peers with (full mesh, route
reflectors, global and per-node peers), BIRD's configuration as BIRD itself parses it
(``bird -p``), ``birdc`` status parsing, and the refusals of ``pycni bgp`` and ``pycni node
--mode bgp`` (code 7 naming the flag; code 11 when etcd does not answer)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from pycni import cli, ipaddr
from pycni.cluster.bgp.bird import parse_protocols
from pycni.cluster.bgp.config import BgpState, Timers, aggregate, announced, desired, render
from pycni.cluster.model import BgpConfig, BgpPeer, Keys, NodeInfo
from pycni.cluster.node import ClusterView, plan


def _view() -> ClusterView:
    v = ClusterView("/p")
    for i in (1, 2, 3, 4):
        v.nodes[f"node{i}"] = NodeInfo(name=f"node{i}", underlay_ips=[f"10.0.0.{i}"])
    keys = Keys("/p")
    for cidr, node in (("10.90.0.0/26", "node1"), ("10.90.0.64/26", "node1"), ("10.90.0.128/26", "node2"),
                       ("10.90.1.0/26", "node1")):
        net = ipaddr.ip_network(cidr)
        v.put(keys.affinity(node, "podnet", net), f'{{"cidr":"{cidr}","node":"{node}","network":"podnet"}}')
    # node1 borrowed an address of node2's block; node2 holds one of its own
    v.handles = {"h1": ("node1", ["10.90.0.130"]), "h2": ("node2", ["10.90.0.131"])}
    return v


def _state(**config: object) -> BgpState:
    st = BgpState("/p")
    st.node_as = {"node1": 64512, "node2": 64512, "node3": 64513}  # node4 runs host-gw: no BGP record
    st.config = BgpConfig(**config)  # type: ignore[arg-type]
    st.peers = {"tor": BgpPeer("tor", "10.0.0.250", 65000), "rack2": BgpPeer("rack2", "10.0.0.251", 65001, "node2")}
    return st


def test_aggregate() -> None:
    nets = [ipaddr.ip_network(c) for c in ("10.0.0.0/26", "10.0.0.64/26", "10.0.0.128/26", "10.0.0.192/26",
                                           "10.0.1.0/26", "10.0.1.0/28", "fd00::/122", "fd00::40/122")]
    assert [str(n) for n in aggregate(nets)] == ["10.0.0.0/24", "10.0.1.0/26", "fd00::/121"]
    # not siblings: 10.0.0.64/26 and 10.0.0.128/26 do not make a /25
    assert [str(n) for n in aggregate([ipaddr.ip_network("10.0.0.64/26"), ipaddr.ip_network("10.0.0.128/26")])] \
        == ["10.0.0.64/26", "10.0.0.128/26"]


def test_announces_own_blocks_and_borrowed_only() -> None:
    v = _view()
    assert announced(v, "node1") == ["10.90.0.0/25", "10.90.1.0/26", "10.90.0.130/32"]
    assert announced(v, "node2") == ["10.90.0.128/26"]  # its own address inside its own block: the block
    assert announced(v, "node3") == []
    # in bgp mode the agent programs only its own blackholes: BIRD routes the rest
    assert {c for c, h in plan(v, "node1", "bgp", "").routes.items()} == {"10.90.0.0/26", "10.90.0.64/26",
                                                                            "10.90.1.0/26"}
    assert all(h.blackhole for h in plan(v, "node1", "bgp", "").routes.values())


def test_sessions_mesh_reflectors_and_peers() -> None:
    v = _view()
    mesh = desired(v, _state(), "node1")
    assert [(s.kind, s.peer, s.address, s.as_number) for s in mesh.sessions] == [
        ("mesh", "node2", "10.0.0.2", 64512), ("mesh", "node3", "10.0.0.3", 64513),
        ("external", "tor", "10.0.0.250", 65000)]  # node4 (no BGP record) left out; rack2 is node2's
    assert mesh.as_number == 64512 and mesh.router_id == "10.0.0.1"
    assert [s.peer for s in desired(v, _state(), "node2").sessions] == ["node1", "node3", "rack2", "tor"]
    assert desired(v, _state(as_number=65100), "node1", as_number=0).as_number == 65100
    assert desired(v, _state(as_number=65100), "node1", as_number=64999).as_number == 64999
    rr = _state(mesh=False, route_reflectors=["node1"])
    assert [(s.kind, s.peer) for s in desired(v, rr, "node1").sessions] == [
        ("client", "node2"), ("mesh", "node3"), ("external", "tor")]  # node3's other AS: no RR client
    assert "node node3 (AS 64513) cannot be a route-reflector client" in desired(v, rr, "node1").skipped[0]
    assert [(s.kind, s.peer) for s in desired(v, rr, "node3").sessions] == [("reflector", "node1"),
                                                                          ("external", "tor")]
    none = _state(mesh=False)
    assert [s.kind for s in desired(v, none, "node1").sessions] == ["external"]
    # a node that died (registration gone) drops out of everyone's sessions
    del v.nodes["node2"]
    assert [s.peer for s in desired(v, _state(), "node1").sessions] == ["node3", "tor"]


@pytest.mark.skipif(shutil.which("bird") is None, reason="needs bird2 (scripts/setup --test)")
@pytest.mark.parametrize("config", [{}, {"mesh": False, "route_reflectors": ["node1"]}])
def test_bird_parses_the_configuration(tmp_path: Path, config: dict[str, object]) -> None:
    for me in ("node1", "node3"):
        text = render(desired(_view(), _state(**config), me), Timers.from_hold(3, 10), str(tmp_path / "bird.log"))
        conf = tmp_path / f"{me}.conf"
        conf.write_text(text)
        proc = subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr + text
        assert "route 10.90.0.130/32 blackhole" in text if me == "node1" else "blackhole" not in text


SHOW = """\
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     2026-11-28 09:00:10
node_node2_v4 BGP     ---        up     2026-11-28 09:00:40  Established
  Description:    mesh node2
  BGP state:          Established
    Neighbor address: 10.0.0.2
    Neighbor AS:      64512
  Channel ipv4
    Routes:         1 imported, 2 exported, 1 preferred
peer_tor_v4 BGP        ---        start  2026-11-28 09:00:41  Active        Socket: Connection refused
  Description:    external tor
  BGP state:          Active
    Neighbor address: 10.0.0.250
    Neighbor AS:      65000
    Last error:       Socket: Connection refused
"""


def test_status_parsing() -> None:
    rows = [p.as_dict() for p in parse_protocols(SHOW)]
    assert rows == [
        {"name": "node2", "kind": "mesh", "protocol": "node_node2_v4", "address": "10.0.0.2", "asNumber": 64512,
         "state": "Established", "since": "2026-11-28 09:00:40", "routesImported": 1, "routesExported": 2,
         "info": "Established"},
        {"name": "tor", "kind": "external", "protocol": "peer_tor_v4", "address": "10.0.0.250", "asNumber": 65000,
         "state": "Active", "since": "2026-11-28 09:00:41", "routesImported": 0, "routesExported": 0,
         "info": "Active Socket: Connection refused"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("argv", "says"), [
    (["bgp", "peer", "add", "tor", "--peer-ip", "nope", "--as-number", "65000"], "invalid --peer-ip 'nope'"),
    (["bgp", "peer", "add", "tor", "--peer-ip", "10.0.0.1", "--as-number", "0"], "invalid --as-number 0"),
    (["bgp", "peer", "add", "bad name", "--peer-ip", "10.0.0.1", "--as-number", "1"], "invalid peer name"),
    (["bgp", "config", "--as-number", "4294967296"], "invalid --as-number"),
    (["bgp", "config", "--route-reflectors", "a,b c"], "invalid node name in --route-reflectors"),
    (["node", "--mode", "bgp", "--underlay-ip", "192.0.2.1", "--bgp-hold-time", "2"], "invalid --bgp-hold-time 2"),
    (["node", "--mode", "bgp", "--underlay-ip", "192.0.2.1", "--as-number", "-1"], "invalid --as-number -1"),
    (["node", "--mode", "bgp", "--underlay-ip", "192.0.2.1", "--bgp-state-dir", "rel"], "invalid --bgp-state-dir"),
])
def test_refusals(capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    assert cli.main([*argv, "--etcd-endpoints", "http://127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert says in err and "(code 7)" in err and "Traceback" not in err, err
    assert err.count("\n") == 1


def test_unreachable_etcd_and_bird(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    # (each waits out the CLI's 10 s budget, retrying: one read, one write)
    for argv in (["bgp", "peer", "list"], ["bgp", "peer", "add", "tor", "--peer-ip", "10.0.0.1", "--as-number", "1"]):
        assert cli.main([*argv, "--etcd-endpoints", url]) == 1
        err = capsys.readouterr().err
        assert "(code 11)" in err and url in err and err.count("\n") == 1, err
    assert cli.main(["bgp", "status", "--node", "n1", "--bgp-state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "BIRD of node n1 does not answer" in err and "(code 11)" in err, err


@pytest.mark.skipif(shutil.which("bird") is None, reason="needs bird2 (scripts/setup --test)")
def test_dual_stack_configuration(tmp_path: Path) -> None:
    """Nodes with an IPv6 underlay address: one session per family, IPv6 blocks in their own
    static and kernel protocols, next hop this node's IPv6 address — and BIRD accepts it."""
    v = ClusterView("/p")
    for i in (1, 2):
        v.nodes[f"node{i}"] = NodeInfo(name=f"node{i}", underlay_ips=[f"10.0.0.{i}", f"fd31::{i}"])
    keys = Keys("/p")
    for cidr in ("10.90.0.0/26", "fd90::/122"):
        v.put(keys.affinity("node1", "podnet", ipaddr.ip_network(cidr)), f'{{"cidr":"{cidr}","node":"node1"}}')
    st = BgpState("/p")
    st.node_as = {"node1": 64512, "node2": 64512}
    st.peers = {"tor6": BgpPeer("tor6", "fd31::fe", 65000)}
    want = desired(v, st, "node1")
    assert [(s.name, s.address, s.local) for s in want.sessions] == [
        ("node_node2_v4", "10.0.0.2", "10.0.0.1"), ("node_node2_v6", "fd31::2", "fd31::1"),
        ("peer_tor6_v6", "fd31::fe", "fd31::1")]
    text = render(want, Timers(), str(tmp_path / "bird.log"))
    assert "route fd90::/122 blackhole;" in text and "bgp_next_hop = fd31::1;" in text
    conf = tmp_path / "bird.conf"
    conf.write_text(text)
    proc = subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + text
