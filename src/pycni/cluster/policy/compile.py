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
- per local endpoint selected for a direction, ``ep_<iface>_in`` / ``ep_<iface>_eg``: a jump to
  each selecting policy's chain, then ``drop``; an endpoint selected by nothing gets no map
  element (allow), or ``drop`` when its network's ``defaultPolicy`` is deny.
- per policy that selects some local endpoint, ``p_<hash>_in`` / ``p_<hash>_eg``: one rule per
  (peer, port) of each of its rules, ending in ``accept``; shared by every endpoint it selects.
- named sets of pod addresses per selector (``s_<hash>_4`` / ``_6``) and per named port
  (``np_<name>_4`` / ``_6``: address . protocol . port of every pod naming a port so), so an
  endpoint or label change is a set element change, not a rule change.

:func:`compile_node` returns a :class:`Desired`; :mod:`pycni.cluster.policy.nftsync` turns the
difference between two of them into one nftables transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from pycni.cluster.policy.evaluate import EGRESS, INGRESS, Workload
from pycni.cluster.policy.model import NS_NAME_LABEL, LabelSelector, NetworkPolicy, Peer, PolicyPort

TABLE = "pycni_policy"
HOST_PREFIX = "rtd"  # routed's host interfaces (pycni.plugins.main.routed.HOST_PREFIX)
ND_TYPES = "nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert"
SET_TYPES = {4: "ipv4_addr", 6: "ipv6_addr"}
PORT_SET_TYPES = {4: "ipv4_addr . inet_proto . inet_service", 6: "ipv6_addr . inet_proto . inet_service"}
_FAM = {4: "ip", 6: "ip6"}


@dataclass(frozen=True)
class Endpoint:
    """One attachment as the agent sees it: the workload (effective labels, named ports), its
    host-side interface and whether its network denies by default."""

    workload: Workload
    iface: str
    network: str = ""
    default_deny: bool = False
    group: tuple[object, ...] = field(init=False, compare=False, repr=False)  # (namespace, sorted labels)
    addresses: tuple[tuple[int, str], ...] = field(init=False, compare=False, repr=False)  # (version, text)

    def __post_init__(self) -> None:
        object.__setattr__(self, "group", (self.workload.namespace, tuple(sorted(self.workload.labels.items()))))
        object.__setattr__(self, "addresses", tuple((ip.version, str(ip)) for ip in self.workload.ips))


@dataclass
class Desired:
    """Everything of ours one node's kernel should hold (besides the static base chains)."""

    sets: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # name -> (type, elements)
    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)           # name -> rules
    ingress: dict[str, str] = field(default_factory=dict)                      # iface -> verdict
    egress: dict[str, str] = field(default_factory=dict)
    covered: frozenset[str] = frozenset()
    # how it was made (not kernel state): the selectors and port names its sets serve
    selections: dict[tuple[object, ...], Selection] = field(default_factory=dict, compare=False, repr=False)
    names: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@lru_cache(maxsize=1 << 16)
def _h(text: str) -> str:
    from hashlib import blake2b

    return blake2b(text.encode(), digest_size=5).hexdigest()


@dataclass
class Memo:
    """What :func:`compile_node` may reuse from one call to the next (the agent keeps one): each
    policy's rules until the policy object is replaced, and which policies select a group of
    pods (namespace, labels) until that namespace's policies change."""

    rules: dict[tuple[str, str], tuple[NetworkPolicy, tuple[str, ...], dict[tuple[object, ...], Selection],
                                       set[str]]] = field(default_factory=dict)
    selected: dict[tuple[object, ...], dict[str, list[NetworkPolicy]]] = field(default_factory=dict)


def policy_chain(policy: NetworkPolicy, direction: str) -> str:
    return f"p_{_h(policy.key)}_{'in' if direction == INGRESS else 'eg'}"


def endpoint_chain(iface: str, direction: str) -> str:
    return f"ep_{iface}_{'in' if direction == INGRESS else 'eg'}"


def _selector_key(policy: NetworkPolicy, peer: Peer) -> tuple[object, ...]:
    ns: object = ("ns", policy.namespace) if peer.namespace_selector is None else \
        ("nssel", peer.namespace_selector.match_labels, peer.namespace_selector.match_expressions)
    pod = None if peer.pod_selector is None else (peer.pod_selector.match_labels, peer.pod_selector.match_expressions)
    return (ns, pod)


def selector_set(key: tuple[object, ...], version: int) -> str:
    return f"s_{_h(repr(key))}_{version}"


def port_set(name: str, version: int) -> str:
    return f"np_{name.replace('-', '_')}_{version}"


class Selection:
    """A peer's pods: the policy's namespace (or those its namespaceSelector picks) and its podSelector."""

    def __init__(self, policy: NetworkPolicy, peer: Peer) -> None:
        self.namespace = policy.namespace if peer.namespace_selector is None else None
        self.ns_selector: LabelSelector | None = peer.namespace_selector
        self.pod_selector = peer.pod_selector

    def matches(self, w: Workload, ns_labels: Mapping[str, str]) -> bool:
        if self.namespace is not None and w.namespace != self.namespace:
            return False
        if self.ns_selector is not None and not self.ns_selector.matches(ns_labels):
            return False
        return self.pod_selector is None or self.pod_selector.matches(w.labels)


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
    key = _selector_key(policy, peer)
    return [(v, f"{_FAM[v]} {where} @{selector_set(key, v)}") for v in (4, 6)]


def policy_rules(policy: NetworkPolicy, direction: str) -> tuple[str, ...]:
    """The rules of a policy's chain for ``direction``: each (peer, port) of each rule, accepting."""
    out: list[str] = []
    rules = policy.ingress if direction == INGRESS else policy.egress
    for rule in rules:
        peers = [m for p in rule.peers for m in _peer_matches(policy, p, direction)] or [(0, "")]
        ports = [m for pp in rule.ports for m in _port_matches(pp)] or [(0, "")]
        for pv, ptext in peers:
            for qv, qtext in ports:
                if pv and qv and pv != qv:
                    continue
                text = " ".join(t for t in (ptext, qtext, "accept") if t)
                if text not in out:
                    out.append(text)
    return tuple(out)


def selectors_of(policy: NetworkPolicy, direction: str) -> Iterable[tuple[tuple[object, ...], Selection]]:
    rules = policy.ingress if direction == INGRESS else policy.egress
    for rule in rules:
        for peer in rule.peers:
            if peer.ip_block is None:
                yield _selector_key(policy, peer), Selection(policy, peer)


def port_names_of(policy: NetworkPolicy, direction: str) -> Iterable[str]:
    rules = policy.ingress if direction == INGRESS else policy.egress
    for rule in rules:
        for pp in rule.ports:
            if isinstance(pp.port, str):
                yield pp.port


def compile_node(me: str, endpoints: Iterable[Endpoint], policies: Iterable[NetworkPolicy],
                 namespaces: Mapping[str, Mapping[str, str]],
                 memo: Memo | None = None, members_from: Desired | None = None) -> Desired:
    """What node ``me`` must hold for these endpoints (every node's), policies and namespace labels.

    Pods sharing a namespace and labels (replicas) are judged once; ``memo``, kept by a caller
    across calls, holds each policy's rules until that policy object is replaced. With
    ``members_from`` (an earlier result for the same endpoints and namespace labels: only
    policies changed since) the member sets it already has are taken from it."""
    eps = list(endpoints)
    by_namespace: dict[str, list[NetworkPolicy]] = {}
    for p in sorted(policies, key=lambda p: p.key):
        by_namespace.setdefault(p.namespace, []).append(p)  # a policy selects pods of its namespace only
    # endpoints grouped by (namespace, labels): selection is a property of the group
    groups: dict[tuple[object, ...], list[Endpoint]] = {}
    for ep in eps:
        groups.setdefault(ep.group, []).append(ep)
    out = Desired()
    used_policies: dict[tuple[str, str], NetworkPolicy] = {}
    selected: dict[tuple[object, ...], dict[str, list[NetworkPolicy]]] = {}
    versions = {ns: tuple(map(id, pols)) for ns, pols in by_namespace.items()}
    old_selected = memo.selected if memo is not None else {}
    new_selected: dict[tuple[object, ...], dict[str, list[NetworkPolicy]]] = {}
    for gkey, members in groups.items():
        if not any(ep.workload.node == me for ep in members):
            continue
        ns, labels = members[0].workload.namespace, members[0].workload.labels
        mkey = (gkey, versions.get(ns, ()))
        hit = old_selected.get(mkey)
        if hit is None:
            candidates = by_namespace.get(ns, ())
            hit = {d: [p for p in candidates if p.applies_to(ns, labels, d)] for d in (INGRESS, EGRESS)}
        selected[gkey] = new_selected[mkey] = hit
    if memo is not None:
        memo.selected = new_selected
    local = []
    for gkey, members in groups.items():
        if gkey not in selected:
            continue
        for direction, table in ((INGRESS, out.ingress), (EGRESS, out.egress)):
            selecting = selected[gkey][direction]
            jumps = (*(f"jump {policy_chain(p, direction)}" for p in selecting), "drop")
            for p in selecting:
                used_policies[(p.key, direction)] = p
            for ep in members:
                if ep.workload.node != me:
                    continue
                if selecting:
                    chain = endpoint_chain(ep.iface, direction)
                    out.chains[chain] = jumps
                    table[ep.iface] = f"jump {chain}"
                elif ep.default_deny:
                    table[ep.iface] = "drop"
        local += [ep for ep in members if ep.workload.node == me]
    out.covered = frozenset(ep.iface for ep in local)
    selections: dict[tuple[object, ...], Selection] = out.selections
    names: set[str] = set()
    for (_, direction), p in used_policies.items():
        cached = _rules_of(p, direction, memo)
        out.chains[policy_chain(p, direction)] = cached[1]
        if cached[2]:
            selections.update(cached[2])
        if cached[3]:
            names.update(cached[3])
    if memo is not None:
        for k in [k for k in memo.rules if k not in used_policies]:
            del memo.rules[k]
    ns_labels = {ns: {**labels, NS_NAME_LABEL: ns} for ns, labels in namespaces.items()}
    for key, sel in selections.items():
        if members_from is not None and selector_set(key, 4) in members_from.sets:
            for v in (4, 6):  # pods and namespaces as before: the same members
                out.sets[selector_set(key, v)] = members_from.sets[selector_set(key, v)]
            continue
        found: dict[int, set[str]] = {4: set(), 6: set()}
        for members in groups.values():
            w = members[0].workload
            if sel.matches(w, ns_labels.get(w.namespace) or {NS_NAME_LABEL: w.namespace}):
                for ep in members:
                    for v, text in ep.addresses:
                        found[v].add(text)
        for v in (4, 6):
            out.sets[selector_set(key, v)] = (SET_TYPES[v], frozenset(found[v]))
    for name in names:
        if members_from is not None and port_set(name, 4) in members_from.sets:
            for v in (4, 6):
                out.sets[port_set(name, v)] = members_from.sets[port_set(name, v)]
            continue
        elems: dict[int, set[str]] = {4: set(), 6: set()}
        for ep in eps:
            for (pname, proto), port in ep.workload.named_ports.items():
                if pname == name:
                    for v, text in ep.addresses:
                        elems[v].add(f"{text} . {proto.lower()} . {port}")
        for v in (4, 6):
            out.sets[port_set(name, v)] = (PORT_SET_TYPES[v], frozenset(elems[v]))
    out.names = frozenset(names)
    return out


def _rules_of(p: NetworkPolicy, direction: str, memo: Memo | None) -> tuple[NetworkPolicy, tuple[str, ...],
                                                                         dict[tuple[object, ...], Selection],
                                                                         set[str]]:
    """A policy's chain rules, selectors and port names for ``direction`` (kept in ``memo``
    until the policy object is replaced)."""
    cached = memo.rules.get((p.key, direction)) if memo is not None else None
    if cached is None or cached[0] is not p:
        cached = (p, policy_rules(p, direction), dict(selectors_of(p, direction)), set(port_names_of(p, direction)))
        if memo is not None:
            memo.rules[(p.key, direction)] = cached
    return cached


def _group_namespace(gkey: object) -> object:
    """The namespace of an :attr:`Endpoint.group` key."""
    return gkey[0] if isinstance(gkey, tuple) else None


def _members(sel: Selection, endpoints: Iterable[Endpoint], ns_labels: Mapping[str, Mapping[str, str]]
             ) -> dict[int, frozenset[str]]:
    """The addresses (by IP version) of the pods ``sel`` picks among ``endpoints``."""
    found: dict[int, set[str]] = {4: set(), 6: set()}
    for ep in endpoints:
        w = ep.workload
        if sel.matches(w, ns_labels.get(w.namespace) or {NS_NAME_LABEL: w.namespace}):
            for v, text in ep.addresses:
                found[v].add(text)
    return {v: frozenset(found[v]) for v in (4, 6)}


def _port_members(name: str, endpoints: Iterable[Endpoint]) -> dict[int, frozenset[str]]:
    """address . protocol . port (by IP version) of every pod naming a port ``name``."""
    elems: dict[int, set[str]] = {4: set(), 6: set()}
    for ep in endpoints:
        for (pname, proto), port in ep.workload.named_ports.items():
            if pname == name:
                for v, text in ep.addresses:
                    elems[v].add(f"{text} . {proto.lower()} . {port}")
    return {v: frozenset(elems[v]) for v in (4, 6)}


def patch_policies(me: str, have: Desired, changed: Iterable[str],
                   endpoints: Iterable[Endpoint], policies: Iterable[NetworkPolicy],
                   namespaces: Mapping[str, Mapping[str, str]], memo: Memo) -> Desired:
    """``have`` after policies alone changed, touching only what they reach.

    ``changed`` names the namespaces whose policies were created, replaced or deleted (a
    policy selects pods of its own namespace only, so nothing else can be judged anew); endpoints
    and namespace labels are those ``have`` (and ``memo``, kept by the compile or patch that
    made ``have``) were made from. Only the local pods of those namespaces are judged again;
    their verdict chains, the chains of policies that start or stop being used, and the member
    sets of selectors and port names that appear or go are what changes — an unchanged
    member set is kept as it is. The result equals what :func:`compile_node` would give."""
    spaces = set(changed)
    eps = endpoints if isinstance(endpoints, list) else list(endpoints)
    by_namespace: dict[str, list[NetworkPolicy]] = {ns: [] for ns in spaces}
    for p in sorted((p for p in policies if p.namespace in spaces), key=lambda p: p.key):
        by_namespace[p.namespace].append(p)
    out = Desired(sets=dict(have.sets), chains=dict(have.chains), ingress=dict(have.ingress),
                  egress=dict(have.egress), covered=have.covered)
    # the local pods of those namespaces, judged again (once per group of replicas)
    used: dict[tuple[str, str], NetworkPolicy] = {}
    judged: dict[tuple[object, ...], dict[str, list[NetworkPolicy]]] = {}
    for ep in eps:
        w = ep.workload
        if w.node != me or w.namespace not in spaces:
            continue
        sel = judged.get(ep.group)
        if sel is None:
            cands = by_namespace[w.namespace]
            sel = judged[ep.group] = {d: [p for p in cands if p.applies_to(w.namespace, w.labels, d)]
                                      for d in (INGRESS, EGRESS)}
        for direction, table in ((INGRESS, out.ingress), (EGRESS, out.egress)):
            selecting = sel[direction]
            chain = endpoint_chain(ep.iface, direction)
            if selecting:
                for p in selecting:
                    used[(p.key, direction)] = p
                out.chains[chain] = (*(f"jump {policy_chain(p, direction)}" for p in selecting), "drop")
                table[ep.iface] = f"jump {chain}"
            else:
                out.chains.pop(chain, None)
                if ep.default_deny:
                    table[ep.iface] = "drop"
                else:
                    table.pop(ep.iface, None)
    # the policies of those namespaces whose chains are used, and no others of theirs
    for rkey in [k for k, c in memo.rules.items() if c[0].namespace in spaces and k not in used]:
        out.chains.pop(policy_chain(memo.rules[rkey][0], rkey[1]), None)
        del memo.rules[rkey]
    for (_, direction), p in used.items():
        out.chains[policy_chain(p, direction)] = _rules_of(p, direction, memo)[1]
    # (a cached selection of a group of those namespaces may now be wrong: forget it)
    memo.selected = {k: v for k, v in memo.selected.items() if _group_namespace(k[0]) not in spaces}
    # the selectors and port names every used policy serves; their sets, new ones filled
    selections: dict[tuple[object, ...], Selection] = {}
    names: set[str] = set()
    for cached in memo.rules.values():
        if cached[2]:
            selections.update(cached[2])
        if cached[3]:
            names.update(cached[3])
    ns_labels = {ns: {**labels, NS_NAME_LABEL: ns} for ns, labels in namespaces.items()}
    wanted: set[str] = set()
    for key, sel_ in selections.items():
        wanted.update(selector_set(key, v) for v in (4, 6))
        if selector_set(key, 4) not in out.sets:
            found = _members(sel_, eps, ns_labels)
            for v in (4, 6):
                out.sets[selector_set(key, v)] = (SET_TYPES[v], found[v])
    for name in names:
        wanted.update(port_set(name, v) for v in (4, 6))
        if port_set(name, 4) not in out.sets:
            found = _port_members(name, eps)
            for v in (4, 6):
                out.sets[port_set(name, v)] = (PORT_SET_TYPES[v], found[v])
    for gone in [s for s in out.sets if s not in wanted]:
        del out.sets[gone]
    out.selections = selections
    out.names = frozenset(names)
    return out


def patch_namespaces(have: Desired, changed: Iterable[str], endpoints: Iterable[Endpoint],
                     namespaces: Mapping[str, Mapping[str, str]]) -> Desired:
    """``have`` after the labels of namespaces ``changed`` (and nothing else) changed: which pods
    a policy selects does not depend on them (a policy selects pods of its own namespace by
    their labels), so only the member sets of namespaceSelector peers move, and only by those
    namespaces' pods. The result equals what :func:`compile_node` would give."""
    spaces = set(changed)
    ns_labels = {ns: {**labels, NS_NAME_LABEL: ns} for ns, labels in namespaces.items()}
    moved = [ep for ep in endpoints if ep.workload.namespace in spaces]
    out = Desired(sets=dict(have.sets), chains=have.chains, ingress=have.ingress, egress=have.egress,
                  covered=have.covered, selections=have.selections, names=have.names)
    for key, sel in have.selections.items():
        if sel.ns_selector is None:
            continue  # (the policy's own namespace, by name: no label moves it)
        drop: dict[int, set[str]] = {4: set(), 6: set()}
        take: dict[int, set[str]] = {4: set(), 6: set()}
        for ep in moved:
            w = ep.workload
            hit = sel.matches(w, ns_labels.get(w.namespace) or {NS_NAME_LABEL: w.namespace})
            for v, text in ep.addresses:
                (take if hit else drop)[v].add(text)
        for v in (4, 6):
            name = selector_set(key, v)
            typ, elems = have.sets[name]
            new = (elems - drop[v]) | take[v]
            if new != elems:
                out.sets[name] = (typ, frozenset(new))
    return out


def _port_elements(ep: Endpoint, names: frozenset[str]) -> list[tuple[str, str]]:
    """(set name, element) of ``ep``'s named ports that ``names`` serve."""
    return [(port_set(pname, v), f"{text} . {proto.lower()} . {port}")
            for (pname, proto), port in ep.workload.named_ports.items() if pname in names
            for v, text in ep.addresses]


def patch_node(me: str, have: Desired, changes: Iterable[tuple[Endpoint | None, Endpoint | None]],
               policies: Iterable[NetworkPolicy], namespaces: Mapping[str, Mapping[str, str]]) -> Desired | None:
    """``have`` after endpoints changed — (old, new) pairs, None for absent — without recomputing
    the rest; None when a change reaches further than set members and the new pods' own
    verdicts (a local pod leaving or changing selection, a policy not programmed yet): then
    :func:`compile_node` must run. The result equals what compile_node would give."""
    pols = [p for p in policies]
    by_namespace: dict[str, list[NetworkPolicy]] = {}
    for p in sorted(pols, key=lambda p: p.key):
        by_namespace.setdefault(p.namespace, []).append(p)

    def selecting(ep: Endpoint) -> dict[str, list[NetworkPolicy]]:
        w = ep.workload
        cands = by_namespace.get(w.namespace, ())
        return {d: [p for p in cands if p.applies_to(w.namespace, w.labels, d)] for d in (INGRESS, EGRESS)}

    out = Desired(sets=dict(have.sets), chains=dict(have.chains), ingress=dict(have.ingress),
                  egress=dict(have.egress), covered=have.covered, selections=have.selections, names=have.names)
    covered = set(have.covered)
    ns_labels = {ns: {**labels, NS_NAME_LABEL: ns} for ns, labels in namespaces.items()}
    set_add: dict[str, set[str]] = {}
    set_del: dict[str, set[str]] = {}
    for old, new in changes:
        if old is not None and old.workload.node == me:
            if new is None or new.workload.node != me or new.iface != old.iface or selecting(old) != selecting(new) \
                    or old.default_deny != new.default_deny:
                return None  # a local pod leaves or is judged anew: chains may become unused
        if new is not None and new.workload.node == me and (old is None or old.workload.node != me):
            if new.iface in covered:
                return None
            for direction, table in ((INGRESS, out.ingress), (EGRESS, out.egress)):
                sel = selecting(new)[direction]
                if any(policy_chain(p, direction) not in out.chains for p in sel):
                    return None  # a policy no local pod used so far: its chain and sets are new
                if sel:
                    chain = endpoint_chain(new.iface, direction)
                    out.chains[chain] = (*(f"jump {policy_chain(p, direction)}" for p in sel), "drop")
                    table[new.iface] = f"jump {chain}"
                elif new.default_deny:
                    table[new.iface] = "drop"
            covered.add(new.iface)
        for ep, bucket in ((old, set_del), (new, set_add)):
            if ep is None:
                continue
            w = ep.workload
            nsl = ns_labels.get(w.namespace) or {NS_NAME_LABEL: w.namespace}
            for key, sel_ in out.selections.items():
                if sel_.matches(w, nsl):
                    for v, text in ep.addresses:
                        bucket.setdefault(selector_set(key, v), set()).add(text)
            for name, elem in _port_elements(ep, out.names):
                bucket.setdefault(name, set()).add(elem)
    for name in set(set_add) | set(set_del):
        typ, elems = out.sets[name]
        out.sets[name] = (typ, frozenset((elems - set_del.get(name, set())) | set_add.get(name, set())))
    out.covered = frozenset(covered)
    return out


def base_script(table: str = TABLE) -> list[str]:
    """The table, its maps, the covered set and the two base chains (made once, atomically)."""
    t = f"inet {table}"
    lines = [f"add table {t}",
             f"add set {t} covered {{ type ifname; }}",
             f"add map {t} ingress {{ type ifname : verdict; }}",
             f"add map {t} egress {{ type ifname : verdict; }}"]
    for chain, prio, dev, mapname in (("wl_egress", 2, "iifname", "egress"), ("wl_ingress", 1, "oifname", "ingress")):
        lines += [f"add chain {t} {chain} {{ type filter hook forward priority filter - {prio}; policy accept; }}",
                  f"add rule {t} {chain} ct state established,related accept",
                  f"add rule {t} {chain} icmpv6 type {{ {ND_TYPES} }} accept",
                  f'add rule {t} {chain} {dev} "{HOST_PREFIX}*" {dev} != @covered drop',
                  f"add rule {t} {chain} {dev} vmap @{mapname}"]
    return lines
