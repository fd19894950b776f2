"""sbr: source-based routing for a container interface, as the Go reference.

For each address the chain gave ``CNI_IFNAME``, a rule ``from <ip> lookup <table>`` sends
traffic sourced from it to a per-address routing table (the first table from 100 that no rule
or route uses), which gets a default route via the address's gateway (or the static one from
``gateways``) and copies of the interface's routes; the interface's routes then leave the main
table (with ``addSourceHints`` its subnet routes stay there, with the address as source hint).
With ``table`` only the rules are added, pointing at that table, and no route moves.

``vrfname`` (pycni extension, not in the Go plugin): use the routing table of that VRF device
in the container (created with the first free table, or ``table``, when missing), enslave the
interface to it, and point the source rules and the default route at its table.

DEL removes the rules whose source is one of the interface's addresses and the routes this
interface has in their tables; CHECK verifies the rules and default routes are in place.
"""

from __future__ import annotations

from pycni import ipaddr, netconf
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import PLUGIN_SPECIFIC, CNIError, invalid_config
from pycni.spec.types import IPAddress, IPConfig, IPNetwork, Result
from pycni.spec.validate import IFNAMSIZ

FIRST_TABLE = 100


@record
class SbrConf:
    """The checked config and the prevResult it acts on (always there for ADD and CHECK)."""
    cni_version: str
    prev: Result | None
    table: int | None = None
    gateways: dict[int, IPAddress] = field(default_factory=dict)  # family -> static gateway
    add_source_hints: bool = False
    vrfname: str = ""


def parse_conf(args: CmdArgs) -> SbrConf:
    """Decode and check the whole config before anything is touched."""
    raw = args.conf()
    netconf.runtime_config(raw)
    netconf.args_cni(raw)
    conf = SbrConf(config_version(raw), netconf.prev_result(raw))
    if netconf.lookup(raw, "table") is not None:

        from pycni.net.rule import RESERVED_TABLES  # net/ only where used: VERSION loads none of it

        table = netconf.get_int(raw, "table")
        if not 0 < table < 2**32 or table in RESERVED_TABLES:
            raise invalid_config(f"invalid routing table {table}",
                                 "use a table id between 1 and 4294967295 other than default/main/local (253-255)")
        conf.table = table
    gws = netconf.get_list(raw, "gateways")
    if not all(isinstance(g, str) for g in gws):
        raise netconf.invalid("gateways", "a list of IP address strings", gws)
    if len(gws) > 2:
        raise invalid_config("gateways list cannot contain more than 2 entries (one IPv4, one IPv6)")
    for g in gws:
        try:
            ip = ipaddr.ip_address(g)
        except ValueError:
            raise invalid_config(f"invalid static gateway IP address: {g}",
                                 "gateways entries must be plain IPv4 or IPv6 addresses") from None
        if ip.version in conf.gateways:
            raise invalid_config(f"gateways list contains multiple IPv{ip.version} addresses: "
                           f"{conf.gateways[ip.version]} and {g}", "give at most one gateway per family")
        conf.gateways[ip.version] = ip
    conf.add_source_hints = netconf.get_bool(raw, "addSourceHints")
    vrf = netconf.get_str(raw, "vrfname")
    if len(vrf) >= IFNAMSIZ or any(c in vrf for c in "/ :\t\n"):
        raise invalid_config(f"invalid vrfname {vrf!r}", "vrfname must be a valid interface name")
    conf.vrfname = vrf
    if args.command == "ADD" and conf.prev is None:
        raise invalid_config("This plugin must be called as chained plugin",  # the reference's words
                             "sbr needs the result of the plugins before it (prevResult): list it after "
                             "the interface plugin in a conflist")
    if args.command in ("ADD", "CHECK"):
        conf.prev = netconf.require_prev_result(raw, "sbr")
        ip_configs(args.ifname, conf.prev)  # refuses a prevResult without addresses
    return conf


def ip_configs(ifname: str, prev: Result) -> list[IPConfig]:
    """prevResult's addresses on ``ifname`` (those without an interface index count as its)."""
    if not prev.ips:
        raise invalid_config(f"No IP addresses supplied on interface: {ifname}",
                             "sbr needs the addresses the interface plugin gave the container")
    out = []
    for ip in prev.ips:
        idx = ip.interface
        if idx is not None and 0 <= idx < len(prev.interfaces) and prev.interfaces[idx].name != ifname:
            continue
        out.append(ip)
    return out


def _host_net(ip: IPConfig) -> IPNetwork:
    """The address as a single-host network: what a source rule matches."""
    return ipaddr.ip_network(f"{ip.address.ip}/{ip.address.max_prefixlen}")


def _gateway(conf: SbrConf, ip: IPConfig) -> IPAddress | None:
    """The gateway for ``ip``: a static one from ``gateways`` wins over the prevResult's."""
    return conf.gateways.get(ip.address.version) or ip.gateway


def _add_default(undo: Rollback, ip: IPConfig, gw: IPAddress, index: int, table: int) -> None:
    """A default route via ``gw`` in ``table`` (undone if the ADD fails later)."""
    from pycni.net import route, rule

    zero = ipaddr.ip_network("0.0.0.0/0" if ip.address.version == 4 else "::/0")
    r = route.RouteEntry(dst=zero, oif=index, gw=gw, proto=route.RTPROT_BOOT, table=table)
    rule.put_route(r, replace=False)
    undo.push(rule.remove_route, r)


def _add_rule(undo: Rollback, ip: IPConfig, table: int) -> None:
    """``from <ip> lookup <table>`` (undone if the ADD fails later)."""
    from pycni.net import rule

    undo.push(rule.del_rule, rule.add_rule(_host_net(ip), table))


def _source_table(conf: SbrConf, undo: Rollback, ip: IPConfig, index: int, table: int) -> None:
    """Send traffic sourced from ``ip`` to ``table``, with a default route via its gateway there."""
    _add_rule(undo, ip, table)
    gw = _gateway(conf, ip)
    if gw is not None:
        _add_default(undo, ip, gw, index, table)


def do_routes(conf: SbrConf, ips: list[IPConfig], ifname: str, undo: Rollback) -> None:
    """Per-address tables with default and copied routes, then clear the main table."""
    from pycni.net import link, route, rule

    used = rule.tables_in_use()
    table = rule.next_free_table(FIRST_TABLE, used)
    lk = link.get_link(ifname)
    if lk is None:
        raise CNIError(PLUGIN_SPECIFIC, f"Cannot find network interface {ifname}",
                       "the interface plugin earlier in the chain should have created it")
    routes = rule.link_routes(lk.index)
    for ip in ips:
        _source_table(conf, undo, ip, lk.index, table)
        for r in routes:
            if r.dst.prefixlen == 0 and r.dst.version in conf.gateways:
                continue  # a static gateway wins (the reference lets the copied default replace it)
            src, gwa = r.prefsrc, r.gw
            if (src is not None and src in ip.address.network) or (gwa is not None and gwa in ip.address.network) \
                    or (src is None and gwa is None):
                rule.put_route(r, table)  # replace: the default route above may be the same
                undo.push(rule.remove_route, r, table)
        used.add(table)
        table = rule.next_free_table(table + 1, used)
    if conf.add_source_hints:
        for ip in ips:
            hint = route.RouteEntry(dst=ip.address.network, oif=lk.index, prefsrc=ip.address.ip,
                                    scope=route.RT_SCOPE_LINK, proto=route.RTPROT_BOOT)
            try:
                rule.put_route(hint)
            except CNIError:
                pass  # as the reference: a hint that cannot be set is not fatal
        doomed = [r for r in routes if r.scope != route.RT_SCOPE_LINK]
    else:
        doomed = routes
    for r in doomed:
        if rule.remove_route(r):
            undo.push(rule.put_route, r)


def do_vrf(conf: SbrConf, ips: list[IPConfig], ifname: str, undo: Rollback) -> None:
    """Enslave the interface to VRF ``vrfname`` and point the source rules at its table."""
    from pycni.net import link

    table = vrf_table(conf.vrfname, conf.table, undo)
    lk = link.set_link(ifname, master=conf.vrfname)
    undo.push(lambda: link.set_link(ifname, master=None))
    for ip in ips:
        _source_table(conf, undo, ip, lk.index, table)


def vrf_table(name: str, table: int | None, undo: Rollback | None = None) -> int:
    """The table of VRF ``name``, creating the VRF (up, with ``table`` or a free one) if missing;
    a VRF created here is deleted by ``undo``."""
    from pycni.net import link, rule, vrf

    found = vrf.vrf_of(name)
    if found is None:
        t = table if table is not None else rule.next_free_table(FIRST_TABLE, rule.tables_in_use())
        vrf.create_vrf(name, t)
        if undo is not None:
            undo.push(link.delete_link_quietly, name)
        found = vrf.vrf_of(name) or ("", 0)
    kind, vt = found
    if kind != "vrf":
        raise invalid_config(f"{name!r} is not a VRF device", f"it is a {kind or 'plain'} link")
    if table is not None and vt != table:
        raise invalid_config(f"VRF {name!r} uses table {vt}, not {table}",
                             "drop \"table\" or make it match the existing VRF")
    if not vt:
        raise CNIError(PLUGIN_SPECIFIC, f"cannot read the routing table of VRF {name!r}")
    return vt


# ---- handlers --------------------------------------------------------------------------------
def cmd_add(args: CmdArgs) -> Result:
    """Rules and tables for each address, under the netns lock so concurrent ADDs pick distinct tables."""
    from pycni.net import netns

    conf = parse_conf(args)
    assert conf.prev is not None  # parse_conf requires it for ADD
    ips = ip_configs(args.ifname, conf.prev)
    with netns.locked(args.netns), netns.enter(args.netns), Rollback() as undo:  # no half-made ADD
        if conf.vrfname:
            do_vrf(conf, ips, args.ifname, undo)
        elif conf.table is not None:
            for ip in ips:
                _add_rule(undo, ip, conf.table)
        else:
            do_routes(conf, ips, args.ifname, undo)
    return conf.prev


def cmd_del(args: CmdArgs) -> None:
    """Remove the rules sourced from the interface's addresses and its routes in their tables."""
    from pycni.net import addr, link, netns, route, rule

    conf = parse_conf(args)
    if not args.netns or not netns.netns_exists(args.netns):
        return  # the namespace is gone and everything in it
    with netns.locked(args.netns), netns.enter(args.netns):
        lk = link.get_link(args.ifname)
        if lk is None:
            return
        mine = {a.address.ip for a in addr.list_addrs(lk.index)}
        tables: set[int] = set()
        for r in rule.list_rules():
            if r.src is None or r.src.network_address not in mine:
                continue
            if conf.table is not None and r.table != conf.table:
                continue
            rule.del_rule(r)
            tables.add(r.table)
        if conf.table is not None and not conf.vrfname:
            return  # with "table" the routes there are the administrator's, not ours
        for t in tables - {route.RT_TABLE_MAIN}:
            for rt in rule.link_routes(lk.index, t):
                rule.remove_route(rt)


def cmd_check(args: CmdArgs) -> None:
    """Beyond the reference (which checks nothing): the source rules and default routes exist."""
    from pycni.net import link, netns, rule

    conf = parse_conf(args)
    assert conf.prev is not None  # parse_conf requires it for CHECK
    ips = ip_configs(args.ifname, conf.prev)
    with netns.enter(args.netns):
        lk = link.get_link(args.ifname)
        if lk is None:
            raise CNIError(PLUGIN_SPECIFIC, f"Cannot find network interface {args.ifname}")
        rules = rule.list_rules()
        for ip in ips:
            want = _host_net(ip)
            found = [r for r in rules if r.src == want and (conf.table is None or r.table == conf.table)]
            if not found:
                raise CNIError(PLUGIN_SPECIFIC, f"no source rule for {ip.address.ip}",
                               f"expected 'from {want} lookup <table>' in the container")
            gw = _gateway(conf, ip)
            if gw is None or conf.table is not None and not conf.vrfname:
                continue
            defaults = [r for r in rule.link_routes(lk.index, found[0].table)
                        if r.dst.prefixlen == 0 and r.gw == gw]
            if not defaults:
                raise CNIError(PLUGIN_SPECIFIC, f"no default route via {gw} in table {found[0].table}")


def cmd_gc(args: CmdArgs) -> None:
    """Nothing to collect: rules and tables live in the container's namespace; the list is still checked."""
    parse_conf(args)
    netconf.valid_attachments(args.conf())


def cmd_status(args: CmdArgs) -> None:
    """Always ready."""
    parse_conf(args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni sbr: source-based routing tables for a container interface")


def main() -> None:
    run_plugin(PLUGIN)
