"""Result types for every spec version, with conversion as the Go reference converts.

One in-memory shape (the 1.x one) is parsed from and rendered to each version's JSON:

* 0.1.0 / 0.2.0: ``ip4`` / ``ip6`` objects with ``ip``, ``gateway``, ``routes``; no interfaces.
* 0.3.0 / 0.3.1 / 0.4.0: ``interfaces``, ``ips`` (each with ``version``), ``routes``, ``dns``.
* 1.0.0 / 1.1.0: as 0.4.0 without the per-IP ``version``; 1.1.0 adds route and
  interface attributes (mtu, advmss, priority, table, scope, socketPath, pciID).
"""

from __future__ import annotations

import copy
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

from pycni.spec.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, CNIError
from pycni.spec.version import ALL_VERSIONS, LEGACY_RESULT_VERSIONS, V04_RESULT_VERSIONS

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _decode_error(what: str, value: object, why: str = "") -> CNIError:
    return CNIError(DECODE_FAILURE, f"failed to decode {what}", f"{value!r}{': ' + why if why else ''}")


def parse_ip(value: object, what: str = "IP address") -> IPAddress:
    if not isinstance(value, str):
        raise _decode_error(what, value, "not a string")
    try:
        return ipaddress.ip_address(value)
    except ValueError as e:
        raise _decode_error(what, value, str(e)) from None


def parse_cidr(value: object, what: str = "CIDR address") -> IPInterface:
    """Parse 'a.b.c.d/n' keeping host bits (an address with its prefix)."""
    if not isinstance(value, str) or "/" not in value:
        raise _decode_error(what, value, "expected address/prefix")
    try:
        return ipaddress.ip_interface(value)
    except ValueError as e:
        raise _decode_error(what, value, str(e)) from None


def parse_network(value: object, what: str = "network") -> IPNetwork:
    """Parse a CIDR as a network, masking host bits as Go's net.ParseCIDR does."""
    if not isinstance(value, str) or "/" not in value:
        raise _decode_error(what, value, "expected address/prefix")
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError as e:
        raise _decode_error(what, value, str(e)) from None


@dataclass
class Interface:
    name: str
    mac: str = ""
    sandbox: str = ""
    mtu: int = 0
    socket_path: str = ""
    pci_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.mac:
            d["mac"] = self.mac
        if self.mtu:
            d["mtu"] = self.mtu
        if self.sandbox:
            d["sandbox"] = self.sandbox
        if self.socket_path:
            d["socketPath"] = self.socket_path
        if self.pci_id:
            d["pciID"] = self.pci_id
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Interface:
        if not isinstance(d, dict) or not isinstance(d.get("name", ""), str):
            raise _decode_error("interface", d)
        return cls(name=d.get("name", ""), mac=str(d.get("mac", "") or ""), sandbox=str(d.get("sandbox", "") or ""),
                   mtu=int(d.get("mtu", 0) or 0), socket_path=str(d.get("socketPath", "") or ""),
                   pci_id=str(d.get("pciID", "") or ""))


@dataclass
class IPConfig:
    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None

    @property
    def version(self) -> str:
        return str(self.address.version)

    def to_dict(self, with_version: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if with_version:
            d["version"] = self.version
        if self.interface is not None:
            d["interface"] = self.interface
        d["address"] = str(self.address)
        if self.gateway is not None:
            d["gateway"] = str(self.gateway)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> IPConfig:
        if not isinstance(d, dict):
            raise _decode_error("IP config", d)
        addr = parse_cidr(d.get("address"), "IP config address")
        gw = parse_ip(d["gateway"], "gateway") if d.get("gateway") else None
        iface = d.get("interface")
        if iface is not None and not isinstance(iface, int):
            raise _decode_error("IP config interface index", iface)
        return cls(address=addr, gateway=gw, interface=iface)


@dataclass
class Route:
    dst: IPNetwork
    gw: IPAddress | None = None
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dst": str(self.dst)}
        if self.gw is not None:
            d["gw"] = str(self.gw)
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
        if not isinstance(d, dict):
            raise _decode_error("route", d)
        dst = parse_network(d.get("dst"), "route destination")
        gw = parse_ip(d["gw"], "route gateway") if d.get("gw") else None
        table = d.get("table")
        scope = d.get("scope")
        return cls(dst=dst, gw=gw, mtu=int(d.get("mtu", 0) or 0), advmss=int(d.get("advmss", 0) or 0),
                   priority=int(d.get("priority", 0) or 0),
                   table=int(table) if table is not None else None,
                   scope=int(scope) if scope is not None else None)


@dataclass
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

    @classmethod
    def from_dict(cls, d: Any) -> DNS:
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise _decode_error("dns", d)

        def strs(key: str) -> list[str]:
            v = d.get(key) or []
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise _decode_error(f"dns {key}", v, "expected a list of strings")
            return list(v)

        return cls(nameservers=strs("nameservers"), domain=str(d.get("domain", "") or ""),
                   search=strs("search"), options=strs("options"))


@dataclass
class Result:
    """A plugin's result, held in the 1.x shape whatever version it came in."""

    cni_version: str = "1.0.0"
    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)

    # ---- parsing -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, version: str | None = None) -> Result:
        """Parse a result of any supported version (``version`` defaults to its cniVersion)."""
        if not isinstance(d, dict):
            raise _decode_error("result", d, "expected a JSON object")
        ver = version or d.get("cniVersion") or "0.1.0"
        if ver not in ALL_VERSIONS:
            raise CNIError(INCOMPATIBLE_VERSION, "unsupported CNI result version",
                           f"result version {ver!r} is not one of {list(ALL_VERSIONS)}")
        if ver in LEGACY_RESULT_VERSIONS:
            return cls._from_legacy(d, ver)
        raw_ifaces = d.get("interfaces") or []
        raw_ips = d.get("ips") or []
        raw_routes = d.get("routes") or []
        for name, v in (("interfaces", raw_ifaces), ("ips", raw_ips), ("routes", raw_routes)):
            if not isinstance(v, list):
                raise _decode_error(f"result {name}", v, "expected a list")
        return cls(cni_version=ver,
                   interfaces=[Interface.from_dict(i) for i in raw_ifaces],
                   ips=[IPConfig.from_dict(i) for i in raw_ips],
                   routes=[Route.from_dict(r) for r in raw_routes],
                   dns=DNS.from_dict(d.get("dns")))

    @classmethod
    def _from_legacy(cls, d: dict[str, Any], ver: str) -> Result:
        res = cls(cni_version=ver, dns=DNS.from_dict(d.get("dns")))
        for key in ("ip4", "ip6"):
            block = d.get(key)
            if not block:
                continue
            if not isinstance(block, dict):
                raise _decode_error(f"result {key}", block)
            addr = parse_cidr(block.get("ip"), f"{key} address")
            gw = parse_ip(block["gateway"], f"{key} gateway") if block.get("gateway") else None
            res.ips.append(IPConfig(address=addr, gateway=gw))
            res.routes.extend(Route.from_dict(r) for r in block.get("routes") or [])
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
        if ver not in ALL_VERSIONS:
            raise CNIError(INCOMPATIBLE_VERSION, "unsupported CNI result version",
                           f"cannot convert result to version {ver!r}; supported: {list(ALL_VERSIONS)}")
        if ver in LEGACY_RESULT_VERSIONS:
            return self._to_legacy(ver)
        with_version = ver in V04_RESULT_VERSIONS
        d: dict[str, Any] = {"cniVersion": ver}
        if self.interfaces:
            d["interfaces"] = [i.to_dict() for i in self.interfaces]
        if self.ips:
            d["ips"] = [ip.to_dict(with_version) for ip in self.ips]
        if self.routes:
            d["routes"] = [r.to_dict() for r in self.routes]
        d["dns"] = self.dns.to_dict()
        return d

    def _to_legacy(self, ver: str) -> dict[str, Any]:
        d: dict[str, Any] = {"cniVersion": ver}
        blocks: dict[str, dict[str, Any]] = {}
        for ip in self.ips:
            key = "ip4" if ip.address.version == 4 else "ip6"
            if key in blocks:
                continue  # only the first address of each family survives, as in Go
            block: dict[str, Any] = {"ip": str(ip.address)}
            if ip.gateway is not None:
                block["gateway"] = str(ip.gateway)
            blocks[key] = block
        for r in self.routes:
            key = "ip4" if r.dst.version == 4 else "ip6"
            if key in blocks:
                blocks[key].setdefault("routes", []).append({"dst": str(r.dst), **(
                    {"gw": str(r.gw)} if r.gw is not None else {})})
        if not blocks:
            raise CNIError(INCOMPATIBLE_VERSION, "cannot convert result",
                           f"cannot convert to version {ver}: no valid IP addresses")
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
        return copy.deepcopy(self)
