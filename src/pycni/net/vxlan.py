"""A VXLAN device for an overlay whose peers are programmed statically, in the calling thread's netns.

No multicast group and no learning: the node agent tells the device about every remote VTEP
(an FDB entry per peer, :mod:`pycni.net.neigh`), as flannel's vxlan backend does. The device
is found by name and reused when its VNI, port and local address already match, so a
restarted agent keeps the device (and the traffic through it) as it was.
"""

from __future__ import annotations

from pycni.net.errors import kernel_errors
from pycni.net.link import Link, lookup_msg, rtnl
from pycni.record import record

VXLAN_OVERHEAD_V4 = 50  # outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14)


@record
class VxlanSpec:
    """What the device must be."""

    name: str
    vni: int
    local: str        # the underlay address encapsulated packets leave from
    port: int = 4789  # the IANA port (the kernel's own default, 8472, predates it)
    mtu: int = 0      # 0: leave the kernel's choice
    mac: str = ""     # '' : random
    underlay_index: int = 0


def _matches(msg: object, spec: VxlanSpec) -> bool:
    info = msg.get_attr("IFLA_LINKINFO")  # type: ignore[attr-defined]
    if info is None or info.get_attr("IFLA_INFO_KIND") != "vxlan":
        return False
    data = info.get_attr("IFLA_INFO_DATA")
    if data is None:
        return False
    return (data.get_attr("IFLA_VXLAN_ID") == spec.vni and data.get_attr("IFLA_VXLAN_PORT") == spec.port
            and data.get_attr("IFLA_VXLAN_LOCAL") == spec.local)


def ensure_vxlan(spec: VxlanSpec) -> tuple[Link, bool]:
    """The device as ``spec`` says, up; (link, whether it was made or remade now).

    A device of that name that does not match (another VNI, port, address or kind) is replaced.
    """
    with rtnl() as sock:
        msg = lookup_msg(sock, spec.name)
        made = False
        if msg is not None and not _matches(msg, spec):
            with kernel_errors(f"failed to replace {spec.name!r} (not the vxlan device asked for)"):
                sock.link("del", index=int(msg["index"]))
            msg = None
        if msg is None:
            kw: dict[str, object] = {"ifname": spec.name, "kind": "vxlan", "vxlan_id": spec.vni,
                                     "vxlan_local": spec.local, "vxlan_port": spec.port, "vxlan_learning": 0}
            if spec.underlay_index:
                kw["vxlan_link"] = spec.underlay_index
            if spec.mtu:
                kw["mtu"] = spec.mtu
            if spec.mac:
                kw["address"] = spec.mac
            with kernel_errors(f"failed to create vxlan device {spec.name!r} (is the vxlan module there?)"):
                sock.link("add", **kw)
            made = True
            msg = lookup_msg(sock, spec.name)
            assert msg is not None
        index = int(msg["index"])
        want: dict[str, object] = {"index": index, "state": "up"}
        if spec.mtu and int(msg.get_attr("IFLA_MTU") or 0) != spec.mtu:
            want["mtu"] = spec.mtu
        with kernel_errors(f"failed to set up vxlan device {spec.name!r}"):
            sock.link("set", **want)
        return Link.from_msg(lookup_msg(sock, index)), made
