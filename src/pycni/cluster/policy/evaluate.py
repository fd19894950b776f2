"""Who may talk to whom: Kubernetes NetworkPolicy semantics as one pure function.

:func:`decide` is the truth: the nftables the node agent programs must agree with it for every
flow (the tests probe real packets and compare with it), and ``pycni policy why`` prints its
reasons. The rules, from the API reference:

- a pod selected by no policy for a direction allows everything in that direction; once some
  policy selects it for Ingress (Egress), only what some such policy's rule allows passes —
  policies are additive, none can deny what another allows;
- a flow needs both: egress allowed at the source pod and ingress allowed at the destination
  pod (an address outside the cluster has no policy of its own);
- a rule with no ``from``/``to`` matches every peer, with no ``ports`` every port; a peer with
  both selectors is an AND, two peers an OR; a peer without ``namespaceSelector`` means the
  policy's own namespace, ``namespaceSelector: {}`` every namespace;
- a named port matches by name *and* protocol on the destination pod;
- traffic between a pod and its own node is always allowed (kubelet's probes);
- replies of allowed connections pass (the dataplane's conntrack; not a question here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pycni import ipaddr
from pycni.cluster.policy.model import (
    IPAddress,
    NetworkPolicy,
    Peer,
    PeerSelector,
    PolicyPort,
    Rule,
    namespace_labels,
)

INGRESS = "Ingress"
EGRESS = "Egress"


@dataclass(frozen=True)
class Workload:
    """A pod as policy sees it: where it lives, its labels, addresses and named ports; built from
    one attachment's record (:class:`pycni.cluster.model.WorkloadEndpoint`, the one record of an
    attachment) under its pod record, with that attachment's host interface (``iface``)."""

    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    ips: tuple[IPAddress, ...] = ()
    named_ports: Mapping[tuple[str, str], int] = field(default_factory=dict, hash=False)  # (name, proto) -> port
    node: str = ""
    default_deny: bool = False  # its network's "defaultPolicy": "deny"
    iface: str = ""  # the attachment's host-side interface (routed's rtd…), where the dataplane judges it

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def address(self, version: int) -> IPAddress | None:
        return next((ip for ip in self.ips if ip.version == version), None)


@dataclass
class Cluster:
    """What a decision reads: the policies, the namespaces' labels, the nodes' own addresses."""

    policies: list[NetworkPolicy] = field(default_factory=list)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    nodes: dict[str, tuple[IPAddress, ...]] = field(default_factory=dict)
    default_deny: bool = False  # the network's "defaultPolicy": "deny": every pod is selected both ways

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        """A namespace's labels with ``kubernetes.io/metadata.name`` (always there, as Kubernetes)."""
        return namespace_labels(namespace, self.namespaces.get(namespace))

    def selecting(self, pod: Workload, direction: str) -> list[NetworkPolicy]:
        """The policies that select ``pod`` for ``direction``, in name order."""
        return sorted((p for p in self.policies if p.applies_to(pod.namespace, pod.labels, direction)),
                      key=lambda p: p.key)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reasons: tuple[str, ...]

    def __bool__(self) -> bool:
        return self.allowed


Party = Workload | IPAddress


def _addr(party: Party, version: int) -> IPAddress | None:
    return party.address(version) if isinstance(party, Workload) else party


def _name(party: Party) -> str:
    return party.key if isinstance(party, Workload) else str(party)


def peer_matches(cluster: Cluster, policy: NetworkPolicy, peer: Peer, other: Party, version: int) -> bool:
    """Whether ``other`` (the remote end of the flow, seen from the selected pod) is ``peer``."""
    if peer.ip_block is not None:
        ip = _addr(other, version)
        return ip is not None and peer.ip_block.contains(ip)
    if not isinstance(other, Workload):
        return False  # selectors match pods only
    return PeerSelector.of(policy.namespace, peer).matches(other.namespace, other.labels,
                                                           cluster.namespace_labels(other.namespace))


def port_matches(pp: PolicyPort, dst: Party, port: int, proto: str) -> bool:
    """Whether a ``ports`` entry admits ``port``/``proto`` at the destination ``dst``."""
    if pp.protocol != proto:
        return False
    if pp.port is None:
        return True
    if isinstance(pp.port, str):
        # a named port: the destination pod's port of that name and protocol
        return isinstance(dst, Workload) and dst.named_ports.get((pp.port, proto)) == port
    if pp.end_port is not None:
        return pp.port <= port <= pp.end_port
    return pp.port == port


def rule_matches(cluster: Cluster, policy: NetworkPolicy, rule: Rule, other: Party, dst: Party, port: int,
                 proto: str, version: int) -> bool:
    peers_ok = not rule.peers or any(peer_matches(cluster, policy, p, other, version) for p in rule.peers)
    ports_ok = not rule.ports or any(port_matches(pp, dst, port, proto) for pp in rule.ports)
    return peers_ok and ports_ok


def _side(cluster: Cluster, pod: Workload, other: Party, dst: Party, port: int, proto: str, version: int,
          direction: str) -> tuple[bool, str]:
    """One direction's verdict at ``pod`` (ingress: ``other`` is the source; egress: the destination)."""
    verb = "ingress to" if direction == INGRESS else "egress from"
    node_ips = cluster.nodes.get(pod.node, ())
    other_ip = _addr(other, version)
    if not isinstance(other, Workload) and other_ip in node_ips:
        return True, f"{verb} {pod.key}: allowed, {other_ip} is the pod's own node"
    selecting = cluster.selecting(pod, direction)
    if not selecting:
        if cluster.default_deny or pod.default_deny:
            return False, f"{verb} {pod.key}: denied by the network's defaultPolicy deny (no policy selects it)"
        return True, f"{verb} {pod.key}: allowed, no policy selects the pod for {direction}"
    allowing = []
    for pol in selecting:
        rules = pol.ingress if direction == INGRESS else pol.egress
        for i, rule in enumerate(rules):
            if rule_matches(cluster, pol, rule, other, dst, port, proto, version):
                allowing.append(f"{pol.key} ({direction.lower()} rule {i})")
                break
    if allowing:
        return True, f"{verb} {pod.key}: allowed by {', '.join(allowing)}"
    return False, (f"{verb} {pod.key}: denied; selected by {', '.join(p.key for p in selecting)} and no rule"
                   f" of theirs allows {_name(other)} on {port}/{proto}")


def decide(cluster: Cluster, src: Party, dst: Party, port: int, proto: str = "TCP",
           version: int | None = None) -> Decision:
    """Whether a new ``proto`` flow from ``src`` to ``dst``:``port`` is allowed, and why.

    ``version`` picks the address family (default: the destination's first address)."""
    proto = proto.upper()
    if version is None:
        if isinstance(dst, Workload):
            version = dst.ips[0].version if dst.ips else 4
        else:
            version = dst.version
    if isinstance(src, Workload) and src is dst:
        return Decision(True, (f"{src.key} to itself: never leaves the pod",))
    reasons = []
    allowed = True
    if isinstance(src, Workload):
        ok, why = _side(cluster, src, dst, dst, port, proto, version, EGRESS)
        allowed &= ok
        reasons.append(why)
    if isinstance(dst, Workload):
        ok, why = _side(cluster, dst, src, dst, port, proto, version, INGRESS)
        allowed &= ok
        reasons.append(why)
    return Decision(allowed, tuple(reasons))


def parse_party(text: str, pods: Iterable[Workload]) -> Party:
    """``NS/POD`` as the named workload, or an IP address."""
    try:
        return ipaddr.ip_address(text)
    except ValueError:
        pass
    for w in pods:
        if w.key == text:
            return w
    raise KeyError(text)
