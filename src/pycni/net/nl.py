"""Our netlink client on a plain AF_NETLINK socket: links, addresses, routes, rules, bridges, tc.

Why not pyroute2: importing it costs a one-shot plugin process ~130 ms of CPU even lean
(asyncio, multiprocessing, its message classes; see docs/architecture.md) and every
``IPRoute()`` spins an asyncio loop. The plugins need a few dozen request shapes, which this
module encodes and decodes with :mod:`struct` alone: links, addresses, routes, policy rules,
neighbours, bridge ports and their VLANs, qdiscs and classes. It is the one netlink stack of
pycni (:class:`NetlinkSocket` carries other families, such as ctnetlink) and the one home of
the kernel's constants (``RT_*``, ``RTN_*``, ``IFF_*``…). A new netlink operation goes here, a
helper that plugins call goes in the ``net/`` module of its subject.

The interface keeps the shape of pyroute2's ``IPRoute`` that :mod:`pycni.net` was written
against — ``link("get"|"add"|"set"|"del", **kw)``, ``link_lookup``, ``get_links``,
``addr``/``get_addr``, ``route``/``get_routes``, ``rule``/``get_rules``, ``brport("set")``,
``vlan_filter``, ``qdisc``/``get_qdiscs``/``get_classes`` — and messages answer ``msg["index"]``
(header fields) and ``msg.get_attr("IFLA_IFNAME")`` (attributes by their kernel names).

Namespace contract as in :mod:`pycni.net.link`: the socket talks to the network namespace
of the thread that created it. Errors are :class:`NetlinkError`, an :class:`OSError` whose
``errno`` (and ``code``, pyroute2's name for it) is the kernel's.
"""

from __future__ import annotations

import _socket
import os
import struct

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from typing import Any, Self

AF_UNSPEC, AF_INET, AF_BRIDGE, AF_INET6 = 0, 2, 7, 10
NETLINK_ROUTE = 0

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
SOL_NETLINK = 270
SO_SNDBUFFORCE = 32
NETLINK_EXT_ACK = 11
NETLINK_GET_STRICT_CHK = 12

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK = 16, 17, 18, 19
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWNEIGH, RTM_DELNEIGH, RTM_GETNEIGH = 28, 29, 30
RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE = 32, 33, 34
RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC = 36, 37, 38
RTM_NEWTCLASS, RTM_GETTCLASS = 40, 42
TC_H_ROOT, TC_H_INGRESS = 0xFFFFFFFF, 0xFFFFFFF1

IFF_UP, IFF_PROMISC, IFF_ALLMULTI = 0x1, 0x100, 0x200
IFA_F_NODAD, IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x02, 0x08, 0x40
RT_TABLE_UNSPEC, RT_TABLE_COMPAT, RT_TABLE_DEFAULT, RT_TABLE_MAIN, RT_TABLE_LOCAL = 0, 252, 253, 254, 255
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_HOST = 0, 253, 254
RT_SCOPE_NOWHERE = 255  # as a delete filter: a route of any scope
RTN_UNICAST, RTN_BLACKHOLE = 1, 6
RTPROT_KERNEL = 2  # routes the kernel made itself (e.g. for an address's subnet)
RTPROT_BOOT = 3    # what vishvananda/netlink (and so the Go plugins) stamp on routes they add
RTPROT_STATIC = 4
RTPROT_BIRD = 12   # routes BIRD installs (BIRD 2 stamps every kernel route with it)
RTNH_F_ONLINK = 4
FR_ACT_TO_TBL = 1
NUD_PERMANENT = 0x80
NTF_SELF = 0x02
RTEXT_FILTER_BRVLAN = 2
BRIDGE_FLAGS_MASTER = 1
BRIDGE_VLAN_INFO_PVID, BRIDGE_VLAN_INFO_UNTAGGED = 0x2, 0x4

_HDR = struct.Struct("=IHHII")        # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")    # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")     # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, proto, scope, type, flags
_NDMSG = struct.Struct("=BxxxiHBB")   # ndmsg: family, (pad), ifindex, state, flags, type
_FIBRULE = struct.Struct("=BBBBBBBBI")  # fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags
_VLAN_INFO = struct.Struct("=HH")     # bridge_vlan_info: flags, vid
_TCMSG = struct.Struct("=BxxxiIII")   # tcmsg: family, (pad), ifindex, handle, parent, info
_RATESPEC = "BBHhHI"                  # tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate
_TBF_QOPT = struct.Struct("=" + _RATESPEC * 2 + "III")  # rate, peakrate, limit, buffer, mtu
_HTB_GLOB = struct.Struct("=IIIII")   # version, rate2quantum, defcls, debug, direct_pkts
_HTB_OPT = struct.Struct("=" + _RATESPEC * 2 + "IIIII")  # rate, ceil, buffer, cbuffer, quantum, level, prio
_U64 = struct.Struct("=Q")
_NLA = struct.Struct("=HH")
_RTNH = struct.Struct("=HBBi")        # rtnexthop: len, flags, hops, ifindex
_U16 = struct.Struct("=H")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")

_IFINFO_FIELDS = ("family", "ifi_type", "index", "flags", "change")
_IFADDR_FIELDS = ("family", "prefixlen", "flags", "scope", "index")
_RTMSG_FIELDS = ("family", "dst_len", "src_len", "tos", "table", "proto", "scope", "type", "flags")
_NDMSG_FIELDS = ("family", "ifindex", "state", "flags", "ndm_type")
_FIBRULE_FIELDS = ("family", "dst_len", "src_len", "tos", "table", "res1", "res2", "action", "flags")
_TCMSG_FIELDS = ("family", "index", "handle", "parent", "info")


class NetlinkError(OSError):
    """The kernel refused a request; ``errno``/``code`` say why (``code`` as pyroute2 names it)."""

    def __init__(self, code: int, msg: str = "") -> None:
        super().__init__(code, msg or os.strerror(code))
        self.code = code


# ---- decoding -------------------------------------------------------------------------------------

def _str(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode("utf-8", "replace")


def _u8(data: bytes) -> int:
    return data[0]


def _u16(data: bytes) -> int:
    return int(_U16.unpack_from(data)[0])


def _u32(data: bytes) -> int:
    return int(_U32.unpack_from(data)[0])


def _messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """The messages of one ``recv``: (type, sequence number, body) each."""
    offset = 0
    while offset + _HDR.size <= len(data):
        length, mtype, _flags, mseq, _pid = _HDR.unpack_from(data, offset)
        if length < _HDR.size:
            raise NetlinkError(71, "malformed netlink message")  # EPROTO
        yield mtype, mseq, data[offset + _HDR.size:offset + length]
        offset += (length + 3) & ~3


def _i32(data: bytes) -> int:
    return int(_I32.unpack_from(data)[0])


def _be16(data: bytes) -> int:
    return int.from_bytes(data[:2], "big")


def _mac(data: bytes) -> str:
    return ":".join(f"{b:02x}" for b in data)


def _ip(data: bytes) -> str:
    return _socket.inet_ntop(AF_INET if len(data) == 4 else AF_INET6, data)


class Attrs:
    """Decoded netlink attributes, looked up by their kernel names (IFLA_*, IFA_*, RTA_*…)."""

    __slots__ = ("attrs",)

    def __init__(self, attrs: list[tuple[str, Any]]) -> None:
        self.attrs = attrs

    def get_attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    def get_attrs(self, name: str) -> list[Any]:
        return [value for key, value in self.attrs if key == name]

    def get_nested(self, *names: str) -> Any:
        node: Any = self
        for name in names:
            node = node.get_attr(name) if node is not None else None
        return node

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.attrs!r})"


class Msg(Attrs):
    """A decoded rtnetlink message: ``msg["field"]`` for the fixed header, ``get_attr`` for the rest."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, int], attrs: list[tuple[str, Any]]) -> None:
        super().__init__(attrs)
        self.fields = fields

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A header field or, failing that, an attribute (pyroute2's ``get``)."""
        if key in self.fields:
            return self.fields[key]
        return self.get_attr(key, default)

    def __repr__(self) -> str:
        return f"Msg({self.fields!r}, {self.attrs!r})"


def _attrs(data: bytes, offset: int, table: Mapping[int, tuple[str, Callable[[bytes], Any]]]) -> list[tuple[str, Any]]:
    """The attributes in ``data[offset:]`` that ``table`` knows, decoded (others are skipped)."""
    out: list[tuple[str, Any]] = []
    end = len(data)
    while offset + 4 <= end:
        length, kind = _NLA.unpack_from(data, offset)
        if length < 4:
            break
        entry = table.get(kind & NLA_TYPE_MASK)
        if entry is not None:
            out.append((entry[0], entry[1](data[offset + 4:offset + length])))
        offset += (length + 3) & ~3
    return out


def _nested(table: Mapping[int, tuple[str, Callable[[bytes], Any]]]) -> Callable[[bytes], Attrs]:
    return lambda data: Attrs(_attrs(data, 0, table))


_BR_DATA = {7: ("IFLA_BR_VLAN_FILTERING", _u8)}
_MACVLAN_DATA = {1: ("IFLA_MACVLAN_MODE", _u32), 2: ("IFLA_MACVLAN_FLAGS", _u16)}
_IPVLAN_DATA = {1: ("IFLA_IPVLAN_MODE", _u16), 2: ("IFLA_IPVLAN_FLAGS", _u16)}
_VLAN_DATA = {1: ("IFLA_VLAN_ID", _u16)}
_VRF_DATA = {1: ("IFLA_VRF_TABLE", _u32)}
_VXLAN_DATA: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    1: ("IFLA_VXLAN_ID", _u32), 3: ("IFLA_VXLAN_LINK", _u32), 4: ("IFLA_VXLAN_LOCAL", _ip),
    7: ("IFLA_VXLAN_LEARNING", _u8), 15: ("IFLA_VXLAN_PORT", _be16)}
_INFO_DATA: dict[str, Mapping[int, tuple[str, Callable[[bytes], Any]]]] = {
    "bridge": _BR_DATA, "macvlan": _MACVLAN_DATA, "macvtap": _MACVLAN_DATA, "ipvlan": _IPVLAN_DATA,
    "vlan": _VLAN_DATA, "vrf": _VRF_DATA, "vxlan": _VXLAN_DATA}
_BRPORT = {1: ("IFLA_BRPORT_STATE", _u8), 4: ("IFLA_BRPORT_MODE", _u8), 8: ("IFLA_BRPORT_LEARNING", _u8),
           9: ("IFLA_BRPORT_UNICAST_FLOOD", _u8), 33: ("IFLA_BRPORT_ISOLATED", _u8)}
_VRF_SLAVE = {1: ("IFLA_VRF_PORT_TABLE", _u32)}
_SLAVE_DATA = {"bridge": _BRPORT, "vrf": _VRF_SLAVE}


def _linkinfo(data: bytes) -> Attrs:
    """IFLA_LINKINFO: the kind first, then its kind-specific data (decoded by kind)."""
    raw = {}
    offset = 0
    while offset + 4 <= len(data):
        length, kind = _NLA.unpack_from(data, offset)
        if length < 4:
            break
        raw[kind & NLA_TYPE_MASK] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    out: list[tuple[str, Any]] = []
    kind_name = _str(raw[1]) if 1 in raw else ""
    slave_kind = _str(raw[4]) if 4 in raw else ""
    if 1 in raw:
        out.append(("IFLA_INFO_KIND", kind_name))
    if 2 in raw:
        out.append(("IFLA_INFO_DATA", Attrs(_attrs(raw[2], 0, _INFO_DATA.get(kind_name, {})))))
    if 4 in raw:
        out.append(("IFLA_INFO_SLAVE_KIND", slave_kind))
    if 5 in raw:
        out.append(("IFLA_INFO_SLAVE_DATA", Attrs(_attrs(raw[5], 0, _SLAVE_DATA.get(slave_kind, {})))))
    return Attrs(out)


_IFLA: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    1: ("IFLA_ADDRESS", _mac), 2: ("IFLA_BROADCAST", _mac), 3: ("IFLA_IFNAME", _str), 4: ("IFLA_MTU", _u32),
    5: ("IFLA_LINK", _i32), 6: ("IFLA_QDISC", _str), 10: ("IFLA_MASTER", _u32), 13: ("IFLA_TXQLEN", _u32),
    16: ("IFLA_OPERSTATE", _u8), 17: ("IFLA_LINKMODE", _u8), 18: ("IFLA_LINKINFO", _linkinfo),
    20: ("IFLA_IFALIAS", _str), 27: ("IFLA_GROUP", _u32), 37: ("IFLA_LINK_NETNSID", _i32),
    54: ("IFLA_PERM_ADDRESS", _mac),
}
_IFA: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    1: ("IFA_ADDRESS", _ip), 2: ("IFA_LOCAL", _ip), 3: ("IFA_LABEL", _str), 4: ("IFA_BROADCAST", _ip),
    8: ("IFA_FLAGS", _u32),
}
_RTAX: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    2: ("RTAX_MTU", _u32), 3: ("RTAX_WINDOW", _u32), 8: ("RTAX_ADVMSS", _u32), 10: ("RTAX_HOPLIMIT", _u32),
}


def _multipath(data: bytes) -> list[Msg]:
    """RTA_MULTIPATH: a list of rtnexthop, each with its own attributes (``hop["oif"]``)."""
    hops: list[Msg] = []
    offset = 0
    while offset + _RTNH.size <= len(data):
        length, flags, hops_, ifindex = _RTNH.unpack_from(data, offset)
        if length < _RTNH.size:
            break
        body = data[offset:offset + length]
        hops.append(Msg({"flags": flags, "hops": hops_, "oif": ifindex}, _attrs(body, _RTNH.size, _RTA)))
        offset += (length + 3) & ~3
    return hops


_RTA: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    1: ("RTA_DST", _ip), 2: ("RTA_SRC", _ip), 3: ("RTA_IIF", _u32), 4: ("RTA_OIF", _u32), 5: ("RTA_GATEWAY", _ip),
    6: ("RTA_PRIORITY", _u32), 7: ("RTA_PREFSRC", _ip), 8: ("RTA_METRICS", _nested(_RTAX)),
    9: ("RTA_MULTIPATH", _multipath), 15: ("RTA_TABLE", _u32), 16: ("RTA_MARK", _u32), 20: ("RTA_PREF", _u8),
}

_NDA: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    1: ("NDA_DST", _ip), 2: ("NDA_LLADDR", _mac), 8: ("NDA_IFINDEX", _u32), 9: ("NDA_MASTER", _u32),
}

_FRA: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    1: ("FRA_DST", _ip), 2: ("FRA_SRC", _ip), 3: ("FRA_IIFNAME", _str), 6: ("FRA_PRIORITY", _u32),
    10: ("FRA_FWMARK", _u32), 15: ("FRA_TABLE", _u32), 17: ("FRA_OIFNAME", _str),
}


def _vlan_info(data: bytes) -> dict[str, int]:
    flags, vid = _VLAN_INFO.unpack_from(data)
    return {"flags": flags, "vid": vid}


# An AF_BRIDGE link message (a bridge port as the bridge sees it): IFLA_AF_SPEC holds its VLANs.
# In other families IFLA_AF_SPEC nests per-family attributes, so it is decoded here only.
_IFLA_BRIDGE: dict[int, tuple[str, Callable[[bytes], Any]]] = {
    1: ("IFLA_ADDRESS", _mac), 3: ("IFLA_IFNAME", _str), 4: ("IFLA_MTU", _u32), 10: ("IFLA_MASTER", _u32),
    26: ("IFLA_AF_SPEC", _nested({2: ("IFLA_BRIDGE_VLAN_INFO", _vlan_info)})),
}

# Link attribute numbers by kernel name, for encoding: read off the decoding tables above, so each
# number is written once; the ones we send but never decode are listed here (linux/if_link.h).
_LINK_ATTR: dict[str, int] = {name: num for table in (_IFLA, _IFLA_BRIDGE, _BRPORT)
                              for num, (name, _) in table.items()}
_LINK_ATTR.update(IFLA_INFO_KIND=1, IFLA_INFO_DATA=2, IFLA_PROTINFO=12, IFLA_NET_NS_PID=19, IFLA_NET_NS_FD=28,
                  IFLA_EXT_MASK=29, IFLA_INET_CONF=1, IFLA_BRIDGE_FLAGS=0, IFLA_BRIDGE_VLAN_INFO=2,
                  VETH_INFO_PEER=1)

def _u64(data: bytes) -> int:
    return int(_U64.unpack_from(data)[0])


def _tbf_parms(data: bytes) -> dict[str, int]:
    v = _TBF_QOPT.unpack_from(data)
    return {"rate": v[5], "limit": v[12], "buffer": v[13], "mtu": v[14]}


def _htb_glob(data: bytes) -> dict[str, int]:
    return {"defcls": _HTB_GLOB.unpack_from(data)[2]}


def _htb_parms(data: bytes) -> dict[str, int]:
    v = _HTB_OPT.unpack_from(data)
    return {"rate": v[5], "ceil": v[11], "buffer": v[12], "cbuffer": v[13]}


# TCA_OPTIONS by qdisc/class kind (decoded once TCA_KIND is known; see _decode).
_TC_OPTIONS: dict[str, dict[int, tuple[str, Callable[[bytes], Any]]]] = {
    "tbf": {1: ("TCA_TBF_PARMS", _tbf_parms), 4: ("TCA_TBF_RATE64", _u64)},
    "htb": {1: ("TCA_HTB_PARMS", _htb_parms), 2: ("TCA_HTB_INIT", _htb_glob), 6: ("TCA_HTB_RATE64", _u64),
            7: ("TCA_HTB_CEIL64", _u64)},
}
_TCA: dict[int, tuple[str, Callable[[bytes], Any]]] = {1: ("TCA_KIND", _str), 2: ("TCA_OPTIONS", bytes)}

_DECODERS: dict[int, tuple[struct.Struct, tuple[str, ...], dict[int, tuple[str, Callable[[bytes], Any]]]]] = {
    RTM_NEWLINK: (_IFINFO, _IFINFO_FIELDS, _IFLA), RTM_DELLINK: (_IFINFO, _IFINFO_FIELDS, _IFLA),
    RTM_NEWADDR: (_IFADDR, _IFADDR_FIELDS, _IFA), RTM_DELADDR: (_IFADDR, _IFADDR_FIELDS, _IFA),
    RTM_NEWROUTE: (_RTMSG, _RTMSG_FIELDS, _RTA), RTM_DELROUTE: (_RTMSG, _RTMSG_FIELDS, _RTA),
    RTM_NEWNEIGH: (_NDMSG, _NDMSG_FIELDS, _NDA), RTM_DELNEIGH: (_NDMSG, _NDMSG_FIELDS, _NDA),
    RTM_NEWRULE: (_FIBRULE, _FIBRULE_FIELDS, _FRA), RTM_DELRULE: (_FIBRULE, _FIBRULE_FIELDS, _FRA),
    RTM_NEWQDISC: (_TCMSG, _TCMSG_FIELDS, _TCA), RTM_NEWTCLASS: (_TCMSG, _TCMSG_FIELDS, _TCA),
}


def _decode(mtype: int, body: bytes) -> Msg | None:
    spec = _DECODERS.get(mtype)
    if spec is None:
        return None
    head, names, table = spec
    if table is _IFLA and body[:1] == bytes((AF_BRIDGE,)):
        table = _IFLA_BRIDGE
    msg = Msg(dict(zip(names, head.unpack_from(body), strict=True)), _attrs(body, head.size, table))
    if table is _TCA:  # the options' layout depends on the kind: None when we do not decode it
        kind = msg.get_attr("TCA_KIND", "")
        msg.attrs = [(k, Attrs(_attrs(v, 0, _TC_OPTIONS[kind])) if kind in _TC_OPTIONS else None)
                     if k == "TCA_OPTIONS" else (k, v) for k, v in msg.attrs]
    return msg


# ---- encoding -------------------------------------------------------------------------------------

def _nla(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return _NLA.pack(length, kind) + payload + b"\0" * (-length % 4)


def _nla_str(kind: int, value: str) -> bytes:
    return _nla(kind, value.encode() + b"\0")


def _nla_u8(kind: int, value: int) -> bytes:
    return _nla(kind, bytes((value & 0xFF,)))


def _nla_u16(kind: int, value: int) -> bytes:
    return _nla(kind, _U16.pack(value))


def _nla_u32(kind: int, value: int) -> bytes:
    return _nla(kind, _U32.pack(value & 0xFFFFFFFF))


def _mac_bytes(mac: str) -> bytes:
    try:
        raw = bytes(int(part, 16) for part in mac.split(":"))
    except ValueError:
        raise NetlinkError(22, f"invalid MAC address {mac!r}") from None
    if not raw:
        raise NetlinkError(22, f"invalid MAC address {mac!r}")
    return raw


def _ip_bytes(ip: str) -> tuple[int, bytes]:
    family = AF_INET6 if ":" in ip else AF_INET
    try:
        return family, _socket.inet_pton(family, ip)
    except OSError:
        raise NetlinkError(22, f"invalid IP address {ip!r}") from None


# Kind-specific IFLA_INFO_DATA keywords: keyword -> (attribute name in the kind's decoding table,
# encoder); the numbers come from that table (_INFO_DATA).
_MACVLAN_MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8, "source": 16}
_LINK_DATA_BY_NAME: dict[str, dict[str, tuple[str, Callable[[int, Any], bytes]]]] = {
    "bridge": {"br_vlan_filtering": ("IFLA_BR_VLAN_FILTERING", _nla_u8)},
    "macvlan": {"macvlan_mode": ("IFLA_MACVLAN_MODE",
                                 lambda k, v: _nla_u32(k, _MACVLAN_MODES[v] if isinstance(v, str) else int(v)))},
    "ipvlan": {"ipvlan_mode": ("IFLA_IPVLAN_MODE", lambda k, v: _nla_u16(k, int(v))),
               "ipvlan_flags": ("IFLA_IPVLAN_FLAGS", lambda k, v: _nla_u16(k, int(v)))},
    "vlan": {"vlan_id": ("IFLA_VLAN_ID", lambda k, v: _nla_u16(k, int(v)))},
    "vrf": {"vrf_table": ("IFLA_VRF_TABLE", lambda k, v: _nla_u32(k, int(v)))},
    # vxlan: VNI, underlay link, local (source) address, learning, UDP destination port (big-endian)
    "vxlan": {"vxlan_id": ("IFLA_VXLAN_ID", lambda k, v: _nla_u32(k, int(v))),
              "vxlan_link": ("IFLA_VXLAN_LINK", lambda k, v: _nla_u32(k, int(v))),
              "vxlan_local": ("IFLA_VXLAN_LOCAL", lambda k, v: _nla(k, _ip_bytes(str(v))[1])),
              "vxlan_learning": ("IFLA_VXLAN_LEARNING", lambda k, v: _nla_u8(k, int(v))),
              "vxlan_port": ("IFLA_VXLAN_PORT", lambda k, v: _nla(k, int(v).to_bytes(2, "big")))},
}
_LINK_DATA: dict[str, dict[str, tuple[int, Callable[[int, Any], bytes]]]] = {
    kind: {key: ({n: num for num, (n, _) in _INFO_DATA[kind].items()}[name], encode)
           for key, (name, encode) in keys.items()}
    for kind, keys in _LINK_DATA_BY_NAME.items()}
_LINK_DATA["macvtap"] = _LINK_DATA["macvlan"]

# The common link keywords: keyword -> (attribute name, encoder), in the order they are sent.
_LINK_KEYWORDS: tuple[tuple[str, str, Callable[[int, Any], bytes]], ...] = (
    ("ifname", "IFLA_IFNAME", _nla_str),
    ("mtu", "IFLA_MTU", lambda k, v: _nla_u32(k, int(v))),
    ("address", "IFLA_ADDRESS", lambda k, v: _nla(k, _mac_bytes(v))),
    ("link", "IFLA_LINK", lambda k, v: _nla_u32(k, int(v))),
    ("master", "IFLA_MASTER", lambda k, v: _nla_u32(k, int(v or 0))),
    ("txqlen", "IFLA_TXQLEN", lambda k, v: _nla_u32(k, int(v))),
    ("ifalias", "IFLA_IFALIAS", _nla_str),
    ("net_ns_fd", "IFLA_NET_NS_FD", lambda k, v: _nla_u32(k, int(v))),
    ("net_ns_pid", "IFLA_NET_NS_PID", lambda k, v: _nla_u32(k, int(v))),
)


def _link_attrs(kw: dict[str, Any]) -> bytes:
    """The IFLA attributes for the common link keywords (pops what it encodes from ``kw``)."""
    out = [encode(_LINK_ATTR[name], kw.pop(key)) for key, name, encode in _LINK_KEYWORDS if key in kw]
    if "ipv4_devconf" in kw:  # {IPV4_DEVCONF_* index: value}: IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF
        conf = b"".join(_nla_u32(int(k), int(v)) for k, v in kw.pop("ipv4_devconf").items())
        out.append(_nla(_LINK_ATTR["IFLA_AF_SPEC"] | NLA_F_NESTED,
                        _nla(AF_INET | NLA_F_NESTED, _nla(_LINK_ATTR["IFLA_INET_CONF"] | NLA_F_NESTED, conf))))
    return b"".join(out)


def _flags(kw: dict[str, Any]) -> tuple[int, int]:
    """ifinfomsg flags/change from ``state="up"|"down"`` or explicit ``flags``/``change``."""
    flags = int(kw.pop("flags", 0))
    change = int(kw.pop("change", 0))
    state = kw.pop("state", None)
    if state is not None:
        change |= IFF_UP
        flags = (flags | IFF_UP) if state == "up" else (flags & ~IFF_UP)
    return flags, change


def _link_request(kw: dict[str, Any]) -> bytes:
    """ifinfomsg + attributes for ``link("add"|"set", **kw)``."""
    kw = dict(kw)
    index = int(kw.pop("index", 0))
    flags, change = _flags(kw)
    kind = kw.pop("kind", None)
    peer = kw.pop("peer", None)
    attrs = _link_attrs(kw)
    if kind is not None:
        info = _nla_str(_LINK_ATTR["IFLA_INFO_KIND"], kind)
        data = b""
        if kind == "veth" and peer is not None:
            peer_kw = {"ifname": peer} if isinstance(peer, str) else dict(peer)
            peer_flags, peer_change = _flags(peer_kw)
            body = _IFINFO.pack(AF_UNSPEC, 0, 0, peer_flags, peer_change) + _link_attrs(peer_kw)
            if peer_kw:
                raise TypeError(f"unsupported veth peer keywords: {sorted(peer_kw)}")
            data = _nla(_LINK_ATTR["VETH_INFO_PEER"], body)
        else:
            known = _LINK_DATA.get(kind, {})
            for key in [k for k in kw if k in known]:
                attr, encode = known[key]
                data += encode(attr, kw.pop(key))
        if data:
            info += _nla(_LINK_ATTR["IFLA_INFO_DATA"] | NLA_F_NESTED, data)
        attrs += _nla(_LINK_ATTR["IFLA_LINKINFO"] | NLA_F_NESTED, info)
    if kw:
        raise TypeError(f"unsupported link keywords: {sorted(kw)}")
    return _IFINFO.pack(AF_UNSPEC, 0, index, flags, change) + attrs


TBF_CELL_LOG = 3  # rate-table cells of 8 bytes: a 1600-byte MTU in 256 cells, as tc picks


def _tbf_options(rate: int, limit: int, buffer: int, rtab: Sequence[int]) -> bytes:
    """TCA_TBF_PARMS and TCA_TBF_RTAB as ``tc`` sends them; ``rtab[i]`` is the ticks a packet of
    ``(i + 1) << TBF_CELL_LOG`` bytes takes at ``rate`` (:func:`pycni.net.tc.rate_table`)."""
    if len(rtab) != 256:
        raise ValueError("a tbf rate table has 256 cells")
    qopt = _TBF_QOPT.pack(TBF_CELL_LOG, 0, 0, -1, 0, rate, 0, 0, 0, 0, 0, 0, limit, buffer, 0)
    return _nla(1, qopt) + _nla(2, b"".join(_U32.pack(v) for v in rtab))


# ---- the socket -----------------------------------------------------------------------------------

def raw_attrs(data: bytes, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute in ``data[offset:]``, undecoded (flags masked off the type)."""
    end = len(data)
    while offset + 4 <= end:
        length, kind = _NLA.unpack_from(data, offset)
        if length < 4:
            return
        yield kind & NLA_TYPE_MASK, data[offset + 4:offset + length]
        offset += (length + 3) & ~3


def nla(kind: int, payload: bytes, nested: bool = False) -> bytes:
    """One attribute, padded (``nested`` sets NLA_F_NESTED)."""
    return _nla(kind | (NLA_F_NESTED if nested else 0), payload)


class NetlinkSocket:
    """A netlink socket of ``protocol`` in the calling thread's namespace: framing, sequence
    numbers, ACKs and errors (:class:`NetlinkError`); use as a context manager or close().
    :class:`IPRoute` speaks rtnetlink on it; :mod:`pycni.net.conntrack` ctnetlink."""

    def __init__(self, protocol: int = NETLINK_ROUTE) -> None:
        self._sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, protocol)
        try:
            self._sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, 1 << 20)
            self._sock.bind((0, 0))
        except BaseException:
            self._sock.close()
            raise
        self._seq = 0
        self._sndbuf = 1 << 17  # (below the default send buffer: no need to ask for more)
        self.kept = False  # a call's shared socket (pycni.callscope): ``with`` leaves it open

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.kept:
            self.close()

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self, bufsize: int = 1 << 18) -> list[tuple[int, bytes]]:
        """(type, body) of each message in the next datagram the kernel sends unasked (NFLOG's
        packets, a group's events), DONE and ERROR frames left out. TimeoutError when the
        :meth:`settimeout` time passes first; OSError(ENOBUFS) when the kernel dropped messages
        because the receive buffer was full (the socket stays usable)."""
        data = self._sock.recv(bufsize)
        out: list[tuple[int, bytes]] = []
        offset = 0
        while offset + _HDR.size <= len(data):
            length, mtype, _flags, _seq, _pid = _HDR.unpack_from(data, offset)
            if length < _HDR.size:
                break
            if mtype not in (NLMSG_DONE, NLMSG_ERROR):
                out.append((mtype, data[offset + _HDR.size:offset + length]))
            offset += (length + 3) & ~3
        return out

    def exchange(self, mtype: int, body: bytes, flags: int = 0) -> list[tuple[int, bytes]]:
        """Send one request; (type, body) of each reply until the ACK (or DONE, for a dump)."""
        self._seq += 1
        seq = self._seq
        self._sock.send(_HDR.pack(_HDR.size + len(body), mtype, flags | NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body)
        return list(self._replies(seq))

    def send_batch(self, messages: list[tuple[int, bytes, int]]) -> None:
        """Send ``messages`` ((type, body, flags)) in one write, as an nfnetlink batch must go, and
        wait for the answer to each flagged NLM_F_ACK; the first error among them raises
        :class:`NetlinkError` (once all have answered, so none is left to be read as a later
        request's)."""
        data = bytearray()
        first = self._seq + 1
        waiting: set[int] = set()
        for mtype, body, flags in messages:
            self._seq += 1
            data += _HDR.pack(_HDR.size + len(body), mtype, flags | NLM_F_REQUEST, self._seq, 0) + body
            data += b"\0" * (-len(body) % 4)
            if flags & NLM_F_ACK:
                waiting.add(self._seq)
        if len(data) > self._sndbuf:
            # (a batch goes in one write: room for it, as root even past the sysctl's ceiling)
            self._sndbuf = len(data) + 4096
            self._sock.setsockopt(_socket.SOL_SOCKET, SO_SNDBUFFORCE, self._sndbuf)
        self._sock.send(bytes(data))
        error = 0
        while waiting:
            for mtype, mseq, body in _messages(self._sock.recv(1 << 18)):
                if mtype != NLMSG_ERROR or not first <= mseq <= self._seq:
                    continue
                err = _i32(body)
                error = error or (-err if err < 0 else 0)
                waiting.discard(mseq)
                if err < 0 and mseq == first:
                    waiting.clear()  # (the batch refused as a whole: nothing else will answer)
        if error:
            raise NetlinkError(error)

    def _replies(self, seq: int) -> Iterator[tuple[int, bytes]]:
        while True:
            for mtype, mseq, body in _messages(self._sock.recv(1 << 18)):
                if mseq != seq:
                    continue  # a late reply to an earlier request on this socket
                if mtype == NLMSG_DONE:
                    err = _i32(body) if len(body) >= 4 else 0
                    if err < 0:
                        raise NetlinkError(-err)
                    return
                if mtype == NLMSG_ERROR:
                    err = _i32(body)
                    if err < 0:
                        raise NetlinkError(-err)
                    return
                yield mtype, body


class IPRoute(NetlinkSocket):
    """An rtnetlink socket in the calling thread's namespace; use as a context manager or close()."""

    def __init__(self) -> None:
        super().__init__(NETLINK_ROUTE)
        self._strict: bool | None = None

    def _strict_dumps(self) -> bool:
        """Ask the kernel to filter dumps by the header's index/table (Linux 4.20+); False if it cannot."""
        if self._strict is None:
            try:
                self._sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
                self._strict = True
            except OSError:
                self._strict = False
        return self._strict

    # -- transport --

    def request(self, mtype: int, body: bytes, flags: int = 0) -> list[Msg]:
        """Send one request and collect its decoded replies until the ACK (or DONE, for a dump)."""
        return [msg for msg in (_decode(t, b) for t, b in self.exchange(mtype, body, flags)) if msg is not None]

    def dump(self, mtype: int, body: bytes) -> list[Msg]:
        return self.request(mtype, body, NLM_F_DUMP)

    # -- links --

    def link(self, command: str, **kw: Any) -> list[Msg]:
        """``get`` (by ``index`` or ``ifname``), ``add``, ``set`` (by ``index``), ``del`` (by ``index``)."""
        if command == "get":
            if "index" in kw:
                body = _IFINFO.pack(AF_UNSPEC, 0, int(kw["index"]), 0, 0)
            else:
                body = _IFINFO.pack(AF_UNSPEC, 0, 0, 0, 0) + _nla_str(_LINK_ATTR["IFLA_IFNAME"], kw["ifname"])
            return self.request(RTM_GETLINK, body)
        if command == "add":
            return self.request(RTM_NEWLINK, _link_request(kw), NLM_F_CREATE | NLM_F_EXCL)
        if command == "set":
            return self.request(RTM_SETLINK, _link_request(kw))
        if command == "del":
            return self.request(RTM_DELLINK, _IFINFO.pack(AF_UNSPEC, 0, int(kw["index"]), 0, 0))
        raise ValueError(f"unsupported link command {command!r}")

    def link_lookup(self, ifname: str) -> list[int]:
        """[index] of the link called ``ifname``, [] when there is none."""
        try:
            msgs = self.link("get", ifname=ifname)
        except NetlinkError as e:
            if e.code in (19, 2):  # ENODEV, ENOENT
                return []
            raise
        return [int(m["index"]) for m in msgs]

    def get_links(self, family: int = AF_UNSPEC, ext_mask: int = 0) -> list[Msg]:
        """Every link; ``family=AF_BRIDGE, ext_mask=RTEXT_FILTER_BRVLAN``: bridge ports with their VLANs."""
        body = _IFINFO.pack(family, 0, 0, 0, 0)
        if ext_mask:
            body += _nla_u32(_LINK_ATTR["IFLA_EXT_MASK"], ext_mask)
        return self.dump(RTM_GETLINK, body)

    def vlan_filter(self, command: str, *, index: int, vid: int, flags: int = 0) -> list[Msg]:
        """``add`` or ``del`` VLAN ``vid`` (BRIDGE_VLAN_INFO_* ``flags``) on bridge port ``index``, master side
        (``bridge vlan add dev X vid N master``)."""
        spec = _nla(_LINK_ATTR["IFLA_AF_SPEC"] | NLA_F_NESTED,
                    _nla_u16(_LINK_ATTR["IFLA_BRIDGE_FLAGS"], BRIDGE_FLAGS_MASTER)
                    + _nla(_LINK_ATTR["IFLA_BRIDGE_VLAN_INFO"], _VLAN_INFO.pack(flags, vid)))
        body = _IFINFO.pack(AF_BRIDGE, 0, index, 0, 0) + spec
        if command == "add":
            return self.request(RTM_SETLINK, body)
        if command == "del":
            return self.request(RTM_DELLINK, body)
        raise ValueError(f"unsupported vlan_filter command {command!r}")

    def brport(self, command: str, *, index: int, **kw: Any) -> list[Msg]:
        """``set`` bridge-port flags (``mode`` = hairpin, ``isolated``, ``learning``, ``unicast_flood``)."""
        if command != "set":
            raise ValueError(f"unsupported brport command {command!r}")
        codes = {k: _LINK_ATTR[f"IFLA_BRPORT_{k.upper()}"] for k in ("mode", "learning", "unicast_flood", "isolated")}
        unknown = sorted(set(kw) - set(codes))
        if unknown:
            raise TypeError(f"unsupported brport keywords: {unknown}")
        protinfo = b"".join(_nla_u8(codes[k], int(v)) for k, v in kw.items())
        body = _IFINFO.pack(AF_BRIDGE, 0, index, 0, 0) + _nla(_LINK_ATTR["IFLA_PROTINFO"] | NLA_F_NESTED, protinfo)
        return self.request(RTM_SETLINK, body)

    # -- addresses --

    def addr(self, command: str, *, index: int, address: str, prefixlen: int, broadcast: str | None = None,
             scope: int = 0, flags: int = 0) -> list[Msg]:
        """``add`` or ``del`` one address (IFA_LOCAL = IFA_ADDRESS = ``address``) on link ``index``;
        ``flags`` are IFA_F_* (IFA_F_NODAD, say), sent as IFA_FLAGS."""
        family, raw = _ip_bytes(address)
        attrs = _nla(2, raw) + _nla(1, raw)
        if broadcast:
            attrs += _nla(4, _ip_bytes(broadcast)[1])
        if flags:
            attrs += _nla_u32(8, flags)
        body = _IFADDR.pack(family, prefixlen, 0, scope, index) + attrs
        if command == "add":
            return self.request(RTM_NEWADDR, body, NLM_F_CREATE | NLM_F_EXCL)
        if command == "del":
            return self.request(RTM_DELADDR, body)
        raise ValueError(f"unsupported addr command {command!r}")

    def get_addr(self, family: int = AF_UNSPEC, index: int | None = None) -> list[Msg]:
        """Addresses of ``family``, only link ``index``'s when given (filtered by the kernel where it can:
        a host with a thousand veths has a thousand link-local addresses nobody asked for)."""
        kernel_filter = index is not None and self._strict_dumps()
        msgs = self.dump(RTM_GETADDR, _IFADDR.pack(family, 0, 0, 0, index if kernel_filter else 0))
        return msgs if index is None else [m for m in msgs if m["index"] == index]

    # -- routes --

    def route(self, command: str, **kw: Any) -> list[Msg]:
        """``add``, ``create``, ``replace`` or ``del`` one route (pyroute2's keywords: dst, dst_len, gateway, oif…).

        ``add`` fails with EEXIST when a route of the same destination and metric exists;
        ``create`` (NLM_F_CREATE alone, what Go's netlink.RouteAddEcmp sends) puts the route beside
        it — IPv4 keeps both, IPv6 joins routes with gateways into one multipath route — and fails
        only on an identical route.
        """
        kw = dict(kw)
        deleting = command == "del"
        dst = kw.pop("dst", None)
        gateway = kw.pop("gateway", None)
        prefsrc = kw.pop("prefsrc", None)
        family = int(kw.pop("family", 0)) or (_ip_bytes(dst)[0] if dst else AF_INET)
        table = int(kw.pop("table", RT_TABLE_MAIN) or RT_TABLE_MAIN)
        scope = int(kw.pop("scope", RT_SCOPE_NOWHERE if deleting else 0))
        rtype = int(kw.pop("type", 0 if deleting else RTN_UNICAST))
        proto = int(kw.pop("proto", 0 if deleting else RTPROT_STATIC))
        rflags = int(kw.pop("flags", 0))  # RTNH_F_ONLINK: the gateway is on the link, no covering route needed
        attrs = []
        if dst:
            attrs.append(_nla(1, _ip_bytes(dst)[1]))
        if "oif" in kw:
            attrs.append(_nla_u32(4, int(kw.pop("oif"))))
        if gateway:
            attrs.append(_nla(5, _ip_bytes(gateway)[1]))
        if kw.get("priority"):
            attrs.append(_nla_u32(6, int(kw["priority"])))
        kw.pop("priority", None)
        if prefsrc:
            attrs.append(_nla(7, _ip_bytes(prefsrc)[1]))
        metrics = kw.pop("metrics", None)
        if metrics:
            codes = {"RTAX_MTU": 2, "RTAX_WINDOW": 3, "RTAX_ADVMSS": 8, "RTAX_HOPLIMIT": 10}
            attrs.append(_nla(8 | NLA_F_NESTED, b"".join(_nla_u32(codes[k], int(v)) for k, v in metrics.items())))
        attrs.append(_nla_u32(15, table))
        dst_len = int(kw.pop("dst_len", 0))
        if kw:
            raise TypeError(f"unsupported route keywords: {sorted(kw)}")
        body = _RTMSG.pack(family, dst_len, 0, 0, table if table < 256 else RT_TABLE_COMPAT, proto, scope, rtype,
                           rflags)
        body += b"".join(attrs)
        if command == "add":
            return self.request(RTM_NEWROUTE, body, NLM_F_CREATE | NLM_F_EXCL)
        if command == "create":
            return self.request(RTM_NEWROUTE, body, NLM_F_CREATE)
        if command == "replace":
            return self.request(RTM_NEWROUTE, body, NLM_F_CREATE | NLM_F_REPLACE)
        if deleting:
            return self.request(RTM_DELROUTE, body)
        raise ValueError(f"unsupported route command {command!r}")

    def route_get(self, dst: str) -> list[Msg]:
        """The route the kernel would use to reach ``dst`` (``ip route get``): [RTM_NEWROUTE]."""
        family, raw = _ip_bytes(dst)
        body = _RTMSG.pack(family, len(raw) * 8, 0, 0, 0, 0, 0, 0, 0) + _nla(1, raw)
        return self.request(RTM_GETROUTE, body)

    def get_routes(self, family: int = AF_UNSPEC, table: int | None = None) -> list[Msg]:
        """Every route of ``family``; only ``table``'s when given (RTA_TABLE, else the header's)."""
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        if table is not None and self._strict_dumps():
            body += _nla_u32(15, table)  # RTA_TABLE: the kernel skips the other tables (local's grows with links)
        try:
            msgs = self.dump(RTM_GETROUTE, body)
        except NetlinkError as e:
            if e.code == 2 and table is not None:  # ENOENT: IPv4 has no such table yet (a filtered dump says so)
                return []
            raise
        if table is None:
            return msgs
        return [m for m in msgs if m.get_attr("RTA_TABLE", m["table"]) == table]

    # -- policy rules --

    def rule(self, command: str, *, family: int, table: int, priority: int | None = None, src: str | None = None,
             src_len: int = 0, action: int = FR_ACT_TO_TBL) -> list[Msg]:
        """``add`` or ``del`` one policy rule (``ip rule add from src/src_len table T pref P``)."""
        attrs = _nla_u32(15, table)  # FRA_TABLE
        if priority is not None:
            attrs += _nla_u32(6, priority)  # FRA_PRIORITY
        if src:
            attrs += _nla(2, _ip_bytes(src)[1])  # FRA_SRC
        body = _FIBRULE.pack(family, 0, src_len, 0, table if table < 256 else RT_TABLE_COMPAT, 0, 0, action, 0) + attrs
        if command == "add":
            return self.request(RTM_NEWRULE, body, NLM_F_CREATE | NLM_F_EXCL)
        if command == "del":
            return self.request(RTM_DELRULE, body)
        raise ValueError(f"unsupported rule command {command!r}")

    def get_rules(self, family: int = AF_UNSPEC) -> list[Msg]:
        """The policy rules of ``family``, in the kernel's order."""
        return self.dump(RTM_GETRULE, _FIBRULE.pack(family, 0, 0, 0, 0, 0, 0, 0, 0))

    # -- traffic control: qdiscs and classes --

    def get_qdiscs(self, index: int | None = None) -> list[Msg]:
        """Every qdisc, only link ``index``'s when given (``tc qdisc show``)."""
        msgs = self.dump(RTM_GETQDISC, _TCMSG.pack(AF_UNSPEC, index or 0, 0, 0, 0))
        return msgs if index is None else [m for m in msgs if m["index"] == index]

    def get_classes(self, index: int) -> list[Msg]:
        """The classes of link ``index`` (``tc class show dev``)."""
        return self.dump(RTM_GETTCLASS, _TCMSG.pack(AF_UNSPEC, index, 0, 0, 0))

    def qdisc(self, command: str, *, index: int, handle: int = 0, parent: int = TC_H_ROOT, kind: str = "",
              **kw: Any) -> list[Msg]:
        """``add`` a qdisc (``kind`` "tbf": ``rate`` bytes/s below 2**32, ``limit`` bytes, ``buffer`` ticks,
        ``rtab`` its rate table), or ``del`` the one at ``parent`` (TC_H_ROOT, TC_H_INGRESS) of link ``index``."""
        body = _TCMSG.pack(AF_UNSPEC, index, handle, parent, 0)
        if command == "del":
            return self.request(RTM_DELQDISC, body)
        if command != "add":
            raise ValueError(f"unsupported qdisc command {command!r}")
        if kind != "tbf" or set(kw) != {"rate", "limit", "buffer", "rtab"}:
            raise TypeError(f"unsupported qdisc {kind!r} with {sorted(kw)}")
        return self.request(RTM_NEWQDISC, body + _nla_str(1, kind) + _nla(2 | NLA_F_NESTED, _tbf_options(**kw)),
                            NLM_F_CREATE | NLM_F_EXCL)

    # -- neighbours (ARP/NDP entries) and bridge/vxlan forwarding database entries --

    def neigh(self, command: str, *, ifindex: int, lladdr: str | None = None, dst: str | None = None,
              family: int | None = None, state: int = NUD_PERMANENT, flags: int = 0) -> list[Msg]:
        """``add``, ``replace`` or ``del`` one neighbour on link ``ifindex``: an ARP/NDP entry
        (``dst`` -> ``lladdr``) or, with ``family=AF_BRIDGE`` and ``flags=NTF_SELF``, an FDB entry
        (``lladdr`` reached through the tunnel endpoint ``dst``)."""
        fam = family if family is not None else (_ip_bytes(dst)[0] if dst else AF_INET)
        attrs = b""
        if dst:
            attrs += _nla(1, _ip_bytes(dst)[1])
        if lladdr:
            attrs += _nla(2, _mac_bytes(lladdr))
        body = _NDMSG.pack(fam, ifindex, state, flags, 0) + attrs
        if command == "add":
            return self.request(RTM_NEWNEIGH, body, NLM_F_CREATE | NLM_F_EXCL)
        if command == "replace":
            return self.request(RTM_NEWNEIGH, body, NLM_F_CREATE | NLM_F_REPLACE)
        if command == "del":
            return self.request(RTM_DELNEIGH, body)
        raise ValueError(f"unsupported neigh command {command!r}")

    def get_neighbours(self, family: int = AF_UNSPEC, ifindex: int | None = None) -> list[Msg]:
        """Neighbour entries of ``family`` (AF_BRIDGE: the FDB), only link ``ifindex``'s when given."""
        msgs = self.dump(RTM_GETNEIGH, _NDMSG.pack(family, 0, 0, 0, 0))
        return msgs if ifindex is None else [m for m in msgs if m["ifindex"] == ifindex]


__all__ = ["IPRoute", "NetlinkSocket", "Msg", "Attrs", "NetlinkError", "raw_attrs", "nla"]
