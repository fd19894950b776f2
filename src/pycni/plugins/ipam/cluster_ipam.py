"""cluster-ipam: cluster-unique addresses from blocks in etcd, each node allocating in its own.

Config (the ``ipam`` section)::

    {"type": "cluster-ipam", "etcdEndpoints": ["http://10.0.0.1:2379"], "etcdPrefix": "/pycni",
     "nodeName": "node1", "blockSize": 26, "blockSizeV6": 122, "ranges": [[{"subnet": "10.90.0.0/16"}]],
     "routes": [...], "strictAffinity": false, "etcdTimeout": 8, "lockDir": "/run/pycni/cluster-ipam",
     "etcdCACert": "...", "etcdCert": "...", "etcdKey": "..."}

``ranges`` is host-local's range-set syntax (one address per range set: several for dual
stack); requested addresses come as host-local's (CNI_ARGS ``IP=``, ``args.cni.ips``,
runtimeConfig ``ips``). The design and the key layout are in :mod:`pycni.cluster.ipam`.
The etcd calls of a command share one budget, ``etcdTimeout`` (seconds, default 8), and the
wait for the node lock is bounded by it too: when no endpoint answers (or there is no quorum)
the command fails with code 11 naming the endpoints, and nothing is allocated. ``nodeName``
defaults to the host name. Stdlib only (``_socket``, ``json``, ``binascii``; ``ssl`` for https).
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Mapping

from pycni import netconf
from pycni.cluster.etcd import DEFAULT_TIMEOUT, Etcd, EtcdError, EtcdUnavailable
from pycni.cluster.ipam import DEFAULT_BLOCK_V4, DEFAULT_BLOCK_V6, DEFAULT_PREFIX, ClusterStore, IpamError
from pycni.cniargs import load_cni_args
from pycni.plugins.ipam.ranges import (
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
from pycni.spec.errors import (
    INTERNAL,
    INVALID_CONFIG,
    PLUGIN_NOT_AVAILABLE,
    TRY_AGAIN,
    UNKNOWN_CONTAINER,
    CNIError,
)
from pycni.spec.types import IPConfig, Result, Route
from pycni.spec.validate import validate_network_name

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

# Where this node's ADD/DEL/GC of one network queue behind each other (see _Session).
DEFAULT_LOCK_DIR = "/run/pycni/cluster-ipam"


@record
class ClusterIpamConf:
    """Everything one invocation needs, checked before any etcd call."""

    name: str
    endpoints: list[str]
    prefix: str = DEFAULT_PREFIX
    node: str = ""
    block_sizes: tuple[int, int] = (DEFAULT_BLOCK_V4, DEFAULT_BLOCK_V6)
    range_sets: list[RangeSet] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    requested: list[IPAddress] = field(default_factory=list)
    strict_affinity: bool = False
    timeout: float = DEFAULT_TIMEOUT
    lock_dir: str = DEFAULT_LOCK_DIR
    ca_cert: str = ""
    cert: str = ""
    key: str = ""


MAX_NODE_NAME = 253  # a DNS name, the longest Kubernetes node name


def _bad(msg: str, details: str = "") -> CNIError:
    return CNIError(INVALID_CONFIG, msg, details)


def parse_conf_dict(conf: Mapping[str, Any], cni_args: str = "", *, need_ranges: bool = True) -> ClusterIpamConf:
    """Parse and check the whole config (also what the ``pycni ipam`` CLI reads)."""
    ipam = netconf.lookup(conf, "ipam")
    if not isinstance(ipam, Mapping):
        raise _bad("IPAM config missing 'ipam' key", "cluster-ipam reads its settings from the \"ipam\" object")
    name = netconf.lookup(conf, "name")
    if not isinstance(name, str):
        raise _bad("missing network name", "the network config needs a \"name\": its blocks and handles "
                   "live under <etcdPrefix>/ipam/.../<name>")
    validate_network_name(name)
    eps = netconf.get_list(ipam, "etcdEndpoints", label="ipam.etcdEndpoints")
    if not eps or not all(isinstance(e, str) for e in eps):
        raise _bad("invalid ipam.etcdEndpoints", "etcdEndpoints must be a non-empty list of URLs such as "
                   "[\"http://10.0.0.1:2379\"]")
    for ep in eps:
        if not ep.startswith(("http://", "https://")):
            raise _bad("invalid ipam.etcdEndpoints", f"{ep!r}: an endpoint is http://host:port or https://host:port")
    prefix = netconf.get_str(ipam, "etcdPrefix", DEFAULT_PREFIX, label="ipam.etcdPrefix")
    if not prefix.startswith("/"):
        raise _bad("invalid ipam.etcdPrefix", f"{prefix!r}: the prefix must start with '/'")
    node = netconf.get_str(ipam, "nodeName", label="ipam.nodeName") or os.uname().nodename
    if "/" in node or not node or len(node) > MAX_NODE_NAME:
        raise _bad("invalid ipam.nodeName", f"{node[:80]!r}{'...' if len(node) > 80 else ''}: a node name must be "
                   f"1 to {MAX_NODE_NAME} characters (a DNS name, as Kubernetes' node names) and hold no '/'")
    lock_dir = netconf.get_str(ipam, "lockDir", DEFAULT_LOCK_DIR, label="ipam.lockDir")
    # The node lock and block hint are files named <network>.<node>.*: refuse what cannot name one.
    if len(lock_dir) > 1024 or len(f"{name}.{node}.blocks".encode()) > 255:
        raise _bad("invalid ipam.lockDir", f"the lock directory ({len(lock_dir)} characters, at most 1024) or the "
                   f"file names <network>.<nodeName>.lock in it ({len(name) + len(node) + 7} characters, at most "
                   "255) are too long")
    # blockSize is the IPv4 block prefix (20..32); a value only IPv6 can have (116..128) sets the
    # IPv6 one instead, unless blockSizeV6 does.
    v4 = DEFAULT_BLOCK_V4
    v6 = netconf.get_int(ipam, "blockSizeV6", DEFAULT_BLOCK_V6, minimum=116, maximum=128, label="ipam.blockSizeV6")
    bs = netconf.get_int(ipam, "blockSize", DEFAULT_BLOCK_V4, label="ipam.blockSize")
    if 20 <= bs <= 32:
        v4 = bs
    elif 116 <= bs <= 128 and netconf.lookup(ipam, "blockSizeV6") is None:
        v6 = bs
    else:
        raise netconf.invalid("ipam.blockSize", "a prefix length from 20 to 32 (IPv4 blocks), or 116 to 128 "
                              "(IPv6 blocks, when blockSizeV6 is not set)", bs)
    strict = netconf.get_bool(ipam, "strictAffinity", label="ipam.strictAffinity")
    timeout = netconf.lookup(ipam, "etcdTimeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
        raise netconf.invalid("ipam.etcdTimeout", "a number of seconds (0 < t <= 300)", timeout)
    cfg = ClusterIpamConf(name=name, endpoints=list(eps), prefix=prefix, node=node, block_sizes=(v4, v6),
                          strict_affinity=strict, timeout=float(timeout),
                          lock_dir=lock_dir,
                          ca_cert=netconf.get_str(ipam, "etcdCACert", label="ipam.etcdCACert"),
                          cert=netconf.get_str(ipam, "etcdCert", label="ipam.etcdCert"),
                          key=netconf.get_str(ipam, "etcdKey", label="ipam.etcdKey"))
    if cfg.key and not cfg.cert:
        raise _bad("invalid ipam.etcdKey", "etcdKey needs etcdCert (the client certificate it belongs to)")
    cfg.routes = parse_routes(netconf.lookup(ipam, "routes"), "ipam.routes")
    ranges = netconf.lookup(ipam, "ranges")

    if ranges is None or ranges == []:
        if need_ranges:
            raise _bad("no IP ranges specified", "set ipam.ranges: [[{\"subnet\": \"10.90.0.0/16\"}]] "
                       "(host-local's syntax; one range set per address family)")
        return cfg
    if not isinstance(ranges, list):
        raise _bad("invalid ipam.ranges", "ranges must be a list of range sets, each a list of "
                   "{\"subnet\": CIDR, \"rangeStart\"?, \"rangeEnd\"?, \"gateway\"?}")
    for idx, raw in enumerate(ranges):
        try:
            cfg.range_sets.append(parse_range_set(raw))
        except RangeError as e:
            raise _bad(f"invalid range set {idx}: {e}", f"ipam.ranges[{idx}] is {raw!r}") from None
    for i, a in enumerate(cfg.range_sets):
        for j in range(i + 1, len(cfg.range_sets)):
            if range_sets_overlap(a, cfg.range_sets[j]):
                raise _bad(f"range set {i} overlaps with {j}",
                           f"{range_set_str(a)} and {range_set_str(cfg.range_sets[j])} share addresses")
    requested = list(dict.fromkeys(ip for ip, _p in requested_ips(conf, load_cni_args(cni_args, ("IP",)))))
    used: set[int] = set()
    for ip in requested:
        where = [i for i, rs in enumerate(cfg.range_sets) if range_for(rs, ip) is not None]
        if not where or where[0] in used:
            raise _bad(f"failed to allocate all requested IPs: {ip}",
                       "each requested address must lie inside rangeStart..rangeEnd of a different range set; "
                       f"range sets: {'; '.join(range_set_str(rs) for rs in cfg.range_sets)}")
        used.add(where[0])
    cfg.requested = requested
    return cfg


def parse_conf(args: CmdArgs) -> ClusterIpamConf:
    return parse_conf_dict(args.conf(), args.args, need_ranges=args.command in ("ADD", "CHECK"))


def client(cfg: ClusterIpamConf, timeout: float | None = None) -> Etcd:
    """The etcd client for this config, with the whole command's budget as its deadline."""
    budget = timeout or cfg.timeout
    # A third of the budget per attempt (at most 3 s): a member stuck without a leader (an election
    # after the leader died, or no quorum) must not eat the whole budget before the others are tried.
    try:
        etcd = Etcd(cfg.endpoints, timeout=budget, attempt_timeout=max(0.5, min(3.0, budget / 3)),
                    ca_cert=cfg.ca_cert, cert=cfg.cert, key=cfg.key)
    except (OSError, ValueError) as e:
        raise _bad("cannot set up the etcd client", str(e)) from None
    etcd.deadline = time.monotonic() + budget
    return etcd


class _Session:
    """The store for one command, with etcd failures mapped to CNI errors at this one boundary.

    With ``lock``, the commands of this node that change this network take turns (a flock in
    ``lockDir``, as calico-ipam's host lock): without it N parallel ADDs on a node race for the
    same block and all but one retry, N times over. The lock is an optimisation, not what keeps
    allocations right (the transactions' compares do): when the directory cannot be used, or
    the lock does not come within the budget (an overloaded node, a holder stuck on an etcd
    that does not answer), the command goes on without it. The etcd budget starts once the
    lock is settled, so a command is bounded by twice ``etcdTimeout``.
    """

    def __init__(self, cfg: ClusterIpamConf, unavailable_code: int = TRY_AGAIN, timeout: float | None = None,
                 lock: bool = False) -> None:
        self.cfg = cfg
        self.code = unavailable_code
        self.timeout = timeout
        self.lock = lock and bool(cfg.lock_dir)
        self._held: Any = None
        self.etcd: Etcd | None = None
        self.store: Any = None
        self._hint_before: list[Any] = []

    def _take_lock(self) -> None:
        from pycni.lockfile import flocked

        cfg = self.cfg
        held = flocked(os.path.join(cfg.lock_dir, f"{cfg.name}.{cfg.node}.lock"), create=True,
                       timeout=self.timeout or cfg.timeout)
        try:
            held.__enter__()
        except (TimeoutError, OSError):
            return  # no usable lock directory, or a queue too long: transactions alone
        self._held = held

    def __enter__(self) -> ClusterStore:
        if self.lock:
            self._take_lock()
        try:
            self.etcd = client(self.cfg, self.timeout)
        except BaseException:
            self._release()
            raise
        self.store = ClusterStore(self.etcd, self.cfg.name, self.cfg.node, self.cfg.prefix)
        if self.lock:
            self.store.hint = self._read_hint()
        self._hint_before = list(self.store.hint)
        return self.store

    # The hint (ClusterStore.hint) lives beside the lock: node-local, a cache, never trusted.
    def _hint_path(self) -> str:
        return os.path.join(self.cfg.lock_dir, f"{self.cfg.name}.{self.cfg.node}.blocks")

    def _read_hint(self) -> list[Any]:
        try:
            with open(self._hint_path(), encoding="ascii") as f:
                return [ipaddress.ip_network(line) for line in f.read().split()]
        except (OSError, ValueError):
            return []

    def _write_hint(self, hint: list[Any]) -> None:
        path = self._hint_path()
        tmp = f"{path}.{os.getpid()}.{id(self)}"
        try:
            with open(tmp, "w", encoding="ascii") as f:
                f.write("".join(f"{c}\n" for c in hint))
            os.replace(tmp, path)  # no fsync: a lost or stale hint costs a round trip, nothing else
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _release(self) -> None:
        if self._held is not None:
            self._held.__exit__(None, None, None)
            self._held = None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None and self.lock and self._held is not None and self.store.hint != self._hint_before:
            self._write_hint(self.store.hint)  # under the lock: writers take turns
        self._release()
        if self.etcd is not None:
            self.etcd.close()
        if isinstance(exc, EtcdUnavailable):
            raise CNIError(self.code, f"cluster-ipam: etcd unavailable: no endpoint of {', '.join(exc.endpoints)} "
                           f"answered within {exc.timeout:g}s",
                           "; ".join(f"{ep}: {err}" for ep, err in exc.errors.items())
                           + " (is etcd running, with a quorum of members?)") from None
        if isinstance(exc, EtcdError):
            raise CNIError(INTERNAL, f"cluster-ipam: etcd refused the request: {exc}") from None
        if isinstance(exc, IpamError):
            code = TRY_AGAIN if exc.kind == "contention" else INTERNAL
            raise CNIError(code, f"cluster-ipam: {exc.msg}", exc.details) from None


def session(cfg: ClusterIpamConf, unavailable_code: int = TRY_AGAIN, timeout: float | None = None,
            lock: bool = False) -> _Session:
    return _Session(cfg, unavailable_code, timeout, lock)


# ---- handlers -----------------------------------------------------------------------------------


def cmd_add(args: CmdArgs) -> Result:
    """One address per range set in one etcd transaction with the handle; the same again on a repeat."""
    cfg = parse_conf(args)
    with session(cfg, lock=True) as store:
        got = store.assign(args.container_id, args.ifname, cfg.range_sets, cfg.requested, cfg.block_sizes,
                           cfg.strict_affinity)
    if len(got) != len(cfg.range_sets):
        raise CNIError(INTERNAL, "cluster-ipam: the handle holds addresses outside the configured ranges",
                       f"{args.container_id}/{args.ifname} exists with other addresses; DEL it first")
    ips = [IPConfig(address=ipaddress.ip_interface(f"{a.ip}/{a.range.subnet.prefixlen}"), gateway=a.range.gateway)
           for a in got]
    return Result(ips=ips, routes=list(cfg.routes))


def cmd_del(args: CmdArgs) -> None:
    """Release the handle's addresses; nothing to release is success."""
    cfg = parse_conf(args)
    with session(cfg, lock=True) as store:
        store.release(args.container_id, args.ifname)


def cmd_check(args: CmdArgs) -> None:
    """The handle exists, holds an address in every range set, and every address of prevResult."""
    conf = args.conf()
    cfg = parse_conf(args)
    cid = args.container_id
    with session(cfg) as store:
        handle = store.handle(cid, args.ifname)
    if handle is None:
        raise CNIError(UNKNOWN_CONTAINER, f"cluster-ipam: no addresses recorded for {cid}/{args.ifname}",
                       f"no handle {store.handle_key(cid, args.ifname)} in etcd")
    held = {ipaddress.ip_interface(t).ip for t in handle.get("ips", ())}
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
    with session(cfg, lock=True) as store:
        store.gc(valid)


def cmd_status(args: CmdArgs) -> None:
    """Ready when an etcd endpoint serves a (linearizable) read: code 50 otherwise."""
    cfg = parse_conf(args)
    with session(cfg, PLUGIN_NOT_AVAILABLE) as store:
        store.etcd.range(store.blocks_prefix, prefix=True, keys_only=True, limit=1)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni cluster-ipam: cluster-wide IPAM in etcd (blocks with node affinity)")


def main() -> None:
    run_plugin(PLUGIN)
