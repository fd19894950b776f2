"""Address ranges and range sets as host-local configures them, and requested IPs. Stdlib only.

A *range* is a subnet with an inclusive ``rangeStart``..``rangeEnd`` window and a gateway; a
*range set* is a list of ranges of one family that together yield one address. Parsing,
defaults, overlap rules and the allocation order follow the Go reference allocator, so the
same config hands out the same addresses in the same order. Addresses are compared as ints
(cheap on the allocation path). The IP, route and requested-IP parsers are not host-local
specific: other IPAM plugins (static) can use them.
"""

from __future__ import annotations

from pycni import ipaddr, netconf
from pycni.record import record
from pycni.spec.errors import INVALID_ENV, CNIError, invalid_config
from pycni.spec.types import IPAddress, IPNetwork, Route

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any


class RangeError(ValueError):
    """A range or range set that cannot be used; the message is the reference's wording."""


# ---- single addresses ----------------------------------------------------------------------


def parse_ip(text: str) -> IPAddress:
    """Parse an address as Go's net.ParseIP does, IPv4-mapped IPv6 folded to IPv4."""
    if not isinstance(text, str) or not text or "%" in text:
        raise ValueError(f"invalid IP address {text!r}")
    addr = ipaddr.ip_address(text)  # raises ValueError
    if isinstance(addr, ipaddr.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def parse_ip_with_prefix(text: str) -> tuple[IPAddress, int | None]:
    """Parse ``ip`` or ``ip/prefix`` (Go's ip.ParseIP): the address and the prefix if given."""
    if not isinstance(text, str):
        raise ValueError(f"invalid IP address {text!r}: not a string")
    if "/" in text:
        if not text.rpartition("/")[2].isdigit():  # Go takes a prefix length, not a netmask
            raise ValueError(f"invalid IP address {text}")
        try:
            iface = ipaddr.ip_interface(text)
        except ValueError:
            raise ValueError(f"invalid IP address {text}") from None
        return parse_ip(str(iface.ip)), iface.network.prefixlen
    try:
        return parse_ip(text), None
    except ValueError:
        raise ValueError(f"invalid IP address {text}") from None


def _opt_ip(obj: Mapping[str, Any], key: str) -> IPAddress | None:
    """An optional address field: absent, null and "" all mean unset (as Go's net.IP)."""
    value = netconf.lookup(obj, key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RangeError(f"{key} must be a string holding an IP address, got {value!r}")
    try:
        return parse_ip(value)
    except ValueError:
        raise RangeError(f"{key} {value!r} is not a valid IP address") from None


# ---- ranges --------------------------------------------------------------------------------


@record(frozen=True)
class Range:
    """One canonical range: every field filled in, as Go's Range.Canonicalize leaves it."""

    subnet: IPNetwork
    range_start: IPAddress
    range_end: IPAddress
    gateway: IPAddress

    @property
    def version(self) -> int:
        return self.subnet.version

    @property
    def start_int(self) -> int:
        return int(self.range_start)

    @property
    def end_int(self) -> int:
        return int(self.range_end)

    def contains(self, addr: IPAddress) -> bool:
        """Same family and inside rangeStart..rangeEnd (which lie inside the subnet)."""
        return addr.version == self.version and self.start_int <= int(addr) <= self.end_int

    def overlaps(self, other: Range) -> bool:
        return (self.version == other.version and self.start_int <= other.end_int
                and other.start_int <= self.end_int)

    def is_reserved(self, value: int) -> bool:
        """The gateway, the network address and (IPv4) the broadcast are never handed out."""
        if self.gateway.version == self.version and value == int(self.gateway):
            return True
        if value == int(self.subnet.network_address):
            return True
        return self.version == 4 and value == int(self.subnet.broadcast_address)

    def to_dict(self) -> dict[str, str]:
        return {"subnet": str(self.subnet), "rangeStart": str(self.range_start),
                "rangeEnd": str(self.range_end), "gateway": str(self.gateway)}

    def __str__(self) -> str:
        return f"{self.range_start}-{self.range_end}"


def parse_subnet(value: Any) -> IPNetwork:
    """A subnet in CIDR form with no host bits, large enough to allocate from."""
    if not isinstance(value, str) or not value:
        raise RangeError(f"subnet must be a CIDR string such as \"10.1.0.0/16\", got {value!r}")
    try:
        iface = ipaddr.ip_interface(value)
    except ValueError:
        raise RangeError(f"invalid CIDR address: {value}") from None
    if not value.rpartition("/")[2].isdigit():
        raise RangeError(f"invalid CIDR address: {value} (the prefix must be a length such as /24)")
    if isinstance(iface, ipaddr.IPv6Interface) and iface.ip.ipv4_mapped is not None:
        raise RangeError(f"subnet {value}: use plain IPv4 notation for IPv4 subnets")
    net = iface.network
    if net.prefixlen == 0:  # Go accepts it and hands out 0.0.0.2/0: a route to everywhere
        raise RangeError(f"subnet {value} is the whole address space: give the network's own prefix, "
                         "such as 10.1.0.0/16 or fd00::/64")
    if net.prefixlen > net.max_prefixlen - 2:
        raise RangeError(f"Network {net} too small to allocate from")
    if iface.ip != net.network_address:
        raise RangeError(f"Network has host bits set. For a subnet mask of length {net.prefixlen} "
                         f"the network address is {net.network_address}")
    return net


def parse_range(obj: Any) -> Range:
    """Parse and canonicalize one range object ({subnet, rangeStart?, rangeEnd?, gateway?})."""
    if not isinstance(obj, dict):  # (decoded JSON; not the Mapping ABC, which needs collections.abc)
        raise RangeError(f"a range must be an object with a \"subnet\", got {obj!r}")
    net = parse_subnet(netconf.lookup(obj, "subnet"))

    first = net.network_address + 1
    last = net.broadcast_address - 1 if net.version == 4 else net.broadcast_address
    gateway = _opt_ip(obj, "gateway") or first
    start = _opt_ip(obj, "rangeStart")
    end = _opt_ip(obj, "rangeEnd")
    # Go checks rangeStart against the subnet and an explicit rangeEnd, then rangeEnd
    # against the subnet and rangeStart: an inverted window fails on whichever comes first.
    if start is not None:
        if start.version != net.version or start not in net or (
                end is not None and end.version == start.version and int(start) > int(end)):
            raise RangeError(f"RangeStart {start} not in network {net}")
    else:
        start = first
    if end is not None:
        if end.version != net.version or end not in net or int(end) < int(start):
            raise RangeError(f"RangeEnd {end} not in network {net}")
    else:
        end = last
    return Range(subnet=net, range_start=start, range_end=end, gateway=gateway)


RangeSet = list[Range]


def parse_range_set(obj: Any) -> RangeSet:
    """A non-empty list of ranges of one family, none overlapping another."""
    if not isinstance(obj, list):
        raise RangeError(f"a range set must be a list of ranges, got {obj!r}")
    if not obj:
        raise RangeError("empty range set")
    rs = [parse_range(r) for r in obj]
    if any(r.version != rs[0].version for r in rs):
        raise RangeError("mixed address families")
    for i, r1 in enumerate(rs):
        for r2 in rs[i + 1:]:
            if r1.overlaps(r2):
                raise RangeError(f"subnets {r1} and {r2} overlap")
    return rs


def range_set_str(rs: Sequence[Range]) -> str:
    """A range set as the reference prints it in errors."""
    return ",".join(str(r) for r in rs)


def range_for(rs: Sequence[Range], addr: IPAddress) -> Range | None:
    """The range of ``rs`` that holds ``addr``, None when none does."""
    for r in rs:
        if r.contains(addr):
            return r
    return None


def range_sets_overlap(a: Sequence[Range], b: Sequence[Range]) -> bool:
    return any(r1.overlaps(r2) for r1 in a for r2 in b)


def candidates(rs: Sequence[Range], last_reserved: IPAddress | None) -> Iterator[tuple[Range, int]]:
    """Every allocatable address of ``rs`` once, in the reference allocator's order.

    Round robin: start right after ``last_reserved`` when it lies in the set (so a crash-looping
    container does not get the same address back at once), else at the first range's start;
    walk each range to its end, wrap to the next range, stop on coming back to the start.
    Gateways, network and broadcast addresses are skipped. Yields (range, address as int).
    """
    idx = 0
    cur: int | None = None
    start: int | None = None
    if last_reserved is not None:
        for i, r in enumerate(rs):
            if r.contains(last_reserved):
                idx, cur = i, int(last_reserved)
                break
    n = len(rs)
    r = rs[idx]
    while True:
        if cur is None:
            cur = r.start_int
            start = cur
        else:
            if cur == r.end_int:
                idx = (idx + 1) % n
                r = rs[idx]
                cur = r.start_int
            else:
                cur += 1
            if start is None:
                start = cur
            elif cur == start:
                return
        if r.is_reserved(cur):
            continue
        yield r, cur


def address(version: int, value: int) -> IPAddress:
    """The IPv4 or IPv6 address with integer ``value``."""
    return ipaddr.IPv4Address(value) if version == 4 else ipaddr.IPv6Address(value)


# ---- requested addresses ------------------------------------------------------------------


def _ip_list(section: Mapping[str, Any], where: str) -> list[tuple[IPAddress, int | None]]:
    """``section["ips"]``: requested addresses (each with an optional prefix); CNIError 7 for anything else."""
    out = []
    for item in netconf.get_list(section, "ips", label=where):
        try:
            out.append(parse_ip_with_prefix(item))
        except ValueError as e:
            raise invalid_config(f"invalid {where}", f"cannot understand ip: {e}") from None
    return out


def requested_ips(conf: Mapping[str, Any], cni_args: Mapping[str, str]) -> list[tuple[IPAddress, int | None]]:
    """Addresses the runtime asks for, in the reference's order of precedence.

    From CNI_ARGS ``IP=`` (comma-separated; parse it with pycni.cniargs first), then the
    config's ``args.cni.ips``, then runtimeConfig ``ips`` (the "ips" capability). Each entry
    is (address, prefix length or None).
    """
    out: list[tuple[IPAddress, int | None]] = []
    raw = cni_args.get("IP", "")
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(parse_ip_with_prefix(part))
        except ValueError as e:
            raise CNIError(INVALID_ENV, f"ARGS: invalid IP in CNI_ARGS IP={raw}",
                           f"{e}; give one or more addresses separated by ','") from None
    out.extend(_ip_list(netconf.args_cni(conf), "args.cni.ips"))
    out.extend(_ip_list(netconf.runtime_config(conf), "runtimeConfig.ips"))
    return out


def parse_routes(value: Any, where: str = "routes") -> list[Route]:
    """A config's route list ([{dst, gw?}]); a bad entry is an invalid config (code 7)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_config(f"invalid {where}", f"{where} must be a list of {{\"dst\": CIDR}}, "
                       f"got {value!r}")
    routes = []
    for item in value:
        try:
            routes.append(Route.from_dict(item))
        except CNIError as e:
            raise invalid_config(f"invalid route in {where}", str(e)) from None
        except (TypeError, ValueError) as e:
            raise invalid_config(f"invalid route in {where}", f"{item!r}: {e}") from None
    return routes
