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

import ipaddress
import os
from collections.abc import Mapping

from pycni.cniargs import load_cni_args
from pycni.plugins.ipam.ranges import (
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
from pycni.skel import CmdArgs, Plugin, config_version, prev_result, run_plugin
from pycni.spec.errors import (
    INCOMPATIBLE_VERSION,
    INTERNAL,
    INVALID_CONFIG,
    IO_FAILURE,
    PLUGIN_NOT_AVAILABLE,
    UNKNOWN_CONTAINER,
    CNIError,
)
from pycni.spec.types import DNS, IPConfig, Result, Route
from pycni.spec.validate import validate_network_name
from pycni.spec.version import greater_than_or_equal

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

# Allocation failures the reference reports with its catch-all code; kept for compatibility.
ALLOCATION_FAILED = INTERNAL
VALID_ATTACHMENTS = "cni.dev/valid-attachments"


# ---- config ------------------------------------------------------------------------------


@record
class IPAMConfig:
    """Everything one invocation needs, canonical (ranges filled in, requests parsed)."""

    name: str
    data_dir: str = ""
    resolv_conf: str = ""
    routes: list[Route] = field(default_factory=list)
    range_sets: list[RangeSet] = field(default_factory=list)
    requested: list[IPAddress] = field(default_factory=list)


def _bad(msg: str, details: str = "") -> CNIError:
    """A config error (CNIError 7)."""
    return CNIError(INVALID_CONFIG, msg, details)


def _str_field(ipam: Mapping[str, Any], key: str) -> str:
    """An optional string key of the ipam section ("" when absent)."""
    value = ipam.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _bad(f"invalid ipam.{key}", f"{key} must be a string, got {value!r}")
    return value


def load_basics(conf: Mapping[str, Any]) -> tuple[Mapping[str, Any], IPAMConfig]:
    """The ``ipam`` section, network name and data directory: all DEL, GC and STATUS need."""
    ipam = conf.get("ipam")
    if not isinstance(ipam, Mapping):
        raise _bad("IPAM config missing 'ipam' key",
                   "host-local reads its settings from the \"ipam\" object of the network config")
    name = conf.get("name")
    if not isinstance(name, str):
        raise _bad("missing network name", "the network config needs a \"name\": host-local keeps "
                   "its reservations in <dataDir>/<name>")
    validate_network_name(name)
    return ipam, IPAMConfig(name=name, data_dir=_str_field(ipam, "dataDir"),
                            resolv_conf=_str_field(ipam, "resolvConf"))


def load_config(conf: Mapping[str, Any], cni_args: str) -> IPAMConfig:
    """Parse and canonicalize the whole config as the reference's LoadIPAMConfig does."""
    ipam, cfg = load_basics(conf)
    args = load_cni_args(cni_args, ("IP",))
    cfg.requested = list(dict.fromkeys(ip for ip, _prefix in requested_ips(conf, args)))
    cfg.routes = parse_routes(ipam.get("routes"), "ipam.routes")

    raw_sets: list[Any] = []
    rc = conf.get("runtimeConfig")
    if isinstance(rc, Mapping) and rc.get("ipRanges"):
        if not isinstance(rc["ipRanges"], list):
            raise _bad("invalid runtimeConfig.ipRanges", "ipRanges must be a list of range sets "
                       "(each a list of {\"subnet\": CIDR, ...})")
        raw_sets.extend(rc["ipRanges"])  # the "ipRanges" capability comes first, as in Go
    if ipam.get("subnet"):  # the legacy single range, kept for old configs
        raw_sets.append([{k: ipam.get(k) for k in ("subnet", "rangeStart", "rangeEnd", "gateway")}])
    ranges = ipam.get("ranges")
    if ranges is not None:
        if not isinstance(ranges, list):
            raise _bad("invalid ipam.ranges", "ranges must be a list of range sets, each a list of "
                       "{\"subnet\": CIDR, \"rangeStart\"?, \"rangeEnd\"?, \"gateway\"?}")
        raw_sets.extend(ranges)
    if not raw_sets:
        raise _bad("no IP ranges specified", "set ipam.ranges (or the legacy ipam.subnet), or pass "
                   "runtimeConfig.ipRanges")

    for idx, raw in enumerate(raw_sets):
        try:
            cfg.range_sets.append(parse_range_set(raw))
        except RangeError as e:
            raise _bad(f"invalid range set {idx}: {e}", f"range set {idx} (runtime ipRanges first, then the "
                       f"legacy subnet, then ipam.ranges) is {raw!r}") from None

    families = [rs[0].version for rs in cfg.range_sets]
    version = config_version(conf)
    if max(families.count(4), families.count(6)) > 1 and not greater_than_or_equal(version, "0.3.0"):
        raise CNIError(INCOMPATIBLE_VERSION, f"CNI version {version} does not support more than 1 address "
                       "per family", "use cniVersion 0.3.0 or later for several range sets of one family")
    for i, a in enumerate(cfg.range_sets):
        for j in range(i + 1, len(cfg.range_sets)):
            if range_sets_overlap(a, cfg.range_sets[j]):
                raise _bad(f"range set {i} overlaps with {j}",
                           f"{range_set_str(a)} and {range_set_str(cfg.range_sets[j])} share addresses")
    return cfg


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
    return IPConfig(address=ipaddress.ip_interface(f"{ip}/{prefixlen}"), gateway=gateway)


def _allocate(store: Store, rs: RangeSet, idx: int, cid: str, ifname: str,
              requested: IPAddress | None, held: list[IPAddress]) -> IPConfig:
    """One address from range set ``idx``: the requested one, or the next free in round robin."""
    if requested is not None:
        r = range_for(rs, requested)
        assert r is not None  # requests are matched to the range set containing them
        if requested == r.gateway:
            raise _bad(f"requested ip {requested} is subnet's gateway")
        if r.is_reserved(int(requested)):
            raise _bad(f"requested ip {requested} is the network or broadcast address of {r.subnet}")
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
    for r, value in candidates(rs, store.last_reserved_ip(str(idx))):
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
    conf = args.conf()
    cfg = load_config(conf, args.args)
    result = Result(dns=parse_resolv_conf(cfg.resolv_conf) if cfg.resolv_conf else DNS())
    pending = list(cfg.requested)
    cid, ifname = args.container_id, args.ifname
    with Store(cfg.name, cfg.data_dir) as store, store.locked():
        made: list[IPAddress] = []
        try:
            held: list[IPAddress] | None = None
            for idx, rs in enumerate(cfg.range_sets):
                want = _take_requested(pending, rs)
                if want is None and held is None:
                    held = store.get_by_id(cid, ifname)
                try:
                    ipc = _allocate(store, rs, idx, cid, ifname, want, held or [])
                except CNIError as e:
                    raise CNIError(e.code, f"failed to allocate for range {idx}: {e.msg}", e.details) from None
                made.append(ipc.address.ip)
                result.ips.append(ipc)
            if pending:
                raise _bad("failed to allocate all requested IPs: " + " ".join(str(ip) for ip in pending),
                           "each requested address must lie inside rangeStart..rangeEnd of a different "
                           f"range set; range sets: {'; '.join(range_set_str(rs) for rs in cfg.range_sets)}")
        except BaseException:
            for ip in made:  # leave nothing half-made
                try:
                    store.release_ip(ip, cid, ifname)
                except CNIError:
                    pass
            raise
    result.routes = list(cfg.routes)
    return result


def cmd_del(args: CmdArgs) -> None:
    """Release whatever the attachment holds; releasing nothing is success (DEL is idempotent)."""
    _ipam, cfg = load_basics(args.conf())
    with Store(cfg.name, cfg.data_dir) as store, store.locked():
        store.release_by_id(args.container_id, args.ifname)


def cmd_check(args: CmdArgs) -> None:
    """The attachment must hold an address in every range set (and every address of prevResult)."""
    conf = args.conf()
    cfg = load_config(conf, args.args)
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
    prev = prev_result(conf)
    if prev is not None:
        mine = set(held)
        for ipc in prev.ips:
            ip = ipc.address.ip
            if any(range_for(rs, ip) for rs in cfg.range_sets) and ip not in mine:
                raise CNIError(UNKNOWN_CONTAINER, f"host-local: {ip} is not reserved for container {cid}",
                               f"prevResult lists {ipc.address} but {store.dir} has no such reservation")


def _valid_attachments(conf: Mapping[str, Any]) -> list[tuple[str, str]]:
    """GC's ``cni.dev/valid-attachments`` as (containerID, ifname) pairs, each checked."""
    raw = conf.get(VALID_ATTACHMENTS, [])
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise _bad(f"invalid {VALID_ATTACHMENTS}", "expected a list of {\"containerID\", \"ifname\"}")
    out = []
    for item in raw:
        if not (isinstance(item, Mapping) and isinstance(item.get("containerID"), str)
                and isinstance(item.get("ifname"), str)):
            raise _bad(f"invalid entry in {VALID_ATTACHMENTS}",
                       f"{item!r}: each entry needs string \"containerID\" and \"ifname\"")
        out.append((item["containerID"], item["ifname"]))
    return out


def cmd_gc(args: CmdArgs) -> None:
    """Release every reservation of this network not held by a valid attachment."""
    conf = args.conf()
    _ipam, cfg = load_basics(conf)
    valid = _valid_attachments(conf)
    if not os.path.isdir(os.path.join(cfg.data_dir or DEFAULT_DATA_DIR, cfg.name)):
        return  # nothing was ever reserved here: create nothing
    with Store(cfg.name, cfg.data_dir) as store, store.locked():
        store.gc(valid)


def cmd_status(args: CmdArgs) -> None:
    """Ready when the data directory can be opened and locked."""
    _ipam, cfg = load_basics(args.conf())
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
