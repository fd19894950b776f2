"""Applying an IPAM result to an interface, as Go's ``ipam.ConfigureIface`` does.

Runs in the calling thread's netns (the container's, normally). The order is the
reference's: addresses of the IPs whose ``interface`` index names this interface (enabling
IPv6 on it and on lo first when an IPv6 address is coming), link up, wait for IPv6 DAD to
settle when there is an IPv6 gateway, then routes (a route without a gateway goes via the
first gateway of its family, as in the reference). Routes are added beside any the namespace
already holds for the same destination (not exclusively), as the reference's: a container on
two networks keeps both default routes — IPv4 as two routes, IPv6 as one multipath route — and
deleting either network's interface leaves the other's working.
"""

from __future__ import annotations

from pycni.net import addr as _addr
from pycni.net import link as _link
from pycni.net import route as _route
from pycni.net.sysctl import read_sysctl, write_sysctl
from pycni.spec.errors import INTERNAL, CNIError
from pycni.spec.types import IPAddress, Result

DAD_SETTLE_TIMEOUT = 5.0


def enable_ipv6(ifname: str) -> None:
    """Turn IPv6 on for lo and ``ifname`` and keep addresses across link down, as the reference before adding IPv6."""
    for name in ("lo", ifname):
        key = f"net/ipv6/conf/{name}/disable_ipv6"
        try:
            value = read_sysctl(key)
        except CNIError:
            continue  # IPv6 not there at all; adding the address will say so
        if value == "0":
            continue
        try:
            write_sysctl(key, "0")
        except CNIError as e:
            raise CNIError(INTERNAL, f"failed to enable IPv6 for interface {name!r} ({key}={value})", str(e)) from None
    write_sysctl(f"net/ipv6/conf/{ifname}/keep_addr_on_down", "1")


def configure_iface(ifname: str, result: Result) -> None:
    """Put ``result``'s addresses and routes for ``ifname`` on it and bring it up."""
    if not result.interfaces:
        raise CNIError(INTERNAL, "no interfaces to configure", "the result lists no interfaces")
    link = _link.get_link(ifname)
    if link is None:
        raise CNIError(INTERNAL, f"failed to lookup {ifname!r}", f"link {ifname!r} not found")
    v4gw: IPAddress | None = None
    v6gw: IPAddress | None = None
    ipv6_ready = False
    for ipc in result.ips:
        if ipc.interface is None:
            continue
        idx = ipc.interface
        if idx < 0 or idx >= len(result.interfaces) or result.interfaces[idx].name != ifname:
            raise CNIError(INTERNAL, f"failed to add IP addr {ipc.address} to {ifname!r}: invalid interface index",
                           f"ips[].interface={idx} does not name {ifname!r} in the result's interfaces")
        if ipc.address.version == 6 and not ipv6_ready:
            enable_ipv6(ifname)
            ipv6_ready = True
        _addr.add_addr(link.index, ipc.address)
        if ipc.gateway is not None:
            if ipc.gateway.version == 4 and v4gw is None:
                v4gw = ipc.gateway
            elif ipc.gateway.version == 6 and v6gw is None:
                v6gw = ipc.gateway
    _link.set_up(link.index, ifname)
    if v6gw is not None:
        _addr.settle_addresses(ifname, DAD_SETTLE_TIMEOUT)
    for r in result.routes:
        gw = r.gw
        if gw is None:
            gw = v4gw if r.dst.version == 4 else v6gw
        _route.add_route(r.dst, gw=gw, dev=link.index, priority=r.priority or None, table=r.table,
                         scope=r.scope, mtu=r.mtu or None, advmss=r.advmss or None, exclusive=False)
