"""Policy routing: ``ip rule`` entries and whole routes moved between tables.

Acts in the calling thread's network namespace (an ``IPRoute`` opened after
:func:`pycni.net.netns.enter`, see :mod:`pycni.net.link`). pyroute2 is imported lazily.

Rules added without an explicit priority get the one the kernel would pick for
``ip rule add`` (one below the second rule of the family's list), so results match the Go
plugins, which leave the priority to the kernel; pyroute2 would otherwise stamp 32000.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Any

from pycni.net.errors import kernel_errors
from pycni.net.link import ipr
from pycni.net.route import RT_TABLE_MAIN
from pycni.record import field, record

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
RESERVED_TABLES = frozenset({253, 254, 255})  # the kernel's default, main and local tables
RULE_ERROR = 100  # plugin-specific: the kernel refused a rule or route change


def _af(version: int) -> int:
    """The socket address family of IP ``version`` 4 or 6."""
    return socket.AF_INET if version == 4 else socket.AF_INET6


@record
class Rule:
    """One policy rule as the kernel reports it."""

    family: int  # 4 or 6
    priority: int
    table: int
    src: IPNetwork | None = None
    dst: IPNetwork | None = None
    action: int = 1  # FR_ACT_TO_TBL

    @classmethod
    def from_msg(cls, msg: Any) -> Rule:
        fam = 4 if msg["family"] == socket.AF_INET else 6
        table = msg.get_attr("FRA_TABLE")

        def net(attr: str, plen: int) -> IPNetwork | None:
            v = msg.get_attr(attr)
            return ipaddress.ip_network(f"{v}/{plen}", strict=False) if v else None

        return cls(family=fam, priority=int(msg.get_attr("FRA_PRIORITY") or 0),
                   table=int(table if table is not None else msg["table"]),
                   src=net("FRA_SRC", msg["src_len"]), dst=net("FRA_DST", msg["dst_len"]),
                   action=int(msg["action"]))


def list_rules(family: int | None = None) -> list[Rule]:
    """Rules of ``family`` (4, 6, or None for both), in the kernel's order."""
    out: list[Rule] = []
    with ipr() as sock:
        for fam in ([4, 6] if family is None else [family]):
            out.extend(Rule.from_msg(m) for m in sock.get_rules(family=_af(fam)))
    return out


def _kernel_default_pref(rules: list[Rule]) -> int:
    """The priority the kernel gives a rule added without one (fib_default_rule_pref)."""
    ordered = sorted(rules, key=lambda r: r.priority)
    if len(ordered) >= 2 and ordered[1].priority > 0:
        return ordered[1].priority - 1
    return 0


def add_rule(src: IPNetwork, table: int, priority: int | None = None) -> Rule:
    """``ip rule add from <src> table <table>``; returns the rule as added."""
    fam = src.version
    if priority is None:
        priority = _kernel_default_pref(list_rules(fam))
    with ipr() as sock, kernel_errors(f"failed to add rule from {src} table {table}", code=RULE_ERROR):
        sock.rule("add", family=_af(fam), table=table, src=str(src.network_address),
                  src_len=src.prefixlen, priority=priority)
    return Rule(fam, priority, table, src)


def del_rule(rule: Rule) -> bool:
    """Delete the rule matching ``rule`` (priority, table, source); False when it is gone."""
    kw: dict[str, Any] = {"family": _af(rule.family), "table": rule.table, "priority": rule.priority}
    if rule.src is not None:
        kw.update(src=str(rule.src.network_address), src_len=rule.src.prefixlen)
    with ipr() as sock, kernel_errors(f"failed to delete rule {rule}", code=RULE_ERROR,
                                      ignore=(errno.ENOENT, errno.ESRCH)) as refused:
        sock.rule("del", **kw)
    return refused.ignored is None


def tables_in_use() -> set[int]:
    """Every table some rule points at or some route (any family) lives in."""
    used = {r.table for r in list_rules()}
    with ipr() as sock:
        for fam in (socket.AF_INET, socket.AF_INET6):
            for m in sock.get_routes(family=fam, table=None):
                t = m.get_attr("RTA_TABLE")
                used.add(int(t if t is not None else m["table"]))
    return used


def next_free_table(start: int, used: set[int]) -> int:
    """The first table id from ``start`` on that is not in ``used``."""
    t = start
    while t in used:
        t += 1
    return t


# ---- routes, whole ---------------------------------------------------------------------------
@record
class RawRoute:
    """A route with every attribute needed to re-create it elsewhere (e.g. in another table)."""

    family: int  # 4 or 6
    dst: IPNetwork
    oif: int
    gw: str | None = None
    prefsrc: str | None = None
    scope: int = 0
    proto: int = 0
    type: int = 1
    priority: int = 0
    table: int = RT_TABLE_MAIN
    metrics: dict[str, int] = field(default_factory=dict)

    def spec(self, table: int | None = None) -> dict[str, Any]:
        """The pyroute2 route() keywords for this route, optionally in another ``table``."""
        kw: dict[str, Any] = {"family": _af(self.family), "dst_len": self.dst.prefixlen, "oif": self.oif,
                              "scope": self.scope, "proto": self.proto, "type": self.type,
                              "table": self.table if table is None else table}
        if self.dst.prefixlen:
            kw["dst"] = str(self.dst.network_address)
        if self.gw:
            kw["gateway"] = self.gw
        if self.prefsrc:
            kw["prefsrc"] = self.prefsrc
        if self.priority:
            kw["priority"] = self.priority
        if self.metrics:
            kw["metrics"] = dict(self.metrics)
        return kw


def link_routes(index: int, table: int = RT_TABLE_MAIN) -> list[RawRoute]:
    """Unicast routes out of link ``index`` in ``table`` (both families)."""
    out: list[RawRoute] = []
    with ipr() as sock:
        for fam in (socket.AF_INET, socket.AF_INET6):
            for m in sock.get_routes(family=fam, table=table):
                t = m.get_attr("RTA_TABLE")
                if int(t if t is not None else m["table"]) != table or m.get_attr("RTA_OIF") != index:
                    continue
                v = 4 if fam == socket.AF_INET else 6
                dst = m.get_attr("RTA_DST") or ("0.0.0.0" if v == 4 else "::")
                metrics: dict[str, int] = {}
                mx = m.get_attr("RTA_METRICS")
                if mx is not None:
                    for name, val in mx.get("attrs", []):
                        if name.startswith("RTAX_") and isinstance(val, int):
                            metrics[name] = val
                out.append(RawRoute(family=v, dst=ipaddress.ip_network(f"{dst}/{m['dst_len']}", strict=False),
                                    oif=index, gw=m.get_attr("RTA_GATEWAY"), prefsrc=m.get_attr("RTA_PREFSRC"),
                                    scope=int(m["scope"]), proto=int(m["proto"]), type=int(m["type"]),
                                    priority=int(m.get_attr("RTA_PRIORITY") or 0), table=table, metrics=metrics))
    return out


def put_route(route: RawRoute, table: int | None = None, replace: bool = True) -> None:
    """(Re)create ``route``, optionally in another ``table`` (replace: no error if present)."""
    with ipr() as sock, kernel_errors(f"failed to add route {route.dst} to table "
                                      f"{route.table if table is None else table}", code=RULE_ERROR):
        sock.route("replace" if replace else "add", **route.spec(table))


def remove_route(route: RawRoute) -> bool:
    """Delete exactly ``route``; False when it was not there."""
    with ipr() as sock, kernel_errors(f"failed to delete route {route.dst} from table {route.table}",
                                      code=RULE_ERROR, ignore=(errno.ESRCH, errno.ENOENT, errno.ENODEV)) as refused:
        sock.route("del", **route.spec())
    return refused.ignored is None

