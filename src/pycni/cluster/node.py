"""``pycni node``: the agent that routes every node's pod blocks to that node.

cluster-ipam records which node owns which address block (``P/ipam/affinity/<node>/...``);
each agent registers its node (``P/nodes/<name>``, bound to a lease it keeps alive) and
programs its own kernel so that every other registered node's blocks are reachable:

- **host-gw**: ``<block> via <node's underlay IP>`` — the nodes share an L2 underlay.
- **vxlan**: one vxlan device; per remote node a permanent neighbour entry (its VTEP address
  -> its VTEP MAC), an FDB entry (that MAC -> its underlay IP) and ``<block> via <VTEP
  address> dev <vxlan> onlink``, as flannel lays it out. The VTEP address of a node is its
  underlay IP: unique by construction, and neighbour tables are per device, so the entry on
  the vxlan device never meets the underlay's own ARP entry for the same address. IPv6 blocks
  go via the peer VTEP's EUI-64 link-local address (its vxlan device has it by itself).

Routes the agent makes carry their own route protocol number (:data:`RTPROT_PYCNI`), which is
how it tells its routes from anyone else's: convergence removes only those. The kernel state
is derived from etcd alone (a full read at start and after any broken watch, then the watch's
events; every ``--resync`` seconds the kernel is read back and repaired, without leaving the
watch), and applied as a diff, so a restarted agent changes
nothing that is already right. The data plane does not depend on the agent: it leaves its
routes when it stops, and its registration stays until the lease lapses (``--ttl``), so an
agent restarted within the TTL disturbs no one.
"""

from __future__ import annotations

import gc
import signal
import sys
import time

from pycni import ipaddr
from pycni.cluster.model import Affinity, Keys, NodeInfo, handle_holder
from pycni.cluster.settings import EtcdSettings
from pycni.record import field, record
from pycni.spec.errors import invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a process ~4 ms (see pycni.record)
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from pycni.cluster.kv import KVStore as Etcd
    from pycni.cluster.metrics import AgentMetrics

RTPROT_PYCNI = 94  # our routes' protocol (``ip route show proto 94``); not one iproute2 names
AGENT_ETCD_TIMEOUT = 5.0  # the budget of each of the agent's etcd calls (it has no command deadline)
MAX_BACKOFF = 10.0  # seconds between the agent's attempts to reach an etcd out of reach, at most
DEFAULT_TTL = 60
DEFAULT_VXLAN_DEVICE = "pycni.vxlan"
DEFAULT_VNI = 4096
DEFAULT_VXLAN_PORT = 4789
# /livez: the agent's loop must turn at least this often (it turns every second or so while it
# watches, and a full read at 10,000 endpoints on a loaded host takes ~25 s)
LIVE_WITHIN = 120.0
RESYNC_SECONDS = 30.0  # the kernel checked against what the agent wants (routes, device, policy table)
# A blackhole's metric: above the kernel's default for IPv6 routes (1024), so a pod's own host
# route to the same prefix (a block of one address: /32, /128) never collides with it and wins.
BLACKHOLE_METRIC = 4096


@record
class Hop:
    """Where a block goes: its gateway, the device for an onlink hop ('' : the kernel's choice);
    or, with ``blackhole``, nowhere (this node's own blocks: only their pods' /32 routes lead on)."""

    gw: str
    dev: str = ""
    node: str = ""
    blackhole: bool = False


@record
class Plan:
    """What the kernel should hold: block routes, and for vxlan the peers behind the device."""

    routes: dict[str, Hop] = field(default_factory=dict)          # block CIDR -> hop
    peers: dict[str, NodeInfo] = field(default_factory=dict)      # vxlan: node name -> info
    skipped: list[str] = field(default_factory=list)              # why a block has no route


# ---- the view of etcd ---------------------------------------------------------------------------


class ClusterView:
    """Nodes, block affinities and handles under the prefix, kept current from a full read plus
    watch events (keys and values decoded by :mod:`pycni.cluster.model`)."""

    def __init__(self, prefix: str) -> None:
        self.keys = Keys(prefix)
        self.prefix = self.keys.prefix
        self.nodes: dict[str, NodeInfo] = {}
        self.affinity: dict[str, tuple[str, str]] = {}  # affinity key -> (block CIDR, node)
        self.handles: dict[str, tuple[str, list[str]]] = {}  # handle key -> (node, addresses)

    @property
    def nodes_prefix(self) -> str:
        return self.keys.nodes

    @property
    def affinity_prefix(self) -> str:
        return self.keys.affinities

    @property
    def handles_prefix(self) -> str:
        return self.keys.handles

    def load(self, etcd: Etcd) -> int:
        """A full read of the three prefixes at one revision; returns it."""
        from pycni.cluster.kv import op_get

        res = etcd.txn([], [op_get(p, prefix=True)
                            for p in (self.nodes_prefix, self.affinity_prefix, self.handles_prefix)])
        self.nodes, self.affinity, self.handles = {}, {}, {}
        for kvs in res.responses:
            for kv in kvs:
                self.put(kv.key, kv.value)
        return res.revision

    def put(self, key: str, value: str) -> bool:
        """Apply one key's new value; True when it is one the agent cares about."""
        if key.startswith(self.nodes_prefix):
            name = key[len(self.nodes_prefix):]
            info = NodeInfo.from_json(name, value)
            if info is None:
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = info
            return True
        if key.startswith(self.affinity_prefix):
            aff = Affinity.from_kv(self.keys, key, value)
            if aff is None:
                self.affinity.pop(key, None)
            else:
                self.affinity[key] = (str(aff.cidr), aff.node)
            return True
        if key.startswith(self.handles_prefix):
            held = handle_holder(value)
            if held is None:
                self.handles.pop(key, None)
            else:
                self.handles[key] = held
            return True
        return False

    def delete(self, key: str) -> bool:
        if key.startswith(self.nodes_prefix):
            self.nodes.pop(key[len(self.nodes_prefix):], None)
            return True
        if key.startswith(self.affinity_prefix):
            self.affinity.pop(key, None)
            return True
        if key.startswith(self.handles_prefix):
            self.handles.pop(key, None)
            return True
        return False

    def blocks(self) -> dict[str, str]:
        """Block CIDR -> owning node."""
        return {cidr: node for cidr, node in self.affinity.values()}


def plan(view: ClusterView, me: str, mode: str, device: str) -> Plan:
    """The kernel state etcd asks of node ``me``: every other registered node's blocks, and a
    host route for each address a node borrowed from a block it does not own."""
    out = Plan()
    blocks = view.blocks()
    for cidr, owner in sorted(blocks.items()):
        if owner == me:
            # Our pods have their /32 routes from the plugin; an address of our block without a
            # pod is dropped here rather than sent on by a default route (and back: a loop).
            out.routes[cidr] = Hop(gw="", node=me, blackhole=True)
        elif mode != "bgp":  # (bgp: BIRD routes the other nodes' blocks, pycni.cluster.bgp)
            _route_to(out, view, cidr, owner, mode, device)
    if view.handles and mode != "bgp":
        nets = [(ipaddr.ip_network(c), o) for c, o in blocks.items()]
        for node, ips in sorted(view.handles.values()):
            if node == me:
                continue
            for ip in ips:
                a = ipaddr.ip_address(ip)
                holder = next((o for n, o in nets if n.version == a.version and a in n), None)
                if holder is not None and holder != node:
                    _route_to(out, view, f"{ip}/{a.max_prefixlen}", node, mode, device)
    return out


def _route_to(out: Plan, view: ClusterView, cidr: str, node: str, mode: str, device: str) -> None:
    """Add the route to ``cidr`` on ``node`` to the plan (or say why there can be none)."""
    info = view.nodes.get(node)
    if info is None:
        out.skipped.append(f"{cidr}: node {node} is not registered")
        return
    version = ipaddr.ip_network(cidr).version
    if mode == "vxlan":
        if not info.underlay(4) or not info.vtep_mac:
            out.skipped.append(f"{cidr}: node {node} has no VTEP (an IPv4 underlay address and a VTEP MAC; "
                               f"it registered {info.underlay_ips}, VTEP MAC {info.vtep_mac or 'none'})")
            return
        gw = info.underlay(4) if version == 4 else info.vtep_link_local()
        out.routes[cidr] = Hop(gw=gw, dev=device, node=node)
        out.peers[node] = info
    else:
        gw = info.underlay(version)
        if not gw:
            out.skipped.append(f"{cidr}: node {node} registered no IPv{version} underlay address")
            return
        out.routes[cidr] = Hop(gw=gw, node=node)


# ---- the kernel ---------------------------------------------------------------------------------


@record
class Programmed:
    """What the kernel holds of ours: block routes (proto :data:`RTPROT_PYCNI`) and vxlan peers."""

    routes: dict[str, Hop] = field(default_factory=dict)
    neighbours: dict[str, str] = field(default_factory=dict)  # VTEP IP -> MAC, on the vxlan device
    fdb: dict[str, str] = field(default_factory=dict)         # MAC -> underlay IP, on the vxlan device
    local: set[str] = field(default_factory=set)              # host routes not ours: this node's pods


def read_kernel(device: str, peers: bool = True) -> Programmed:
    """What the kernel holds of ours; the vxlan peers (neighbour and FDB dumps) only with ``peers``."""
    from pycni.net import link, neigh, route
    from pycni.net.nl import NUD_PERMANENT

    out = Programmed()
    # A hop's device is recorded when it is an overlay (a host-gw hop leaves the device to the
    # kernel), so a route left over a vxlan device by the other mode is seen to differ. Only the
    # devices our routes use are looked up (one or two), not every link: a dump of all links
    # grows with the node's pods and was most of a convergence (~6 ms of ~8 with 40 pods).
    overlays: dict[int, str] = {}

    def overlay(index: int) -> str:
        if index not in overlays:
            ln = link.get_link(index) if index else None
            overlays[index] = ln.name if ln is not None and ln.kind == "vxlan" else ""
        return overlays[index]

    for r in route.list_routes(table=route.RT_TABLE_MAIN):
        if r.proto == RTPROT_PYCNI:
            out.routes[str(r.dst)] = Hop(gw=str(r.gw or ""), dev=overlay(r.oif or 0),
                                         blackhole=r.type == route.RTN_BLACKHOLE)
        elif r.dst.prefixlen == r.dst.max_prefixlen and r.type == route.RTN_UNICAST and r.oif:
            out.local.add(str(r.dst))
    if peers and device and link.get_link(device) is not None:
        for n in neigh.list_neighbours(device):
            if n.state & NUD_PERMANENT and n.dst:
                out.neighbours[n.dst] = n.lladdr
        for n in neigh.list_neighbours(device, fdb=True):
            if n.dst and n.lladdr and n.lladdr != "00:00:00:00:00:00":
                out.fdb[n.lladdr] = n.dst
    return out


def _same(cur: Hop, want: Hop) -> bool:
    """Whether the kernel's route already is the one wanted (the owner's name is not in the kernel)."""
    return cur.blackhole == want.blackhole and cur.gw == want.gw and cur.dev == want.dev


def describe(cidr: str, hop: Hop) -> str:
    if hop.blackhole:
        return f"blackhole {cidr}"
    return f"{cidr} via {hop.gw}" + (f" dev {hop.dev} onlink" if hop.dev else "")


def converge(want: Plan, device: str, log: Any, peers: bool = True) -> tuple[int, int]:
    """Make the kernel hold exactly ``want`` of what is ours; one log line per change. Returns
    (changes made, changes the kernel refused): a refusal is logged and retried at the next pass.

    Without ``peers`` the vxlan peers (FDB and neighbour entries) are neither read nor changed:
    the caller knows they are as last applied. The FDB dump takes the kernel's rtnl lock, shared
    by every namespace of the machine, so it waited behind whatever else held it (tens of ms on a
    busy host) on every event; most events (a block claimed, an address borrowed) move no peer."""
    from pycni.net import neigh, route
    from pycni.spec.errors import CNIError

    have = read_kernel(device, peers)
    changes = failed = 0
    want_neigh = {ip: mac for info in want.peers.values() for ip, mac in info.vtep_neighbours().items()}
    want_fdb = {info.vtep_mac: info.underlay(4) for info in want.peers.values()}

    def attempt(what: str, fn: Any, *args: Any, **kw: Any) -> None:
        nonlocal changes, failed
        try:
            fn(*args, **kw)
        except CNIError as e:
            failed += 1
            log(f"FAILED {what}: {e.msg}: {e.details}")
            return
        changes += 1
        log(what)

    # Peers first (a route over the device needs its neighbour), routes, then stale peers.
    if not peers:
        want_fdb, want_neigh = dict(have.fdb), dict(have.neighbours)  # (both empty: nothing to do)
    for mac, remote in sorted(want_fdb.items()):
        if have.fdb.get(mac) != remote:
            attempt(f"fdb {mac} dst {remote} dev {device}", neigh.set_fdb, device, mac, remote)
    for ip, mac in sorted(want_neigh.items()):
        if have.neighbours.get(ip) != mac:
            attempt(f"neighbour {ip} lladdr {mac} dev {device}", neigh.set_neighbour, device, ip, mac)
    for cidr, hop in sorted(want.routes.items()):
        cur = have.routes.get(cidr)
        if cur is not None and _same(cur, hop):
            continue
        if not hop.blackhole and cidr in have.local:
            # A pod of this node holds the address (its plugin's route): etcd's view here is behind
            # (the handle naming another node was deleted before this pod got the address, and
            # that event is still on its way). Replacing the pod's route would cut the pod off —
            # for good, once the stale route is withdrawn.
            if cur is None:
                continue
            attempt(f"route del {describe(cidr, cur)} (a local pod holds {cidr})", route.del_route, cidr,
                    gw=cur.gw or None, proto=RTPROT_PYCNI)
            continue
        verb = "add" if cur is None else "change"
        if hop.blackhole:
            attempt(f"route {verb} blackhole {cidr} (this node's block)", route.replace_route, cidr,
                    proto=RTPROT_PYCNI, type=route.RTN_BLACKHOLE, priority=BLACKHOLE_METRIC)
            continue
        dev = f" dev {hop.dev} onlink" if hop.dev else ""
        attempt(f"route {verb} {cidr} via {hop.gw}{dev} (node {hop.node})", route.replace_route, cidr,
                gw=hop.gw, dev=hop.dev or None, proto=RTPROT_PYCNI, onlink=bool(hop.dev))
    for cidr, hop in sorted(have.routes.items()):
        if cidr not in want.routes:
            attempt(f"route del {describe(cidr, hop)}", route.del_route, cidr, gw=hop.gw or None,
                    proto=RTPROT_PYCNI, priority=BLACKHOLE_METRIC if hop.blackhole else None)
    for ip in sorted(have.neighbours):
        if ip not in want_neigh:
            attempt(f"neighbour del {ip} dev {device}", neigh.del_neighbour, device, ip)
    for mac, remote in sorted(have.fdb.items()):
        if mac not in want_fdb:
            attempt(f"fdb del {mac} dst {remote} dev {device}", neigh.del_fdb, device, mac, remote)
    return changes, failed


# ---- the agent ----------------------------------------------------------------------------------


@record
class AgentOptions:
    etcd: EtcdSettings
    name: str
    underlay_ips: list[str]
    mode: str = "host-gw"
    ttl: int = DEFAULT_TTL
    device: str = DEFAULT_VXLAN_DEVICE
    vni: int = DEFAULT_VNI
    port: int = DEFAULT_VXLAN_PORT
    resync: float = RESYNC_SECONDS
    policy: bool = True  # enforce network policy (pycni.cluster.policy.agent); --no-policy opts out
    metrics_address: tuple[str, int] | None = None  # --metrics-address (pycni.cluster.metrics)
    flows: Any = None  # the --flows-* flags (an argparse.Namespace; None or --flows-socket '': flows off)
    bgp: Any = None  # bgp mode's pycni.cluster.bgp.agent.BgpOptions


def vtep_mac(name: str) -> str:
    """A stable, locally administered unicast MAC for node ``name``'s VTEP (same after a restart)."""
    import hashlib

    raw = hashlib.sha256(f"pycni-vtep\0{name}".encode()).digest()[:5]
    return ":".join(f"{b:02x}" for b in (0x0E, *raw))


def _underlay_link(ip: str) -> tuple[int, int]:
    """(index, MTU) of the link holding the underlay address ``ip``."""
    from pycni.net import addr, link

    want = ipaddr.ip_address(ip)
    for a in addr.list_addrs():
        if a.address.ip == want:
            found = link.require_link(a.index)
            return found.index, found.mtu
    raise invalid_config(f"underlay address {ip} is not on any interface of this node",
                         "give --underlay-ip an address this host holds (the one other nodes reach it on)")


class NameTaken(Exception):
    """Another live agent holds this node name (a different underlay address registered it)."""

    def __init__(self, name: str, other: NodeInfo | None, lease: int) -> None:
        where = ", ".join(other.underlay_ips) if other is not None else "an unreadable registration"
        super().__init__(f"node name {name} is held by another agent (underlay {where}, lease {lease:x})")
        self.name, self.other, self.lease = name, other, lease


def _same_node(a: NodeInfo, b: NodeInfo) -> bool:
    """Whether two registrations come from one node: the same underlay addresses (an agent restarted
    within its TTL takes its own registration over; a clone with the same name does not)."""
    return sorted(a.underlay_ips) == sorted(b.underlay_ips)


def claim_name(etcd: Etcd, key: str, info: NodeInfo, lease: int) -> bool:
    """Write our registration under ``lease`` only if the name is free or already ours (a create-if-
    absent; a compare on the revision seen when taking our own back). True when it replaced our own
    earlier registration; :class:`NameTaken` when another node holds the name."""
    from pycni.cluster.kv import if_absent, if_mod, op_get, op_put

    for _ in range(8):
        res = etcd.txn([if_absent(key)], [op_put(key, info.to_json(), lease=lease)], [op_get(key)])
        if res.succeeded:
            return False
        kv = res.responses[0][0] if res.responses and res.responses[0] else None
        if kv is None:
            continue  # gone meanwhile: try again
        other = NodeInfo.from_json(info.name, kv.value)
        if other is None or not _same_node(other, info):
            raise NameTaken(info.name, other, kv.lease)
        if etcd.txn([if_mod(key, kv.mod_revision)], [op_put(key, info.to_json(), lease=lease)]).succeeded:
            return True
    raise NameTaken(info.name, None, 0)  # (changing under us all along: someone else is writing it)


class Agent:
    """One node's agent: registration, lease, watch, convergence (see the module docstring)."""

    def __init__(self, opts: AgentOptions, out: Any = None) -> None:
        self.opts = opts
        self.view = ClusterView(opts.etcd.prefix)
        self.out = out if out is not None else sys.stderr
        self.stopping = False
        self.lease = 0
        self.mac = vtep_mac(opts.name) if opts.mode == "vxlan" else ""
        self.device = opts.device if opts.mode == "vxlan" else ""
        self.applied: Plan | None = None
        self.conflict = ""  # the last NameTaken logged while running
        self.registered = False  # once: a name taken at start is a refusal, later a logged conflict
        self.beat = time.monotonic()  # when the agent's loop last turned (/livez)
        self.watching = False  # following etcd's events (/readyz)
        self.trouble = ""  # why the last attempt to read or follow etcd failed, as logged ('' : none)
        self.metrics: AgentMetrics | None = None  # with --metrics-address (serve_metrics)
        self.policy: Any = None
        if opts.policy:
            from pycni.cluster.policy.agent import PolicyEnforcer
            from pycni.cluster.policy.compile import LogSpec
            from pycni.net import nft

            nft.use_library()  # long-lived: libnftables in-process, no nft exec per update
            flows = opts.flows is not None and bool(opts.flows.flows_socket)
            self.policy = PolicyEnforcer(self.view.keys, opts.name, self.log,
                                         logspec=LogSpec(group=opts.flows.flows_group) if flows else None)
        self.flows: Any = None  # the FlowService (pycni.cluster.flows), while running
        self.bgp: Any = None
        if opts.mode == "bgp":
            from pycni.cluster.bgp.agent import BgpDriver

            self.bgp = BgpDriver(opts.bgp, self.view.prefix, opts.name, self.log)

    def log(self, msg: str) -> None:
        now = time.time()
        stamp = time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        self.out.write(f"{stamp} pycni node {self.opts.name}: {msg}\n")
        self.out.flush()

    def stop(self, *_: object) -> None:
        self.stopping = True

    def live(self) -> str:
        """/livez: '' while the agent's loop turns (it may be retrying etcd: that is not a reason
        to restart it), else why not."""
        quiet = time.monotonic() - self.beat
        return "" if quiet < LIVE_WITHIN else f"the agent's loop has not turned for {quiet:.0f}s"

    def ready(self) -> str:
        """/readyz: '' when registered, following etcd, and the kernel as etcd says (routes, and
        the policy table when enforcing), else why not."""
        why = f": {self.trouble}" if self.trouble else ""
        if not self.lease:
            return f"not registered in etcd{why}"
        if not self.watching:
            return f"not following etcd{why}"
        if self.applied is None:
            return "routes not programmed (the last convergence failed; it is retried at the next event)"
        if self.policy is not None and (not self.policy.loaded or self.policy.writer.mirror is None):
            return "network policy not programmed yet"
        return ""

    def _client(self) -> Etcd:
        from pycni.cluster.settings import client

        return client(self.opts.etcd, one_shot=False)

    def node_key(self) -> str:
        return self.view.keys.node(self.opts.name)

    def setup_device(self) -> None:
        """vxlan mode: the device, its MTU the underlay's less the encapsulation."""
        if not self.device:
            return
        from pycni.net import vxlan

        local = next((ip for ip in self.opts.underlay_ips if ipaddr.ip_address(ip).version == 4), "")
        if not local:
            raise invalid_config("vxlan mode needs an IPv4 --underlay-ip",
                                 f"got {', '.join(self.opts.underlay_ips)}")
        index, mtu = _underlay_link(local)
        spec = vxlan.VxlanSpec(name=self.device, vni=self.opts.vni, local=local, port=self.opts.port,
                               mtu=mtu - vxlan.VXLAN_OVERHEAD_V4, mac=self.mac, underlay_index=index)
        dev, made = vxlan.ensure_vxlan(spec)
        self.mac = dev.mac
        if made:
            self.log(f"vxlan device {self.device} vni {self.opts.vni} port {self.opts.port} local {local} "
                     f"mtu {dev.mtu} mac {dev.mac}")

    def register(self, etcd: Etcd) -> None:
        """Claim our name: our key, bound to a fresh lease, written only if the name is free or
        registered by this node before (same underlay addresses); :class:`NameTaken` when another
        live agent holds it (kept only once the key is written: a failure half-way leaves the
        agent unregistered, to try again; the orphan lease just expires)."""
        lease = etcd.lease_grant(self.opts.ttl)
        info = self.info()
        try:
            took_over = claim_name(etcd, self.node_key(), info, lease)
        except NameTaken:
            etcd.lease_revoke(lease)
            raise
        self.lease = lease
        self.conflict = ""
        self.log(f"registered {self.node_key()} ({info.to_json()}) with a {self.opts.ttl}s lease"
                 + (" (took over this node's earlier registration)" if took_over else ""))

    def _refusal(self, e: NameTaken) -> Exception:
        where = ", ".join(e.other.underlay_ips) if e.other else "?"
        return invalid_config(f"refusing to start: {e}",
                              f"another agent registered {self.node_key()} from {where} and keeps it alive; this "
                              "one would take its routes. Give this node its own --node-name (a cloned machine "
                              "keeps its host name), or stop the other agent (then `pycni node remove "
                              f"{self.opts.name}`, or wait out its lease)")

    def info(self) -> NodeInfo:
        return NodeInfo(name=self.opts.name, underlay_ips=list(self.opts.underlay_ips), vtep_mac=self.mac,
                        policy=self.policy is not None)

    def keepalive(self, etcd: Etcd) -> None:
        """Renew the lease; one that lapsed anyway (etcd out of reach past the TTL, or revoked)
        means registering again."""
        if self.lease and etcd.lease_keepalive(self.lease) > 0:
            return
        self.lease = 0
        self.log("lease lapsed: registering again")
        self._reclaim(etcd)

    def _reclaim(self, etcd: Etcd) -> None:
        """Register again while running; another agent holding the name by now is logged (once per
        holder) and left alone — its routes are what the others follow — and tried again later."""
        try:
            self.register(etcd)
        except NameTaken as e:
            if str(e) != self.conflict:
                self.conflict = str(e)
                self.log(f"CONFLICT: {e}; not overwriting it (two nodes with one name? give one --node-name)")

    def sync(self, etcd: Etcd) -> int:
        """A full read (start, a broken watch), then converge (the kernel is read whatever the last
        plan was); returns the revision read."""
        rev = self.view.load(etcd)
        if self.metrics is not None:
            self.metrics.resyncs.inc()
        if self.policy is not None:
            self.policy.load(etcd, rev)  # (at rev: the watch from rev + 1 never replays an older state onto it)
        if self.bgp is not None:
            self.bgp.load(etcd)
        self.setup_device()  # (again: someone may have deleted it)
        self.apply(force=True)
        # What the full read left is long-lived (at 10,000 endpoints ~100 MB of records and index):
        # out of the cyclic collector's sight, so its full collections do not walk it all again
        # and stall an event for 100+ ms. (Frozen objects are still freed by reference counting.)
        gc.freeze()
        return rev

    def reconcile_kernel(self) -> None:
        """The periodic check (every ``resync`` seconds), inside the watch: the etcd watch is
        reliable and ordered (a compaction or a break ends it, and a full read follows), so what
        can drift is the kernel: the device, the routes (read back and repaired) and the policy
        table (:meth:`PolicyEnforcer.check_kernel`: the generation id, else read back off the event
        path)."""
        if self.metrics is not None:
            self.metrics.kernel_checks.inc()
        self.setup_device()
        self.apply(force=True)
        if self.policy is not None:
            self.policy.check_kernel()

    def apply(self, force: bool = False) -> int:
        """Converge to the current view; without ``force`` only when the plan changed (most
        events — a pod's handle — change nothing the kernel holds). Returns the changes made."""
        self.apply_policy()  # first: a new pod waits on it (routed's policySetupTimeout)
        want = plan(self.view, self.opts.name, self.opts.mode, self.device)
        if self.bgp is not None:
            self.bgp.update(self.view)
        if not force and want == self.applied:
            return 0
        # the peers as last applied (a full sync reads and repairs them, every resync period)
        same_peers = not force and self.applied is not None and want.peers == self.applied.peers
        changes, failed = converge(want, self.device, self.log, peers=not same_peers)
        self.applied = None if failed else want  # a refusal is tried again at the next event
        return changes

    def apply_policy(self, arrived: float = 0.0) -> None:
        """Program policy; ``arrived``: when the watch batch asking for it came (its latency is
        observed when the kernel took a change)."""
        if self.policy is not None:
            writes = self.policy.writes
            self.policy.apply(arrived)
            if arrived and self.metrics is not None and self.policy.writes != writes:
                self.metrics.policy_programming.observe(time.monotonic() - arrived)

    def start_flows(self) -> None:
        """With policy enforced and --flows-socket: the flow collector and its socket (docs/flows.md).
        Observability never stops enforcement: a failure to start is one logged line."""
        if self.policy is None or self.policy.logspec is None or self.opts.flows is None:
            return
        from pycni.cluster.flows.service import FlowService
        from pycni.unixsock import Refused

        try:
            self.flows = FlowService.from_args(self.opts.flows, self.policy.resolver(),
                                               metrics=None if self.metrics is None else self.metrics.flows)
            if self.flows is not None:
                self.flows.start()
        except (OSError, ValueError, Refused) as e:  # (a live agent's socket, a bound group, no permission)
            self.flows = None
            self.log(f"flows: not collected ({e}); policy is enforced as before")
            return
        self.log(f"flows: NFLOG group {self.opts.flows.flows_group}, asked at {self.opts.flows.flows_socket}")

    def run(self) -> int:
        """Until SIGTERM/SIGINT: register, then resync and watch, resyncing after any interruption."""
        from pycni.cluster.etcd import EtcdError, EtcdUnavailable, WatchBroken
        from pycni.spec.errors import CNIError

        for ip in self.opts.underlay_ips:
            _underlay_link(ip)  # refuse an address this host does not hold, before registering it
        self.setup_device()
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        if self.opts.metrics_address is not None:
            self.serve_metrics(self.opts.metrics_address)
        self.start_flows()
        etcd = self._client()
        self.log(f"starting: mode {self.opts.mode}, underlay {', '.join(self.opts.underlay_ips)}, "
                 f"etcd {', '.join(self.opts.etcd.endpoints)}, prefix {self.view.prefix}")
        pause = 0.5
        unreachable = ""  # why etcd was last out of reach, as logged ('' when it answers)
        try:
            while not self.stopping:
                self.beat = time.monotonic()
                try:
                    if not self.lease and not self.registered:
                        try:
                            self.register(etcd)
                        except NameTaken as e:
                            raise self._refusal(e) from None
                        self.registered = True
                    elif not self.lease:
                        self._reclaim(etcd)
                    rev = self.sync(etcd)
                    self.trouble = ""
                    if unreachable:
                        self.log("etcd answers again")
                        unreachable = ""
                    try:
                        self._watch(etcd, rev)
                    finally:
                        self.watching = False
                    pause = 0.5
                except WatchBroken as e:
                    self._count_error("watch")
                    self.trouble = f"watch interrupted ({e})"
                    self.log(f"watch interrupted ({e}): resyncing")
                    self._sleep(0.1)
                except CNIError as e:
                    if not self.registered and e.code == 7:
                        raise
                    self._count_error("config" if e.code == 7 else "etcd")
                    self.trouble = f"{e.msg}: {e.details}"
                    self.log(f"{e.msg}: {e.details}: retrying in {pause:g}s")
                    self._sleep(pause)
                    pause = min(pause * 2, 5.0)
                except EtcdUnavailable as e:
                    self._count_error("etcd_unavailable")
                    # said once, clearly (and again only when the reason changes); retried with backoff
                    said = "every endpoint refused the connection" if e.refused else f"no answer within " \
                        f"{e.timeout:g}s ({'; '.join(f'{ep}: {why}' for ep, why in e.errors.items())})"
                    self.trouble = f"cannot reach etcd: {said}"
                    if said != unreachable:
                        self.log(f"cannot reach etcd at {', '.join(self.opts.etcd.endpoints)}: {said}; retrying "
                                 f"with backoff (up to every {MAX_BACKOFF:g}s) until it answers")
                        unreachable = said
                    self._sleep(pause)
                    pause = min(pause * 2, MAX_BACKOFF)
                except EtcdError as e:
                    self._count_error("etcd")
                    self.trouble = e.msg + ': ' + e.details if isinstance(e, CNIError) else 'etcd: ' + str(e)
                    self.log(f"{self.trouble}: "
                             f"retrying in {pause:g}s")
                    self._sleep(pause)
                    pause = min(pause * 2, 5.0)
        finally:
            etcd.close()
            if self.flows is not None:
                self.flows.stop()
        self.log("stopped (routes left in place)")
        return 0

    def serve_metrics(self, address: tuple[str, int]) -> None:
        """Count what the agent does and serve it at http://ADDRESS/metrics (pycni.cluster.metrics),
        with the agent's own /livez and /readyz (:meth:`live`, :meth:`ready`); an address that
        cannot be bound refuses the start (code 7, one line)."""
        from pycni import metrics
        from pycni.cluster.metrics import AgentMetrics

        reg = metrics.registry()
        self.metrics = AgentMetrics(self, reg)
        try:
            metrics.serve(address, reg, health=self)
        except OSError as e:
            raise invalid_config(f"cannot serve metrics on {address[0]}:{address[1]}",
                                 e.strerror or str(e)) from None
        self.log(f"metrics at http://{address[0]}:{address[1]}/metrics, probes at /livez and /readyz")

    def _count_error(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.errors.labels(kind).inc()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            self.beat = time.monotonic()
            time.sleep(min(0.2, end - time.monotonic()))

    def _watch(self, etcd: Etcd, rev: int) -> None:
        """Follow events from ``rev`` + 1; keep the lease alive; check the kernel every ``resync``
        seconds (without leaving the watch)."""
        interval = max(1.0, self.opts.ttl / 3)
        next_keepalive = time.monotonic() + interval
        next_check = time.monotonic() + self.opts.resync
        with etcd.watch(f"{self.view.prefix}/", prefix=True, start_revision=rev + 1) as w:
            self.watching = True
            while not self.stopping:
                self.beat = now = time.monotonic()
                if now >= next_keepalive:
                    self.keepalive(etcd)
                    next_keepalive = now + interval
                if now >= next_check:
                    self.reconcile_kernel()
                    next_check = now + self.opts.resync
                # (a periodic check in progress: how long events may be waited for before it goes on)
                checking = self.policy.poll_kernel() if self.policy is not None else None
                if self.bgp is not None:
                    self.bgp.tick()
                if checking == 0.0 and not w.ready():
                    batch = None  # (comparing a read-back, a step a turn: no event is waiting)
                else:
                    batch = w.next(timeout=0.05 if checking is not None else
                                   min(1.0, max(0.05, min(next_keepalive, next_check) - now)))
                touched = policy_touched = False
                arrived = time.monotonic()
                drain_until = arrived + 0.05
                events = 0
                last_rev = 0
                while batch is not None:
                    events += len(batch.events)
                    last_rev = max(last_rev, batch.revision)
                    for ev in batch.events:
                        if self.policy is not None:
                            policy_touched |= self.policy.event(ev.type, ev.kv.key, ev.kv.value)
                        if self.bgp is not None:
                            touched |= self.bgp.event(ev.type, ev.kv.key, ev.kv.value)
                        if ev.type == "DELETE":
                            touched |= self.view.delete(ev.kv.key)
                        else:
                            touched |= self.view.put(ev.kv.key, ev.kv.value)
                    # take what is already queued before converging: a burst of claims is one pass
                    # (only what has arrived: waiting even 2 ms per event is 2 ms more on every route,
                    # and far more on a loaded host, where a sleeper waits for a CPU to wake up)
                    batch = w.next(timeout=0.002) if time.monotonic() < drain_until and w.ready() else None
                if policy_touched:
                    self.apply_policy(arrived)  # (a policy, label or endpoint change moves no route)
                if touched:
                    if self.opts.name not in self.view.nodes:
                        # our key gone while we run (deleted by hand, or our lease revoked): this
                        # node is still here
                        self.log("registration gone while running: registering again")
                        self._reclaim(etcd)
                    elif not _same_node(self.view.nodes[self.opts.name], self.info()) and \
                            f"{self.view.nodes[self.opts.name].underlay_ips}" not in self.conflict:
                        # overwritten by someone not claiming (an older agent, a hand edit)
                        self.conflict = f"{self.view.nodes[self.opts.name].underlay_ips}"
                        self.log(f"CONFLICT: {self.node_key()} now says underlay "
                                 f"{', '.join(self.view.nodes[self.opts.name].underlay_ips)}, not this node's; "
                                 "the other nodes route our blocks there")
                    drained = time.monotonic()
                    cpu, queued = _sched()
                    changes = self.apply()
                    if changes and self.metrics is not None:
                        self.metrics.route_changes.inc(changes)
                        self.metrics.convergence.observe(time.monotonic() - arrived)
                    if changes:
                        # the agent's own share of a convergence (its wall time from the watch's
                        # answer to the last change), split: CPU time it used converging, time it
                        # waited for a CPU (the host's load), and the rest, blocked in the kernel
                        end = time.monotonic()
                        cpu2, queued2 = _sched()
                        conv = end - drained
                        self.log(f"applied rev {last_rev}: {events} events, {(end - arrived) * 1000:.1f} ms "
                                 f"after they arrived (drain {(drained - arrived) * 1000:.1f} ms, "
                                 f"converge {conv * 1000:.1f} ms, cpu {(cpu2 - cpu) * 1000:.1f} ms, "
                                 f"waiting for a cpu {(queued2 - queued) * 1000:.1f} ms, blocked "
                                 f"{max(0.0, conv - (cpu2 - cpu) - (queued2 - queued)) * 1000:.1f} ms)")


def _sched() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of this thread, from the
    scheduler's own accounting (/proc/thread-self/schedstat); CPU time alone when it is absent."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            run, wait, _ = f.read().split()
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0


# ---- operator commands --------------------------------------------------------------------------


def status_lines(opts: AgentOptions, etcd: Etcd) -> tuple[list[str], bool]:
    """What this node has programmed against what etcd asks of it; (lines, in sync)."""
    view = ClusterView(opts.etcd.prefix)
    view.load(etcd)
    me = view.nodes.get(opts.name)
    mode = opts.mode or ("vxlan" if me is not None and me.vtep_mac else "host-gw")  # as registered
    device = opts.device if mode == "vxlan" else ""
    want = plan(view, opts.name, mode, device)
    have = read_kernel(device)
    lines = [f"node {opts.name}: {'registered ' + ', '.join(me.underlay_ips) if me else 'NOT registered'}; "
             f"mode {mode}; etcd: {len(view.nodes)} nodes, {len(view.blocks())} blocks"]
    ok = me is not None
    if me is not None:
        from pycni.net import addr

        here = {str(a.address.ip) for a in addr.list_addrs()}
        if not here & set(me.underlay_ips):
            ok = False
            lines.append(f"CONFLICT: {opts.name} is registered from {', '.join(me.underlay_ips)}, which is not an "
                         "address of this host: another agent holds this name, and the other nodes route this "
                         "node's blocks there (give one of the two its own --node-name)")
    for cidr, hop in sorted(want.routes.items()):
        cur = have.routes.get(cidr)
        state = "programmed" if cur is not None and _same(cur, hop) else (
            "LOCAL (a pod of this node holds it; left alone)" if cidr in have.local and not hop.blackhole else
            "MISSING" if cur is None else f"DIFFERS (kernel: {describe(cidr, cur)})")
        ok &= state == "programmed"
        whose = "this node's block" if hop.blackhole else f"node {hop.node}"
        lines.append(f"route {describe(cidr, hop)} ({whose}): {state}")
    for cidr, hop in sorted(have.routes.items()):
        if cidr not in want.routes:
            ok = False
            lines.append(f"route {describe(cidr, hop)}: EXTRA (etcd no longer asks for it)")
    for info in sorted(want.peers.values(), key=lambda i: i.name):
        vtep = info.underlay(4)
        good = all(have.neighbours.get(ip) == mac for ip, mac in info.vtep_neighbours().items()) and \
            have.fdb.get(info.vtep_mac) == vtep
        ok &= good
        lines.append(f"vtep {info.name} {vtep} {info.vtep_mac}: {'programmed' if good else 'MISSING'}")
    lines.extend(f"skipped {s}" for s in want.skipped)
    return lines, ok


def print_status(ns: argparse.Namespace, opts: AgentOptions, etcd: Etcd) -> int:
    """``pycni node status``: every registered node (whether it enforces network policy among its
    columns), then this node's routes against what etcd asks (when ``--node-name`` is given or the
    host name is registered); EXIT_NO (3) when this node is not in sync."""
    from pycni.output import EXIT_NO, emit

    view = ClusterView(opts.etcd.prefix)
    view.load(etcd)
    owners: dict[str, int] = {}
    for node in view.blocks().values():
        owners[node] = owners.get(node, 0) + 1
    checked = ns.node_name or (opts.name if opts.name in view.nodes else "")
    lines, in_sync = status_lines(opts, etcd) if checked else ([], True)
    items: list[dict[str, Any]] = []
    for name, info in sorted(view.nodes.items()):
        item: dict[str, Any] = {"name": name, "underlayIPs": list(info.underlay_ips),
                                "mode": "vxlan" if info.vtep_mac else "host-gw", "policy": info.policy,
                                "blocks": owners.get(name, 0), "vtepMAC": info.vtep_mac}
        if name == checked:
            item.update(status=lines, inSync=in_sync)
        items.append(item)
    emit(ns.output, items, [("NAME", "name"), ("UNDERLAY", "underlayIPs"), ("MODE", "mode"),
                            ("POLICY", lambda i: "enforced" if i["policy"] else "off"), ("BLOCKS", "blocks")],
         wide=[("VTEP-MAC", "vtepMAC")], empty=f"no node is registered under {opts.etcd.prefix}")
    if lines and ns.output not in ("json", "yaml"):
        print(("\n" if items else "") + "\n".join(lines))
    return 0 if in_sync else EXIT_NO


def remove_node(etcd: Etcd, prefix: str, name: str) -> bool:
    """Delete node ``name``'s registration and revoke its lease: every agent drops its routes."""
    key = Keys(prefix).node(name)
    kv = etcd.get(key)
    if kv is None:
        return False
    if kv.lease:
        etcd.lease_revoke(kv.lease)
    etcd.delete(key)
    etcd.delete(Keys(prefix).bgp_node(name))  # (bgp mode: it no longer speaks BGP either)
    return True


# ---- command line -------------------------------------------------------------------------------


def add_arguments(sp: argparse.ArgumentParser) -> None:
    from pycni.cluster.policy.workload import TABLE

    sp.add_argument("action", nargs="?", default="run", choices=("run", "status", "remove"),
                    help="run the agent (default), print status, or remove node NAME for good")
    sp.add_argument("target", nargs="?", metavar="NAME", help="the node to remove")
    from pycni.cluster.settings import add_etcd_arguments

    add_etcd_arguments(sp)
    sp.add_argument("--node-name", default="", help="this node's name (default: the host name)")
    sp.add_argument("--underlay-ip", default="",
                    help="the address other nodes reach this one on; IPv4 and IPv6 comma-separated")
    sp.add_argument("--mode", choices=("host-gw", "vxlan", "bgp"),
                    help="how blocks reach nodes (default host-gw; for status: the mode the node registered)")
    sp.add_argument("--ttl", type=int, default=DEFAULT_TTL,
                    help=f"registration lease in seconds: how long a silent node keeps its routes "
                         f"(default {DEFAULT_TTL})")
    sp.add_argument("--resync", type=float, default=RESYNC_SECONDS, metavar="SECONDS",
                    help=f"check the kernel every SECONDS (default {RESYNC_SECONDS:g}) without leaving the etcd "
                         "watch: the device and routes are read back and repaired; the policy table is read back "
                         "(off the event path) only when something was committed to nftables since the agent's "
                         "own last commit, and the difference written. etcd is read in full only at start and "
                         "when the watch breaks")
    sp.add_argument("--vxlan-device", default=DEFAULT_VXLAN_DEVICE, help="vxlan device name")
    sp.add_argument("--vxlan-vni", type=int, default=DEFAULT_VNI, help=f"VNI (default {DEFAULT_VNI})")
    sp.add_argument("--vxlan-port", type=int, default=DEFAULT_VXLAN_PORT,
                    help=f"UDP port (default {DEFAULT_VXLAN_PORT})")
    sp.add_argument("--policy", dest="policy", action="store_true", default=True,
                    help=f"enforce network policy on this node's pods (the default: nftables table inet "
                         f"{TABLE}; see docs/policy.md)")
    sp.add_argument("--no-policy", dest="policy", action="store_false",
                    help="do not enforce network policy here (`pycni node status` shows it; `policy apply` warns "
                         "when no node enforces)")
    from pycni.output import add_output_argument

    add_output_argument(sp, "nodes (status)")
    from pycni.metrics import add_argument as add_metrics_argument

    add_metrics_argument(sp)
    from pycni.cluster.bgp.agent import add_arguments as bgp_arguments

    bgp_arguments(sp)  # --as-number, --bgp-state-dir, ... (bgp mode: docs/cluster.md)
    from pycni.cluster.flows.service import add_arguments as flows_arguments

    flows_arguments(sp)  # --flows-socket, --flows-group, ... (docs/flows.md)


def options(ns: argparse.Namespace, *, need_underlay: bool) -> AgentOptions:
    """Validated options; CNIError 7 naming the flag for anything wrong."""
    import socket

    from pycni.cluster.settings import etcd_settings_from_args

    etcd = etcd_settings_from_args(ns, AGENT_ETCD_TIMEOUT)
    ips = [i.strip() for i in ns.underlay_ip.split(",") if i.strip()]
    for ip in ips:
        try:
            ipaddr.ip_address(ip)
        except ValueError:
            raise invalid_config(f"invalid --underlay-ip {ip!r}", "give an IP address") from None
    if need_underlay and not ips:
        raise invalid_config("--underlay-ip is required", "the address other nodes reach this one on")
    if ns.ttl < 2:
        raise invalid_config("--ttl must be at least 2 seconds", f"got {ns.ttl}")
    if not getattr(ns, "resync", RESYNC_SECONDS) >= 1:
        raise invalid_config("--resync must be at least 1 second", f"got {ns.resync}")
    if not 0 < ns.vxlan_vni < 1 << 24 or not 0 < ns.vxlan_port < 65536 or not 0 < len(ns.vxlan_device) < 16:
        raise invalid_config("invalid vxlan settings",
                             "--vxlan-vni 1..16777215, --vxlan-port 1..65535, --vxlan-device up to 15 characters")
    if hasattr(ns, "flows_socket") and not (0 <= ns.flows_group <= 65535 and ns.flows_capacity >= 1
                                            and ns.flows_rate > 0):
        raise invalid_config("invalid flows settings",
                             "--flows-group 0..65535, --flows-capacity at least 1, --flows-rate above 0")
    # no --mode: the agent runs host-gw; status goes by the mode the node registered ("")
    mode = ns.mode or ("host-gw" if need_underlay else "")
    return AgentOptions(etcd=etcd, name=ns.node_name or socket.gethostname(), underlay_ips=ips, mode=mode,
                        ttl=ns.ttl, resync=getattr(ns, "resync", RESYNC_SECONDS), device=ns.vxlan_device,
                        vni=ns.vxlan_vni, port=ns.vxlan_port,
                        policy=bool(getattr(ns, "policy", True)),
                        metrics_address=getattr(ns, "metrics_address", None), bgp=_bgp_options(ns, mode),
                        flows=ns if hasattr(ns, "flows_socket") else None)


def _bgp_options(ns: argparse.Namespace, mode: str) -> Any:
    from pycni.cluster.bgp.agent import options as bgp_options

    return bgp_options(ns) if mode == "bgp" else None


def main(ns: argparse.Namespace) -> int:
    """``pycni node [run|status|remove NAME] ...``; etcd out of reach is CNIError 11."""
    from pycni.cluster.etcd import EtcdUnavailable
    from pycni.cluster.settings import client
    from pycni.spec.errors import TRY_AGAIN, CNIError, invalid_config

    opts = options(ns, need_underlay=ns.action == "run")
    try:
        if ns.action == "run":
            return Agent(opts).run()
        with client(opts.etcd, one_shot=True) as etcd:
            if ns.action == "remove":
                if not ns.target:
                    raise invalid_config("pycni node remove needs the node's NAME")
                if not remove_node(etcd, opts.etcd.prefix, ns.target):
                    sys.stderr.write(f"pycni: node {ns.target} is not registered under {opts.etcd.prefix} "
                                     "(`pycni node status` lists the nodes)\n")
                    return 1
                # The registration is gone; an agent still running there writes it again at once.
                print(f"node {ns.target}: removed; if its agent (`pycni node`) still runs on {ns.target} it "
                      "registers the node again within seconds: stop the agent first to remove the node for good")
                return 0
            return print_status(ns, opts, etcd)
    except EtcdUnavailable as e:
        from pycni.cluster.session import raise_mapped

        raise_mapped(e, TRY_AGAIN, "")
        raise CNIError(TRY_AGAIN, "etcd unavailable", str(e)) from None
