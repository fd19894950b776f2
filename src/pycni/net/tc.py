"""Traffic control: token-bucket and HTB shaping, ifb devices, ingress redirects.

Everything acts in the calling thread's network namespace (see :mod:`pycni.net.link`).
Qdiscs, classes and filters are *created* with the ``tc`` command (it runs in the calling
thread's namespace because forked processes inherit it): tc encodes rate64 attributes, u32
selectors and mirred actions correctly, which pyroute2 0.9 does not for all of these. They
are *read back* over netlink (:mod:`pycni.net.nl`), which gives the kernel's exact numbers,
64-bit rates included — what CHECK compares. A tbf below 2**32 bytes/s is created over netlink
too, so its bucket is exactly the reference's (tc rounds the tick count differently).

Numbers follow the Go reference's arithmetic: rates in bytes per second, a bucket ``buffer``
in scheduler ticks (``burst`` bytes at ``rate``), and a tbf ``limit`` of 25 ms of traffic
plus the burst.
"""

from __future__ import annotations

import errno

from pycni import ipaddr
from pycni.net.errors import kernel_errors
from pycni.net.link import link_index, rtnl
from pycni.net.nl import TBF_CELL_LOG, TC_H_INGRESS, TC_H_ROOT
from pycni.record import field, record
from pycni.spec.errors import TRY_AGAIN, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from pycni.spec.types import IPNetwork

TIME_UNITS_PER_SEC = 1_000_000
LATENCY_MS = 25
MAX_U32 = 0xFFFFFFFF
ROOT_HANDLE = 0x10000  # 1:
SHAPED_MINOR = 0x30  # class 1:30 carries shaped traffic (as the reference's htb mode)
UNSHAPED_MINOR = 0x1  # class 1:1 is effectively unlimited
UNCAPPED_RATE_BITS = 100_000_000_000
TC_ERROR = 100  # plugin-specific: the kernel refused a tc change


def tick_in_usec() -> float:
    """Scheduler ticks per microsecond, from /proc/net/psched (as tc and netlink libraries do)."""
    try:
        with open("/proc/net/psched") as f:
            t2us, us2t, clock_res = (int(x, 16) for x in f.read().split()[:3])
    except (OSError, ValueError):
        return 1.0
    clock_factor = clock_res / TIME_UNITS_PER_SEC if clock_res else 1.0
    return t2us / us2t * clock_factor


def xmittime(rate_bytes: int, size_bytes: int, tick: float | None = None) -> int:
    """Ticks needed to send ``size_bytes`` at ``rate_bytes``/s (the bucket's ``buffer``)."""
    t = tick if tick is not None else tick_in_usec()
    return int(int(size_bytes * TIME_UNITS_PER_SEC / rate_bytes) * t)


def tc_xmittime(rate_bytes: int, size_bytes: int, tick: float | None = None) -> int:
    """The same, rounded as the ``tc`` tool rounds (no truncation before scaling to ticks)."""
    t = tick if tick is not None else tick_in_usec()
    return int(size_bytes * TIME_UNITS_PER_SEC / rate_bytes * t)


def largest_burst(rate_bytes: int, burst_bytes: int) -> int:
    """``burst_bytes``, or less: the largest bucket the kernel can hold at ``rate_bytes``/s.

    A tbf's (and an htb class's) bucket is the time the burst takes at the rate, in scheduler
    ticks of 64 ns, in 32 bits: at most ~275 s of traffic. A runtime that means "no particular
    burst" sends MaxUint32 bits (containerd does), which at rates under ~15.6 Mbit/s is more;
    Go's arithmetic wraps it to an arbitrary smaller bucket, we take the largest that fits
    (the queue limit, rate x 25 ms + burst bytes, must fit in 32 bits too).
    """
    tick = tick_in_usec()

    def fits(b: int) -> bool:
        return (max(xmittime(rate_bytes, b, tick), tc_xmittime(rate_bytes, b, tick)) <= MAX_U32
                and tbf_limit(rate_bytes, b) <= MAX_U32)

    if fits(burst_bytes):
        return burst_bytes
    lo, hi = 0, burst_bytes  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def tbf_buffer(rate_bytes: int, burst_bytes: int) -> int:
    """The bucket :func:`add_tbf` installs (netlink path below 2**32 bytes/s, tc above)."""
    if rate_bytes > MAX_U32:
        return tc_xmittime(rate_bytes, burst_bytes)
    return xmittime(rate_bytes, burst_bytes)


def rate_table(rate_bytes: int) -> list[int]:
    """A tbf's rate table: the ticks each 256th of a 2048-byte range takes at ``rate_bytes``/s.

    At a few bytes per second a large cell takes more ticks than 32 bits hold: those cells say
    "never" (MaxUint32). The kernel reads the table only to tell ATM links from others (it
    shapes by the rate itself), and the Go reference sends none at all.
    """
    tick = tick_in_usec()
    return [min(xmittime(rate_bytes, (i + 1) << TBF_CELL_LOG, tick), MAX_U32) for i in range(256)]


def tbf_limit(rate_bytes: int, burst_bytes: int) -> int:
    """Queue limit in bytes: what ``rate`` sends in the latency budget, plus the burst."""
    return int(rate_bytes * LATENCY_MS * 1000 / TIME_UNITS_PER_SEC) + burst_bytes


def run_tc(lines: Sequence[str], what: str) -> None:
    """Run tc commands as one ``tc -batch`` (stops at the first failure); CNIError on failure."""
    from pycni.net.tools import ToolTimeout, run_tool  # not subprocess: see pycni.net.tools

    script = "".join(line + "\n" for line in lines)
    try:
        status, out, err = run_tool(["tc", "-batch", "-"], script, timeout=30)
    except FileNotFoundError:
        raise CNIError(TC_ERROR, "tc command not found", "install iproute2 (the `tc` tool)") from None
    except ToolTimeout:
        raise CNIError(TRY_AGAIN, f"{what}: tc timed out", "try again") from None
    if status != 0:
        raise CNIError(TC_ERROR, f"failed to {what}", (err or out).strip()[-1000:])


# ---- devices ---------------------------------------------------------------------------------
def create_ifb(name: str, mtu: int) -> str:
    """Create an ifb device, up, with ``mtu``; return its MAC. Fails if ``name`` exists."""
    with rtnl() as sock:
        with kernel_errors(f"failed to create ifb device {name!r}", code=TC_ERROR):
            sock.link("add", ifname=name, kind="ifb", mtu=mtu)
            idx = link_index(sock, name)
            if idx is None:
                raise CNIError(TC_ERROR, f"ifb device {name!r} vanished after creation")
            sock.link("set", index=idx, state="up")
            msg = sock.link("get", index=idx)[0]
        return str(msg.get_attr("IFLA_ADDRESS") or "")


# ---- creating shapers ------------------------------------------------------------------------
def add_tbf(dev: str, rate_bytes: int, burst_bytes: int) -> None:
    """Root tbf qdisc (handle 1:) shaping everything that ``dev`` transmits.

    Over netlink, so the bucket is exactly the reference's (tc rounds the tick count
    differently); rates beyond 32 bits need TCA_TBF_RATE64, which only tc encodes.
    """
    limit = tbf_limit(rate_bytes, burst_bytes)
    if rate_bytes > MAX_U32:
        run_tc([f"qdisc add dev {dev} root handle 1: tbf rate {rate_bytes}bps burst {burst_bytes} "
                f"limit {limit}"], f"create tbf qdisc on {dev}")
        return
    with rtnl() as sock:
        idx = link_index(sock, dev)
        if idx is None:
            raise CNIError(TC_ERROR, f"get host device: {dev} not found")
        with kernel_errors(f"failed to create tbf qdisc on {dev}", code=TC_ERROR):
            sock.qdisc("add", index=idx, handle=ROOT_HANDLE, kind="tbf", rate=rate_bytes, limit=limit,
                       buffer=xmittime(rate_bytes, burst_bytes), rtab=rate_table(rate_bytes))


def _u32_match(net: IPNetwork) -> tuple[str, int, str]:
    """(protocol, prio, match clause) matching destination ``net``; prio differs per family."""
    if net.version == 4:
        proto, prio, match = "ip", 16, f"match ip dst {net}"
    else:
        proto, prio, match = "ipv6", 15, f"match ip6 dst {net}"
    if net.prefixlen == 0:
        match = "match u32 0 0"  # the whole family
    return proto, prio, match


def add_htb(dev: str, rate_bytes: int, burst_bytes: int, subnets: Sequence[str], exclude: bool) -> None:
    """Root htb with a shaped class 1:30 and an uncapped class 1:1; ``subnets`` pick the class.

    With ``exclude`` (unshapedSubnets) everything is shaped except traffic to ``subnets``;
    otherwise (shapedSubnets) only traffic to ``subnets`` is shaped.
    """
    default = SHAPED_MINOR if (exclude or not subnets) else UNSHAPED_MINOR
    target = UNSHAPED_MINOR if exclude else SHAPED_MINOR
    lines = [
        f"qdisc add dev {dev} root handle 1: htb default {default:x} r2q 10",
        f"class add dev {dev} parent 1: classid 1:{SHAPED_MINOR:x} htb rate {rate_bytes}bps "
        f"burst {burst_bytes} ceil {2 * rate_bytes}bps cburst {2 * burst_bytes}",
        f"class add dev {dev} parent 1: classid 1:{UNSHAPED_MINOR:x} htb rate {UNCAPPED_RATE_BITS}bit "
        f"ceil {UNCAPPED_RATE_BITS}bit",
    ]
    for s in subnets:
        proto, prio, match = _u32_match(ipaddr.ip_network(s, strict=False))
        lines.append(f"filter add dev {dev} parent 1: protocol {proto} prio {prio} u32 {match} "
                     f"flowid 1:{target:x}")
    run_tc(lines, f"create htb shaping on {dev}")


def add_ingress_redirect(dev: str, ifb: str) -> None:
    """Ingress qdisc on ``dev`` and a filter redirecting all it receives to ``ifb``'s egress."""
    run_tc([f"qdisc add dev {dev} handle ffff: ingress",
            f"filter add dev {dev} parent ffff: protocol all prio 1 u32 match u32 0 0 flowid 1:1 "
            f"action mirred egress redirect dev {ifb}"], f"redirect {dev} ingress to {ifb}")


def delete_qdisc(dev: str, ingress: bool = False) -> bool:
    """Remove the root (or ingress) qdisc of ``dev``; False when there was none or no ``dev``."""
    with rtnl() as sock:
        idx = link_index(sock, dev)
        if idx is None:
            return False
        for q in sock.get_qdiscs(index=idx):
            kind = q.get_attr("TCA_KIND")
            if ingress and kind == "ingress" or (not ingress and int(q["parent"]) == TC_H_ROOT
                                                 and kind in ("tbf", "htb")):
                with kernel_errors(f"failed to delete qdisc on {dev}", code=TC_ERROR,
                                   ignore=(errno.ENOENT, errno.ENODEV, errno.EINVAL)) as refused:  # already gone
                    sock.qdisc("del", index=idx, handle=int(q["handle"]), parent=TC_H_INGRESS if ingress else TC_H_ROOT)
                return refused.ignored is None
    return False


# ---- reading back ----------------------------------------------------------------------------
@record
class Qdisc:
    """A qdisc as read back; ``params`` holds what CHECK compares (tbf rate/limit/buffer, htb defcls)."""

    kind: str
    handle: int
    parent: int
    params: dict[str, Any] = field(default_factory=dict)


@record
class HtbClass:
    """An htb class as read back: rates in bytes/s, buckets in scheduler ticks."""

    handle: int
    rate: int
    ceil: int
    buffer: int
    cbuffer: int


def qdiscs(dev: str) -> list[Qdisc] | None:
    """The qdiscs of ``dev`` (without pfifo_fast/noqueue defaults); None when there is no ``dev``."""
    with rtnl() as sock:
        idx = link_index(sock, dev)
        if idx is None:
            return None
        out = []
        for q in sock.get_qdiscs(index=idx):
            kind = q.get_attr("TCA_KIND") or ""
            if kind in ("pfifo_fast", "noqueue", "mq", "fq_codel"):
                continue
            params: dict[str, Any] = {}
            opts = q.get_attr("TCA_OPTIONS")
            if kind == "tbf" and opts is not None:
                p = opts.get_attr("TCA_TBF_PARMS") or {}
                params = {"rate": opts.get_attr("TCA_TBF_RATE64") or p.get("rate"), "limit": p.get("limit"),
                          "buffer": p.get("buffer")}
            elif kind == "htb" and opts is not None:
                p = opts.get_attr("TCA_HTB_INIT") or {}
                params = {"defcls": p.get("defcls")}
            out.append(Qdisc(kind, int(q["handle"]), int(q["parent"]), params))
        return out


def htb_classes(dev: str) -> list[HtbClass]:
    """The htb classes of ``dev`` ([] when there is no ``dev``), 64-bit rates decoded."""
    with rtnl() as sock:
        idx = link_index(sock, dev)
        if idx is None:
            return []
        out = []
        for c in sock.get_classes(index=idx):
            opts = c.get_attr("TCA_OPTIONS")
            if c.get_attr("TCA_KIND") != "htb" or opts is None:
                continue
            p = opts.get_attr("TCA_HTB_PARMS") or {}
            rate = opts.get_attr("TCA_HTB_RATE64") or p.get("rate", 0)
            ceil = opts.get_attr("TCA_HTB_CEIL64") or p.get("ceil", 0)
            out.append(HtbClass(int(c["handle"]), int(rate), int(ceil), int(p.get("buffer", 0)),
                                int(p.get("cbuffer", 0))))
        return out


def filters(dev: str, parent: str) -> list[dict[str, Any]]:
    """u32 filters under ``parent`` (e.g. ``ffff:`` or ``1:``) as tc's JSON (keys/flowid/actions)."""
    import json

    from pycni.net.tools import run_tool

    status, out, _err = run_tool(["tc", "-j", "filter", "show", "dev", dev, "parent", parent], timeout=30)
    if status != 0:
        return []
    try:
        data = json.loads(out or "[]")
    except ValueError:
        return []
    return [f for f in data if isinstance(f, dict) and "flowid" in (f.get("options") or {})]
