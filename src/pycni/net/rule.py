"""Policy routing: ``ip rule`` entries and whole routes moved between tables.

Acts in the calling thread's network namespace (see :mod:`pycni.net.link`), over
:mod:`pycni.net.nl`. Routes are :class:`pycni.net.route.RouteEntry`, the one route model.

Rules added without an explicit priority get the one the kernel would pick for
``ip rule add`` (one below the second rule of the family's list), so results match the Go
plugins, which leave the priority to the kernel.
"""

from __future__ import annotations

import errno

from pycni import ipaddr
from pycni.net.errors import kernel_errors
from pycni.net.link import rtnl
from pycni.net.nl import AF_INET, AF_INET6, FR_ACT_TO_TBL, RT_TABLE_DEFAULT, RT_TABLE_LOCAL, RT_TABLE_MAIN
from pycni.net.route import RouteEntry, list_routes
from pycni.record import record

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from pycni.spec.types import IPNetwork

RESERVED_TABLES = frozenset({RT_TABLE_DEFAULT, RT_TABLE_MAIN, RT_TABLE_LOCAL})
RULE_ERROR = 100  # plugin-specific: the kernel refused a rule or route change


def _af(version: int) -> int:
    """The socket address family of IP ``version`` 4 or 6."""
    return AF_INET if version == 4 else AF_INET6


@record
class Rule:
    """One policy rule as the kernel reports it."""

    family: int  # 4 or 6
    priority: int
    table: int
    src: IPNetwork | None = None
    dst: IPNetwork | None = None
    action: int = FR_ACT_TO_TBL

    @classmethod
    def from_msg(cls, msg: Any) -> Rule:
        fam = 4 if msg["family"] == AF_INET else 6
        table = msg.get_attr("FRA_TABLE")

        def net(attr: str, plen: int) -> IPNetwork | None:
            v = msg.get_attr(attr)
            return ipaddr.ip_network(f"{v}/{plen}", strict=False) if v else None

        return cls(family=fam, priority=int(msg.get_attr("FRA_PRIORITY") or 0),
                   table=int(table if table is not None else msg["table"]),
                   src=net("FRA_SRC", msg["src_len"]), dst=net("FRA_DST", msg["dst_len"]),
                   action=int(msg["action"]))


def list_rules(family: int | None = None) -> list[Rule]:
    """Rules of ``family`` (4, 6, or None for both), in the kernel's order."""
    out: list[Rule] = []
    with rtnl() as sock:
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
    with rtnl() as sock, kernel_errors(f"failed to add rule from {src} table {table}", code=RULE_ERROR):
        sock.rule("add", family=_af(fam), table=table, src=str(src.network_address),
                  src_len=src.prefixlen, priority=priority)
    return Rule(fam, priority, table, src)


def del_rule(rule: Rule) -> bool:
    """Delete the rule matching ``rule`` (priority, table, source); False when it is gone."""
    src = str(rule.src.network_address) if rule.src is not None else None
    with rtnl() as sock, kernel_errors(f"failed to delete rule {rule}", code=RULE_ERROR,
                                       ignore=(errno.ENOENT, errno.ESRCH)) as refused:
        sock.rule("del", family=_af(rule.family), table=rule.table, priority=rule.priority, src=src,
                  src_len=rule.src.prefixlen if rule.src is not None else 0)
    return refused.ignored is None


def tables_in_use() -> set[int]:
    """Every table some rule points at or some route (any family) lives in."""
    used = {r.table for r in list_rules()}
    with rtnl() as sock:
        for fam in (AF_INET, AF_INET6):
            for m in sock.get_routes(family=fam):
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
def link_routes(index: int, table: int = RT_TABLE_MAIN) -> list[RouteEntry]:
    """The single-path routes out of link ``index`` in ``table`` (both families): what can be copied."""
    return [r for r in list_routes(table=table, dev=index) if not r.multipath_gws]


def put_route(route: RouteEntry, table: int | None = None, replace: bool = True) -> None:
    """(Re)create ``route``, optionally in another ``table`` (replace: no error if present)."""
    with rtnl() as sock, kernel_errors(f"failed to add route {route.dst} to table "
                                       f"{route.table if table is None else table}", code=RULE_ERROR):
        sock.route("replace" if replace else "add", **route.spec(table))


def remove_route(route: RouteEntry, table: int | None = None) -> bool:
    """Delete exactly ``route`` (from ``table`` instead of its own, when given); False when it was not there."""
    with rtnl() as sock, kernel_errors(f"failed to delete route {route.dst} from table "
                                       f"{route.table if table is None else table}", code=RULE_ERROR,
                                       ignore=(errno.ESRCH, errno.ENOENT, errno.ENODEV)) as refused:
        sock.route("del", **route.spec(table))
    return refused.ignored is None
