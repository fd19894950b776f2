"""Routes, in the calling thread's netns (see :mod:`pycni.net.link`).

Defaults follow vishvananda/netlink as the Go plugins use it: a route is added with scope
universe and the main table unless told otherwise, and adding an identical route fails with
"file exists" unless ``exist_ok``. Routes from an IPAM result go in with ``exclusive=False``, as
Go's ``ipam.ConfigureIface`` adds them (netlink.RouteAddEcmp): a container on several networks
gets each network's default route, where an exclusive add would refuse the second.
"""

from __future__ import annotations

import errno

from pycni import ipaddr
from pycni.net.errors import kernel_errors
from pycni.net.link import require_index, rtnl
from pycni.net.nl import (  # noqa: F401 - the route constants, re-exported for callers of this module
    AF_INET,
    AF_INET6,
    RT_SCOPE_LINK,
    RT_SCOPE_NOWHERE,
    RT_SCOPE_UNIVERSE,
    RT_TABLE_LOCAL,
    RT_TABLE_MAIN,
    RTN_BLACKHOLE,
    RTN_UNICAST,
    RTNH_F_ONLINK,
    RTPROT_BOOT,
    RTPROT_KERNEL,
)
from pycni.record import field, record
from pycni.spec.errors import CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from pycni.spec.types import IPAddress, IPNetwork


@record
class RouteEntry:
    """One route as the kernel reports it: what CHECK compares, and all it takes to re-create it
    elsewhere (:func:`pycni.net.rule.put_route` copies routes between tables)."""

    dst: IPNetwork
    gw: IPAddress | None = None
    oif: int | None = None
    table: int = RT_TABLE_MAIN
    priority: int = 0
    scope: int = RT_SCOPE_UNIVERSE
    proto: int = 0
    type: int = RTN_UNICAST
    multipath_gws: tuple[IPAddress, ...] = ()
    prefsrc: IPAddress | None = None
    metrics: dict[str, int] = field(default_factory=dict)  # RTAX_* name -> value

    @classmethod
    def from_msg(cls, msg: Any) -> RouteEntry:
        fam = 4 if msg["family"] == AF_INET else 6
        dst_ip = msg.get_attr("RTA_DST") or ("0.0.0.0" if fam == 4 else "::")
        dst = ipaddr.ip_network(f"{dst_ip}/{msg['dst_len']}", strict=False)
        gw = msg.get_attr("RTA_GATEWAY")
        table = msg.get_attr("RTA_TABLE")
        mp_gws: list[IPAddress] = []
        oif = msg.get_attr("RTA_OIF")
        for nh in msg.get_attr("RTA_MULTIPATH") or []:
            g = nh.get_attr("RTA_GATEWAY")
            if g:
                mp_gws.append(ipaddr.ip_address(g))
            if oif is None:
                oif = nh["oif"]
        prefsrc = msg.get_attr("RTA_PREFSRC")
        mx = msg.get_attr("RTA_METRICS")
        return cls(dst=dst, gw=ipaddr.ip_address(gw) if gw else None, oif=oif,
                   table=int(table if table is not None else msg["table"]),
                   priority=int(msg.get_attr("RTA_PRIORITY") or 0), scope=int(msg["scope"]),
                   proto=int(msg["proto"]), type=int(msg["type"]), multipath_gws=tuple(mp_gws),
                   prefsrc=ipaddr.ip_address(prefsrc) if prefsrc else None,
                   metrics=dict(mx.attrs) if mx is not None else {})

    def spec(self, table: int | None = None) -> dict[str, Any]:
        """The ``route()`` keywords that re-create exactly this route, optionally in another ``table``."""
        kw = _spec(self.dst, self.gw, self.oif, self.table if table is None else table, self.priority, self.scope,
                   proto=self.proto)
        kw["type"] = self.type
        if self.prefsrc is not None:
            kw["prefsrc"] = str(self.prefsrc)
        if self.metrics:
            kw["metrics"] = dict(self.metrics)
        return kw

    def via(self, gw: IPAddress) -> bool:
        """Whether this route goes through ``gw``, as its gateway or one of its multipath hops."""
        return self.gw == gw or gw in self.multipath_gws


def _oif(sock: Any, dev: str | int | None) -> int | None:
    """The output interface index for ``dev`` (None: any); a missing link is an error."""
    return None if dev is None else require_index(sock, dev)


def _spec(dst: IPNetwork | str, gw: IPAddress | str | None, oif: int | None, table: int | None,
          priority: int | None, scope: int | None, mtu: int | None = None, advmss: int | None = None,
          proto: int | None = None) -> dict[str, Any]:
    """The nl ``route()`` keywords; unset values are left out so the kernel defaults apply."""
    net = ipaddr.ip_network(dst, strict=False) if isinstance(dst, str) else dst
    kw: dict[str, Any] = {"family": AF_INET if net.version == 4 else AF_INET6,
                          "dst_len": net.prefixlen}
    if net.prefixlen:
        kw["dst"] = str(net.network_address)
    if gw is not None:
        kw["gateway"] = str(gw)
    if oif is not None:
        kw["oif"] = oif
    if table is not None:
        kw["table"] = table
    if priority:
        kw["priority"] = priority
    if scope is not None:
        kw["scope"] = scope
    if proto is not None:
        kw["proto"] = proto
    metrics = {}
    if mtu:
        metrics["RTAX_MTU"] = mtu
    if advmss:
        metrics["RTAX_ADVMSS"] = advmss
    if metrics:
        kw["metrics"] = metrics
    return kw


def _describe(kw: dict[str, Any], dev: str | int | None) -> str:
    """A route in the words the Go plugins use in their error messages."""
    dst = f"{kw.get('dst', 'default' if kw['dst_len'] == 0 else '')}/{kw['dst_len']}"
    return (f"{dst} via {kw.get('gateway', '<nil>')} dev {dev} metric {kw.get('priority', 0)} "
            f"(scope {kw.get('scope', 0)}, table {kw.get('table', RT_TABLE_MAIN)})")


def add_route(dst: IPNetwork | str, *, gw: IPAddress | str | None = None, dev: str | int | None = None,
              table: int | None = None, priority: int | None = None, scope: int | None = None,
              mtu: int | None = None, advmss: int | None = None, exist_ok: bool = False,
              replace: bool = False, src: IPAddress | str | None = None, exclusive: bool = True,
              proto: int = RTPROT_BOOT, onlink: bool = False,
              type: int = RTN_UNICAST) -> None:  # noqa: A002 - the kernel's name
    """Add (or with ``replace``, replace) a route; ``dev`` is a link name or index; ``src`` the prefsrc.

    ``exclusive=False`` adds it beside a route of the same destination and metric through another
    gateway or link (see :meth:`pycni.net.nl.IPRoute.route`'s ``create``) instead of failing.
    ``proto`` marks who owns the route (a daemon that reconciles routes picks its own number and
    touches no other); ``onlink`` says the gateway is on ``dev`` though no route covers it;
    ``type`` RTN_BLACKHOLE drops what matches (no gateway, no device).
    """
    with rtnl() as sock:
        oif = _oif(sock, dev)
        kw = _spec(dst, gw, oif, table, priority, scope, mtu, advmss, proto=proto)
        if type != RTN_UNICAST:
            kw["type"] = type
        if src is not None:
            kw["prefsrc"] = str(src)
        if onlink:
            kw["flags"] = RTNH_F_ONLINK
        with kernel_errors(f"failed to add route '{_describe(kw, dev)}'", ignore=(errno.EEXIST,) if exist_ok else ()):
            sock.route("replace" if replace else "add" if exclusive else "create", **kw)


def replace_route(dst: IPNetwork | str, **kw: Any) -> None:
    """:func:`add_route` that replaces a route already there instead of failing."""
    add_route(dst, replace=True, **kw)


def del_route(dst: IPNetwork | str, *, gw: IPAddress | str | None = None, dev: str | int | None = None,
              table: int | None = None, priority: int | None = None, scope: int | None = None,
              proto: int | None = None) -> bool:
    """Delete a matching route (only one marked ``proto``, when given); True when one was removed.
    Idempotent."""
    with rtnl() as sock:
        try:
            oif = _oif(sock, dev)
        except CNIError:
            return False
        kw = _spec(dst, gw, oif, table, priority, scope, proto=proto)
        with kernel_errors(f"failed to delete route '{_describe(kw, dev)}'",
                           ignore=(errno.ESRCH, errno.ENOENT, errno.ENODEV)) as refused:
            sock.route("del", **kw)
        return refused.ignored is None


def list_routes(family: int | None = None, *, table: int | None = RT_TABLE_MAIN,
                dev: str | int | None = None) -> list[RouteEntry]:
    """Routes of ``family`` (4, 6, None for both) in ``table`` (None: every table), optionally by link."""
    with rtnl() as sock:
        oif = _oif(sock, dev)
        fams = [AF_INET, AF_INET6] if family is None else [
            AF_INET if family == 4 else AF_INET6]
        out: list[RouteEntry] = []
        for fam in fams:
            kw: dict[str, Any] = {"table": table} if table is not None else {}  # no table: all of them
            for msg in sock.get_routes(family=fam, **kw):
                r = RouteEntry.from_msg(msg)
                if table is not None and r.table != table:
                    continue
                if oif is not None and r.oif != oif:
                    continue
                out.append(r)
        return out


def output_link(ip: IPAddress | str) -> str | None:
    """The name of the link the kernel routes ``ip`` out of (``ip route get``), None when unroutable."""
    with rtnl() as sock:
        try:
            msgs = sock.route_get(str(ip))
        except OSError:
            return None
        oif = msgs[0].get_attr("RTA_OIF") if msgs else None
        if oif is None:
            return None
        found = sock.link("get", index=int(oif))
        return str(found[0].get_attr("IFLA_IFNAME")) if found else None
