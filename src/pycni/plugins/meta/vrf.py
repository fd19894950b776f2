"""vrf: put the container interface of the previous plugin into a VRF inside the container.

Chained after an interface plugin. ADD creates the VRF ``vrfname`` in the container if it is
not there (routing table ``table``, or the first table no other VRF uses), enslaves the
interface, puts back the IPv6 addresses the kernel drops on enslaving, and moves the
interface's routes from the main table into the VRF's table. DEL releases the interface and
removes the VRF once nothing is left in it. The prevResult passes through unchanged. A chained
plugin, so it lives with the meta plugins as upstream's does; its CNI type stays ``vrf``. An ADD
that fails part-way takes back the VRF it made, the enslavement and the routes it copied.
"""

from __future__ import annotations

from pycni import netconf
from pycni.net import netns
from pycni.net.rule import RESERVED_TABLES, next_free_table
from pycni.record import record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import INTERNAL, CNIError, invalid_config
from pycni.spec.types import Result

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any


@record
class VrfConf:
    """``vrfname`` and ``table`` (None: the first table no other VRF uses), and the chain's prevResult."""

    name: str
    cni_version: str
    vrfname: str
    table: int | None = None
    prev: Result | None = None


def parse_conf(args: CmdArgs) -> VrfConf:
    """The config as a :class:`VrfConf`, each key checked."""
    conf = args.conf()
    name = netconf.lookup(conf, "vrfname", "")
    if not isinstance(name, str) or not name:
        raise invalid_config("configuration is expected to have a valid vrf name",
                             "set \"vrfname\" to the VRF device to create or join in the container")
    if len(name) > 15 or "/" in name or any(c.isspace() for c in name):
        raise invalid_config(f"invalid vrf name {name!r}", "a VRF is an interface: at most 15 characters")
    table = netconf.lookup(conf, "table")

    if table is not None and (not isinstance(table, int) or isinstance(table, bool) or not 0 < table < 2**32
                              or table in RESERVED_TABLES):
        raise invalid_config(f"invalid vrf table {table!r}",
                             "\"table\" must be a routing table number other than 253-255 (default, main, local)")
    netconf.runtime_config(conf)
    netconf.args_cni(conf)
    return VrfConf(name=netconf.network_name(conf), cni_version=config_version(conf), vrfname=name, table=table,
                   prev=netconf.prev_result(conf))


def _vrfs() -> dict[str, tuple[int, int]]:
    """VRF devices here: name -> (index, table)."""
    from pycni.net.vrf import list_vrfs

    return list_vrfs()


def first_free_table(taken: set[int]) -> int:
    """The lowest table id no other VRF uses, skipping the kernel's default, main and local (253-255)."""
    return next_free_table(1, taken | RESERVED_TABLES)


def _ensure_vrf(name: str, table: int | None, undo: Rollback) -> int:
    """The index of VRF ``name`` here, created (up) with ``table`` or a free one when missing
    (a failed ADD deletes the VRF it made)."""
    from pycni.net import link
    from pycni.net.vrf import create_vrf

    vrfs = _vrfs()
    if name in vrfs:
        index, have = vrfs[name]
        if table is not None and table != have:
            raise invalid_config(f"VRF {name!r} already exists with table {have}, not {table}",
                                 "use the existing table or another vrfname")
        return index
    if link.get_link(name) is not None:
        raise invalid_config(f"interface {name!r} exists and is not a VRF")
    use = table if table is not None else first_free_table({t for _, t in vrfs.values()})
    index = create_vrf(name, use)
    undo.push(link.delete_link, name)
    return index


def cmd_add(args: CmdArgs) -> Result:
    from pycni.net import addr, link, route

    n = parse_conf(args)
    if n.prev is None:
        raise invalid_config("missing prevResult from earlier plugin",
                             "vrf is a chained plugin: put it after the plugin that creates the interface")
    with netns.enter(args.netns), Rollback() as undo:
        iface = link.get_link(args.ifname)
        if iface is None:
            raise CNIError(INTERNAL, f"failed to find interface {args.ifname!r}", "the previous plugin made none")
        before = [a.address for a in addr.list_addrs(iface.index) if a.scope == 0]
        main_routes = [r for r in route.list_routes(dev=iface.index) if r.proto != route.RTPROT_KERNEL]
        vrf_index = _ensure_vrf(n.vrfname, n.table, undo)
        vrf_table = _vrfs()[n.vrfname][1]
        undo.push(_release, iface.index, before)
        link.set_link(iface.index, master=vrf_index)
        after = {a.address for a in addr.list_addrs(iface.index)}
        for a in before:
            if a not in after:
                addr.add_addr(iface.index, a, exist_ok=True)
        for r in main_routes:
            route.add_route(r.dst, gw=r.gw, dev=iface.index, table=vrf_table, priority=r.priority or None,
                            exist_ok=True)
    return n.prev


def _release(index: int, addresses: list[Any]) -> None:
    """Rollback of the enslavement: out of the VRF, with the addresses the kernel dropped put back."""
    from pycni.net import addr, link

    link.set_link(index, master=None)
    for a in addresses:
        addr.add_addr(index, a, exist_ok=True)


def cmd_del(args: CmdArgs) -> None:
    from pycni.net import link

    name = parse_conf(args).vrfname
    if not args.netns or not netns.netns_exists(args.netns):
        return
    with netns.enter(args.netns):
        vrfs = _vrfs()
        if name not in vrfs:
            return
        vrf_index = vrfs[name][0]
        iface = link.get_link(args.ifname)
        if iface is not None and iface.master == vrf_index:
            link.set_link(iface.index, master=None)
        if not [li for li in link.list_links() if li.master == vrf_index]:
            link.delete_link(vrf_index)


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import link

    n = parse_conf(args)
    name, table = n.vrfname, n.table
    netns.check_netns(args.netns)
    with netns.enter(args.netns):
        vrfs = _vrfs()
        if name not in vrfs:
            raise CNIError(INTERNAL, f"VRF {name!r} not found in the container")
        if table is not None and vrfs[name][1] != table:
            raise CNIError(INTERNAL, f"VRF {name!r} uses table {vrfs[name][1]}, expected {table}")
        iface = link.get_link(args.ifname)
        if iface is None or iface.master != vrfs[name][0]:
            raise CNIError(INTERNAL, f"interface {args.ifname!r} is not enslaved to VRF {name!r}")


def cmd_gc(args: CmdArgs) -> None:
    """Nothing outlives its container here: the VRF lives in the container's namespace."""
    parse_conf(args)


def cmd_status(args: CmdArgs) -> None:
    """Always ready: the VRF is made on demand."""
    parse_conf(args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni vrf: puts the container interface into a VRF")


def main() -> None:
    run_plugin(PLUGIN)
