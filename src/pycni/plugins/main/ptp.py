"""ptp: a veth pair routed point-to-point, no bridge.

As in the reference: the container end gets the IPAM address, but the kernel's subnet route is
replaced by a /32 (/128) route to the gateway on the link and a subnet route via the gateway,
so every packet goes through the host. The host end carries the gateway as a /32 (/128)
address and a host route to the container's address. ``ipMasq`` masquerades outbound traffic,
``mtu`` sets both ends.
"""

from __future__ import annotations

from pycni import invoke, ipam, netconf
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import invalid_config
from pycni.spec.types import DNS, Interface, IPConfig, Result


@record
class PtpConf:
    """The ptp keys, checked: the IPAM section is required, masquerading optional."""

    name: str
    cni_version: str
    ipam_type: str
    mtu: int = 0
    ip_masq: bool = False
    ip_masq_backend: str = ""
    dns: DNS = field(default_factory=DNS)
    dns_set: bool = False  # the config's dns replaces IPAM's (an empty list given clears it)

    def masq_backend(self) -> str:
        """``ipMasqBackend``, or the backend that works here."""
        from pycni.net import masq

        return self.ip_masq_backend or masq.default_backend()


def parse_conf(args: CmdArgs) -> PtpConf:
    """The config as a :class:`PtpConf`, every key (and runtimeConfig, args) checked before anything is made."""
    raw = args.conf()
    netconf.runtime_config(raw)
    netconf.args_cni(raw)
    n = PtpConf(name=netconf.network_name(raw), cni_version=config_version(raw),
                ipam_type=ipam.require_ipam(raw, "ptp"),
                mtu=netconf.get_int(raw, "mtu", minimum=0, maximum=netconf.MAX_MTU),
                ip_masq=netconf.get_bool(raw, "ipMasq"), ip_masq_backend=netconf.get_str(raw, "ipMasqBackend"),
                dns=DNS.from_dict(netconf.get_dict(raw, "dns")))
    n.dns_set = DNS.is_set(netconf.lookup(raw, "dns"))  # Go's key rules, as every other key here
    return n


def check_for_add(n: PtpConf, args: CmdArgs) -> None:
    """What ADD must find before making anything (DEL still cleans up after such a config): a known
    masquerade backend, the IPAM plugin on CNI_PATH, the netns, a free CNI_IFNAME."""
    from pycni.net import link

    if n.ip_masq_backend:
        from pycni.net import masq  # here: its iptables/nft modules cost a plugin without ipMasq ~5 ms

        masq.check_backend(n.ip_masq_backend)
    invoke.find_in_path(n.ipam_type, args.cni_path)
    link.check_container_ifname(args.netns, args.ifname)


def enable_forwarding(ips: list[IPConfig], undo: Rollback) -> None:
    """Turn on forwarding in the host namespace for the families in use (as ip.EnableForward);
    a failed ADD turns off what it turned on."""
    from pycni.net import sysctl

    for version in sorted({i.address.version for i in ips}):
        if sysctl.enable_forwarding(version):
            undo.push(sysctl.disable_forwarding, version)


def _setup_container(args: CmdArgs, result: Result) -> None:
    """Configure the container end; its subnet goes via the gateway, reached by an on-link host route (as Go)."""
    from pycni.net import iface, netns, route
    from pycni.net.link import require_link

    with netns.enter(args.netns):
        iface.configure_iface(args.ifname, result)
        index = require_link(args.ifname).index
        for ipc in result.ips:
            assert ipc.gateway is not None
            subnet = ipc.address.network
            bits = ipc.address.max_prefixlen
            route.del_route(subnet, dev=index, scope=route.RT_SCOPE_NOWHERE)  # any scope, as the reference
            route.add_route(f"{ipc.gateway}/{bits}", dev=index, scope=route.RT_SCOPE_LINK, src=ipc.address.ip)
            route.add_route(subnet, gw=ipc.gateway, dev=index, src=ipc.address.ip)


def _setup_host(host_veth: str, result: Result) -> None:
    """The gateway address on the host end and a host route back to each container address."""
    from pycni.net import addr, route

    for ipc in result.ips:
        bits = ipc.address.max_prefixlen
        addr.add_addr(host_veth, f"{ipc.gateway}/{bits}", exist_ok=True)
        route.add_route(f"{ipc.address.ip}/{bits}", dev=host_veth, scope=route.RT_SCOPE_LINK, exist_ok=True)


def cmd_add(args: CmdArgs) -> Result:
    from pycni.net import link, veth

    n = parse_conf(args)
    check_for_add(n, args)
    conf = args.conf()
    with Rollback() as undo:
        result = ipam.add(conf, args)
        undo.push(ipam.delete, conf, args)
        for ipc in result.ips:
            if ipc.gateway is None:
                raise invalid_config(f"ptp: IPAM gave {ipc.address} no gateway",
                                     "ptp routes everything through the gateway; configure one in the IPAM section")
        enable_forwarding(result.ips, undo)
        pair = veth.setup_veth(args.netns, args.ifname, mtu=n.mtu)
        undo.push(link.delete_link, pair.host.name)
        result.interfaces = [Interface(name=pair.host.name, mac=pair.host.mac),
                             Interface(name=args.ifname, mac=pair.container.mac, sandbox=args.netns)]
        for ipc in result.ips:
            ipc.interface = 1
        _setup_container(args, result)
        _setup_host(pair.host.name, result)
        if n.ip_masq:
            from pycni.net import masq

            addrs = [i.address for i in result.ips]
            backend = n.masq_backend()
            undo.push(masq.undo_ip_masq, backend, n.name, args.container_id, args.ifname, addrs)
            masq.setup_ip_masq(backend, n.name, args.container_id, args.ifname, addrs)
        if n.dns_set:
            result.dns = n.dns  # the plugin's own DNS settings win over IPAM's, as in the reference
    return result


def cmd_del(args: CmdArgs) -> None:
    from pycni.net import addr, link, masq, netns

    n = parse_conf(args)
    ipam.delete(args.conf(), args)
    addresses = None
    if args.netns and netns.netns_exists(args.netns):
        with netns.enter(args.netns):
            found = link.get_link(args.ifname)
            if found is not None:
                addresses = [a.address for a in addr.list_addrs(found.index) if a.scope == 0]
                link.delete_link(found.index)  # the host end goes with it
    if n.ip_masq:
        # Even with the netns gone (addresses unknown) our masquerade chain is found by container ID.
        # Clean whichever backend holds it: a config changed since ADD must not block DEL.
        masq.teardown_ip_masq(None, n.name, args.container_id, args.ifname, addresses or None)


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import netns, verify

    n = parse_conf(args)
    conf = args.conf()
    netns.check_netns(args.netns)
    ipam.check(conf, args)
    prev = netconf.require_prev_result(conf, "ptp")
    verify.container_link(prev, args.ifname, args.netns, kind="veth", label="ptp")
    if n.ip_masq:
        from pycni.net import masq

        masq.check_ip_masq(n.masq_backend(), n.name, args.container_id, args.ifname, [i.address for i in prev.ips])


def cmd_gc(args: CmdArgs) -> None:
    """The IPAM plugin's GC releases what ``cni.dev/valid-attachments`` does not list; masquerade
    rules of attachments not listed go too, in both layouts (as in bridge)."""
    n = parse_conf(args)
    conf = args.conf()
    ipam.gc(conf, args)
    if n.ip_masq:
        from pycni.net import masq

        masq.gc_ip_masq(n.name, netconf.valid_attachments(conf))


def cmd_status(args: CmdArgs) -> None:
    """The IPAM plugin's STATUS is ours."""
    parse_conf(args)
    ipam.status(args.conf(), args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni ptp: a routed veth pair between the host and the container")


def main() -> None:
    run_plugin(PLUGIN)
