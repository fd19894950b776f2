"""cluster-ipam: cluster-unique addresses from blocks in etcd, each node allocating in its own.

Config (the ``ipam`` section)::

    {"type": "cluster-ipam", "etcdEndpoints": ["http://10.0.0.1:2379"], "etcdPrefix": "/pycni",
     "nodeName": "node1", "blockSize": 26, "blockSizeV6": 122, "ranges": [[{"subnet": "10.90.0.0/16"}]],
     "routes": [...], "strictAffinity": false, "etcdTimeout": 8, "lockDir": "/run/pycni/cluster-ipam",
     "etcdCACert": "...", "etcdCert": "...", "etcdKey": "..."}

``ranges`` is host-local's range-set syntax (one address per range set: several for dual
stack); requested addresses come as host-local's (CNI_ARGS ``IP=``, ``args.cni.ips``,
runtimeConfig ``ips``). The design is in :mod:`pycni.cluster.ipam`, the key layout in
:mod:`pycni.cluster.model`, the session (lock, hint, etcd -> CNI errors) in
:mod:`pycni.cluster.session`: this module parses the config and calls them.
The etcd calls of a command share one budget, ``etcdTimeout`` (seconds, default 8), and the
wait for the node lock is bounded by it too: when no endpoint answers (or there is no quorum)
the command fails with code 11 naming the endpoints, and nothing is allocated. ``nodeName``
defaults to the host name. Stdlib only (``_socket``, ``binascii``; ``ssl`` for https).
"""

from __future__ import annotations

from pycni import ipaddr, netconf
from pycni.cluster.session import QUICK_DEL, clear_failed_add, failed_add, note_add, note_failed_add, session
from pycni.cluster.settings import ClusterSettings, parse_cluster_settings
from pycni.cniargs import load_cni_args
from pycni.ipranges import (
    IPAddress,
    RangeError,
    RangeSet,
    parse_range_set,
    parse_routes,
    range_for,
    range_set_str,
    range_sets_overlap,
    requested_ips,
)
from pycni.record import field, record
from pycni.skel import CmdArgs, Plugin, run_plugin
from pycni.spec.errors import INTERNAL, PLUGIN_NOT_AVAILABLE, UNKNOWN_CONTAINER, CNIError, invalid_config
from pycni.spec.types import IPConfig, Result, Route

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


@record
class ClusterIpamConf:
    """Everything one invocation needs, checked before any etcd call: the network's cluster
    settings (etcd, node, lock directory, block sizes) and this config's ranges."""

    cluster: ClusterSettings
    range_sets: list[RangeSet] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    requested: list[IPAddress] = field(default_factory=list)


def parse_conf_dict(conf: Mapping[str, Any], cni_args: str = "", *, need_ranges: bool = True) -> ClusterIpamConf:
    """Parse and check the whole config: the cluster settings, then ranges, routes and requested IPs."""
    cfg = ClusterIpamConf(cluster=parse_cluster_settings(conf))
    ipam = netconf.lookup(conf, "ipam")
    cfg.routes = parse_routes(netconf.lookup(ipam, "routes"), "ipam.routes")
    ranges = netconf.lookup(ipam, "ranges")
    if ranges is None or ranges == []:
        if need_ranges:
            raise invalid_config("no IP ranges specified", "set ipam.ranges: [[{\"subnet\": \"10.90.0.0/16\"}]] "
                                 "(host-local's syntax; one range set per address family)")
        return cfg
    if not isinstance(ranges, list):
        raise invalid_config("invalid ipam.ranges", "ranges must be a list of range sets, each a list of "
                             "{\"subnet\": CIDR, \"rangeStart\"?, \"rangeEnd\"?, \"gateway\"?}")
    for idx, raw in enumerate(ranges):
        try:
            cfg.range_sets.append(parse_range_set(raw))
        except RangeError as e:
            raise invalid_config(f"invalid range set {idx}: {e}", f"ipam.ranges[{idx}] is {raw!r}") from None
    for i, a in enumerate(cfg.range_sets):
        for j in range(i + 1, len(cfg.range_sets)):
            if range_sets_overlap(a, cfg.range_sets[j]):
                raise invalid_config(f"range set {i} overlaps with {j}",
                                     f"{range_set_str(a)} and {range_set_str(cfg.range_sets[j])} share addresses")
    requested = list(dict.fromkeys(ip for ip, _p in requested_ips(conf, load_cni_args(cni_args, ("IP",)))))
    used: set[int] = set()
    for ip in requested:
        where = [i for i, rs in enumerate(cfg.range_sets) if range_for(rs, ip) is not None]
        if not where or where[0] in used:
            raise invalid_config(f"failed to allocate all requested IPs: {ip}",
                                 "each requested address must lie inside rangeStart..rangeEnd of a different range "
                                 f"set; range sets: {'; '.join(range_set_str(rs) for rs in cfg.range_sets)}")
        used.add(where[0])
    cfg.requested = requested
    return cfg


def parse_conf(args: CmdArgs) -> ClusterIpamConf:
    return parse_conf_dict(args.conf(), args.args, need_ranges=args.command in ("ADD", "CHECK"))


# ---- handlers -----------------------------------------------------------------------------------


def cmd_add(args: CmdArgs) -> Result:
    """One address per range set in one etcd transaction with the handle; the same again on a repeat."""
    cfg = parse_conf(args)
    cid, ifname = args.container_id, args.ifname
    prior = failed_add(cfg.cluster, cid, ifname)  # an earlier ADD's write may still be on its way
    sess = session(cfg.cluster, lock=True)
    try:
        with sess as store:
            if cfg.cluster.lock_dir:
                store.before_write = lambda: note_add(cfg.cluster, cid, ifname, "pending")
            got = store.assign(cid, ifname, cfg.range_sets, cfg.requested,
                               cfg.cluster.block_sizes, cfg.cluster.strict_affinity)
    except CNIError as e:
        if not sess.unavailable:  # answered: nothing of this ADD is in flight; an earlier one's may be
            if prior in ("pending", "sent"):
                note_add(cfg.cluster, cid, ifname, prior)
            else:
                clear_failed_add(cfg.cluster, cid, ifname)
            raise
        sent = bool(sess.store is not None and sess.store.sent_write)
        note_failed_add(cfg.cluster, cid, ifname, sent, prior)
        left = ("its transaction went out and may have been applied: the runtime's DEL releases it (or GC does)"
                if sent else "an earlier ADD of it was cut off with its transaction on the way: the runtime's DEL "
                "releases what it may have taken" if prior in ("pending", "sent") else
                "nothing was allocated: nothing is left for the runtime's DEL")
        raise CNIError(e.code, e.msg, f"{e.details}; {left}") from None
    clear_failed_add(cfg.cluster, cid, ifname)  # the handle stands: a DEL releases it in full
    if len(got) != len(cfg.range_sets):
        raise CNIError(INTERNAL, "cluster-ipam: the handle holds addresses outside the configured ranges",
                       f"{args.container_id}/{args.ifname} exists with other addresses; DEL it first")
    ips = [IPConfig(address=ipaddr.ip_interface(f"{a.ip}/{a.range.subnet.prefixlen}"), gateway=a.range.gateway)
           for a in got]
    return Result(ips=ips, routes=list(cfg.routes))


def cmd_del(args: CmdArgs) -> None:
    """Release the handle's addresses; nothing to release is success."""
    cfg = parse_conf(args)
    note = failed_add(cfg.cluster, args.container_id, args.ifname)
    if note == "unsent":
        # The ADD just before failed without sending a write: nothing of it is in etcd, and this DEL
        # (its rollback) need not wait a second budget for an etcd that did not answer.
        clear_failed_add(cfg.cluster, args.container_id, args.ifname)
        return
    # "sent": the ADD just before failed with its write unanswered, against an etcd that did not
    # answer: one short try. "pending" (an ADD cut off mid-flight) or none: a DEL with the full budget.
    note = note if note == "sent" else ""
    sess = session(cfg.cluster, lock=True, timeout=min(QUICK_DEL, cfg.cluster.etcd.timeout) if note else None)
    try:
        with sess as store:
            store.release(args.container_id, args.ifname)
    except CNIError as e:
        if note and sess.unavailable:
            raise CNIError(e.code, e.msg, f"{e.details}; the ADD that failed just before had sent its transaction, "
                           "which may have been applied: DEL again once etcd answers (or GC releases it)") from None
        raise
    clear_failed_add(cfg.cluster, args.container_id, args.ifname)


def cmd_check(args: CmdArgs) -> None:
    """The handle exists, holds an address in every range set, and every address of prevResult."""
    conf = args.conf()
    cfg = parse_conf(args)
    cid = args.container_id
    with session(cfg.cluster) as store:
        handle = store.handle(cid, args.ifname)
    if handle is None:
        raise CNIError(UNKNOWN_CONTAINER, f"cluster-ipam: no addresses recorded for {cid}/{args.ifname}",
                       f"no handle {store.handle_key(cid, args.ifname)} in etcd")
    held = {ipaddr.ip_interface(t).ip for t in handle.get("ips", ())}
    for idx, rs in enumerate(cfg.range_sets):
        if not any(range_for(rs, ip) is not None for ip in held):
            raise CNIError(UNKNOWN_CONTAINER, f"cluster-ipam: {cid} holds no address in range set {idx}",
                           f"range set {range_set_str(rs)}; held: {', '.join(map(str, sorted(held, key=str)))}")
    prev = netconf.prev_result(conf)
    if prev is not None:
        for ipc in prev.ips:
            ip = ipc.address.ip
            if any(range_for(rs, ip) for rs in cfg.range_sets) and ip not in held:
                raise CNIError(UNKNOWN_CONTAINER, f"cluster-ipam: {ip} is not allocated to {cid}/{args.ifname}",
                               f"prevResult lists {ipc.address}; the handle holds "
                               f"{', '.join(map(str, sorted(held, key=str)))}")


def cmd_gc(args: CmdArgs) -> None:
    """Release this node's handles of this network that are not in the valid-attachments list."""
    conf = args.conf()
    cfg = parse_conf(args)
    valid = netconf.valid_attachments(conf)
    with session(cfg.cluster, lock=True) as store:
        store.gc(valid)


def cmd_status(args: CmdArgs) -> None:
    """Ready when an etcd endpoint serves a (linearizable) read: code 50 otherwise."""
    cfg = parse_conf(args)
    with session(cfg.cluster, PLUGIN_NOT_AVAILABLE) as store:
        store.ready()


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni cluster-ipam: cluster-wide IPAM in etcd (blocks with node affinity)")


def main() -> None:
    run_plugin(PLUGIN)
