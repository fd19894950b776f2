"""pycni.net.nl, our stdlib rtnetlink client: requests checked against the kernel and iproute2.

Everything runs in throwaway namespaces. Where this kernel cannot make a link type (ipvlan,
vlan, vrf), the encoded request is decoded back and checked attribute by attribute instead.
"""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest
from netns_util import Namespace

from pycni.net import netns, nl


def ip_json(ns: Namespace, *args: str) -> Any:
    return json.loads(ns.run(["ip", "-j", "-d", *args]).stdout or "[]")


@pytest.fixture
def ns(netns_factory: Callable[[], Namespace]) -> Namespace:
    return netns_factory()


def test_links_as_iproute2_sees_them(ns: Namespace) -> None:
    ns.run(["ip", "link", "add", "br0", "mtu", "1400", "type", "bridge"])
    ns.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
    ns.run(["ip", "link", "set", "v0", "master", "br0"])
    ns.run(["ip", "link", "set", "v0", "alias", "kept-name"])
    with netns.enter(ns.path), nl.IPRoute() as sock:
        links = {m.get_attr("IFLA_IFNAME"): m for m in sock.get_links()}
        v0 = sock.link("get", ifname="v0")[0]
        by_index = sock.link("get", index=v0["index"])[0]
    want = {d["ifname"]: d for d in ip_json(ns, "link", "show")}
    assert set(links) == set(want)
    for name, d in want.items():
        m = links[name]
        assert m["index"] == d["ifindex"] and m.get_attr("IFLA_MTU") == d["mtu"]
        assert m.get_attr("IFLA_ADDRESS") == d["address"]
    assert links["br0"].get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") == "bridge"
    assert v0.get_attr("IFLA_MASTER") == want["br0"]["ifindex"] and v0.get_attr("IFLA_IFALIAS") == "kept-name"
    assert v0.get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_KIND") == "bridge"
    assert v0.get_attr("IFLA_LINK") == want["v1"]["ifindex"]  # a veth's peer
    assert by_index.fields == v0.fields and by_index.get_attr("IFLA_IFNAME") == "v0"


def test_create_change_delete_links(ns: Namespace, netns_factory: Callable[[], Namespace]) -> None:
    other = netns_factory()
    fd = netns.open_netns(other.path)
    try:
        with netns.enter(ns.path), nl.IPRoute() as sock:
            sock.link("add", ifname="br0", kind="bridge", mtu=1300)
            sock.link("add", ifname="h0", kind="veth", mtu=1300,
                      peer={"ifname": "c0", "net_ns_fd": fd, "mtu": 1300, "address": "0a:58:00:00:00:09"})
            h0 = sock.link_lookup(ifname="h0")[0]
            br0 = sock.link_lookup(ifname="br0")[0]
            sock.link("set", index=h0, master=br0)
            sock.link("set", index=h0, state="up")
            sock.link("set", index=h0, txqlen=77, ifalias="alias0")
            sock.brport("set", index=h0, mode=1, isolated=1)
            sock.link("add", ifname="mv0", kind="macvlan", link=br0, macvlan_mode="private")
    finally:
        import os

        os.close(fd)
    links = {d["ifname"]: d for d in ip_json(ns, "link", "show")}
    assert links["br0"]["linkinfo"]["info_kind"] == "bridge" and links["br0"]["mtu"] == 1300
    h0d = links["h0"]
    assert h0d["master"] == "br0" and "UP" in h0d["flags"] and h0d["txqlen"] == 77 and h0d["ifalias"] == "alias0"
    assert h0d["linkinfo"]["info_slave_data"]["hairpin"] is True
    assert h0d["linkinfo"]["info_slave_data"]["isolated"] is True
    assert links["mv0"]["linkinfo"]["info_kind"] == "macvlan"
    assert links["mv0"]["linkinfo"]["info_data"]["mode"] == "private"
    c0 = ip_json(other, "link", "show", "c0")[0]  # the peer was born in the other namespace
    assert c0["mtu"] == 1300 and c0["address"] == "0a:58:00:00:00:09"
    with netns.enter(ns.path), nl.IPRoute() as sock:
        data = sock.link("get", ifname="mv0")[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
        assert data.get_attr("IFLA_MACVLAN_MODE") == 1
        sock.link("set", index=sock.link_lookup(ifname="h0")[0], master=0)
        sock.link("del", index=sock.link_lookup(ifname="mv0")[0])
        assert sock.link_lookup(ifname="mv0") == []
    assert "master" not in ip_json(ns, "link", "show", "h0")[0]


def test_kernel_refusals_are_oserrors_with_the_errno(ns: Namespace) -> None:
    with netns.enter(ns.path), nl.IPRoute() as sock:
        with pytest.raises(nl.NetlinkError) as missing:
            sock.link("get", ifname="nothere")
        assert missing.value.code == errno.ENODEV == missing.value.errno
        assert isinstance(missing.value, OSError)
        sock.link("add", ifname="d0", kind="bridge")
        with pytest.raises(nl.NetlinkError) as exists:
            sock.link("add", ifname="d0", kind="bridge")
        assert exists.value.code == errno.EEXIST and "exists" in str(exists.value)
        with pytest.raises(TypeError, match="unsupported link keywords"):
            sock.link("add", ifname="d1", kind="bridge", no_such_option=1)
        with pytest.raises(nl.NetlinkError):
            sock.link("set", index=1, address="not-a-mac")


def test_addresses(ns: Namespace) -> None:
    ns.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
    with netns.enter(ns.path), nl.IPRoute() as sock:
        index = sock.link_lookup(ifname="v0")[0]
        sock.addr("add", index=index, address="10.5.0.2", prefixlen=24, broadcast="10.5.0.255")
        sock.addr("add", index=index, address="fd55::2", prefixlen=64)
        with pytest.raises(nl.NetlinkError) as dup:
            sock.addr("add", index=index, address="10.5.0.2", prefixlen=24)
        assert dup.value.code == errno.EEXIST
        v4 = [(m.get_attr("IFA_LOCAL"), m["prefixlen"]) for m in sock.get_addr(family=socket.AF_INET, index=index)]
        v6 = [m.get_attr("IFA_ADDRESS") for m in sock.get_addr(family=socket.AF_INET6, index=index)]
    assert v4 == [("10.5.0.2", 24)] and "fd55::2" in v6
    info = ip_json(ns, "addr", "show", "v0")[0]["addr_info"]
    assert {"local": "10.5.0.2", "prefixlen": 24, "broadcast": "10.5.0.255"}.items() <= info[0].items()
    with netns.enter(ns.path), nl.IPRoute() as sock:
        sock.addr("del", index=index, address="10.5.0.2", prefixlen=24)
        with pytest.raises(nl.NetlinkError) as gone:
            sock.addr("del", index=index, address="10.5.0.2", prefixlen=24)
        assert gone.value.code == errno.EADDRNOTAVAIL


def test_routes(ns: Namespace) -> None:
    ns.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
    ns.run(["ip", "link", "set", "v0", "up"])
    ns.run(["ip", "link", "set", "v1", "up"])
    ns.run(["ip", "addr", "add", "10.6.0.1/24", "dev", "v0"])
    with netns.enter(ns.path), nl.IPRoute() as sock:
        index = sock.link_lookup(ifname="v0")[0]
        sock.route("add", family=socket.AF_INET, dst="10.7.0.0", dst_len=16, gateway="10.6.0.9", oif=index, proto=3,
                   metrics={"RTAX_MTU": 1280})
        sock.route("add", family=socket.AF_INET, dst_len=0, gateway="10.6.0.8", table=100, priority=7)
        sock.route("add", family=socket.AF_INET, dst="10.8.0.1", dst_len=32, oif=index, scope=253,
                   prefsrc="10.6.0.1")
        with pytest.raises(nl.NetlinkError) as dup:
            sock.route("add", family=socket.AF_INET, dst="10.7.0.0", dst_len=16, gateway="10.6.0.9")
        assert dup.value.code == errno.EEXIST
        sock.route("replace", family=socket.AF_INET, dst="10.7.0.0", dst_len=16, gateway="10.6.0.7", oif=index)
        main = sock.get_routes(family=socket.AF_INET, table=254)
        every = sock.get_routes(family=socket.AF_INET)
    shown = {(r["dst"], r.get("table", "main")): r for r in ip_json(ns, "route", "show", "table", "all")}
    assert {"gateway": "10.6.0.7", "dev": "v0", "protocol": "static"}.items() <= shown["10.7.0.0/16", "main"].items()
    assert {"gateway": "10.6.0.8", "metric": 7}.items() <= shown["default", "100"].items()
    assert {"dev": "v0", "scope": "link", "prefsrc": "10.6.0.1"}.items() <= shown["10.8.0.1", "main"].items()
    routes = {(m.get_attr("RTA_DST"), m["dst_len"]): m for m in main}
    r = routes[("10.7.0.0", 16)]
    assert r.get_attr("RTA_GATEWAY") == "10.6.0.7" and r.get_attr("RTA_OIF") == index
    assert routes[("10.8.0.1", 32)]["scope"] == 253 and routes[("10.8.0.1", 32)].get_attr("RTA_PREFSRC") == "10.6.0.1"
    assert all(m.get_attr("RTA_TABLE") == 254 for m in main)
    assert any(m.get_attr("RTA_TABLE") == 100 and m.get_attr("RTA_PRIORITY") == 7 for m in every)
    with netns.enter(ns.path), nl.IPRoute() as sock:
        sock.route("del", family=socket.AF_INET, dst_len=0, table=100)
        sock.route("del", family=socket.AF_INET, dst="10.7.0.0", dst_len=16)
        with pytest.raises(nl.NetlinkError) as gone:
            sock.route("del", family=socket.AF_INET, dst="10.7.0.0", dst_len=16)
        assert gone.value.code == errno.ESRCH
    assert "10.7.0.0" not in ns.run(["ip", "route", "show", "table", "all"]).stdout


def test_multipath_and_metrics_decode(ns: Namespace) -> None:
    ns.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
    for name in ("v0", "v1"):
        ns.run(["ip", "link", "set", name, "up"])
    ns.run(["ip", "addr", "add", "10.6.0.1/24", "dev", "v0"])
    ns.run(["ip", "route", "add", "10.9.0.0/16", "mtu", "1300", "nexthop", "via", "10.6.0.2", "dev", "v0",
            "nexthop", "via", "10.6.0.3", "dev", "v0"])
    with netns.enter(ns.path), nl.IPRoute() as sock:
        index = sock.link_lookup(ifname="v0")[0]
        (r,) = [m for m in sock.get_routes(family=socket.AF_INET, table=254) if m.get_attr("RTA_DST") == "10.9.0.0"]
    hops = r.get_attr("RTA_MULTIPATH")
    assert [h.get_attr("RTA_GATEWAY") for h in hops] == ["10.6.0.2", "10.6.0.3"]
    assert all(h["oif"] == index for h in hops)
    assert r.get_attr("RTA_METRICS").get_attr("RTAX_MTU") == 1300


@pytest.mark.parametrize("kw,kind,data", [
    ({"ipvlan_mode": 1, "ipvlan_flags": 0}, "ipvlan", {"IFLA_IPVLAN_MODE": 1, "IFLA_IPVLAN_FLAGS": 0}),
    ({"vlan_id": 42}, "vlan", {"IFLA_VLAN_ID": 42}),
    ({"vrf_table": 1001}, "vrf", {"IFLA_VRF_TABLE": 1001}),
    ({"macvlan_mode": "passthru"}, "macvlan", {"IFLA_MACVLAN_MODE": 8}),
    ({}, "dummy", {}),
    ({"vxlan_id": 42, "vxlan_link": 3, "vxlan_local": "192.0.2.1", "vxlan_learning": 0, "vxlan_port": 4789}, "vxlan",
     {"IFLA_VXLAN_ID": 42, "IFLA_VXLAN_LINK": 3, "IFLA_VXLAN_LOCAL": "192.0.2.1", "IFLA_VXLAN_LEARNING": 0,
      "IFLA_VXLAN_PORT": 4789}),
])
def test_link_types_this_kernel_may_lack_encode_as_the_kernel_expects(kw: dict[str, Any], kind: str,
                                                                      data: dict[str, int]) -> None:
    """The RTM_NEWLINK body, decoded back: kind, kind-specific data, parent, name, MTU, MAC, netns."""
    body = nl._link_request({"ifname": "tmp0", "kind": kind, "link": 7, "mtu": 1400,
                             "address": "0a:58:00:00:00:01", "net_ns_fd": 5, **kw})
    msg = nl._decode(nl.RTM_NEWLINK, body)
    assert msg is not None
    assert msg.get_attr("IFLA_IFNAME") == "tmp0" and msg.get_attr("IFLA_LINK") == 7
    assert msg.get_attr("IFLA_MTU") == 1400 and msg.get_attr("IFLA_ADDRESS") == "0a:58:00:00:00:01"
    info = msg.get_attr("IFLA_LINKINFO")
    assert info.get_attr("IFLA_INFO_KIND") == kind
    got = info.get_attr("IFLA_INFO_DATA")
    assert {k: v for k, v in (got.attrs if got is not None else [])} == data
    # IFLA_NET_NS_FD (28) is not decoded (the kernel never reports it): find it raw
    assert nl._NLA.pack(8, 28) + nl._U32.pack(5) in body


def test_route_get_names_the_output_link(ns: Namespace) -> None:
    from pycni.net import route

    ns.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
    ns.run(["ip", "link", "set", "v0", "up"])
    ns.run(["ip", "addr", "add", "10.6.0.1/24", "dev", "v0"])
    with netns.enter(ns.path):
        assert route.output_link("10.6.0.77") == "v0"
        assert route.output_link("192.0.2.1") is None  # no default route here: unreachable


def test_set_master_by_name_or_index(ns: Namespace) -> None:
    from pycni.net import bridge, link
    from pycni.spec.errors import CNIError

    ns.run(["ip", "link", "add", "br9", "type", "bridge"])
    ns.run(["ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
    with netns.enter(ns.path):
        link.set_link("p0", master="br9")
        assert ip_json(ns, "link", "show", "p0")[0]["master"] == "br9"
        link.set_link("p0", master=None)
        p0, br9 = link.require_link("p0"), link.require_link("br9")
        link.set_link(p0.index, master=br9.index)
        bridge.set_port(p0.index, hairpin=True)
        with pytest.raises(CNIError, match="master"):
            link.set_link("p1", master="nosuchbridge")
    shown = ip_json(ns, "link", "show", "p0")[0]
    assert shown["master"] == "br9" and shown["linkinfo"]["info_slave_data"]["hairpin"] is True


def test_rules(ns: Namespace) -> None:
    """A policy rule added over nl is the one `ip rule` shows; the dump decodes it; del removes it."""
    with netns.enter(ns.path), nl.IPRoute() as sock:
        sock.rule("add", family=socket.AF_INET, table=100, priority=3000, src="10.9.0.0", src_len=24)
        shown = ip_json(ns, "rule", "show")
        assert {"priority": 3000, "src": "10.9.0.0", "srclen": 24, "table": "100"}.items() <= next(
            r for r in shown if r.get("priority") == 3000).items()
        (mine,) = [m for m in sock.get_rules(socket.AF_INET) if m.get_attr("FRA_PRIORITY") == 3000]
        assert (mine.get_attr("FRA_SRC"), mine["src_len"], mine.get_attr("FRA_TABLE")) == ("10.9.0.0", 24, 100)
        assert mine["action"] == nl.FR_ACT_TO_TBL
        sock.rule("del", family=socket.AF_INET, table=100, priority=3000, src="10.9.0.0", src_len=24)
        with pytest.raises(nl.NetlinkError) as ei:
            sock.rule("del", family=socket.AF_INET, table=100, priority=3000, src="10.9.0.0", src_len=24)
        assert ei.value.errno == errno.ENOENT
    assert not [r for r in ip_json(ns, "rule", "show") if r.get("priority") == 3000]


def test_bridge_vlan_request_and_dump_decode() -> None:
    """VLAN requests read back by an independent decoder (pyroute2's, in this test only), and an
    AF_BRIDGE link message's VLANs decoded (this kernel may lack VLAN filtering, so no live run)."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    sent: list[tuple[int, bytes]] = []

    class Capture(nl.IPRoute):
        def request(self, mtype: int, body: bytes, flags: int = 0) -> list[nl.Msg]:
            sent.append((mtype, body))
            return []

    with Capture() as sock:
        sock.vlan_filter("add", index=7, vid=42, flags=nl.BRIDGE_VLAN_INFO_PVID | nl.BRIDGE_VLAN_INFO_UNTAGGED)
        sock.vlan_filter("del", index=7, vid=42)
    assert [m for m, _ in sent] == [nl.RTM_SETLINK, nl.RTM_DELLINK]
    for (_, body), flags in zip(sent, (6, 0), strict=True):
        header = nl._HDR.pack(nl._HDR.size + len(body), nl.RTM_SETLINK, 0, 0, 0)
        msg = ifinfmsg(header + body)
        msg.decode()
        assert msg["family"] == nl.AF_BRIDGE and msg["index"] == 7
        spec = msg.get_attr("IFLA_AF_SPEC")
        # IFLA_BRIDGE_FLAGS (0), which pyroute2 names IFLA_BRIDGE_VLAN_FLAGS
        assert spec.get_attr("IFLA_BRIDGE_VLAN_FLAGS") == nl.BRIDGE_FLAGS_MASTER
        info = spec.get_attr("IFLA_BRIDGE_VLAN_INFO")
        assert (info["vid"], info["flags"]) == (42, flags)
    # what the kernel sends for a port in an AF_BRIDGE dump with RTEXT_FILTER_BRVLAN
    spec = nl._nla(26, nl._nla(2, nl._VLAN_INFO.pack(6, 1)) + nl._nla(2, nl._VLAN_INFO.pack(0, 42)))
    dumped = nl._decode(nl.RTM_NEWLINK, nl._IFINFO.pack(nl.AF_BRIDGE, 0, 7, 0, 0) + nl._nla_str(3, "p0") + spec)
    assert dumped is not None and dumped.get_attr("IFLA_IFNAME") == "p0"
    assert dumped.get_attr("IFLA_AF_SPEC").get_attrs("IFLA_BRIDGE_VLAN_INFO") == [
        {"flags": 6, "vid": 1}, {"flags": 0, "vid": 42}]
    # in other families IFLA_AF_SPEC nests per-family attributes: not read as VLANs
    inet = nl._decode(nl.RTM_NEWLINK, nl._IFINFO.pack(nl.AF_UNSPEC, 0, 7, 0, 0) + spec)
    assert inet is not None and inet.get_attr("IFLA_AF_SPEC") is None
