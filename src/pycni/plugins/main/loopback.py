"""The ``loopback`` plugin: bring a namespace's ``lo`` up (ADD) or down (DEL).

As the Go reference: CNI_IFNAME is ignored (it is always ``lo``); the result lists ``lo``
with its first IPv4 and first IPv6 address (interface 0), or, when chained, passes the
prevResult through unchanged. DEL succeeds when there is no netns at all.
"""

from __future__ import annotations

import os

from pycni import netconf
from pycni.record import record
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import DECODE_FAILURE, INTERNAL, CNIError
from pycni.spec.types import Interface, IPConfig, Result

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

LOOPBACK = "lo"
LOOPBACK_MAC = "00:00:00:00:00:00"


class LoopbackResult(Result):
    """Printed as Go's loopback (v1.1.1, Debian's) prints it: a 1.0.0 result with an empty
    ``"dns": {}`` (libcni before 1.2 wrote it for every 1.0.0 result; later ones, and our other
    plugins, leave it out). Callers that wait for the first output line holding both braces,
    as the reference's own loopback test did, see it; at 1.1.0 it is left out, as libcni 1.2 does."""

    def to_dict(self, version: str | None = None) -> dict[str, Any]:
        d = super().to_dict(version)
        if (version or self.cni_version) == "1.0.0":
            d.setdefault("dns", {})
        return d


@record
class LoopbackConf:
    """Nothing to configure but the version and, when chained, the prevResult to pass through."""

    name: str
    cni_version: str
    prev: Result | None = None


def parse_conf(args: CmdArgs) -> LoopbackConf:
    """The config as a :class:`LoopbackConf` (prevResult parsed, so a bad one fails before we touch anything)."""
    conf = args.conf()
    netconf.runtime_config(conf)  # read by nothing here, but a malformed config is refused as everywhere
    netconf.args_cni(conf)
    try:
        prev = netconf.prev_result(conf)
    except CNIError as e:
        raise CNIError(DECODE_FAILURE, "failed to parse prevResult", e.details or e.msg) from None
    return LoopbackConf(name=netconf.network_name(conf), cni_version=config_version(conf), prev=prev)


def cmd_add(args: CmdArgs) -> Result:
    from pycni.net import addr, link, netns

    n = parse_conf(args)
    with netns.enter(args.netns):
        lo = link.set_link(LOOPBACK, up=True)
        v4 = addr.list_addrs(lo.index, 4)
        v6 = addr.list_addrs(lo.index, 6)
    for a in (*v4, *v6):
        if not a.address.ip.is_loopback:
            raise CNIError(INTERNAL, f"loopback interface found with non-loopback address {str(a.address.ip)!r}",
                           "lo carries an address outside 127.0.0.0/8 and ::1; remove it or use another netns")
    if n.prev is not None:
        p = n.prev
        return LoopbackResult(cni_version=p.cni_version, interfaces=p.interfaces, ips=p.ips, routes=p.routes,
                              dns=p.dns)
    result = LoopbackResult(cni_version=n.cni_version,
                            interfaces=[Interface(name=LOOPBACK, mac=LOOPBACK_MAC, sandbox=args.netns)])
    for found in (v4, v6):
        if found:
            result.ips.append(IPConfig(address=found[0].address, interface=0))
    return result


def cmd_del(args: CmdArgs) -> None:
    """Take lo down; nothing to do (and nothing imported) when the netns is gone: containerd's
    RemovePodSandbox repeats the DEL with CNI_NETNS empty."""
    if not args.netns or not os.path.exists(args.netns):
        return  # nothing to take down: DEL is idempotent
    from pycni.net import link, netns

    if not netns.netns_exists(args.netns):
        return
    with netns.enter(args.netns):
        if link.get_link(LOOPBACK) is not None:
            link.set_link(LOOPBACK, up=False)


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import link, netns

    parse_conf(args)
    with netns.enter(args.netns):
        lo = link.get_link(LOOPBACK)
    if lo is None:
        raise CNIError(INTERNAL, "Link not found", f"no {LOOPBACK} in {args.netns}")
    if not lo.up:
        raise CNIError(INTERNAL, "loopback interface is down",
                       f"{LOOPBACK} in {args.netns} is down; run ADD again to bring it up")


def cmd_gc(args: CmdArgs) -> None:
    """Nothing to collect: lo lives and dies with its namespace."""
    parse_conf(args)


def cmd_status(args: CmdArgs) -> None:
    """Always ready."""
    parse_conf(args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="CNI loopback plugin (pycni): brings up lo in the container")


def main() -> None:
    run_plugin(PLUGIN)
