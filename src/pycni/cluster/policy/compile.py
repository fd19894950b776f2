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
- flow logging (docs/flows.md; :class:`LogSpec`, on unless the agent runs with flows off): each
  decision's first packet is logged to NFLOG with a ``pycni:<A|D>:<token>`` prefix, behind its
  own ``limit rate`` (a rule whose limit fails just does not match: the verdict is the next
  rule's, never changed). A verdict chain's final ``drop`` is preceded by its log rule (token:
  the verdict chain); a policy chain's rules ``jump`` to ``pa_<hash>_<dir>`` (log, accept; token:
  the policy chain) instead of accepting; the fail-closed rule and a default-deny map element
  jump to ``fc_<dir>`` / ``dd_<dir>`` (log, drop); after the vmap rule, a routed interface that
  fell through (no policy selects the pod) is logged as ``na_<dir>``.
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

from pycni.cluster.flows.model import ALLOW, DENY, log_prefix
from pycni.cluster.names import HOST_PREFIX
from pycni.cluster.policy.evaluate import EGRESS, INGRESS, Workload
from pycni.cluster.policy.model import NetworkPolicy, Peer, PeerSelector, PolicyPort, namespace_labels

ND_TYPES = "nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert"
SET_TYPES = {4: "ipv4_addr", 6: "ipv6_addr"}
PORT_SET_TYPES = {4: "ipv4_addr . inet_proto . inet_service", 6: "ipv6_addr . inet_proto . inet_service"}
_FAM = {4: "ip", 6: "ip6"}


@dataclass(frozen=True)
class LogSpec:
    """Where and how fast the rules log (docs/flows.md): NFLOG ``group``, at most ``rate`` packets
    a second per log rule with a ``burst`` (past it a packet is judged as before, only not logged)."""

    group: int = 36  # (pycni.cluster.flows.collector.DEFAULT_GROUP)
    rate: int = 100
    burst: int = 50

    def rule(self, verdict: str, token: str) -> str:
        """The log rule for ``token``'s decision: ``limit rate ... log group G prefix "pycni:V:token"``."""
        return (f"limit rate {self.rate}/second burst {self.burst} packets log group {self.group} "
                f'prefix "{log_prefix(verdict, token)}"')


LOG = LogSpec()  # the default: log (the agent passes None when flows are off)


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
    log: LogSpec | None = None  # the log rules' spec (None: no log rules), base chains included


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


def _dir(direction: str) -> str:
    return "in" if direction == INGRESS else "eg"


def accept_chain(policy: NetworkPolicy, direction: str) -> str:
    """With logging, where a policy chain's matches jump: log (token: the policy chain), accept."""
    return f"pa_{_h(policy.key)}_{_dir(direction)}"


def accept_rules(policy: NetworkPolicy, direction: str, log: LogSpec) -> tuple[str, ...]:
    return (log.rule(ALLOW, policy_chain(policy, direction)), "accept")


def fixed_chains(log: LogSpec | None) -> dict[str, tuple[str, ...]]:
    """With logging, the chains the fail-closed rule and default-deny map elements jump to."""
    if log is None:
        return {}
    return {f"{kind}_{d}": (log.rule(DENY, f"{kind}_{d}"), "drop") for kind in ("fc", "dd") for d in ("in", "eg")}


def default_deny(direction: str, log: LogSpec | None) -> str:
    """A default-deny map element's verdict."""
    return "drop" if log is None else f"jump dd_{_dir(direction)}"


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


def render(policy: NetworkPolicy, direction: str, log: LogSpec | None = None) -> Rendered:
    """The rules of a policy's chain for ``direction``: each (peer, port) of each rule, accepting
    (with ``log``: through its :func:`accept_chain`, which logs)."""
    out: list[str] = []
    verdict = "accept" if log is None else f"jump {accept_chain(policy, direction)}"
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
                text = " ".join(t for t in (ptext, qtext, verdict) if t)
                if text not in out:
                    out.append(text)
    return Rendered(tuple(out), tuple(sels.values()), tuple(names))


def selecting(policies: Iterable[NetworkPolicy], w: Workload, direction: str) -> tuple[NetworkPolicy, ...]:
    """The policies (of ``w``'s namespace, in key order) selecting ``w`` for ``direction``."""
    return tuple(sorted((p for p in policies if p.applies_to(w.namespace, w.labels, direction)),
                        key=lambda p: p.key))


def verdict_chain(selected: Iterable[NetworkPolicy], direction: str, log: LogSpec | None = None
                  ) -> tuple[str, ...]:
    """An endpoint's verdict chain: a jump to each selecting policy's chain, then (``log``: log
    with the verdict chain as token) drop."""
    sel = tuple(selected)
    tail = () if log is None else (log.rule(DENY, verdict_chain_name(tuple(p.key for p in sel), direction)),)
    return (*(f"jump {policy_chain(p, direction)}" for p in sel), *tail, "drop")


def address_elements(w: Workload) -> list[tuple[int, str]]:
    return [(ip.version, str(ip)) for ip in w.ips]


def port_elements(w: Workload, name: str) -> list[tuple[int, str]]:
    """address . protocol . port of ``w``'s port called ``name`` (per protocol), by IP version."""
    return [(v, f"{text} . {proto.lower()} . {port}") for (pname, proto), port in sorted(w.named_ports.items())
            if pname == name for v, text in address_elements(w)]


def compile_full(me: str, workloads: Iterable[Workload], policies: Iterable[NetworkPolicy],
                 namespaces: Mapping[str, Mapping[str, str]], log: LogSpec | None = LOG) -> Desired:
    """What node ``me`` must hold, from nothing: the tests' oracle for the incremental index
    (``workloads``: every node's attachments; ``namespaces``: labels by namespace)."""
    ws = list(workloads)
    pols = list(policies)
    out = Desired(chains=dict(fixed_chains(log)), log=log)
    used: dict[str, tuple[NetworkPolicy, str]] = {}
    for w in ws:
        if w.node != me:
            continue
        out.covered |= {w.iface}
        for direction, table in ((INGRESS, out.ingress), (EGRESS, out.egress)):
            sel = selecting(pols, w, direction)
            if sel:
                chain = verdict_chain_name(tuple(p.key for p in sel), direction)
                out.chains[chain] = verdict_chain(sel, direction, log)
                table[w.iface] = f"jump {chain}"
                for p in sel:
                    used[policy_chain(p, direction)] = (p, direction)
            elif w.default_deny:
                table[w.iface] = default_deny(direction, log)
    sels: dict[tuple[object, ...], PeerSelector] = {}
    names: set[str] = set()
    for chain, (p, direction) in used.items():
        r = render(p, direction, log)
        out.chains[chain] = r.rules
        out.comments[chain] = policy_comment(p, direction)
        if log is not None:
            out.chains[accept_chain(p, direction)] = accept_rules(p, direction, log)
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


def _base_chain(prio: int, dev: str, mapname: str, log: LogSpec | None) -> tuple[str, tuple[str, ...]]:
    d = "in" if mapname == "ingress" else "eg"
    closed = "drop" if log is None else f"jump fc_{d}"
    tail = () if log is None else (f'{dev} "{HOST_PREFIX}*" {log.rule(ALLOW, f"na_{d}")}',)
    return (f"{{ type filter hook forward priority filter - {prio}; policy accept; }}",
            ("ct state established,related accept",
             f"icmpv6 type {{ {ND_TYPES} }} accept",
             f'{dev} "{HOST_PREFIX}*" {dev} != @covered {closed}',
             f"{dev} vmap @{mapname}",
             *tail))


def base_chains(log: LogSpec | None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The two base chains (name -> (hook declaration, rules)); with ``log``, their log rules:
    the fail-closed jump to ``fc_<dir>`` and, after the vmap, the unselected pods' ``na_<dir>``."""
    return {"wl_egress": _base_chain(2, "iifname", "egress", log),
            "wl_ingress": _base_chain(1, "oifname", "ingress", log)}


BASE_CHAINS = base_chains(None)  # (their names and declarations; the rules depend on the LogSpec)
BASE_PRIORITY = {"wl_egress": -2, "wl_ingress": -1}  # (as the kernel reports them back)
