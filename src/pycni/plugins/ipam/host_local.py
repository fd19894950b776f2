"""host-local IPAM: hands out addresses from configured ranges, remembered in files on this host.

A drop-in for the Go reference: the same config keys (legacy ``subnet``/``rangeStart``/
``rangeEnd``/``gateway``, ``ranges``, ``routes``, ``resolvConf``, ``dataDir``), requested
addresses (CNI_ARGS ``IP=``, ``args.cni.ips``, runtimeConfig ``ips``), runtimeConfig
``ipRanges``, the same allocation order and the same on-disk store (see :mod:`.store`), so Go
and Python host-local can share a data directory. Beyond the reference: GC and STATUS
(spec 1.1), spec error codes for bad input, and an ADD that never leaves half its
addresses behind. Stdlib only.
"""

from __future__ import annotations

import os

from pycni import ipaddr, netconf
from pycni.cniargs import load_cni_args
from pycni.ipranges import (
    IPAddress,
    RangeError,
    RangeSet,
    address,
    candidates,
    parse_range_set,
    parse_routes,
    range_for,
    range_set_str,
    range_sets_overlap,
    requested_ips,
)
from pycni.plugins.ipam.store import DEFAULT_DATA_DIR, Store
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import (
    INCOMPATIBLE_VERSION,
    INTERNAL,
    IO_FAILURE,
    PLUGIN_NOT_AVAILABLE,
    UNKNOWN_CONTAINER,
    CNIError,
    invalid_config,
)
from pycni.spec.types import DNS, IPConfig, Result, Route
from pycni.spec.version import greater_than_or_equal

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# Allocation failures the reference reports with its catch-all code; kept for compatibility.
ALLOCATION_FAILED = INTERNAL


# ---- config ------------------------------------------------------------------------------


@record
class HostLocalConf:
    """Everything one invocation needs, canonical (ranges filled in, requests parsed).

    ADD and CHECK read the whole config; DEL, GC and STATUS only the network name and the
    data directory (a DEL must work after the ranges were edited), GC also its list of
    attachments still in use.
    """

    name: str
    data_dir: str = ""
    resolv_conf: str = ""
    routes: list[Route] = field(default_factory=list)
    range_sets: list[RangeSet] = field(default_factory=list)
    requested: list[IPAddress] = field(default_factory=list)
    valid: list[tuple[str, str]] = field(default_factory=list)
    prev: Result | None = None  # CHECK's prevResult, when given

    @property
    def store_dir(self) -> str:
        return os.path.join(self.data_dir or DEFAULT_DATA_DIR, self.name)


def parse_conf(args: CmdArgs) -> HostLocalConf:
    """The config as the reference's LoadIPAMConfig reads it, checked whole before any change."""
    conf = args.conf()
    ipam = netconf.ipam_section(conf, "host-local reads its settings from the \"ipam\" object of the network config")
    # skel has refused a missing or invalid name (it becomes part of the store's path)
    cfg = HostLocalConf(name=netconf.network_name(conf),
                        data_dir=netconf.get_str(ipam, "dataDir", label="ipam.dataDir"),
                        resolv_conf=netconf.get_str(ipam, "resolvConf", label="ipam.resolvConf"))
    if args.command in ("ADD", "CHECK"):
        _parse_ranges(conf, ipam, args.args, cfg)
        if args.command == "CHECK":
            cfg.prev = netconf.prev_result(conf)
    elif args.command == "GC":
        cfg.valid = netconf.valid_attachments(conf)
    return cfg


def _parse_ranges(conf: Mapping[str, Any], ipam: Mapping[str, Any], cni_args: str, cfg: HostLocalConf) -> None:
    """Range sets (runtime ipRanges, legacy subnet, ranges), requested addresses and routes."""
    args = load_cni_args(cni_args, ("IP",))
    cfg.requested = list(dict.fromkeys(ip for ip, _prefix in requested_ips(conf, args)))
    cfg.routes = parse_routes(netconf.lookup(ipam, "routes"), "ipam.routes")

    # The "ipRanges" capability comes first, as in Go.
    raw_sets: list[Any] = list(netconf.get_list(netconf.runtime_config(conf), "ipRanges",
                                                label="runtimeConfig.ipRanges"))
    if netconf.lookup(ipam, "subnet"):  # the legacy single range, kept for old configs
        raw_sets.append([{k: netconf.lookup(ipam, k) for k in ("subnet", "rangeStart", "rangeEnd", "gateway")}])

    raw_sets.extend(netconf.get_list(ipam, "ranges", label="ipam.ranges"))
    if not raw_sets:
        raise invalid_config("no IP ranges specified", "set ipam.ranges (or the legacy ipam.subnet), "
                       "or pass runtimeConfig.ipRanges")

    for idx, raw in enumerate(raw_sets):
        try:
            cfg.range_sets.append(parse_range_set(raw))
        except RangeError as e:
            raise invalid_config(f"invalid range set {idx}: {e}", f"range set {idx} (runtime "
                           f"ipRanges first, then the legacy subnet, then ipam.ranges) is {raw!r}") from None

    families = [rs[0].version for rs in cfg.range_sets]
    version = config_version(conf)
    if max(families.count(4), families.count(6)) > 1 and not greater_than_or_equal(version, "0.3.0"):
        raise CNIError(INCOMPATIBLE_VERSION, f"CNI version {version} does not support more than 1 address "
                       "per family", "use cniVersion 0.3.0 or later for several range sets of one family")
    for i, a in enumerate(cfg.range_sets):
        for j in range(i + 1, len(cfg.range_sets)):
            if range_sets_overlap(a, cfg.range_sets[j]):
                raise invalid_config(f"range set {i} overlaps with {j}",
                                     f"{range_set_str(a)} and {range_set_str(cfg.range_sets[j])} share addresses")


def parse_resolv_conf(path: str) -> DNS:
    """nameserver / domain / search / options of a resolv.conf, as the reference reads it."""
    dns = DNS()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise CNIError(IO_FAILURE, f"cannot read resolvConf {path}", e.strerror or str(e)) from None
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        fields = line.split()
        if len(fields) < 2:
            continue
        key, values = fields[0], fields[1:]
        if key == "nameserver":
            dns.nameservers.append(values[0])
        elif key == "domain":
            dns.domain = values[0]
        elif key == "search":
            dns.search.extend(values)
        elif key == "options":
            dns.options.extend(values)
    return dns


# ---- allocation --------------------------------------------------------------------------


def _ip_config(ip: IPAddress, prefixlen: int, gateway: IPAddress) -> IPConfig:
    return IPConfig(address=ipaddr.ip_interface(f"{ip}/{prefixlen}"), gateway=gateway)


_WALK_BEFORE_LISTING = 32  # candidates tried one by one before the store's names are listed


def _taken_values(names: set[str]) -> dict[int, set[int]]:
    """The addresses among a store's file names, as integers by IP version; the store's own
    files (lock, last_reserved_ip.N) are not addresses and drop out."""
    import _socket

    aton, pton, af6 = _socket.inet_aton, _socket.inet_pton, _socket.AF_INET6
    v4: set[int] = set()
    v6: set[int] = set()
    for name in names:
        try:
            if ":" in name:
                v6.add(int.from_bytes(pton(af6, name), "big"))
            elif name.count(".") == 3:
                v4.add(int.from_bytes(aton(name), "big"))
        except OSError:
            continue
    return {4: v4, 6: v6}


def _allocate(store: Store, rs: RangeSet, idx: int, cid: str, ifname: str,
              requested: IPAddress | None, held: list[IPAddress]) -> IPConfig:
    """One address from range set ``idx``: the requested one, or the next free in round robin."""
    if requested is not None:
        r = range_for(rs, requested)
        assert r is not None  # requests are matched to the range set containing them
        if requested == r.gateway:
            raise invalid_config(f"requested ip {requested} is subnet's gateway")
        if r.is_reserved(int(requested)):
            raise invalid_config(f"requested ip {requested} is the network or broadcast address of {r.subnet}")
        if not store.reserve(cid, ifname, requested, str(idx)):
            owner = store.owner_of(requested)
            raise CNIError(ALLOCATION_FAILED, f"requested IP address {requested} is not available in range "
                           f"set {range_set_str(rs)}", f"held by {owner[0]} {owner[1] or ''}".strip()
                           if owner else "")
        return _ip_config(requested, r.subnet.prefixlen, r.gateway)

    # The spec forbids a second ADD for one attachment: refuse rather than hand out another.
    for ip in held:
        if range_for(rs, ip) is not None:
            raise CNIError(ALLOCATION_FAILED, f"{ip} has been allocated to {cid}, duplicate allocation is "
                           "not allowed", f"DEL {cid}/{ifname} before adding it again")
    # Round robin usually finds the next address free; a range walked through many taken ones
    # (bench (d): 60,000) costs a stat and two address objects each. So after a few, the names in
    # the store are listed once (we hold its lock: nobody adds one meanwhile) and the taken ones
    # are skipped by name; a free-looking one is still created exclusively (reserve).
    taken: dict[int, set[int]] | None = None
    for n, (r, value) in enumerate(candidates(rs, store.last_reserved_ip(str(idx)))):
        if taken is None and n == _WALK_BEFORE_LISTING:
            taken = _taken_values(store.names())
        if taken is not None and value in taken[r.version]:
            continue
        ip = address(r.version, value)
        if store.reserve(cid, ifname, ip, str(idx)):
            return _ip_config(ip, r.subnet.prefixlen, r.gateway)
    raise CNIError(ALLOCATION_FAILED, f"no IP addresses available in range set: {range_set_str(rs)}",
                   "every address is reserved; free some (DEL or GC) or add a range")


def _take_requested(pending: list[IPAddress], rs: RangeSet) -> IPAddress | None:
    """Remove and return the first requested address this range set holds."""
    for i, ip in enumerate(pending):
        if range_for(rs, ip) is not None:
            return pending.pop(i)
    return None


# ---- handlers ----------------------------------------------------------------------------


def cmd_add(args: CmdArgs) -> Result:
    """One address from each range set (a requested one where given), under the store lock; all or none."""
    cfg = parse_conf(args)
    result = Result(dns=parse_resolv_conf(cfg.resolv_conf) if cfg.resolv_conf else DNS())
    pending = list(cfg.requested)
    cid, ifname = args.container_id, args.ifname
    with Store(cfg.name, cfg.data_dir) as store, store.locked(), Rollback() as undo:
        held: list[IPAddress] | None = None
        for idx, rs in enumerate(cfg.range_sets):
            want = _take_requested(pending, rs)
            if want is None and held is None:
                held = store.get_by_id(cid, ifname)
            try:
                ipc = _allocate(store, rs, idx, cid, ifname, want, held or [])
            except CNIError as e:
                raise CNIError(e.code, f"failed to allocate for range {idx}: {e.msg}", e.details) from None
            undo.push(store.release_ip, ipc.address.ip, cid, ifname)  # leave nothing half-made
            result.ips.append(ipc)
        if pending:
            raise invalid_config("failed to allocate all requested IPs: " + " ".join(map(str, pending)),
                           "each requested address must lie inside rangeStart..rangeEnd of a different range set; "
                           f"range sets: {'; '.join(range_set_str(rs) for rs in cfg.range_sets)}")
    result.routes = list(cfg.routes)
    return result


def cmd_del(args: CmdArgs) -> None:
    """Release whatever the attachment holds; releasing nothing is success (DEL is idempotent)."""
    cfg = parse_conf(args)
    with Store(cfg.name, cfg.data_dir) as store, store.locked():
        store.release_by_id(args.container_id, args.ifname)


def cmd_check(args: CmdArgs) -> None:
    """The attachment must hold an address in every range set (and every address of prevResult)."""
    cfg = parse_conf(args)
    cid = args.container_id
    with Store(cfg.name, cfg.data_dir) as store, store.locked():
        held = store.get_by_id(cid, args.ifname)
    if not held:
        raise CNIError(UNKNOWN_CONTAINER, f"host-local: Failed to find address added by container {cid}",
                       f"no reservation for {cid}/{args.ifname} in {store.dir}")
    for idx, rs in enumerate(cfg.range_sets):
        if not any(range_for(rs, ip) is not None for ip in held):
            raise CNIError(UNKNOWN_CONTAINER, f"host-local: container {cid} holds no address in range set {idx}",
                           f"range set {range_set_str(rs)}; held: {', '.join(map(str, held))}")
    if cfg.prev is not None:
        mine = set(held)
        for ipc in cfg.prev.ips:
            ip = ipc.address.ip
            if any(range_for(rs, ip) for rs in cfg.range_sets) and ip not in mine:
                raise CNIError(UNKNOWN_CONTAINER, f"host-local: {ip} is not reserved for container {cid}",
                               f"prevResult lists {ipc.address} but {store.dir} has no such reservation")


def cmd_gc(args: CmdArgs) -> None:
    """Release every reservation of this network not held by a valid attachment."""
    cfg = parse_conf(args)
    if not os.path.isdir(cfg.store_dir):
        return  # nothing was ever reserved here: create nothing
    with Store(cfg.name, cfg.data_dir) as store, store.locked():
        store.gc(cfg.valid)


def cmd_status(args: CmdArgs) -> None:
    """Ready when the data directory can be opened and locked."""
    cfg = parse_conf(args)
    try:
        with Store(cfg.name, cfg.data_dir) as store, store.locked():
            pass
    except CNIError as e:
        if e.code != IO_FAILURE:
            raise
        raise CNIError(PLUGIN_NOT_AVAILABLE, "host-local: data directory unusable", str(e)) from None


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni host-local IPAM plugin")


def main() -> None:
    run_plugin(PLUGIN)
