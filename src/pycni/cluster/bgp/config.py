"""What BIRD should say on one node, derived from etcd, and the text of its configuration.

The inputs are the agent's :class:`pycni.cluster.node.ClusterView` (registered nodes, block
affinities, handles) and a :class:`BgpState` (``P/bgp/``: the cluster's BGP settings, the external
peers and each BGP node's AS). :func:`desired` turns them into a :class:`Desired` — the prefixes
this node announces and the sessions it holds — and :func:`render` into BIRD 2's configuration.
Both are pure, so the agent re-renders on every change and reloads BIRD only when the text moved.
"""

from __future__ import annotations

from pycni import ipaddr
from pycni.cluster.model import DEFAULT_AS, BgpConfig, BgpPeer, Keys, bgp_node_as
from pycni.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pycni.cluster.kv import KVStore
    from pycni.cluster.node import ClusterView
    from pycni.ipranges import IPNetwork


@record
class Timers:
    """The BGP timers of every session (seconds): hold, keepalive, connect retry, and how long
    peers keep this node's routes while its BIRD restarts (graceful restart)."""

    hold: int = 90
    keepalive: int = 30
    connect_retry: int = 5
    restart: int = 120

    @classmethod
    def from_hold(cls, hold: int, restart: int = 120) -> Timers:
        return cls(hold=hold, keepalive=max(1, hold // 3), connect_retry=max(1, min(5, hold // 3)), restart=restart)


@record
class Session:
    """One BGP session of this node. ``kind``: "mesh" (another node, full mesh), "reflector" (a
    route reflector this node is a client of, or another reflector), "client" (a node this
    reflector serves) or "external" (a router outside the cluster)."""

    name: str          # the BIRD protocol name (an identifier)
    kind: str
    peer: str          # the node's or the peer's name
    address: str
    as_number: int
    local: str         # this node's address of the same family


@record
class Desired:
    """BIRD's inputs on one node: its identity, what it announces, whom it talks to."""

    node: str
    router_id: str
    as_number: int
    announce: list[str] = field(default_factory=list)    # aggregated blocks + borrowed /32 (/128)
    sessions: list[Session] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class BgpState:
    """``P/bgp/`` as the agent sees it: settings, external peers, each BGP node's AS."""

    def __init__(self, prefix: str) -> None:
        self.keys = Keys(prefix)
        self.config = BgpConfig()
        self.peers: dict[str, BgpPeer] = {}
        self.node_as: dict[str, int] = {}

    def load(self, kv: KVStore) -> None:
        kvs, _ = kv.get_prefix(self.keys.bgp)
        self.config, self.peers, self.node_as = BgpConfig(), {}, {}
        for item in kvs:
            self.put(item.key, item.value)

    def put(self, key: str, value: str) -> bool:
        """Apply one key's new value; True when it is under ``P/bgp/``."""
        parsed = self.keys.parse(key) if key.startswith(self.keys.bgp) else None
        if parsed is None:
            return key.startswith(self.keys.bgp)
        if parsed.kind == "bgpconfig":
            self.config = BgpConfig.from_json(value)
        elif parsed.kind == "bgppeer":
            peer = BgpPeer.from_json(parsed.name, value)
            if peer is None:
                self.peers.pop(parsed.name, None)
            else:
                self.peers[parsed.name] = peer
        elif parsed.kind == "bgpnode":
            n = bgp_node_as(value)
            if n:
                self.node_as[parsed.name] = n
            else:
                self.node_as.pop(parsed.name, None)
        return True

    def delete(self, key: str) -> bool:
        parsed = self.keys.parse(key) if key.startswith(self.keys.bgp) else None
        if parsed is None:
            return key.startswith(self.keys.bgp)
        if parsed.kind == "bgpconfig":
            self.config = BgpConfig()
        elif parsed.kind == "bgppeer":
            self.peers.pop(parsed.name, None)
        elif parsed.kind == "bgpnode":
            self.node_as.pop(parsed.name, None)
        return True


def aggregate(nets: list[IPNetwork]) -> list[IPNetwork]:
    """The fewest prefixes covering exactly ``nets``: contained ones dropped, sibling pairs merged."""
    out: list[IPNetwork] = []
    for version in (4, 6):
        cur = sorted({n for n in nets if n.version == version}, key=lambda n: (int(n.network_address), n.prefixlen))
        changed = True
        while changed:
            changed = False
            kept: list[IPNetwork] = []
            for n in cur:
                if kept and n.subnet_of(kept[-1]):  # type: ignore[arg-type]
                    changed = True
                    continue
                if kept and kept[-1].prefixlen == n.prefixlen and n.prefixlen > 0:
                    parent = kept[-1].supernet()
                    if n.subnet_of(parent) and parent.network_address == kept[-1].network_address:  # type: ignore[arg-type]
                        kept[-1] = parent
                        changed = True
                        continue
                kept.append(n)
            cur = kept
        out.extend(cur)
    return out


def announced(view: ClusterView, me: str) -> list[str]:
    """This node's affine blocks, aggregated, and the host prefix of every address it borrowed
    from another node's block — nothing else (never what it learned)."""
    blocks = view.blocks()
    own = [ipaddr.ip_network(c) for c, owner in blocks.items() if owner == me]
    nets = [(ipaddr.ip_network(c), o) for c, o in blocks.items()]
    borrowed: list[str] = []
    for node, ips in view.handles.values():
        if node != me:
            continue
        for ip in ips:
            a = ipaddr.ip_address(ip)
            holder = next((o for n, o in nets if n.version == a.version and a in n), None)
            if holder is not None and holder != me:
                borrowed.append(f"{ip}/{a.max_prefixlen}")
    return [str(n) for n in aggregate(own)] + sorted(set(borrowed))


def protocol_name(kind: str, peer: str, version: int) -> str:
    """A BIRD protocol name (letters, digits, '_') for a session, unique per (kind, peer, family)."""
    import hashlib

    clean = "".join(c if c.isalnum() else "_" for c in peer)
    if clean != peer:  # two names differing only in punctuation must not meet
        clean += "_" + hashlib.sha256(peer.encode()).hexdigest()[:6]
    return f"{'node' if kind != 'external' else 'peer'}_{clean}_v{version}"


def _router_id(name: str) -> str:
    """A stable router ID for a node without an IPv4 address (BGP's ID is 32 bits, IPv4-shaped)."""
    import hashlib

    return str(ipaddr.IPv4Address(int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") | 1))


def desired(view: ClusterView, state: BgpState, me: str, as_number: int = 0) -> Desired:
    """This node's announcements and sessions. ``as_number`` 0: the cluster's (``pycni bgp config``)."""
    my_as = as_number or state.config.as_number or DEFAULT_AS
    info = view.nodes.get(me)
    underlay = {4: info.underlay(4), 6: info.underlay(6)} if info is not None else {4: "", 6: ""}
    out = Desired(node=me, router_id=underlay[4] or _router_id(me), as_number=my_as, announce=announced(view, me))
    cfg = state.config
    reflectors = set(cfg.route_reflectors)
    # BGP nodes: registered (alive) and running in bgp mode (a BGP record)
    bgp_nodes = sorted(n for n in view.nodes if n != me and n in state.node_as)
    if cfg.mesh:
        pairs = [(n, "mesh") for n in bgp_nodes]
    elif me in reflectors:
        pairs = [(n, "reflector" if n in reflectors else "client") for n in bgp_nodes]
    else:
        pairs = [(n, "reflector") for n in bgp_nodes if n in reflectors]
    for name, kind in pairs:
        other = view.nodes[name]
        if kind == "client" and state.node_as[name] != my_as:
            # route reflection is within one AS: a node of another AS gets a plain session
            out.skipped.append(f"node {name} (AS {state.node_as[name]}) cannot be a route-reflector client of "
                               f"AS {my_as}: peering with it as an ordinary eBGP neighbour")
            kind = "mesh"
        for version in (4, 6):
            if underlay[version] and other.underlay(version):
                out.sessions.append(Session(name=protocol_name(kind, name, version), kind=kind, peer=name,
                                            address=other.underlay(version), as_number=state.node_as[name],
                                            local=underlay[version]))
    for peer in sorted(state.peers.values(), key=lambda p: p.name):
        if peer.node and peer.node != me:
            continue
        version = ipaddr.ip_address(peer.peer_ip).version
        if not underlay[version]:
            out.skipped.append(f"peer {peer.name} ({peer.peer_ip}): this node registered no IPv{version} address")
            continue
        out.sessions.append(Session(name=protocol_name("external", peer.name, version), kind="external",
                                    peer=peer.name, address=peer.peer_ip, as_number=peer.as_number,
                                    local=underlay[version]))
    return out


def render(want: Desired, timers: Timers, log_path: str) -> str:
    """BIRD 2's configuration for ``want``.

    - static protocols ``pycni_export4/6`` hold the announced prefixes as blackholes (BIRD's own
      table only: the kernel protocols export nothing but BGP routes, and the agent blackholes its
      blocks itself), and every session exports only those — a reflector also what other nodes
      told it (iBGP routes: an empty AS path) to its clients;
    - kernel protocols install what BGP learned (proto ``bird``), with graceful restart so a
      restarted BIRD (started with ``-R``) keeps them until its sessions are back;
    - every session has graceful restart on: its peers keep this node's routes while BIRD restarts.
    """
    lines = [f"# pycni node {want.node}: BIRD's configuration, written by the agent from etcd; edits are overwritten",
             f'log "{log_path}" {{ info, remote, warning, error, auth, fatal, bug }};',
             f"router id {want.router_id};",
             "timeformat protocol iso long;",
             f"graceful restart wait {max(10, timers.restart)};",
             "protocol device { scan time 10; }"]
    families = {ipaddr.ip_network(p).version for p in want.announce} | {4} | \
        {ipaddr.ip_address(s.address).version for s in want.sessions}
    for v in sorted(families):
        lines.append(f"protocol kernel pycni_kernel{v} {{\n  ipv{v} {{ import none; export where source = RTS_BGP; }};"
                     "\n  metric 32; graceful restart on;\n}")
        routes = "".join(f"\n  route {p} blackhole;" for p in want.announce if ipaddr.ip_network(p).version == v)
        lines.append(f"protocol static pycni_export{v} {{\n  ipv{v};{routes}\n}}")
    local = {ipaddr.ip_address(s.local).version: s.local for s in want.sessions}
    own = " || ".join(f'proto = "pycni_export{v}"' for v in sorted(families))
    nh = "".join(f'  if proto = "pycni_export{v}" then {{ bgp_next_hop = {local[v]}; accept; }}\n'
                 for v in sorted(families) if v in local)
    lines.append(f"filter pycni_to_nodes {{\n{nh}  reject;\n}}")
    lines.append(f"filter pycni_to_clients {{\n{nh}  if source = RTS_BGP && bgp_path.len = 0 then accept;\n"
                 "  reject;\n}")
    lines.append(f"filter pycni_to_external {{\n  if {own} then accept;\n  reject;\n}}")
    for s in want.sessions:
        v = ipaddr.ip_address(s.address).version
        export = {"external": "pycni_to_external", "client": "pycni_to_clients"}.get(s.kind, "pycni_to_nodes")
        extra = "\n  rr client;" if s.kind == "client" else ""
        lines.append(
            f"protocol bgp {s.name} {{\n"
            f'  description "{s.kind} {s.peer}";\n'
            f"  local {s.local} as {want.as_number};\n"
            f"  neighbor {s.address} as {s.as_number};\n"
            f"  direct;{extra}\n"
            f"  hold time {timers.hold}; keepalive time {timers.keepalive};\n"
            f"  connect retry time {timers.connect_retry};\n"
            f"  graceful restart on; graceful restart time {timers.restart};\n"
            f"  ipv{v} {{ import all; export filter {export}; }};\n"
            "}")
    return "\n".join(lines) + "\n"
