"""Reading the packets nftables' ``log group N`` hands to NFLOG (nfnetlink_log), stdlib only.

Why: the flows of a node (docs/flows.md) are what its policy rules logged, and the kernel gives
a logged packet to whoever bound the NFLOG group on a ``NETLINK_NETFILTER`` socket. This is
that binding and the decoder, over :class:`pycni.net.nl.NetlinkSocket` (the one netlink codec;
ctnetlink rides on it the same way in :mod:`pycni.net.conntrack`). The socket, like every
netlink socket, belongs to the network namespace of the thread that opens it; groups are per
namespace, and one socket at a time may bind a group there (EBUSY otherwise).

The group is bound in copy-packet mode with a small copy range: enough for the IP and transport
headers (addresses, protocol, ports), never the payload. :meth:`NflogReader.read` waits at most
its timeout and returns what arrived; a full receive buffer loses packets in the kernel, which
is counted (``overruns``) and never an error.
"""

from __future__ import annotations

import _socket
import os
import struct
import time

from pycni.net.nfnl import NETLINK_NETFILTER, NFNL_SUBSYS_ULOG
from pycni.net.nl import NLM_F_ACK, IPRoute, NetlinkSocket, nla, raw_attrs
from pycni.record import record

TYPE_CHECKING = False  # not typing's: see pycni.record
if TYPE_CHECKING:
    from collections.abc import Callable

NFULNL_MSG_PACKET, NFULNL_MSG_CONFIG = 0, 1
NFULA_CFG_CMD, NFULA_CFG_MODE, NFULA_CFG_NLBUFSIZ, NFULA_CFG_TIMEOUT, NFULA_CFG_QTHRESH = 1, 2, 3, 4, 5
NFULNL_CFG_CMD_BIND, NFULNL_CFG_CMD_UNBIND = 1, 2
NFULNL_COPY_PACKET = 2
NFULA_PACKET_HDR, NFULA_TIMESTAMP, NFULA_IFINDEX_INDEV, NFULA_IFINDEX_OUTDEV = 1, 3, 4, 5
NFULA_PAYLOAD, NFULA_PREFIX = 9, 10
NF_LOG_PREFIXLEN = 128  # the kernel's buffer, with its NUL: a prefix is at most 127 bytes

# IPv4 20..60 bytes, IPv6 40 plus a few extension headers; then 8 bytes of TCP/UDP/SCTP/ICMP
DEFAULT_COPY_RANGE = 128
IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMPV6, IPPROTO_SCTP = 1, 6, 17, 58, 132
PROTOCOLS = {IPPROTO_ICMP: "ICMP", IPPROTO_TCP: "TCP", IPPROTO_UDP: "UDP", IPPROTO_ICMPV6: "ICMPv6",
             IPPROTO_SCTP: "SCTP"}
_PORTED = (IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP)
_IPV6_EXTENSIONS = (0, 43, 60)  # hop-by-hop, routing, destination options: walked over to the transport
_IPV6_FRAGMENT = 44
_EPERM, _EBUSY, _ENOBUFS = 1, 16, 105
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (the group, big-endian)
_TIMESTAMP = struct.Struct("!QQ")  # seconds, microseconds
_BE32 = struct.Struct("!I")
_IFNAME_CACHE_MAX = 4096


class GroupBusy(OSError):
    """Another socket in this namespace has the NFLOG group (errno EBUSY)."""


@record(frozen=True)
class LoggedPacket:
    """One packet a rule logged: what the kernel said about it and what its headers hold.

    ``time`` is the kernel's timestamp when it gave one (a packet is stamped only when something
    on the host asked for timestamps), else when it was read. ``protocol`` is the IP protocol
    number, ``proto`` its name (TCP, UDP, SCTP, ICMP, ICMPv6, or the number as text); ``sport``
    and ``dport`` are ports for TCP/UDP/SCTP, ICMP's type and code for ICMP/ICMPv6, else None.
    """

    prefix: str
    time: float
    family: int           # 4 or 6 (0 when the payload was not IP)
    src: str
    dst: str
    protocol: int
    proto: str
    sport: int | None
    dport: int | None
    indev: int | None = None
    outdev: int | None = None
    indev_name: str | None = None
    outdev_name: str | None = None
    group: int = 0


def _ipv4(data: bytes) -> tuple[int, str, str, int, bytes | None]:
    ihl = (data[0] & 0x0F) * 4
    frag_offset = int.from_bytes(data[6:8], "big") & 0x1FFF
    src = _socket.inet_ntop(_socket.AF_INET, data[12:16])
    dst = _socket.inet_ntop(_socket.AF_INET, data[16:20])
    return 4, src, dst, data[9], None if frag_offset else data[ihl:]


def _ipv6(data: bytes) -> tuple[int, str, str, int, bytes | None]:
    src = _socket.inet_ntop(_socket.AF_INET6, data[8:24])
    dst = _socket.inet_ntop(_socket.AF_INET6, data[24:40])
    nexthdr, offset = data[6], 40
    transport: bytes | None = None
    for _ in range(8):
        if nexthdr in _IPV6_EXTENSIONS and offset + 2 <= len(data):
            nexthdr, offset = data[offset], offset + (data[offset + 1] + 1) * 8
            continue
        if nexthdr == _IPV6_FRAGMENT and offset + 8 <= len(data):
            first = int.from_bytes(data[offset + 2:offset + 4], "big") & 0xFFF8 == 0
            nexthdr, offset = data[offset], offset + 8
            if not first:
                return 6, src, dst, nexthdr, None  # a later fragment carries no transport header
            continue
        transport = data[offset:]
        break
    return 6, src, dst, nexthdr, transport


def decode_payload(data: bytes) -> tuple[int, str, str, int, int | None, int | None]:
    """(family, src, dst, protocol, sport, dport) of an IP packet's first bytes; family 0 when
    it is not IPv4 or IPv6. A field the copied bytes do not reach is None (ports) or 0/""."""
    version = data[0] >> 4 if data else 0
    if version == 4 and len(data) >= 20:
        family, src, dst, protocol, transport = _ipv4(data)
    elif version == 6 and len(data) >= 40:
        family, src, dst, protocol, transport = _ipv6(data)
    else:
        return 0, "", "", 0, None, None
    sport = dport = None
    if transport is not None:
        if protocol in _PORTED and len(transport) >= 4:
            sport, dport = int.from_bytes(transport[0:2], "big"), int.from_bytes(transport[2:4], "big")
        elif protocol in (IPPROTO_ICMP, IPPROTO_ICMPV6) and len(transport) >= 2:
            sport, dport = transport[0], transport[1]  # type, code
    return family, src, dst, protocol, sport, dport


def decode_packet(body: bytes, now: float, ifname: Callable[[int], str | None] | None = None) -> LoggedPacket:
    """One NFULNL_MSG_PACKET body (nfgenmsg + attributes) as a :class:`LoggedPacket`; ``ifname``
    names an interface index (NFLOG gives indexes only)."""
    _family, _version, group = _NFGENMSG.unpack_from(body)
    attrs = dict(raw_attrs(body, _NFGENMSG.size))
    prefix = attrs.get(NFULA_PREFIX, b"").split(b"\0", 1)[0].decode("utf-8", "replace")
    stamp = attrs.get(NFULA_TIMESTAMP)
    if stamp is not None and len(stamp) >= _TIMESTAMP.size:
        sec, usec = _TIMESTAMP.unpack_from(stamp)
        when = sec + usec / 1e6
    else:
        when = now
    family, src, dst, protocol, sport, dport = decode_payload(attrs.get(NFULA_PAYLOAD, b""))
    indev = _BE32.unpack_from(attrs[NFULA_IFINDEX_INDEV])[0] if NFULA_IFINDEX_INDEV in attrs else None
    outdev = _BE32.unpack_from(attrs[NFULA_IFINDEX_OUTDEV])[0] if NFULA_IFINDEX_OUTDEV in attrs else None
    return LoggedPacket(prefix=prefix, time=when, family=family, src=src, dst=dst, protocol=protocol,
                        proto=PROTOCOLS.get(protocol, str(protocol)), sport=sport, dport=dport,
                        indev=indev, outdev=outdev,
                        indev_name=ifname(indev) if ifname and indev else None,
                        outdev_name=ifname(outdev) if ifname and outdev else None, group=group)


class NflogReader:
    """A bound NFLOG group in the calling thread's network namespace; ``with`` unbinds and closes.

    ``batch_timeout`` (seconds, 0.01 steps) and ``queue_threshold`` let the kernel send several
    packets in one message under load instead of one message each: the reader then costs less
    per packet, at the price of up to ``batch_timeout`` of delay.
    """

    def __init__(self, group: int, copy_range: int = DEFAULT_COPY_RANGE, batch_timeout: float = 0.1,
                 queue_threshold: int = 32, buffer_bytes: int = 1 << 20) -> None:
        if not 0 <= group <= 0xFFFF:
            raise ValueError(f"NFLOG group {group} is out of range (0..65535)")
        self.group = group
        self.overruns = 0  # reads that found the kernel had dropped messages (receive buffer full)
        self._ifnames: dict[int, str] = {}
        self._sock = NetlinkSocket(NETLINK_NETFILTER)
        self._rtnl: IPRoute | None = None
        self._bound = False
        try:
            self._rtnl = IPRoute()  # names indexes in the reader's namespace, whichever thread reads
            try:
                self._config(nla(NFULA_CFG_CMD, bytes([NFULNL_CFG_CMD_BIND])))
            except OSError as e:
                if e.errno != _EPERM or os.geteuid() != 0:
                    raise
                # the kernel's answer when another socket holds the group (root may bind any free one)
                raise GroupBusy(_EBUSY, f"NFLOG group {group} is already bound by another reader in this "
                                        "network namespace") from None
            self._bound = True
            mode = struct.pack("!IBx", copy_range, NFULNL_COPY_PACKET)
            self._config(nla(NFULA_CFG_MODE, mode)
                         + nla(NFULA_CFG_TIMEOUT, _BE32.pack(max(1, round(batch_timeout * 100))))
                         + nla(NFULA_CFG_QTHRESH, _BE32.pack(max(1, queue_threshold)))
                         + nla(NFULA_CFG_NLBUFSIZ, _BE32.pack(min(buffer_bytes, 1 << 17))))
        except BaseException:
            self.close()
            raise

    def _config(self, attrs: bytes) -> None:
        self._sock.exchange((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
                            _NFGENMSG.pack(_socket.AF_UNSPEC, 0, self.group) + attrs, NLM_F_ACK)

    def fileno(self) -> int:
        return self._sock.fileno()

    def ifname(self, index: int) -> str | None:
        """The name of interface ``index`` in the reader's namespace (cached: the kernel hands out
        indexes in increasing order, so one is not soon reused), None when it is gone."""
        name = self._ifnames.get(index)
        if name is None and self._rtnl is not None:
            try:
                links = self._rtnl.link("get", index=index)
            except OSError:
                return None
            name = links[0].get_attr("IFLA_IFNAME") if links else None
            if name is None:
                return None
            if len(self._ifnames) >= _IFNAME_CACHE_MAX:
                self._ifnames.clear()
            self._ifnames[index] = name
        return name

    def read(self, timeout: float | None = 1.0) -> list[LoggedPacket]:
        """The packets of the next batch the kernel sends, waiting at most ``timeout`` seconds
        ([] then). Never blocks forever unless ``timeout`` is None."""
        self._sock.settimeout(timeout)
        try:
            messages = self._sock.receive()
        except TimeoutError:
            return []
        except OSError as e:
            if e.errno == _ENOBUFS:
                self.overruns += 1
                return []
            raise
        now = time.time()
        return [decode_packet(body, now, self.ifname) for mtype, body in messages
                if mtype == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET]

    def close(self) -> None:
        """Unbind the group (so another reader may bind it at once) and close the socket."""
        if self._bound:
            self._bound = False
            try:
                self._sock.settimeout(2.0)
                self._config(nla(NFULA_CFG_CMD, bytes([NFULNL_CFG_CMD_UNBIND])))
            except OSError:
                pass  # closing the socket unbinds it too
        self._sock.close()
        if self._rtnl is not None:
            self._rtnl.close()

    def __enter__(self) -> NflogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
