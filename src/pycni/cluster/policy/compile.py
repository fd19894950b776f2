"""From endpoints, namespaces and policies to the nftables objects one node must hold (pure).

The layout (table ``inet pycni_policy``; docs/policy.md draws it):

- two base chains on the forward hook: ``wl_egress`` (priority filter - 2) judges what a
  workload sends, ``wl_ingress`` (filter - 1) what it receives; an ``accept`` in the first hands
  the packet to the second, a ``drop`` is final. Each accepts conntrack established/related
  first, and ICMPv6 neighbour discovery; then **fails closed**: a routed host interface
  (``rtd*``) that is not yet in the ``covered`` set is dropped — a pod the agent has not
  programmed yet (just made, or the agent is down) sends and receives nothing; then a
  ``vmap`` keyed by the host-side interface name jumps to the endpoint's verdict chain. Traffic
  between a pod and its own node never crosses forward: always allowed, as Kubernetes wants.
- per distinct set of policies selecting some local endpoint for a direction, a verdict chain
  ``v_<hash>_in`` / ``v_<hash>_eg``: a jump to each of those policies' chains, then ``drop``,
  shared by every endpoint they select (its map element jumps there); an endpoint selected by
  nothing gets no map element (allow), or ``drop`` when its network's ``defaultPolicy`` is deny.
- per policy that selects some local endpoint, ``p_<hash>_in`` / ``p_<hash>_eg``: one rule per
  (peer, port) of each of its rules, ending in ``accept``; shared by every endpoint it selects.
- named sets of pod addresses per selector (``s_<hash>_4`` / ``_6``) and per named port
  (``np_<name>_4`` / ``_6``: address . protocol . port of every pod naming a port so), so an
  endpoint or label change is a set element change, not a rule change.

:mod:`pycni.cluster.policy.index` keeps a :class:`Desired` up to date event by event (the
agent's path); :func:`compile_full` computes it from nothing and is kept only as the oracle the
tests compare the index with. This module holds what both share: the names of the objects and
the rules a policy renders to. :mod:`pycni.cluster.policy.nftsync` writes a :class:`Desired` to
the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from pycni.cluster.policy.evaluate import EGRESS, INGRESS, Workload
from pycni.cluster.policy.model import NetworkPolicy, Peer, PeerSelector, PolicyPort, namespace_labels

HOST_PREFIX = "rtd"  # routed's host interfaces (pycni.plugins.main.routed.HOST_PREFIX)
ND_TYPES = "nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert"
SET_TYPES = {4: "ipv4_addr", 6: "ipv6_addr"}
PORT_SET_TYPES = {4: "ipv4_addr . inet_proto . inet_service", 6: "ipv6_addr . inet_proto . inet_service"}
_FAM = {4: "ip", 6: "ip6"}


@dataclass
class Desired:
    """Everything of ours one node's kernel should hold (besides the static base chains)."""

    sets: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # name -> (type, elements)
    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)           # name -> rules
    ingress: dict[str, str] = field(default_factory=dict)                      # iface -> verdict
    egress: dict[str, str] = field(default_factory=dict)
    covered: frozenset[str] = frozenset()
    # a chain's comment, given when it is made (a policy chain's says NS/NAME and the direction:
    # what a verdict is attributed to); not compared, a chain's name fixes it
    comments: dict[str, str] = field(default_factory=dict, compare=False, repr=False)


@lru_cache(maxsize=1 << 16)
def _h(text: str) -> str:
    from hashlib import blake2b

    return blake2b(text.encode(), digest_size=5).hexdigest()


def rule_tag(rule: str) -> str:
    """The comment a rule carries in the kernel: a digest of its text, so a rule read back is
    compared with the one wanted without parsing nft's rendering of it."""
    return _h(rule)


def policy_chain(policy: NetworkPolicy, direction: str) -> str:
    return f"p_{_h(policy.key)}_{'in' if direction == INGRESS else 'eg'}"


def policy_comment(policy: NetworkPolicy, direction: str) -> str:
    """A policy chain's comment: NAMESPACE/NAME and the direction, naming it back."""
    return f"{policy.key} {direction.lower()}"


def verdict_chain_name(policy_keys: tuple[str, ...], direction: str) -> str:
    """The verdict chain shared by every local pod these policies (NS/NAME, in key order) select
    for ``direction``: one per distinct selection, so the ruleset grows with endpoints (map
    elements) plus rules, not endpoints times the policies selecting each."""
    return f"v_{_h(direction + ':' + ','.join(policy_keys))}_{'in' if direction == INGRESS else 'eg'}"


def selector_set(key: tuple[object, ...], version: int) -> str:
    return f"s_{_h(repr(key))}_{version}"


def port_set(name: str, version: int) -> str:
    return f"np_{name.replace('-', '_')}_{version}"


def _port_matches(pp: PolicyPort) -> list[tuple[int, str]]:
    """A ports entry as nft matches: (family or 0 for both, text)."""
    proto = pp.protocol.lower()
    if pp.port is None:
        return [(0, f"meta l4proto {proto}")]
    if isinstance(pp.port, str):
        return [(v, f"meta l4proto {proto} {_FAM[v]} daddr . meta l4proto . th dport @{port_set(pp.port, v)}")
                for v in (4, 6)]
    if pp.end_port is not None and pp.end_port != pp.port:
        return [(0, f"meta l4proto {proto} th dport {pp.port}-{pp.end_port}")]
    return [(0, f"meta l4proto {proto} th dport {pp.port}")]


def _peer_matches(policy: NetworkPolicy, peer: Peer, direction: str) -> list[tuple[int, str]]:
    where = "saddr" if direction == INGRESS else "daddr"
    if peer.ip_block is not None:
        b = peer.ip_block
        v = b.cidr.version
        text = f"{_FAM[v]} {where} {b.cidr}"
        if b.excepts:
            text += f" {_FAM[v]} {where} != {{ {', '.join(map(str, b.excepts))} }}"
        return [(v, text)]
    key = PeerSelector.of(policy.namespace, peer).key
    return [(v, f"{_FAM[v]} {where} @{selector_set(key, v)}") for v in (4, 6)]


@dataclass(frozen=True)
class Rendered:
    """One policy's chain for one direction: its rules, the pod selectors whose member sets they
    name, and the port names whose sets they name."""

    rules: tuple[str, ...]
    selectors: tuple[PeerSelector, ...]
    names: tuple[str, ...]


def render(policy: NetworkPolicy, direction: str) -> Rendered:
    """The rules of a policy's chain for ``direction``: each (peer, port) of each rule, accepting."""
    out: list[str] = []
    sels: dict[tuple[object, ...], PeerSelector] = {}
    names: list[str] = []
    rules = policy.ingress if direction == INGRESS else policy.egress
    for rule in rules:
        for peer in rule.peers:
            if peer.ip_block is None:
                sel = PeerSelector.of(policy.namespace, peer)
                sels.setdefault(sel.key, sel)
        for pp in rule.ports:
            if isinstance(pp.port, str) and pp.port not in names:
                names.append(pp.port)
        peers = [m for p in rule.peers for m in _peer_matches(policy, p, direction)] or [(0, "")]
        ports = [m for pp in rule.ports for m in _port_matches(pp)] or [(0, "")]
        for pv, ptext in peers:
            for qv, qtext in ports:
                if pv and qv and pv != qv:
                    continue
                text = " ".join(t for t in (ptext, qtext, "accept") if t)
                if text not in out:
                    out.append(text)
    return Rendered(tuple(out), tuple(sels.values()), tuple(names))


def selecting(policies: Iterable[NetworkPolicy], w: Workload, direction: str) -> tuple[NetworkPolicy, ...]:
    """The policies (of ``w``'s namespace, in key order) selecting ``w`` for ``direction``."""
    return tuple(sorted((p for p in policies if p.applies_to(w.namespace, w.labels, direction)),
                        key=lambda p: p.key))


def verdict_chain(selected: Iterable[NetworkPolicy], direction: str) -> tuple[str, ...]:
    """An endpoint's verdict chain: a jump to each selecting policy's chain, then drop."""
    return (*(f"jump {policy_chain(p, direction)}" for p in selected), "drop")


def address_elements(w: Workload) -> list[tuple[int, str]]:
    return [(ip.version, str(ip)) for ip in w.ips]


def port_elements(w: Workload, name: str) -> list[tuple[int, str]]:
    """address . protocol . port of ``w``'s port called ``name`` (per protocol), by IP version."""
    return [(v, f"{text} . {proto.lower()} . {port}") for (pname, proto), port in sorted(w.named_ports.items())
            if pname == name for v, text in address_elements(w)]


def compile_full(me: str, workloads: Iterable[Workload], policies: Iterable[NetworkPolicy],
                 namespaces: Mapping[str, Mapping[str, str]]) -> Desired:
    """What node ``me`` must hold, from nothing: the tests' oracle for the incremental index
    (``workloads``: every node's attachments; ``namespaces``: labels by namespace)."""
    ws = list(workloads)
    pols = list(policies)
    out = Desired()
    used: dict[str, tuple[NetworkPolicy, str]] = {}
    for w in ws:
        if w.node != me:
            continue
        out.covered |= {w.iface}
        for direction, table in ((INGRESS, out.ingress), (EGRESS, out.egress)):
            sel = selecting(pols, w, direction)
            if sel:
                chain = verdict_chain_name(tuple(p.key for p in sel), direction)
                out.chains[chain] = verdict_chain(sel, direction)
                table[w.iface] = f"jump {chain}"
                for p in sel:
                    used[policy_chain(p, direction)] = (p, direction)
            elif w.default_deny:
                table[w.iface] = "drop"
    sels: dict[tuple[object, ...], PeerSelector] = {}
    names: set[str] = set()
    for chain, (p, direction) in used.items():
        r = render(p, direction)
        out.chains[chain] = r.rules
        out.comments[chain] = policy_comment(p, direction)
        sels.update((s.key, s) for s in r.selectors)
        names.update(r.names)
    for key, peer in sels.items():
        found: dict[int, set[str]] = {4: set(), 6: set()}
        for w in ws:
            if peer.matches(w.namespace, w.labels, namespace_labels(w.namespace, namespaces.get(w.namespace))):
                for v, text in address_elements(w):
                    found[v].add(text)
        for v in (4, 6):
            out.sets[selector_set(key, v)] = (SET_TYPES[v], frozenset(found[v]))
    for name in names:
        elems: dict[int, set[str]] = {4: set(), 6: set()}
        for w in ws:
            for v, text in port_elements(w, name):
                elems[v].add(text)
        for v in (4, 6):
            out.sets[port_set(name, v)] = (PORT_SET_TYPES[v], frozenset(elems[v]))
    return out


# what every table of ours holds besides a Desired: the covered set, the two verdict maps, and the
# base chains on the forward hook (name -> (its hook declaration, its rules))
BASE_OBJECTS = {"covered": "set {t} covered { type ifname; }",
                "ingress": "map {t} ingress { type ifname : verdict; }",
                "egress": "map {t} egress { type ifname : verdict; }"}


def _base_chain(prio: int, dev: str, mapname: str) -> tuple[str, tuple[str, ...]]:
    return (f"{{ type filter hook forward priority filter - {prio}; policy accept; }}",
            ("ct state established,related accept",
             f"icmpv6 type {{ {ND_TYPES} }} accept",
             f'{dev} "{HOST_PREFIX}*" {dev} != @covered drop',
             f"{dev} vmap @{mapname}"))


BASE_CHAINS = {"wl_egress": _base_chain(2, "iifname", "egress"), "wl_ingress": _base_chain(1, "oifname", "ingress")}
BASE_PRIORITY = {"wl_egress": -2, "wl_ingress": -1}  # (as the kernel reports them back)
