"""Linux bridges and their ports, in the calling thread's netns (see :mod:`pycni.net.link`)."""

from __future__ import annotations

import errno
import os

from pycni.net.errors import kernel_errors
from pycni.net.link import IFF_PROMISC, Link, lookup_msg, require_index, require_msg, rtnl, setlink
from pycni.net.nl import AF_BRIDGE, BRIDGE_VLAN_INFO_PVID, BRIDGE_VLAN_INFO_UNTAGGED, RTEXT_FILTER_BRVLAN
from pycni.net.sysctl import try_write_sysctl
from pycni.record import field, record
from pycni.spec.errors import INTERNAL, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from typing import Any


def ensure_bridge(name: str, *, mtu: int = 0, promisc: bool = False, vlan_filtering: bool = False) -> Link:
    """Create bridge ``name`` or reuse the one there; bring it up; return it.

    As in the reference: an existing non-bridge link of that name is an error, an existing
    bridge is taken as it is (its MTU and vlan_filtering are not changed), ``accept_ra`` is
    turned off so we own its routes.

    Its MAC is pinned before any port joins: a bridge we make gets its own in the creating
    request, an existing one keeps the one it has (set again, which tells the kernel it was
    chosen; a bridge whose last port left has none — 00:00:00:00:00:00 — and gets a new one).
    Unpinned, a bridge takes the lowest MAC of its ports: its first port's address, changing as
    ports come and go. (Go pins it after its first port joined, to what it read before.)
    """
    with rtnl() as sock:
        kw: dict[str, Any] = {"ifname": name, "kind": "bridge", "address": random_mac()}
        if mtu:
            kw["mtu"] = mtu
        if vlan_filtering:
            kw["br_vlan_filtering"] = 1
        with kernel_errors(f"could not add {name!r}", ignore=(errno.EEXIST,)) as made:
            sock.link("add", **kw)
        msg = lookup_msg(sock, name)
        if msg is None:
            raise CNIError(INTERNAL, f"could not lookup {name!r}", "the bridge vanished right after creation")
        link = Link.from_msg(msg)
        if link.kind != "bridge":
            raise CNIError(INTERNAL, f"{name!r} already exists but is not a bridge",
                           f"link {name!r} is of kind {link.kind or 'unknown'!r}; pick another bridge name")
        if promisc:
            setlink(sock, f"could not set promiscuous mode on {name!r}", index=link.index, flags=IFF_PROMISC,
                    change=IFF_PROMISC)
    try_write_sysctl(f"net/ipv6/conf/{name}/accept_ra", "0")  # IPv6 disabled: nothing to own
    pin: dict[str, Any] = {}
    if made.ignored is not None:  # it was there: pin what it has
        pin["address"] = random_mac() if link.mac == "00:00:00:00:00:00" else link.mac
    with rtnl() as sock:
        setlink(sock, f"could not set {name!r} up", index=link.index, state="up", **pin)
        return Link.from_msg(lookup_msg(sock, link.index))


def random_mac() -> str:
    """A random locally administered unicast MAC, as the kernel's eth_hw_addr_random makes."""
    b = bytearray(os.urandom(6))
    b[0] = (b[0] & 0xFE) | 0x02
    return ":".join(f"{x:02x}" for x in b)


def bridge_vlan_filtering(name: str) -> bool | None:
    """Whether bridge ``name`` filters VLANs (None when it is not there)."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
        if msg is None:
            return None
        data = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
        return bool(data.get_attr("IFLA_BR_VLAN_FILTERING")) if data is not None else False


@record
class PortInfo:
    """A bridge port's hairpin and isolation flags and its VLANs."""

    hairpin: bool = False
    isolated: bool = False
    vlans: dict[int, int] = field(default_factory=dict)  # vid -> BRIDGE_VLAN_INFO_* flags

    @property
    def pvid(self) -> int | None:
        """The port's PVID (untagged ingress VLAN), None when it has none."""
        for vid, flags in self.vlans.items():
            if flags & BRIDGE_VLAN_INFO_PVID:
                return vid
        return None


def set_port(name: str | int, *, hairpin: bool | None = None, isolated: bool | None = None) -> None:
    """Set bridge-port flags of an enslaved link (hairpin = IFLA_BRPORT_MODE)."""
    kw: dict[str, Any] = {}
    if hairpin is not None:
        kw["mode"] = 1 if hairpin else 0
    if isolated is not None:
        kw["isolated"] = 1 if isolated else 0
    if not kw:
        return
    with rtnl() as sock:
        index = require_index(sock, name)  # an index is taken as it is: no lookup
        with kernel_errors(f"failed to set bridge port flags {kw} on {name!r}"):
            sock.brport("set", index=index, **kw)


def get_port(name: str | int) -> PortInfo | None:
    """Hairpin, isolation and VLANs of bridge port ``name`` (None when not a bridge port)."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
        if msg is None:
            return None
        index = int(msg["index"])
        data = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA")
        if data is None:
            return None
        info = PortInfo(hairpin=bool(data.get_attr("IFLA_BRPORT_MODE")),
                        isolated=bool(data.get_attr("IFLA_BRPORT_ISOLATED")))
        info.vlans = _port_vlans(sock, index)
        return info


def _port_vlans(sock: Any, index: int) -> dict[int, int]:
    """VLAN id -> BRIDGE_VLAN_INFO flags of port ``index``, read from the AF_BRIDGE link dump."""
    out: dict[int, int] = {}
    for m in sock.get_links(family=AF_BRIDGE, ext_mask=RTEXT_FILTER_BRVLAN):
        if int(m["index"]) != index:
            continue
        spec = m.get_attr("IFLA_AF_SPEC")
        if spec is None:
            continue
        for nla in spec.get_attrs("IFLA_BRIDGE_VLAN_INFO"):
            out[int(nla["vid"])] = int(nla["flags"])
    return out


def add_port_vlan(name: str | int, vid: int, *, pvid: bool = False, untagged: bool = False) -> None:
    """Allow VLAN ``vid`` on bridge port ``name`` (master side, as Go's BridgeVlanAdd(.., master))."""
    _port_vlan("add", name, vid, pvid, untagged)


def del_port_vlan(name: str | int, vid: int) -> None:
    """Disallow VLAN ``vid`` on bridge port ``name``."""
    _port_vlan("del", name, vid, False, False)


def _port_vlan(cmd: str, name: str | int, vid: int, pvid: bool, untagged: bool) -> None:
    flags = (BRIDGE_VLAN_INFO_PVID if pvid else 0) | (BRIDGE_VLAN_INFO_UNTAGGED if untagged else 0)
    with rtnl() as sock:
        msg = require_msg(sock, name)
        with kernel_errors(f"failed to {cmd} vlan {vid} on interface {name!r}"):
            sock.vlan_filter(cmd, index=int(msg["index"]), vid=vid, flags=flags)


def port_vlans(name: str | int) -> dict[int, int]:
    """VLAN id -> BRIDGE_VLAN_INFO flags of bridge port ``name`` ({} when there is no such link)."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
        if msg is None:
            return {}
        return _port_vlans(sock, int(msg["index"]))


def remove_all_port_vlans(name: str | int) -> None:
    """Drop every VLAN of a port (the default VLAN 1 included), as Go's removeDefaultVlan."""
    for vid in port_vlans(name):
        del_port_vlan(name, vid)


__all__ = ["ensure_bridge", "random_mac", "bridge_vlan_filtering", "set_port", "get_port", "add_port_vlan",
           "del_port_vlan", "port_vlans", "remove_all_port_vlans", "PortInfo"]
