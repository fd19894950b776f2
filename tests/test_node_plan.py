"""The node agent's view of etcd and its plan (no kernel, no etcd), and its command line's
refusals: bad flags are code 7 naming the flag, an etcd that does not answer is code 11."""

from __future__ import annotations

import json
import socket

from pycni import cli
from pycni.cluster.model import NodeInfo
from pycni.cluster.node import ClusterView, Hop, plan, vtep_mac

P = "/pycni"


def view(*, nodes: dict[str, dict[str, object]], blocks: dict[str, str],
         handles: dict[str, tuple[str, list[str]]] | None = None) -> ClusterView:
    v = ClusterView(P + "/")
    for name, obj in nodes.items():
        assert v.put(f"{P}/nodes/{name}", json.dumps(obj))
    for cidr, node in blocks.items():
        assert v.put(f"{P}/ipam/affinity/{node}/net/{cidr.replace('/', '-')}",
                     json.dumps({"cidr": cidr, "node": node, "network": "net"}))
    for cid, (node, ips) in (handles or {}).items():
        assert v.put(f"{P}/ipam/handles/net/{cid}/eth0", json.dumps({"node": node, "ips": ips}))
    assert not v.put(f"{P}/ipam/blocks/net/10.0.0.0-26", "{}")  # not the agent's business
    return v


N1 = {"name": "n1", "underlayIP": "192.0.2.1", "underlayIPs": ["192.0.2.1", "2001:db8::1"],
      "vtepMAC": "0e:00:00:00:00:01"}
N2 = {"name": "n2", "underlayIP": "192.0.2.2", "vtepMAC": "0e:00:00:00:00:02"}


def test_host_gw_plan_routes_other_nodes_blocks_by_family() -> None:
    v = view(nodes={"n1": N1, "n2": N2},
             blocks={"10.1.0.0/26": "n1", "10.1.0.64/26": "n2", "fd00::/122": "n1", "10.1.0.128/26": "gone"})
    p = plan(v, "n2", "host-gw", "")
    assert p.routes == {"10.1.0.0/26": Hop(gw="192.0.2.1", node="n1"), "fd00::/122": Hop(gw="2001:db8::1", node="n1"),
                        "10.1.0.64/26": Hop(gw="", node="n2", blackhole=True)}  # its own: only pods' /32s lead on
    assert any("gone is not registered" in s for s in p.skipped)
    # n1 cannot reach n2's IPv6 blocks: n2 registered no IPv6 underlay address
    v.put(f"{P}/ipam/affinity/n2/net/fd00::40-122", json.dumps({"cidr": "fd00::40/122", "node": "n2"}))
    assert "fd00::40/122" not in plan(v, "n1", "host-gw", "").routes
    # a lapsed registration (its key deleted) takes the node's routes with it
    assert v.delete(f"{P}/nodes/n1")
    assert [c for c, h in plan(v, "n2", "host-gw", "").routes.items() if not h.blackhole] == []


def test_vxlan_plan_uses_the_device_and_peers() -> None:
    v = view(nodes={"n1": N1, "n2": N2}, blocks={"10.1.0.0/26": "n1", "fd00::/122": "n1"})
    p = plan(v, "n2", "vxlan", "vx0")
    # IPv6 over the IPv4 overlay: via the peer VTEP's link-local address (EUI-64 of its MAC)
    assert p.routes == {"10.1.0.0/26": Hop(gw="192.0.2.1", dev="vx0", node="n1"),
                        "fd00::/122": Hop(gw="fe80::c00:ff:fe00:1", dev="vx0", node="n1")}
    assert list(p.peers) == ["n1"] and p.peers["n1"].vtep_neighbours() == {
        "192.0.2.1": "0e:00:00:00:00:01", "fe80::c00:ff:fe00:1": "0e:00:00:00:00:01"}
    # a node without a VTEP (registered by a host-gw agent) cannot be reached over the overlay
    v.put(f"{P}/nodes/n3", json.dumps({"name": "n3", "underlayIP": "192.0.2.3"}))
    v.put(f"{P}/ipam/affinity/n3/net/10.1.1.0-26", json.dumps({"cidr": "10.1.1.0/26", "node": "n3"}))
    p = plan(v, "n2", "vxlan", "vx0")
    assert "10.1.1.0/26" not in p.routes and any("n3 has no VTEP" in s for s in p.skipped)


def test_borrowed_addresses_get_host_routes() -> None:
    v = view(nodes={"n1": N1, "n2": N2, "n3": dict(N2, name="n3", underlayIP="192.0.2.3")},
             blocks={"10.1.0.0/26": "n1"},
             handles={"a": ("n1", ["10.1.0.2/16"]), "b": ("n2", ["10.1.0.9/16"]), "c": ("n3", ["10.9.9.9/16"])})
    assert plan(v, "n3", "host-gw", "").routes == {"10.1.0.0/26": Hop(gw="192.0.2.1", node="n1"),
                                                    "10.1.0.9/32": Hop(gw="192.0.2.2", node="n2")}
    assert "10.1.0.9/32" in plan(v, "n1", "host-gw", "").routes  # the block's owner routes it away too
    assert "10.1.0.9/32" not in plan(v, "n2", "host-gw", "").routes  # the pod's node has its own /32


def test_affinity_from_key_when_value_is_not_json_and_bad_values() -> None:
    v = ClusterView(P)
    v.put(f"{P}/nodes/n1", json.dumps(N1))
    v.put(f"{P}/ipam/affinity/n1/net/10.2.0.0-24", "not json")
    assert v.blocks() == {"10.2.0.0/24": "n1"}
    v.put(f"{P}/ipam/affinity/n1/net/garbage", "{}")
    v.put(f"{P}/nodes/bad", json.dumps({"underlayIP": "not-an-ip"}))
    assert v.blocks() == {"10.2.0.0/24": "n1"} and set(v.nodes) == {"n1"}


def test_node_info_round_trip_and_vtep_mac() -> None:
    info = NodeInfo(name="n1", underlay_ips=["192.0.2.1"], vtep_mac=vtep_mac("n1"))
    obj = json.loads(info.to_json())
    assert obj["underlayIP"] == obj["vtepIP"] == "192.0.2.1" and obj["vtepMAC"] == info.vtep_mac
    assert NodeInfo.from_json("n1", info.to_json()) == info
    mac = vtep_mac("n1")
    assert mac == vtep_mac("n1") != vtep_mac("n2") and int(mac[:2], 16) & 0b11 == 0b10  # local, unicast


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_refusals(capsys: object) -> None:
    assert cli.main(["node", "--underlay-ip", "192.0.2.1"]) == 1
    assert "--etcd-endpoints is required" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert cli.main(["node", "--etcd-endpoints", "http://127.0.0.1:1", "--underlay-ip", "nope"]) == 1
    assert "invalid --underlay-ip 'nope'" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert cli.main(["node", "--etcd-endpoints", "127.0.0.1:2379", "--underlay-ip", "192.0.2.1"]) == 1
    assert "(code 7)" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert cli.main(["node", "--etcd-endpoints", "http://127.0.0.1:1", "--underlay-ip", "192.0.2.1",
                     "--ttl", "1"]) == 1
    assert "--ttl" in capsys.readouterr().err  # type: ignore[attr-defined]
    assert cli.main(["node", "remove", "--etcd-endpoints", "http://127.0.0.1:1"]) == 1
    assert "NAME" in capsys.readouterr().err  # type: ignore[attr-defined]
    # nothing listens there: code 11 naming the endpoint
    url = f"http://127.0.0.1:{_free_port()}"
    assert cli.main(["node", "status", "--etcd-endpoints", url, "--node-name", "n1"]) == 1
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "(code 11)" in err and url in err
