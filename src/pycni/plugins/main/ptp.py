"""ptp: a veth pair routed point-to-point, no bridge.

As in the reference: the container end gets the IPAM address, but the kernel's subnet route is
replaced by a /32 (/128) route to the gateway on the link and a subnet route via the gateway,
so every packet goes through the host. The host end carries the gateway as a /32 (/128)
address and a host route to the container's address. ``ipMasq`` masquerades outbound traffic,
``mtu`` sets both ends.
"""

from __future__ import annotations

from pycni import ipam
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, load_conf, prev_result, run_plugin
from pycni.spec import errors as E
from pycni.spec.errors import CNIError
from pycni.spec.types import DNS, Interface, IPConfig, Result

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any


def _conf(args: CmdArgs) -> dict[str, Any]:
    """The config with IPAM, ``mtu`` and the masquerade keys checked before anything is made."""
    conf = load_conf(args.stdin_data)
    ipam.require_ipam(conf, "ptp")
    mtu = conf.get("mtu", 0) or 0
    if not isinstance(mtu, int) or isinstance(mtu, bool) or mtu < 0:
        raise CNIError(E.INVALID_CONFIG, "\"mtu\" must be a non-negative integer", f"got {mtu!r}")
    if not isinstance(conf.get("ipMasq", False), bool):
        raise CNIError(E.INVALID_CONFIG, "\"ipMasq\" must be true or false", f"got {conf.get('ipMasq')!r}")
    if conf.get("ipMasqBackend") is not None:
        from pycni.net import masq

        if not isinstance(conf["ipMasqBackend"], str):
            raise CNIError(E.INVALID_CONFIG, "\"ipMasqBackend\" must be a string", f"got {conf['ipMasqBackend']!r}")
        masq.check_backend(conf["ipMasqBackend"])
    return conf


def _masq_backend(conf: dict[str, Any]) -> str:
    """The masquerade backend: ``ipMasqBackend`` or the one that works here."""
    from pycni.net import masq

    return str(conf.get("ipMasqBackend") or masq.default_backend())


def enable_forwarding(ips: list[IPConfig]) -> None:
    """Turn on forwarding in the host namespace for the families in use (as ip.EnableForward)."""
    from pycni.net import sysctl

    for version in sorted({i.address.version for i in ips}):
        sysctl.enable_forwarding(version)


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
            route.del_route(subnet, dev=index, scope=255)  # RT_SCOPE_NOWHERE: any scope, as the reference
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
    from pycni.net import link, masq, netns, veth

    conf = _conf(args)
    netns.check_netns(args.netns)
    with Rollback() as undo:
        result = ipam.add(conf, args)
        undo.push(ipam.delete, conf, args)
        for ipc in result.ips:
            if ipc.gateway is None:
                raise CNIError(E.INVALID_CONFIG, f"ptp: IPAM gave {ipc.address} no gateway",
                               "ptp routes everything through the gateway; configure one in the IPAM section")
        enable_forwarding(result.ips)
        pair = veth.setup_veth(args.netns, args.ifname, mtu=conf.get("mtu", 0) or 0)
        undo.push(link.delete_link, pair.host.name)
        result.interfaces = [Interface(name=pair.host.name, mac=pair.host.mac),
                             Interface(name=args.ifname, mac=pair.container.mac, sandbox=args.netns)]
        for ipc in result.ips:
            ipc.interface = 1
        _setup_container(args, result)
        _setup_host(pair.host.name, result)
        if conf.get("ipMasq"):
            addrs = [i.address for i in result.ips]
            masq.setup_ip_masq(_masq_backend(conf), conf.get("name", ""), args.container_id, args.ifname, addrs)
            undo.push(masq.teardown_ip_masq, _masq_backend(conf), conf.get("name", ""), args.container_id,
                      args.ifname, addrs)
        dns = DNS.from_dict(conf.get("dns"))
        if not dns.is_empty():
            result.dns = dns  # the plugin's own DNS settings win over IPAM's, as in the reference
    return result


def cmd_del(args: CmdArgs) -> None:
    from pycni.net import addr, link, masq, netns

    conf = load_conf(args.stdin_data)
    ipam.delete(conf, args)
    addresses = None
    if args.netns and netns.netns_exists(args.netns):
        with netns.enter(args.netns):
            found = link.get_link(args.ifname)
            if found is not None:
                addresses = [a.address for a in addr.list_addrs(found.index) if a.scope == 0]
                link.delete_link(found.index)  # the host end goes with it
    if conf.get("ipMasq"):
        # Even with the netns gone (addresses unknown) our masquerade chain is found by container ID.
        # Clean whichever backend holds it: a config changed since ADD must not block DEL.
        masq.teardown_ip_masq(None, conf.get("name", ""), args.container_id, args.ifname, addresses or None)


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import netns, verify

    conf = _conf(args)
    netns.check_netns(args.netns)
    ipam.check(conf, args)
    prev = prev_result(conf)
    if prev is None:
        raise CNIError(E.INVALID_CONFIG, "ptp: Required prevResult missing", "CHECK needs the result of ADD")
    verify.container_link(prev, args.ifname, args.netns, kind="veth", label="ptp")
    if conf.get("ipMasq"):
        from pycni.net import masq

        masq.check_ip_masq(_masq_backend(conf), conf.get("name", ""), args.container_id, args.ifname,
                           [i.address for i in prev.ips])


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check,
                about="pycni ptp: a routed veth pair between the host and the container")


def main() -> None:
    run_plugin(PLUGIN)
