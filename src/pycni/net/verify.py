"""CHECK helpers: does the namespace still hold what a prevResult says it should?

Run in the container's netns (the calling thread's). Routes are looked for in every routing
table, not only main: a later plugin in the chain (sbr, vrf) legitimately moves a container's
routes into its own table, and CHECK must not fail because of that — the Go reference's does.
"""

from __future__ import annotations

from pycni.net import addr as _addr
from pycni.net import netns
from pycni.net import route as _route
from pycni.net.link import Link, get_link
from pycni.spec.errors import INTERNAL, CNIError
from pycni.spec.types import IPConfig, Result, Route

TYPE_CHECKING = False  # not typing's: this module is on plugins' one-shot start path
if TYPE_CHECKING:
    from collections.abc import Sequence


def expect_interface_ips(ifname: str, ips: Sequence[IPConfig]) -> None:
    """Every address of ``ips`` must be on ``ifname`` with its prefix length."""
    link = get_link(ifname)
    if link is None:
        raise CNIError(INTERNAL, f"failed to find interface {ifname!r}", "the container interface is gone")
    present = {a.address for a in _addr.list_addrs(link.index)}
    for ipc in ips:
        if ipc.address not in present:  # the reference's wording (pkg/ip ValidateExpectedInterfaceIPs)
            raise CNIError(INTERNAL, f"Failed to match addr {ipc.address} on interface {ifname}",
                           f"addresses present: {sorted(str(a) for a in present) or 'none'}")


def expect_subnet_routes(ifname: str, ips: Sequence[IPConfig]) -> None:
    """Each address's subnet must still be routed, in some table (the bridge plugin's check)."""
    routes = _route.list_routes(table=None)
    for ipc in ips:
        if not any(r.dst == ipc.address.network for r in routes):
            raise CNIError(INTERNAL, f"Failed to find Gateway {ipc.gateway} for interface {ifname}",
                           f"no route to {ipc.address.network} in any table")


def expect_routes(routes: Sequence[Route]) -> None:
    """Every route must exist (same destination, and gateway when one is given) in some table."""
    if not routes:
        return
    installed = _route.list_routes(table=None)
    for r in routes:
        if not any(e.dst == r.dst and (r.gw is None or e.gw == r.gw or r.gw in e.multipath_gws)
                   for e in installed):
            raise CNIError(INTERNAL, f"Expected Route {r.to_dict()} not found in routing table",
                           "looked in every routing table; the container's routing no longer matches the ADD result")


def container_interface(result_interfaces: Sequence[object], ifname: str, netns_path: str) -> None:
    """The prevResult must name ``ifname`` in ``netns_path`` (the reference's sandbox check)."""
    for intf in result_interfaces:
        if getattr(intf, "name", None) == ifname and getattr(intf, "sandbox", None) == netns_path:
            return
    raise CNIError(INTERNAL, f"interface {ifname!r} with sandbox {netns_path} not found in prevResult",
                   "CHECK compares against the result of ADD for this container and interface")


def container_link(prev: Result, ifname: str, netns_path: str, *, kind: str = "", label: str = "",
                   subnet_routes: bool = False) -> Link:
    """CHECK the container side of a prevResult: the interface named with this sandbox exists
    (of ``kind`` when given), keeps its MAC, and holds its addresses and routes (and, with
    ``subnet_routes``, a route to each address's subnet).

    Runs from the host; enters ``netns_path`` itself. Returns the link as found.
    """
    container_interface(prev.interfaces, ifname, netns_path)
    index = next(i for i, intf in enumerate(prev.interfaces) if intf.name == ifname and intf.sandbox == netns_path)
    expected = prev.interfaces[index]
    prefix = f"{label}: " if label else ""
    with netns.enter(netns_path):
        found = get_link(ifname)
        if found is None:
            raise CNIError(INTERNAL, f"{prefix}Container Interface name in prevResult: {ifname} not found")
        if kind and found.kind != kind:
            raise CNIError(INTERNAL, f"{prefix}Container interface {ifname} not of type {kind}")
        if expected.mac and expected.mac.lower() != found.mac:
            raise CNIError(INTERNAL, f"{prefix}Interface {ifname} Mac {expected.mac} doesn't match container "
                                     f"Mac: {found.mac}")
        ips = [i for i in prev.ips if i.interface in (None, index)]
        expect_interface_ips(ifname, ips)
        if subnet_routes:
            expect_subnet_routes(ifname, ips)
        expect_routes(prev.routes)
    return found
