"""Result types for every spec version, with conversion as the Go reference converts.

One in-memory shape (the 1.x one) is parsed from and rendered to each version's JSON:

* 0.1.0 / 0.2.0: ``ip4`` / ``ip6`` objects with ``ip``, ``gateway``, ``routes``; no interfaces.
* 0.3.0 / 0.3.1 / 0.4.0: ``interfaces``, ``ips`` (each with ``version``), ``routes``, ``dns``.
* 1.0.0 / 1.1.0: as 0.4.0 without the per-IP ``version``; interfaces may carry ``mtu``,
  ``socketPath`` and ``pciID``. Routes carry ``mtu``, ``advmss``, ``priority``, ``table``
  and ``scope`` in every version from 0.3.0 (the Go route type is shared).

What survives a conversion follows the Go reference (pkg/types/{020,040,100}) exactly:

* 1.x -> 0.3/0.4 drops the interface extras, recomputes each IP's ``version`` from its
  address, keeps route attributes; -> 0.1/0.2 keeps the first IPv4 and first IPv6 address,
  files routes under the family of their destination with only ``dst`` and ``gw``, and
  refuses a result with no address at all.
* 0.3/0.4 -> 0.1/0.2 picks addresses by their declared ``version`` string, not the address.
* 1.0.0 <-> 1.1.0 keeps everything (same Go type).
* Empty ``dns`` is always printed (``"dns": {}``) for 0.x results; 1.x results omit it
  (current reference, since libcni 1.2; 1.1.x printed ``{}`` there too).

Parsing is stricter than Go's where Go would accept garbage silently (a missing address, a
number in a string field): that is refused with code 6 and says which field is wrong. Keys are
matched as Go's decoder matches them (:mod:`pycni.spec.gokeys`: ``"IPs"``, ``"Address"`` and
``"CNIVersion"`` are read too); output is always in the canonical spelling.
"""

from __future__ import annotations

from pycni import ipaddr
from pycni import jsonlite as json
from pycni.record import field, record
from pycni.spec.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, CNIError
from pycni.spec.gokeys import lookup
from pycni.spec.validate import charset_match
from pycni.spec.version import ALL_VERSIONS, LEGACY_RESULT_VERSIONS, V04_RESULT_VERSIONS, V1_RESULT_VERSIONS

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

IPAddress = ipaddr.IPv4Address | ipaddr.IPv6Address
IPInterface = ipaddr.IPv4Interface | ipaddr.IPv6Interface
IPNetwork = ipaddr.IPv4Network | ipaddr.IPv6Network

# Go's net.ParseCIDR takes a literal address, '/', and a decimal prefix length; no zones,
# no netmask notation (which pycni.ipaddr, like Python's ipaddress, would also accept).


def _decode_error(what: str, value: object, why: str = "") -> CNIError:
    return CNIError(DECODE_FAILURE, f"failed to decode {what}", f"{value!r}{': ' + why if why else ''}")


def parse_ip(value: object, what: str = "IP address") -> IPAddress:
    if not isinstance(value, str):
        raise _decode_error(what, value, "not a string")
    if "%" in value:
        raise _decode_error(what, value, "zone suffixes are not allowed")
    try:
        return ipaddr.ip_address(value)
    except ValueError as e:
        raise _decode_error(what, value, str(e)) from None


def _cidr_form(value: str) -> bool:
    """``re.match(r"^[0-9A-Fa-f:.]+/[0-9]{1,3}$", value)`` without importing re."""
    addr, slash, plen = value.partition("/")
    if plen.endswith("\n"):
        plen = plen[:-1]
    return (bool(slash) and charset_match(addr, _ADDR_CHARS, _ADDR_CHARS)
            and charset_match(plen, "0123456789", "0123456789", 3))


_ADDR_CHARS = "0123456789ABCDEFabcdef:."


def parse_cidr(value: object, what: str = "CIDR address") -> IPInterface:
    """Parse 'a.b.c.d/n' keeping host bits (an address with its prefix)."""
    if not isinstance(value, str) or not _cidr_form(value):
        raise _decode_error(what, value, "expected address/prefix, e.g. 10.1.2.3/24")
    try:
        return ipaddr.ip_interface(value)
    except ValueError as e:
        raise _decode_error(what, value, str(e)) from None


def _str_field(d: dict[str, Any], key: str, what: str) -> str:
    v = lookup(d, key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise _decode_error(f"{what} {key}", v, "expected a string")
    return v


def _int_field(d: dict[str, Any], key: str, what: str) -> int | None:
    """An optional JSON integer (null/absent -> None); bools and floats are refused as in Go."""
    v = lookup(d, key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _decode_error(f"{what} {key}", v, "expected an integer")
    return v


def _list_field(d: dict[str, Any], key: str, what: str) -> list[Any]:
    v = lookup(d, key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise _decode_error(f"{what} {key}", v, "expected a list")
    return v


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _decode_error(what, value, "expected a JSON object")
    return value


def result_family(version: str) -> str:
    """Which Go result type holds ``version``: 'legacy' (0.1/0.2), '04' (0.3/0.4) or '1'."""
    if version in LEGACY_RESULT_VERSIONS:
        return "legacy"
    if version in V04_RESULT_VERSIONS:
        return "04"
    if version in V1_RESULT_VERSIONS:
        return "1"
    raise CNIError(INCOMPATIBLE_VERSION, "unsupported CNI result version",
                   f"result version {version!r} is not one of {list(ALL_VERSIONS)}")


@record
class Interface:
    name: str
    mac: str = ""
    sandbox: str = ""
    mtu: int = 0
    socket_path: str = ""
    pci_id: str = ""

    def to_dict(self, version: str | None = None) -> dict[str, Any]:
        """JSON in Go's field order; the 1.x extras only when ``version`` is 1.x (or unset)."""
        extras = version is None or version in V1_RESULT_VERSIONS
        d: dict[str, Any] = {"name": self.name}
        if self.mac:
            d["mac"] = self.mac
        if extras and self.mtu:
            d["mtu"] = self.mtu
        if self.sandbox:
            d["sandbox"] = self.sandbox
        if extras and self.socket_path:
            d["socketPath"] = self.socket_path
        if extras and self.pci_id:
            d["pciID"] = self.pci_id
        return d

    @classmethod
    def from_dict(cls, d: Any, version: str | None = None) -> Interface:
        """Parse one interface; a 0.x result has no extras, so Go ignores them there."""
        d = _object(d, "interface")
        iface = cls(name=_str_field(d, "name", "interface"), mac=_str_field(d, "mac", "interface"),
                    sandbox=_str_field(d, "sandbox", "interface"))
        if version is None or version in V1_RESULT_VERSIONS:
            iface.mtu = _int_field(d, "mtu", "interface") or 0
            iface.socket_path = _str_field(d, "socketPath", "interface")
            iface.pci_id = _str_field(d, "pciID", "interface")
        return iface


@record
class IPConfig:
    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None
    # The "version" string a 0.3/0.4 result (or the ip4/ip6 key of a 0.1/0.2 one) declared.
    # Go trusts it over the address when converting down, so it is kept for 0.x results.
    declared_version: str | None = field(default=None, compare=False, repr=False)

    @property
    def version(self) -> str:
        return str(self.address.version)

    def to_dict(self, with_version: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if with_version:
            d["version"] = self.declared_version if self.declared_version is not None else self.version
        if self.interface is not None:
            d["interface"] = self.interface
        d["address"] = str(self.address)
        if self.gateway is not None:
            d["gateway"] = str(self.gateway)
        return d

    @classmethod
    def from_dict(cls, d: Any, version: str | None = None) -> IPConfig:
        d = _object(d, "IP config")
        addr = parse_cidr(lookup(d, "address"), "IP config address")
        gw_text = lookup(d, "gateway")
        gw = parse_ip(gw_text, "IP config gateway") if gw_text not in (None, "") else None
        iface = _int_field(d, "interface", "IP config")
        declared = None
        if version in V04_RESULT_VERSIONS:
            declared = _str_field(d, "version", "IP config")
        return cls(address=addr, gateway=gw, interface=iface, declared_version=declared)


@record
class Route:
    dst: IPNetwork
    gw: IPAddress | None = None
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None
    # Go keeps the host bits of "dst" ("10.0.0.5/24" prints back as given); so do we.
    dst_host: IPAddress | None = field(default=None, compare=False, repr=False)
    # The ip4/ip6 block a 0.1/0.2 route came in; Go copies blocks verbatim between 0.1 and 0.2.
    legacy_block: str | None = field(default=None, compare=False, repr=False)

    def dst_text(self) -> str:
        host = self.dst_host
        if host is not None and host.version == self.dst.version and host in self.dst:
            return f"{host}/{self.dst.prefixlen}"
        return str(self.dst)

    def to_dict(self, attributes: bool = True) -> dict[str, Any]:
        """JSON in Go's field order; ``attributes=False`` keeps only dst and gw (0.1/0.2)."""
        d: dict[str, Any] = {"dst": self.dst_text()}
        if self.gw is not None:
            d["gw"] = str(self.gw)
        if not attributes:
            return d
        if self.mtu:
            d["mtu"] = self.mtu
        if self.advmss:
            d["advmss"] = self.advmss
        if self.priority:
            d["priority"] = self.priority
        if self.table is not None:
            d["table"] = self.table
        if self.scope is not None:
            d["scope"] = self.scope
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Route:
        d = _object(d, "route")
        where = parse_cidr(lookup(d, "dst"), "route destination")
        gw_text = lookup(d, "gw")
        gw = parse_ip(gw_text, "route gateway") if gw_text not in (None, "") else None
        return cls(dst=where.network, gw=gw, mtu=_int_field(d, "mtu", "route") or 0,
                   advmss=_int_field(d, "advmss", "route") or 0,
                   priority=_int_field(d, "priority", "route") or 0,
                   table=_int_field(d, "table", "route"), scope=_int_field(d, "scope", "route"),
                   dst_host=where.ip)


@record
class DNS:
    nameservers: list[str] = field(default_factory=list)
    domain: str = ""
    search: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.nameservers:
            d["nameservers"] = list(self.nameservers)
        if self.domain:
            d["domain"] = self.domain
        if self.search:
            d["search"] = list(self.search)
        if self.options:
            d["options"] = list(self.options)
        return d

    def is_empty(self) -> bool:
        return not (self.nameservers or self.domain or self.search or self.options)

    @staticmethod
    def is_set(d: Any) -> bool:
        """Whether a plugin's raw ``dns`` object overrides IPAM's, as Go's dnsConfSet: any list
        given, even empty (``"nameservers": []`` clears IPAM's), or a non-empty domain."""
        if not isinstance(d, dict):
            return False
        return any(d.get(k) is not None for k in ("nameservers", "search", "options")) or bool(d.get("domain"))

    @classmethod
    def from_dict(cls, d: Any) -> DNS:
        if d is None:
            return cls()
        d = _object(d, "dns")

        def strs(key: str) -> list[str]:
            v = _list_field(d, key, "dns")
            if not all(isinstance(x, str) for x in v):
                raise _decode_error(f"dns {key}", v, "expected a list of strings")
            return list(v)

        return cls(nameservers=strs("nameservers"), domain=_str_field(d, "domain", "dns"),
                   search=strs("search"), options=strs("options"))


@record
class Result:
    """A plugin's result, held in the 1.x shape whatever version it came in.

    ``cni_version`` is the version it was parsed from (or built for): conversion rules
    depend on where a result comes from, as Go's do on its concrete type.
    """

    cni_version: str = "1.0.0"
    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)

    # ---- parsing -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, version: str | None = None) -> Result:
        """Parse a result of any supported version.

        ``version`` is the version the caller expects (e.g. the config's, for a prevResult
        or a result without ``cniVersion``); a declared ``cniVersion`` of the same Go result
        type wins, one of another type is refused, as Go's create.Create refuses it.
        """
        d = _object(d, "result")
        declared = lookup(d, "cniVersion")
        if declared is not None and not isinstance(declared, str):
            raise _decode_error("result cniVersion", declared, "expected a string")
        ver = declared or version or "0.1.0"
        family = result_family(ver)
        if version and declared and result_family(version) != family:
            raise CNIError(DECODE_FAILURE, "result version does not match the expected version",
                           f"expected a {version} result, got one declaring cniVersion {declared!r}")
        if family == "legacy":
            return cls._from_legacy(d, ver)
        return cls(cni_version=ver,
                   interfaces=[Interface.from_dict(i, ver) for i in _list_field(d, "interfaces", "result")],
                   ips=[IPConfig.from_dict(i, ver) for i in _list_field(d, "ips", "result")],
                   routes=[Route.from_dict(r) for r in _list_field(d, "routes", "result")],
                   dns=DNS.from_dict(lookup(d, "dns")))

    @classmethod
    def _from_legacy(cls, d: dict[str, Any], ver: str) -> Result:
        res = cls(cni_version=ver, dns=DNS.from_dict(lookup(d, "dns")))
        for key, family in (("ip4", "4"), ("ip6", "6")):
            block = lookup(d, key)
            if block is None:
                continue
            block = _object(block, f"result {key}")
            addr = parse_cidr(lookup(block, "ip"), f"{key} address")
            gw_text = lookup(block, "gateway")
            gw = parse_ip(gw_text, f"{key} gateway") if gw_text not in (None, "") else None
            res.ips.append(IPConfig(address=addr, gateway=gw, declared_version=family))
            for raw in _list_field(block, "routes", f"result {key}"):
                route = Route.from_dict(raw)
                route.legacy_block = family
                res.routes.append(route)
        return res

    @classmethod
    def from_json(cls, data: str | bytes, version: str | None = None) -> Result:
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise CNIError(DECODE_FAILURE, "failed to decode result", str(e)) from None
        return cls.from_dict(obj, version)

    # ---- rendering -----------------------------------------------------------------------
    def to_dict(self, version: str | None = None) -> dict[str, Any]:
        """Render as ``version`` (default: own), converting as the Go reference does."""
        ver = version or self.cni_version
        target = result_family(ver)
        source = result_family(self.cni_version) if self.cni_version in ALL_VERSIONS else "1"
        if target == "legacy":
            return self._to_legacy(ver, source)
        d: dict[str, Any] = {"cniVersion": ver}
        if self.interfaces:
            d["interfaces"] = [i.to_dict(ver) for i in self.interfaces]
        if self.ips:
            if target == "04":
                # From a 1.x result Go recomputes "version" from the address; a 0.x one keeps its own.
                d["ips"] = [(ip if source != "1" else _undeclared(ip)).to_dict(True) for ip in self.ips]
            else:
                d["ips"] = [ip.to_dict(False) for ip in self.ips]
        if self.routes:
            d["routes"] = [r.to_dict() for r in self.routes]
        if target == "04" or not self.dns.is_empty():
            d["dns"] = self.dns.to_dict()
        return d

    def _to_legacy(self, ver: str, source: str) -> dict[str, Any]:
        blocks: dict[str, dict[str, Any]] = {}
        for ip in self.ips:
            family = ip.declared_version if source != "1" and ip.declared_version is not None else ip.version
            key = {"4": "ip4", "6": "ip6"}.get(family)
            if key is None or key in blocks:
                continue  # only the first address of each family survives, as in Go
            block: dict[str, Any] = {"ip": str(ip.address)}
            if ip.gateway is not None:
                block["gateway"] = str(ip.gateway)
            blocks[key] = block
        for r in self.routes:
            # 0.1 <-> 0.2 copies blocks whole; from 0.3+ Go files routes by destination family
            # and keeps only dst/gw.
            route_family = str(r.dst.version)
            if source == "legacy" and r.legacy_block is not None:
                route_family = r.legacy_block
            key = "ip4" if route_family == "4" else "ip6"
            if key in blocks:
                blocks[key].setdefault("routes", []).append(r.to_dict(attributes=source == "legacy"))
        if not blocks:
            raise CNIError(INCOMPATIBLE_VERSION, "cannot convert: no valid IP addresses",  # Go's words
                           f"cannot convert to version {ver}: no valid IP addresses "
                           "(0.1.0/0.2.0 results need at least one)")
        d: dict[str, Any] = {"cniVersion": ver}
        for key in ("ip4", "ip6"):
            if key in blocks:
                d[key] = blocks[key]
        d["dns"] = self.dns.to_dict()
        return d

    def to_json(self, version: str | None = None) -> str:
        return json.dumps(self.to_dict(version), indent=4)

    def convert(self, version: str) -> Result:
        """A copy of this result as ``version`` (dropping what that version cannot hold)."""
        return Result.from_dict(self.to_dict(version))

    def copy(self) -> Result:
        """A deep copy (bandwidth and tuning change theirs); record.deep_copy, not the copy module."""
        from pycni.record import deep_copy

        out: Result = deep_copy(self)
        return out


def _undeclared(ip: IPConfig) -> IPConfig:
    return IPConfig(address=ip.address, gateway=ip.gateway, interface=ip.interface)
