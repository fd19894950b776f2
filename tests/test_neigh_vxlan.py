"""net.neigh and net.vxlan against the kernel (a throwaway namespace): permanent neighbours and FDB
entries set, listed, replaced and removed idempotently; the vxlan device made once, reused as it
is, replaced when it does not match; routes marked with a protocol and onlink; blackholes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from netns_util import Namespace

from pycni.net import neigh, nl, route, vxlan
from pycni.spec.errors import CNIError


def _underlay(ns: Namespace) -> None:
    ns.run(["ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul1"])
    ns.run(["ip", "addr", "add", "192.0.2.1/24", "dev", "ul0"])
    for dev in ("ul0", "ul1"):
        ns.run(["ip", "link", "set", dev, "up"])


def test_vxlan_device_neighbours_fdb_and_marked_routes(netns_factory: Callable[[], Namespace]) -> None:
    ns = netns_factory()
    _underlay(ns)
    spec = vxlan.VxlanSpec(name="vx0", vni=42, local="192.0.2.1", port=4789, mtu=1450, mac="0e:00:00:00:00:01")
    with ns.enter():
        dev, made = vxlan.ensure_vxlan(spec)
        assert made and dev.kind == "vxlan" and dev.mtu == 1450 and dev.mac == "0e:00:00:00:00:01" and dev.up
        again, made = vxlan.ensure_vxlan(spec)
        assert not made and again.index == dev.index  # reused as it is
        other, made = vxlan.ensure_vxlan(vxlan.VxlanSpec(name="vx0", vni=43, local="192.0.2.1"))
        assert made and other.index != dev.index  # another VNI: replaced

        neigh.set_fdb("vx0", "0e:00:00:00:00:02", "192.0.2.2")
        neigh.set_fdb("vx0", "0e:00:00:00:00:02", "192.0.2.3")  # replace: one entry, the new endpoint
        neigh.set_neighbour("vx0", "192.0.2.2", "0e:00:00:00:00:02")
        fdb = [(n.lladdr, n.dst) for n in neigh.list_neighbours("vx0", fdb=True) if n.dst]
        assert fdb == [("0e:00:00:00:00:02", "192.0.2.3")]
        (entry,) = [n for n in neigh.list_neighbours("vx0") if n.dst == "192.0.2.2"]
        assert entry.lladdr == "0e:00:00:00:00:02" and entry.state & nl.NUD_PERMANENT

        route.replace_route("10.90.0.0/26", gw="192.0.2.2", dev="vx0", proto=94, onlink=True)
        route.replace_route("10.90.1.0/26", proto=94, type=route.RTN_BLACKHOLE, priority=4096)
        ours = {str(r.dst): r for r in route.list_routes(4) if r.proto == 94}
        assert set(ours) == {"10.90.0.0/26", "10.90.1.0/26"}
        assert str(ours["10.90.0.0/26"].gw) == "192.0.2.2" and ours["10.90.1.0/26"].type == route.RTN_BLACKHOLE
        # delete by protocol: another owner's route to the same prefix is not ours to remove
        assert not route.del_route("10.90.0.0/26", proto=3)
        assert route.del_route("10.90.0.0/26", proto=94) and route.del_route("10.90.1.0/26", proto=94)

        assert neigh.del_neighbour("vx0", "192.0.2.2") and not neigh.del_neighbour("vx0", "192.0.2.2")
        assert neigh.del_fdb("vx0", "0e:00:00:00:00:02", "192.0.2.3")
        assert not neigh.del_fdb("vx0", "0e:00:00:00:00:02", "192.0.2.3")
        assert not neigh.del_neighbour("nosuch0", "192.0.2.2")  # link gone: nothing to remove
        with pytest.raises(CNIError) as e:
            neigh.set_neighbour("vx0", "192.0.2.9", "not-a-mac")
        assert "192.0.2.9" in e.value.msg
