"""DHCPv4 messages (RFC 2131/2132): build the client's, parse the server's. Stdlib only.

Only what a CNI lease needs: message type, client identifier, requested address, server id,
parameter request list, lease times, subnet mask, routers, DNS servers, domain name and search
list (RFC 3397), static routes (33) and classless static routes (RFC 3442, option 121).
"""

from __future__ import annotations

import struct

from pycni import ipaddr
from pycni.record import field, record

BOOTREQUEST = 1
BOOTREPLY = 2
MAGIC_COOKIE = b"\x63\x82\x53\x63"
FLAG_BROADCAST = 0x8000

# Message types (option 53).
DISCOVER, OFFER, REQUEST, DECLINE, ACK, NAK, RELEASE, INFORM = range(1, 9)
TYPE_NAMES = {DISCOVER: "DISCOVER", OFFER: "OFFER", REQUEST: "REQUEST", DECLINE: "DECLINE", ACK: "ACK",
              NAK: "NAK", RELEASE: "RELEASE", INFORM: "INFORM"}

# Option codes.
OPT_PAD = 0
OPT_SUBNET_MASK = 1
OPT_ROUTER = 3
OPT_DNS = 6
OPT_HOST_NAME = 12
OPT_DOMAIN_NAME = 15
OPT_STATIC_ROUTE = 33
OPT_VENDOR_CLASS = 60
OPT_REQUESTED_IP = 50
OPT_LEASE_TIME = 51
OPT_OVERLOAD = 52
OPT_MESSAGE_TYPE = 53
OPT_SERVER_ID = 54
OPT_PARAM_REQUEST_LIST = 55
OPT_MESSAGE = 56
OPT_MAX_MESSAGE_SIZE = 57
OPT_RENEWAL_TIME = 58
OPT_REBINDING_TIME = 59
OPT_CLIENT_ID = 61
OPT_USER_CLASS = 77
OPT_DOMAIN_SEARCH = 119
OPT_CLASSLESS_ROUTE = 121
OPT_END = 255

# Names the ipam "provide"/"request" entries may use, as the reference accepts (dhcp-options(5)).
OPTION_NAMES: dict[str, int] = {
    "dhcp-client-identifier": OPT_CLIENT_ID,
    "subnet-mask": OPT_SUBNET_MASK,
    "routers": OPT_ROUTER,
    "host-name": OPT_HOST_NAME,
    "user-class": OPT_USER_CLASS,
    "vendor-class-identifier": OPT_VENDOR_CLASS,
}

_HEADER = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s")


class MessageError(ValueError):
    """A packet that is not a well-formed DHCP message."""


def parse_option_name(name: str) -> int:
    """An option given by dhcp-options(5) name or by number (1-254)."""
    if name in OPTION_NAMES:
        return OPTION_NAMES[name]
    if name.isdigit() and 0 < int(name) < 255:
        return int(name)
    raise ValueError(f"unknown DHCP option {name!r}: use a number 1-254 or one of {sorted(OPTION_NAMES)}")


@record
class Message:
    op: int = BOOTREQUEST
    xid: int = 0
    secs: int = 0
    flags: int = 0
    ciaddr: ipaddr.IPv4Address = ipaddr.IPv4Address(0)
    yiaddr: ipaddr.IPv4Address = ipaddr.IPv4Address(0)
    siaddr: ipaddr.IPv4Address = ipaddr.IPv4Address(0)
    giaddr: ipaddr.IPv4Address = ipaddr.IPv4Address(0)
    chaddr: bytes = b""
    options: dict[int, bytes] = field(default_factory=dict)

    # ---- wire format --------------------------------------------------------------------
    def encode(self) -> bytes:
        head = _HEADER.pack(self.op, 1, 6, 0, self.xid, self.secs, self.flags, self.ciaddr.packed,
                            self.yiaddr.packed, self.siaddr.packed, self.giaddr.packed,
                            self.chaddr.ljust(16, b"\0")[:16], b"", b"")
        opts = bytearray(MAGIC_COOKIE)
        for code, value in self.options.items():
            for i in range(0, max(len(value), 1), 255):  # RFC 3396: long options split in parts
                chunk = value[i:i + 255]
                opts += bytes((code, len(chunk))) + chunk
        opts.append(OPT_END)
        data = head + bytes(opts)
        return data.ljust(300, b"\0")  # BOOTP minimum size, some servers insist

    @classmethod
    def decode(cls, data: bytes) -> Message:
        if len(data) < _HEADER.size + 4:
            raise MessageError(f"short DHCP message ({len(data)} bytes)")
        (op, _htype, hlen, _hops, xid, secs, flags, ci, yi, si, gi, chaddr, sname,
         bootfile) = _HEADER.unpack_from(data)
        if data[_HEADER.size:_HEADER.size + 4] != MAGIC_COOKIE:
            raise MessageError("no DHCP magic cookie")
        options = _parse_options(data[_HEADER.size + 4:])
        overload = options.get(OPT_OVERLOAD, b"\0")[:1]
        if overload in (b"\x01", b"\x03"):
            _merge(options, _parse_options(bootfile))
        if overload in (b"\x02", b"\x03"):
            _merge(options, _parse_options(sname))
        return cls(op=op, xid=xid, secs=secs, flags=flags, ciaddr=ipaddr.IPv4Address(ci),
                   yiaddr=ipaddr.IPv4Address(yi), siaddr=ipaddr.IPv4Address(si),
                   giaddr=ipaddr.IPv4Address(gi), chaddr=chaddr[:min(hlen, 16)], options=options)

    # ---- typed views of the options ------------------------------------------------------
    @property
    def message_type(self) -> int:
        v = self.options.get(OPT_MESSAGE_TYPE, b"")
        return v[0] if len(v) == 1 else 0

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.message_type, f"type {self.message_type}")

    def ip_option(self, code: int) -> ipaddr.IPv4Address | None:
        v = self.options.get(code, b"")
        return ipaddr.IPv4Address(v[:4]) if len(v) >= 4 else None

    def ip_list_option(self, code: int) -> list[ipaddr.IPv4Address]:
        v = self.options.get(code, b"")
        return [ipaddr.IPv4Address(v[i:i + 4]) for i in range(0, len(v) - len(v) % 4, 4)]

    def seconds_option(self, code: int) -> int | None:
        v = self.options.get(code, b"")
        return struct.unpack("!I", v)[0] if len(v) == 4 else None

    @property
    def server_id(self) -> ipaddr.IPv4Address | None:
        return self.ip_option(OPT_SERVER_ID)

    @property
    def subnet_mask(self) -> ipaddr.IPv4Address | None:
        return self.ip_option(OPT_SUBNET_MASK)

    @property
    def routers(self) -> list[ipaddr.IPv4Address]:
        return self.ip_list_option(OPT_ROUTER)

    @property
    def dns_servers(self) -> list[ipaddr.IPv4Address]:
        return self.ip_list_option(OPT_DNS)

    @property
    def domain_name(self) -> str:
        return self.options.get(OPT_DOMAIN_NAME, b"").rstrip(b"\0").decode("ascii", "replace")

    @property
    def domain_search(self) -> list[str]:
        return decode_domain_list(self.options.get(OPT_DOMAIN_SEARCH, b""))

    @property
    def server_message(self) -> str:
        return self.options.get(OPT_MESSAGE, b"").decode("utf-8", "replace")

    def classless_routes(self) -> list[tuple[ipaddr.IPv4Network, ipaddr.IPv4Address]]:
        """Option 121 (RFC 3442): (destination, router) pairs; [] when absent or malformed."""
        data = self.options.get(OPT_CLASSLESS_ROUTE, b"")
        out = []
        i = 0
        while i < len(data):
            width = data[i]
            if width > 32:
                return []
            octets = (width + 7) // 8
            if i + 1 + octets + 4 > len(data):
                return []
            dst = data[i + 1:i + 1 + octets].ljust(4, b"\0")
            gw = data[i + 1 + octets:i + 5 + octets]
            out.append((ipaddr.IPv4Network((dst, width), strict=False), ipaddr.IPv4Address(gw)))
            i += 5 + octets
        return out

    def static_routes(self) -> list[tuple[ipaddr.IPv4Network, ipaddr.IPv4Address]]:
        """Option 33: classful (destination, router) pairs."""
        data = self.options.get(OPT_STATIC_ROUTE, b"")
        out = []
        for i in range(0, len(data) - len(data) % 8, 8):
            dst = ipaddr.IPv4Address(data[i:i + 4])
            first = data[i]
            prefix = 8 if first < 128 else 16 if first < 192 else 24
            out.append((ipaddr.IPv4Network((dst, prefix), strict=False), ipaddr.IPv4Address(data[i + 4:i + 8])))
        return out


def _parse_options(data: bytes) -> dict[int, bytes]:
    opts: dict[int, bytes] = {}
    i = 0
    while i < len(data):
        code = data[i]
        if code == OPT_END:
            break
        if code == OPT_PAD:
            i += 1
            continue
        if i + 1 >= len(data):
            raise MessageError("truncated DHCP option")
        length = data[i + 1]
        value = data[i + 2:i + 2 + length]
        if len(value) != length:
            raise MessageError(f"truncated DHCP option {code}")
        opts[code] = opts.get(code, b"") + value  # RFC 3396 concatenation
        i += 2 + length
    return opts


def _merge(into: dict[int, bytes], more: dict[int, bytes]) -> None:
    for code, value in more.items():
        into[code] = into.get(code, b"") + value


def decode_domain_list(data: bytes) -> list[str]:
    """RFC 3397 search list: DNS wire-format names, with compression pointers into the option."""
    names: list[str] = []
    i = 0
    while i < len(data):
        labels, i = _read_name(data, i)
        if labels is None:
            break
        names.append(".".join(labels))
    return names


def _read_name(data: bytes, i: int) -> tuple[list[str] | None, int]:
    labels: list[str] = []
    end = -1
    hops = 0
    while True:
        if i >= len(data):
            return None, len(data)
        n = data[i]
        if n == 0:
            return labels, (end if end >= 0 else i + 1)
        if n & 0xC0 == 0xC0:
            if i + 1 >= len(data) or hops > 32:
                return None, len(data)
            if end < 0:
                end = i + 2
            i = ((n & 0x3F) << 8) | data[i + 1]
            hops += 1
            continue
        labels.append(data[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
