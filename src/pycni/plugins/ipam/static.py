"""IPAM plugin ``static``: hand out exactly the addresses the configuration names.

Same config keys as the Go reference: ``ipam.addresses`` (``address`` in CIDR form, optional
``gateway``), ``ipam.routes``, ``ipam.dns``. Addresses can also come from CNI_ARGS
(``IP=cidr[,cidr]``, ``GATEWAY=ip[,ip]``, appended to the config's), from ``args.cni.ips`` and
from the ``ips`` runtimeConfig capability (each of those two replaces the list). Nothing is
allocated, so DEL and GC have nothing to do.

Stricter than the reference where it only fails later or never: a gateway of the other IP
family, an IPv4 gateway outside its address's subnet (host addresses, /32, excepted: their
gateway is on-link by design), or a CNI_ARGS ``GATEWAY`` that matches no address, is refused
(code 7). An IPv6 gateway may lie anywhere, as in the reference (routers are often link-local).
Stdlib only.
"""

from __future__ import annotations

from pycni import ipaddr, netconf
from pycni.cniargs import load_cni_args
from pycni.record import field, record
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import CNIError, invalid_config
from pycni.spec.types import DNS, IPAddress, IPConfig, IPInterface, Result, Route
from pycni.spec.version import greater_than_or_equal

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


@record
class StaticConf:
    """The ``ipam`` section after merging CNI_ARGS, args and runtimeConfig (ADD and CHECK);
    ``prev`` is CHECK's prevResult. DEL reads nothing: nothing was allocated."""

    addresses: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)
    cni_version: str = "0.1.0"
    prev: Result | None = None


def _parse_cidr(value: object, where: str) -> IPInterface:
    """An address with its prefix length, host bits kept (Go's net.ParseCIDR + IP)."""
    if not isinstance(value, str) or "/" not in value:
        raise invalid_config(f"the '{where}' field is expected to be in CIDR notation, got: {value!r}",
                   "write addresses as ADDRESS/PREFIX, e.g. 10.10.0.1/24 or 2001:db8::1/64")
    try:
        return ipaddr.ip_interface(value.strip())
    except ValueError as e:
        raise invalid_config(f"the '{where}' field is expected to be in CIDR notation, got: {value!r}",
                   str(e)) from None


def _parse_ip(value: object, where: str) -> IPAddress:
    if not isinstance(value, str):
        raise invalid_config(f"invalid {where}: {value!r}", "expected an IP address string")
    try:
        return ipaddr.ip_address(value.strip())
    except ValueError as e:
        raise invalid_config(f"invalid {where}: {value!r}", str(e)) from None


def _config_addresses(ipam: Mapping[str, Any]) -> list[IPConfig]:
    out: list[IPConfig] = []
    for i, entry in enumerate(netconf.get_list(ipam, "addresses", label="ipam.addresses")):
        if not isinstance(entry, dict):
            raise invalid_config(f"invalid address {i}",
                       f"each entry of ipam.addresses must be an object, got {entry!r}")
        addr = _parse_cidr(netconf.lookup(entry, "address"), "address")
        gw = netconf.lookup(entry, "gateway")
        out.append(IPConfig(address=addr, gateway=_parse_ip(gw, "gateway address") if gw else None))
    return out


def _replace_from(values: list[Any], where: str) -> list[IPConfig]:
    """``args.cni.ips`` / runtimeConfig ``ips``: a list of CIDRs that replaces the config's."""
    out = []
    for v in values:
        try:
            out.append(IPConfig(address=_parse_cidr(v, where)))
        except CNIError as e:  # the reference's words for these two lists
            raise invalid_config(f"an entry in the '{where}' field is NOT in CIDR notation, got: "
                           f"'{v}'", e.details) from None
    return out


def _apply_env_args(addresses: list[IPConfig], raw_args: str) -> None:
    """CNI_ARGS ``IP`` adds addresses; ``GATEWAY`` sets the gateway of those containing it."""
    env = load_cni_args(raw_args, ("IP", "GATEWAY"))
    for item in filter(None, (s.strip() for s in env.get("IP", "").split(","))):
        addresses.append(IPConfig(address=_parse_cidr(item, "ip")))
    for item in filter(None, (s.strip() for s in env.get("GATEWAY", "").split(","))):
        gw = _parse_ip(item, "gateway address")
        matched = [a for a in addresses if a.address.version == gw.version and gw in a.address.network]
        if not matched:
            have = [str(a.address) for a in addresses]
            raise invalid_config(f"GATEWAY {item} is not inside any address",
                       f"CNI_ARGS GATEWAY must lie in the subnet of one of {have}")
        for a in matched:
            a.gateway = gw


def parse_conf(args: CmdArgs) -> StaticConf:
    """Parse and validate the configuration as the reference merges it (errors are code 7)."""
    conf = args.conf()
    cfg = StaticConf(cni_version=config_version(conf))
    if args.command not in ("ADD", "CHECK"):
        return cfg
    ipam = netconf.ipam_section(conf)
    cfg.addresses = _config_addresses(ipam)
    if args.args:
        _apply_env_args(cfg.addresses, args.args)

    # args.cni.ips, then the "ips" capability, each replacing the list.
    for section, label in ((netconf.args_cni(conf), "args.cni.ips"),
                           (netconf.runtime_config(conf), "runtimeConfig.ips")):
        ips = netconf.get_list(section, "ips", label=label)
        if ips:
            cfg.addresses = _replace_from(ips, "ips")

    for i, a in enumerate(cfg.addresses):
        if a.gateway is None:
            continue
        if a.gateway.version != a.address.version:
            raise invalid_config(f"invalid address {i}: gateway {a.gateway} is not of the family of {a.address}",
                           "give an IPv4 gateway to an IPv4 address and an IPv6 one to an IPv6 address")
        # A host address (/32, /128) with an on-link gateway elsewhere (e.g. 169.254.1.1) is a
        # common pattern the reference accepts; only proper IPv4 subnets are checked. An IPv6
        # router is often outside the prefix (link-local fe80::1, or another /64 of the site's
        # on-link range) and Go takes any: so do we.
        if a.address.version == 4 and a.address.network.num_addresses > 1 and a.gateway not in a.address.network:
            raise invalid_config(f"invalid address {i}: gateway {a.gateway} is outside {a.address.network}",
                       "a gateway must lie inside the subnet of its address")
    v4 = sum(1 for a in cfg.addresses if a.address.version == 4)
    v6 = len(cfg.addresses) - v4
    if (v4 > 1 or v6 > 1) and not greater_than_or_equal(cfg.cni_version, "0.3.0"):
        raise invalid_config(f"CNI version {cfg.cni_version} does not support more than 1 address per family",
                   "use cniVersion 0.3.0 or later for several addresses of one family")

    try:
        cfg.routes = [Route.from_dict(r) for r in netconf.get_list(ipam, "routes", label="ipam.routes")]
        cfg.dns = DNS.from_dict(netconf.lookup(ipam, "dns"))

    except CNIError as e:
        raise invalid_config(f"invalid ipam section: {e.msg}", e.details) from None
    if args.command == "CHECK":
        cfg.prev = netconf.require_prev_result(conf, "static")
    return cfg


def cmd_add(args: CmdArgs) -> Result:
    cfg = parse_conf(args)
    return Result(cni_version=cfg.cni_version, ips=cfg.addresses, routes=cfg.routes, dns=cfg.dns)


def cmd_check(args: CmdArgs) -> None:
    """Every configured address must be in prevResult, with the configured gateway."""
    cfg = parse_conf(args)
    assert cfg.prev is not None  # parse_conf requires it for CHECK
    for want in cfg.addresses:
        found = [ip for ip in cfg.prev.ips if ip.address.ip == want.address.ip]
        if not found:
            raise invalid_config(f"static: address {want.address.ip} missing on interface {args.ifname}",
                           "prevResult does not hold an address this configuration assigns")
        if want.gateway is not None and not any(ip.gateway == want.gateway for ip in found):
            raise invalid_config(f"static: Failed to match addr {want.address.ip} on interface {args.ifname}",
                           f"expected gateway {want.gateway}, prevResult has "
                           f"{[str(i.gateway) for i in found]}")


def cmd_del(args: CmdArgs) -> None:
    """Nothing was allocated; DEL succeeds whatever the state."""
    return None


def cmd_gc(args: CmdArgs) -> None:
    """Nothing was allocated; the list is still checked."""
    parse_conf(args)
    netconf.valid_attachments(args.conf())


def cmd_status(args: CmdArgs) -> None:
    """Always ready: nothing is kept anywhere."""
    parse_conf(args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="CNI static IPAM plugin (pycni)")


def main() -> None:
    run_plugin(PLUGIN)


if __name__ == "__main__":
    main()
