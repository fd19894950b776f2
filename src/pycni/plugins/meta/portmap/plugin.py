"""portmap's configuration and handlers (the reference's main.go).

:func:`parse_conf` checks everything (config, runtimeConfig, prevResult, GC list) before any
change and gives a :class:`PortmapConf`; the handlers then drive a backend
(:mod:`.backend`) without knowing which one it is.
"""

from __future__ import annotations

from pycni import ipaddr, netconf
from pycni.plugins.meta.portmap import backend as backends
from pycni.record import field, record
from pycni.skel import CmdArgs, Plugin, config_version, prev_result, run_plugin
from pycni.spec.errors import PLUGIN_SPECIFIC, CNIError, invalid_config
from pycni.spec.types import IPAddress, Result
from pycni.spec.validate import ALNUM, charset_match

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

IPv4Interface = ipaddr.IPv4Interface
IPv6Interface = ipaddr.IPv6Interface
ContainerNet = IPv4Interface | IPv6Interface

DEFAULT_MARK_BIT = 13
PROTOCOLS = ("tcp", "udp", "sctp")
BACKENDS = ("iptables", "nftables")
# An iptables chain name the tools take as a jump target: no path characters, no option look,
# within XT_EXTENSION_MAXNAMELEN. Built-in chains and verdicts would change what the rules mean.
_RESERVED_CHAINS = frozenset({"ACCEPT", "DROP", "RETURN", "QUEUE", "REJECT", "DNAT", "SNAT", "MASQUERADE", "MARK",
                              "PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING", "CNI-HOSTPORT-DNAT",
                              "CNI-HOSTPORT-MASQ", "CNI-HOSTPORT-SETMARK"})


@record(frozen=True)
class PortMapping:
    host_port: int
    container_port: int
    protocol: str
    host_ip: str = ""  # "" = every local address

    def host_addr(self) -> IPAddress | None:
        return ipaddr.ip_address(self.host_ip) if self.host_ip else None

    def applies_to(self, family: int) -> bool:
        """A mapping with a hostIP only applies to the container address of the same family."""
        addr = self.host_addr()
        return addr is None or addr.version == family

    def specific_host(self) -> IPAddress | None:
        """The hostIP to match on; unspecified (0.0.0.0, ::) means any, as in the reference."""
        addr = self.host_addr()
        return None if addr is None or addr.is_unspecified else addr


@record
class PortmapConf:
    """One invocation, checked. ``backend`` is the configured or chosen one; ``auto`` when the
    config named none (then ADD falls back to nftables where iptables cannot work)."""

    name: str
    cni_version: str
    backend: str
    snat: bool
    masq_all: bool
    mark_masq_bit: int
    external_set_mark_chain: str | None
    conditions_v4: list[str]
    conditions_v6: list[str]
    mappings: list[PortMapping]
    prev: Result | None
    container_id: str = ""
    auto: bool = False
    cont_v4: IPv4Interface | None = None
    cont_v6: IPv6Interface | None = None
    nets: list[ContainerNet] = field(default_factory=list)


def _int_field(entry: dict[str, Any], key: str, i: int) -> int:
    v = netconf.lookup(entry, key, 0)
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid_config(f"invalid portMappings[{i}].{key}", f"expected an integer, got {v!r}")
    return v


def _parse_mappings(raw: Any) -> list[PortMapping]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_config("invalid runtimeConfig.portMappings", f"expected a list, got {type(raw).__name__}")
    out = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise invalid_config(f"invalid portMappings[{i}]", f"expected an object, got {e!r}")
        hp, cp = _int_field(e, "hostPort", i), _int_field(e, "containerPort", i)
        if cp <= 0 or cp > 65535:
            raise invalid_config(f"Invalid container port number: {cp}",
                                 f"portMappings[{i}].containerPort must be 1-65535")
        if hp <= 0 or hp > 65535:
            raise invalid_config(f"Invalid host port number: {hp}", f"portMappings[{i}].hostPort must be 1-65535")
        proto = netconf.lookup(e, "protocol") or "tcp"
        if not isinstance(proto, str) or proto.lower() not in PROTOCOLS:
            raise invalid_config(f"invalid portMappings[{i}].protocol {proto!r}",
                                 f"protocol must be one of {PROTOCOLS}")
        host_ip = netconf.lookup(e, "hostIP") or ""
        if not isinstance(host_ip, str):
            raise invalid_config(f"invalid portMappings[{i}].hostIP", f"expected a string, got {host_ip!r}")
        if host_ip:
            try:
                host_ip = str(ipaddr.ip_address(host_ip))
            except ValueError:
                raise invalid_config(f"invalid portMappings[{i}].hostIP {host_ip!r}",
                                     "hostIP must be an IP address") from None
        out.append(PortMapping(hp, cp, proto.lower(), host_ip))
    return out


def _conditions(conf: dict[str, Any], key: str) -> list[str] | None:
    v = netconf.lookup(conf, key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(c, str) for c in v):
        raise invalid_config(f"invalid {key}", f"{key} must be a list of strings, got {v!r}")
    return v


def _conditions_backend(conds: list[str] | None) -> str:
    """iptables conditions start with a dash (-d, -m, --sport) or '!'; nftables ones never do."""
    if not conds or not conds[0]:
        return ""
    return "iptables" if conds[0][0] in "-!" else "nftables"


def _external_chain(v: Any) -> str | None:
    if v is None:
        return None
    if (not isinstance(v, str) or not charset_match(v, ALNUM + "_", ALNUM + "_.+-", 28, eol=True)
            or v in _RESERVED_CHAINS):
        raise invalid_config(f"invalid externalSetMarkChain {v!r}",
                   "expected the name of an existing nat chain that sets the masquerade mark "
                   "(letters, digits, '_', '-', '.', '+'; at most 28; not a built-in chain or target)")
    return v


def parse_conf(args: CmdArgs) -> PortmapConf:
    """Decode and validate the config, and pick the container's addresses from prevResult."""
    raw = args.conf()
    version = config_version(raw)
    name = netconf.get_str(raw, "name")
    snat = netconf.get_bool(raw, "snat", True)
    netconf.args_cni(raw)
    masq_all = netconf.get_bool(raw, "masqAll")
    if netconf.lookup(raw, "markMasqBit") is not None and netconf.lookup(raw, "externalSetMarkChain") is not None:
        raise invalid_config("Cannot specify externalSetMarkChain and markMasqBit",
                   "externalSetMarkChain replaces the mark chain markMasqBit configures; set one of them")
    mark_bit = netconf.get_int(raw, "markMasqBit", DEFAULT_MARK_BIT)
    if not 0 <= mark_bit <= 31:  # the reference's wording
        raise invalid_config("MasqMarkBit must be between 0 and 31", f"markMasqBit is {mark_bit!r}")
    ext_chain = netconf.lookup(raw, "externalSetMarkChain")
    ext_chain = _external_chain(ext_chain)
    cond4, cond6 = _conditions(raw, "conditionsV4"), _conditions(raw, "conditionsV6")

    backend = netconf.lookup(raw, "backend")
    # Options only one backend understands; they also choose the backend when none is named.
    wants: dict[str, list[str]] = {"iptables": [], "nftables": []}
    if ext_chain is not None:
        wants["iptables"].append("externalSetMarkChain")
    for key, conds in (("conditionsV4", cond4), ("conditionsV6", cond6)):
        if b := _conditions_backend(conds):
            wants[b].append(key)
    auto = backend is None
    if auto:
        # The reference's default: iptables, unless only nftables works here (found out by
        # the ADD itself, which then falls back: no probe process on every call).
        backend = "nftables" if wants["nftables"] and not wants["iptables"] else "iptables"
        auto = not wants["iptables"] and not wants["nftables"]
    if backend not in BACKENDS:
        raise invalid_config(f"unrecognized backend {backend!r}", f"backend must be one of {', '.join(BACKENDS)}")
    wrong = "nftables" if backend == "iptables" else "iptables"
    if wants[wrong]:
        raise invalid_config(f"{backend} backend was requested but configuration contains {wrong}-specific options "
                   f"{wants[wrong]}", f"remove them or set \"backend\": \"{wrong}\"")

    rc = netconf.runtime_config(raw)
    conf = PortmapConf(name=name, cni_version=version, backend=backend, snat=snat, masq_all=masq_all,
                       mark_masq_bit=mark_bit, external_set_mark_chain=ext_chain,
                       conditions_v4=cond4 or [], conditions_v6=cond6 or [],
                       mappings=_parse_mappings(netconf.lookup(rc, "portMappings")), prev=prev_result(raw),

                       container_id=args.container_id, auto=auto)
    if conf.prev is not None:
        _pick_addresses(conf, args.ifname)
    return conf


def _pick_addresses(conf: PortmapConf, ifname: str) -> None:
    """The first IPv4 and IPv6 address on the container's own interface (as the reference)."""
    assert conf.prev is not None
    ifaces = conf.prev.interfaces
    for ip in conf.prev.ips:
        if ip.interface is not None and 0 <= ip.interface < len(ifaces):
            iface = ifaces[ip.interface]
            if iface.name != ifname or not iface.sandbox:
                continue
        if isinstance(ip.address, IPv4Interface) and conf.cont_v4 is None:
            conf.cont_v4 = ip.address
        elif isinstance(ip.address, IPv6Interface) and conf.cont_v6 is None:
            conf.cont_v6 = ip.address
    conf.nets = [n for n in (conf.cont_v4, conf.cont_v6) if n is not None]


# ---- host side helpers -----------------------------------------------------------------------
def enable_localnet_routing(ip: ipaddr.IPv4Address) -> None:
    """route_localnet=1 on the interface routing to the container, so 127/8 may be DNAT'd to it."""
    from pycni.net import route
    from pycni.net.sysctl import write_sysctl

    dev = route.output_link(ip)
    if dev is not None:
        write_sysctl(f"net/ipv4/conf/{dev}/route_localnet", "1")


def forget_stale_udp_flows(conf: PortmapConf) -> None:
    """Delete conntrack entries of UDP flows to the mapped host ports that began before the
    mapping: they would bypass the DNAT until they time out. Best effort, as in the reference."""
    udp_ports = sorted({m.host_port for m in conf.mappings if m.protocol == "udp"})
    if not udp_ports:
        return
    import socket

    from pycni.net.conntrack import delete_by_dst_port

    for net in conf.nets:
        family = socket.AF_INET if net.version == 4 else socket.AF_INET6
        for port in udp_ports:
            try:
                delete_by_dst_port(socket.IPPROTO_UDP, port, family)
            except OSError:
                pass


# ---- handlers --------------------------------------------------------------------------------
def cmd_add(args: CmdArgs) -> Result:
    conf = parse_conf(args)
    if conf.prev is None:
        raise invalid_config("must be called as chained plugin",
                             "portmap needs a prevResult (put it after an interface plugin)")
    if not conf.mappings or not conf.nets:
        return conf.prev
    mapper = backends.named(conf.backend)
    try:
        mapper.forward(conf)
    except backends.Unusable as e:
        mapper = backends.fallback(conf, e)
        mapper.forward(conf)
    if conf.snat and conf.cont_v4 is not None:
        try:
            enable_localnet_routing(conf.cont_v4.ip)
        except CNIError as e:
            try:
                mapper.unforward(conf)  # leave nothing half-made
            except CNIError:
                pass
            raise CNIError(e.code, "unable to enable route_localnet", e.details) from None
    forget_stale_udp_flows(conf)
    return conf.prev


def cmd_del(args: CmdArgs) -> None:
    """Remove the container's mappings from every layout, whatever the configured backend.

    Unlike the reference, this works without portMappings on DEL (what ADD made is found from
    the network name and container ID), and finds what another configuration or the Go plugin
    made: a node may swap implementations or configs under live containers.
    """
    conf = parse_conf(args)
    errors = []
    for mapper in backends.every(conf.backend):
        try:
            mapper.unforward(conf)
        except CNIError as e:
            errors.append(f"{mapper.name}: {e.msg}{': ' + e.details if e.details else ''}")
    if errors:
        raise CNIError(PLUGIN_SPECIFIC, "failed to remove port mappings", "; ".join(errors))
    return None


def cmd_check(args: CmdArgs) -> None:
    conf = parse_conf(args)
    if conf.prev is None:
        raise invalid_config("Required prevResult missing", "CHECK needs the prevResult of the ADD")
    if not conf.mappings or not conf.nets:
        return None
    backends.chosen(conf).check(conf)
    return None


def cmd_gc(args: CmdArgs) -> None:
    """Spec 1.1 GC: remove mappings of this network's containers the runtime no longer knows,
    from every layout."""
    conf = parse_conf(args)
    valid = {cid for cid, _ifname in netconf.valid_attachments(args.conf())}  # code 7 before any change
    for mapper in backends.every(conf.backend):
        mapper.gc(conf, valid)
    return None


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, about="pycni portmap plugin")


def main() -> None:
    run_plugin(PLUGIN)
