"""The flow record, the log-prefix convention, the resolver seam and the bounded ring (docs/flows.md).

Why a convention: nftables hands a logged packet to NFLOG with nothing but its prefix to say
which rule logged it, and a prefix holds at most 127 bytes. So the policy engine writes
``pycni:<A|D>:<token>`` — the verdict the rule applies, and the token naming the chain that
decided (a policy's ``p_<hash>_<in|eg>``, a verdict chain's ``v_<hash>_<in|eg>``, or one of
the fixed tokens below) — and this module turns such a packet into a :class:`Flow` with the engine's
:class:`Resolver` naming the policy and the pods.

Why a ring with a rate limit: a flood of denied packets must not cost the node memory or much
CPU. The ring keeps the newest ``capacity`` flows (the oldest are dropped, and counted) and
admits at most ``rate`` flows a second (the rest are counted, not kept).
"""

from __future__ import annotations

import threading
import time

from pycni.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from pycni.net.nflog import LoggedPacket

PREFIX = "pycni"
PREFIX_MAX = 127  # NF_LOG_PREFIXLEN - 1: the kernel keeps 128 bytes with the NUL
ALLOW, DENY = "A", "D"
ALLOWED, DENIED = "allowed", "denied"
INGRESS, EGRESS = "ingress", "egress"
_DIRECTIONS = {"in": INGRESS, "eg": EGRESS}
_VERDICTS = {ALLOW: ALLOWED, DENY: DENIED}

DEFAULT_DENY = "default deny"
NETWORK_DEFAULT_DENY = "default deny (no policy selects this pod)"
NO_POLICY = "no policy selects this pod"
NOT_PROGRAMMED = "not yet programmed"
# The fixed tokens (each with _in / _eg): the rules that decide without a policy.
FIXED_TOKENS = {"fc": NOT_PROGRAMMED,          # fail closed: a pod's interface not yet covered
                "dd": NETWORK_DEFAULT_DENY,    # the network denies by default and no policy selects the pod
                "na": NO_POLICY}               # no policy selects the pod: allowed
POLICY_CHAIN, VERDICT_CHAIN = "p", "v"


class PrefixError(ValueError):
    """A verdict or token that cannot make a valid log prefix."""


def log_prefix(verdict: str, token: str) -> str:
    """The prefix the engine gives the log rule of ``token``'s chain: ``pycni:A:p_0a1b2c3d4e_in``.

    ``verdict`` is ``A`` (the rule accepts) or ``D`` (it drops); ``token`` ends in ``_in`` or
    ``_eg`` and holds no quote, space or colon; the whole stays within the kernel's 127 bytes."""
    if verdict not in _VERDICTS:
        raise PrefixError(f"verdict {verdict!r} is not A or D")
    text = f"{PREFIX}:{verdict}:{token}"
    if _direction(token) is None or any(c in token for c in ' :"\\') or not token.isascii():
        raise PrefixError(f"token {token!r} must end in _in or _eg and hold no space, colon or quote")
    if len(text) > PREFIX_MAX:
        raise PrefixError(f"log prefix {text!r} is {len(text)} bytes; the kernel keeps {PREFIX_MAX}")
    return text


def _direction(token: str) -> str | None:
    return _DIRECTIONS.get(token.rpartition("_")[2]) if "_" in token else None


def parse_prefix(prefix: str) -> tuple[str, str, str] | None:
    """(verdict, token, direction) of a prefix of ours — ``("denied", "v_0a1b2c3d4e_in", "ingress")`` —
    or None for anyone else's."""
    head, _, rest = prefix.partition(":")
    letter, _, token = rest.partition(":")
    if head != PREFIX or letter not in _VERDICTS:
        return None
    direction = _direction(token)
    if direction is None:
        return None
    return _VERDICTS[letter], token, direction


def _none(_key: str) -> str | None:
    return None


class Resolver:
    """What only the policy engine knows, handed to the collector (the seam of docs/flows.md).

    ``policy(token)``: the ``NS/NAME`` of the policy whose chain is ``token`` (``p_<hash>_in``),
    or None when it is not known (any more). It is asked about every token, so the engine may
    also name what a verdict chain's final drop means (``v_<hash>_in``), e.g. with the policies
    that select the pod; None leaves the built-in reason. ``pod(address)``: ``NS/POD`` of the pod
    holding that address, or None. Both are called from the collector thread, once per flow:
    keep them to dictionary lookups."""

    def __init__(self, policy: Callable[[str], str | None] = _none, pod: Callable[[str], str | None] = _none) -> None:
        self.policy = policy
        self.pod = pod


@record(frozen=True)
class Flow:
    """One logged connection attempt as ``pycni flows`` shows it.

    ``source``/``destination`` are ``NS/POD`` when the address is a pod's, else the address;
    ``endpoint`` is the local pod the rule protects (the destination for ingress, the source
    for egress). ``policy`` is the deciding policy's ``NS/NAME`` ("" when none decided), and
    ``reason`` says why when no policy did ("default deny", "no policy selects this pod", "not
    yet programmed", or "unknown chain <token>")."""

    seq: int
    time: float
    source: str
    destination: str
    src_addr: str
    dst_addr: str
    sport: int | None
    port: int | None
    proto: str
    direction: str
    verdict: str
    policy: str
    reason: str
    endpoint: str
    icmp_type: int | None = None
    icmp_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": self.time, "source": self.source, "destination": self.destination,
                "src_addr": self.src_addr, "dst_addr": self.dst_addr, "sport": self.sport, "port": self.port,
                "proto": self.proto, "direction": self.direction, "verdict": self.verdict, "policy": self.policy,
                "reason": self.reason, "endpoint": self.endpoint, "icmp_type": self.icmp_type,
                "icmp_code": self.icmp_code}


def to_flow(packet: LoggedPacket, resolver: Resolver, seq: int = 0) -> Flow | None:
    """The flow a logged packet tells of, or None when its prefix is not ours."""
    parsed = parse_prefix(packet.prefix)
    if parsed is None:
        return None
    verdict, token, direction = parsed
    kind = token.partition("_")[0]
    named = resolver.policy(token)
    policy = reason = ""
    if kind == POLICY_CHAIN:
        policy = named or ""
        reason = "" if named else f"unknown chain {token}"
    elif named:
        reason = named
    elif kind in FIXED_TOKENS:
        reason = FIXED_TOKENS[kind]
    elif kind == VERDICT_CHAIN:
        reason = DEFAULT_DENY
    else:
        reason = f"unknown chain {token}"
    source = resolver.pod(packet.src) or packet.src
    destination = resolver.pod(packet.dst) or packet.dst
    icmp = packet.proto in ("ICMP", "ICMPv6")
    return Flow(seq=seq, time=packet.time, source=source, destination=destination, src_addr=packet.src,
                dst_addr=packet.dst, sport=None if icmp else packet.sport, port=None if icmp else packet.dport,
                proto=packet.proto, direction=direction, verdict=verdict, policy=policy, reason=reason,
                endpoint=destination if direction == INGRESS else source,
                icmp_type=packet.sport if icmp else None, icmp_code=packet.dport if icmp else None)


@record(frozen=True)
class Query:
    """A request's filters: ``namespace`` (either side's pod in it), ``pod`` (``NS/POD`` on either
    side), ``verdict``; ``follow`` streams new flows after the recent ones."""

    namespace: str = ""
    pod: str = ""
    verdict: str = ""
    follow: bool = False

    def matches(self, flow: Flow) -> bool:
        if self.verdict and flow.verdict != self.verdict:
            return False
        if self.pod and self.pod not in (flow.source, flow.destination):
            return False
        if self.namespace:
            prefix = self.namespace + "/"
            if not (flow.source.startswith(prefix) or flow.destination.startswith(prefix)):
                return False
        return True


class QueryError(ValueError):
    """A request the server refuses: the message says which field and why."""


def parse_query(doc: object) -> Query:
    """A :class:`Query` from a request's JSON object; :class:`QueryError` naming what is wrong."""
    if not isinstance(doc, dict):
        raise QueryError("a request is one JSON object")
    unknown = sorted(set(doc) - {"namespace", "pod", "verdict", "follow"})
    if unknown:
        raise QueryError(f"unknown request field(s): {', '.join(unknown)}")
    for key in ("namespace", "pod", "verdict"):
        if not isinstance(doc.get(key, ""), str):
            raise QueryError(f"{key} must be a string")
    if not isinstance(doc.get("follow", False), bool):
        raise QueryError("follow must be true or false")
    verdict = doc.get("verdict", "")
    if verdict not in ("", ALLOWED, DENIED):
        raise QueryError(f"verdict must be {ALLOWED} or {DENIED}, not {verdict!r}")
    pod = doc.get("pod", "")
    if pod and (pod.count("/") != 1 or not all(pod.split("/"))):
        raise QueryError(f"pod must be NS/POD, not {pod!r}")
    namespace = doc.get("namespace", "")
    if "/" in namespace:
        raise QueryError(f"namespace must be a name, not {namespace!r}")
    return Query(namespace=namespace, pod=pod, verdict=verdict, follow=doc.get("follow", False))


class Ring:
    """The newest ``capacity`` flows, admitted at most ``rate`` a second (a token bucket with a
    burst of one second's worth). One producer (the collector: :meth:`admit`, then :meth:`add`
    with the number it gave) and any number of readers; followers wait on it for new flows.

    ``dropped`` counts flows pushed out by newer ones, ``rate_limited`` those refused."""

    def __init__(self, capacity: int = 10_000, rate: float = 1_000.0, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if capacity < 1 or rate <= 0:
            raise ValueError("a flow ring needs a capacity of at least 1 and a positive rate")
        self.capacity = capacity
        self.rate = rate
        self._clock = clock
        self._items: list[Flow | None] = [None] * capacity
        self._next = 0          # sequence number of the next flow admitted (also how many were)
        self._tokens = rate
        self._last = clock()
        self._cond = threading.Condition()
        self.dropped = 0
        self.rate_limited = 0
        self.closed = False

    def admit(self) -> int | None:
        """A sequence number for one more flow if the rate allows it now, else None (counted)."""
        with self._cond:
            now = self._clock()
            self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens < 1:
                self.rate_limited += 1
                return None
            self._tokens -= 1
            return self._next

    def add(self, flow: Flow) -> None:
        """Store ``flow`` (its ``seq`` from :meth:`admit`), pushing out the oldest when full."""
        with self._cond:
            slot = self._next % self.capacity
            if self._items[slot] is not None:
                self.dropped += 1
            self._items[slot] = flow
            self._next += 1
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return min(self._next, self.capacity)

    def since(self, seq: int) -> list[Flow]:
        """The kept flows numbered ``seq`` or later, oldest first."""
        with self._cond:
            start = max(seq, self._next - self.capacity)
            return [f for f in (self._items[i % self.capacity] for i in range(start, self._next)) if f is not None]

    def wait(self, seq: int, timeout: float) -> bool:
        """Wait until a flow numbered ``seq`` or later exists (True) or ``timeout`` passes."""
        with self._cond:
            return self._cond.wait_for(lambda: self._next > seq or self.closed, timeout) and not self.closed

    def close(self) -> None:
        """Wake every follower: no more flows will come."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def follow(self, query: Query, stop: Callable[[], bool], poll: float = 1.0) -> Iterator[Flow]:
        """The kept flows ``query`` matches, then (``query.follow``) each new one as it comes,
        until ``stop()`` is true or the ring is closed."""
        seq = 0
        while True:
            batch = self.since(seq)
            for flow in batch:
                if query.matches(flow):
                    yield flow
            if batch:
                seq = batch[-1].seq + 1
            if not query.follow:
                return
            while not self.wait(seq, poll):
                if stop() or self.closed:
                    return
            if stop():
                return
