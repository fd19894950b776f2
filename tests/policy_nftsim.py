"""A reading of the policy table as the kernel would judge a new flow, for the index's oracle test.

It understands exactly the rule forms :mod:`pycni.cluster.policy.compile` renders (set lookups,
ipBlock with except, protocols, ports and ranges, named-port concatenations, jumps (a match's
jump to a policy's logging accept chain too), accept, drop, and the flow-log rules, which judge
nothing: a ``limit rate ... log ...`` rule never ends a chain) and refuses anything else, so a
form it does not know fails the test instead of passing silently. The real kernel is exercised
by tests/test_policy_dataplane.py and tests/test_policy_cluster.py; this lets thousands of random
states be checked in seconds.
"""

from __future__ import annotations

import re

from pycni import ipaddr
from pycni.cluster.policy.compile import Desired
from pycni.cluster.policy.evaluate import EGRESS, INGRESS, Workload

_ADDR_SET = re.compile(r"^(ip6?) (saddr|daddr) @(\S+)$")
_BLOCK = re.compile(r"^(ip6?) (saddr|daddr) (\S+)(?: \1 \2 != \{ ([^}]*) \})?$")
_PROTO = re.compile(r"^meta l4proto (\w+)(?: (.*))?$")
_NAMED = re.compile(r"^(ip6?) daddr \. meta l4proto \. th dport @(\S+)$")
_PORT = re.compile(r"^th dport (\d+)(?:-(\d+))?$")
_LOG = re.compile(r'^limit rate \d+/second burst \d+ packets log group \d+ prefix "pycni:[AD]:\w+"$')
_JUMP = re.compile(r"^(.+) jump (pa_\w+)$")


def _match(desired: Desired, text: str, remote: ipaddr.IPv4Address | ipaddr.IPv6Address,
           dst: ipaddr.IPv4Address | ipaddr.IPv6Address, port: int, proto: str) -> bool:
    """Whether a rule's match part (without "accept") matches the flow (``remote``: the peer's address)."""
    fam = "ip" if remote.version == 4 else "ip6"
    # split the match into its peer part and its port part
    m = re.match(r"^(.*?)(?:\s*(meta l4proto .*))?$", text)
    assert m is not None
    peer, ports = m.group(1).strip(), m.group(2)
    if peer:
        a = _ADDR_SET.match(peer)
        b = _BLOCK.match(peer)
        if a:
            if a.group(1) != fam:
                return False
            typ, elems = desired.sets[a.group(3)]
            if str(remote) not in elems:
                return False
        elif b:
            if b.group(1) != fam:
                return False
            if remote not in ipaddr.ip_network(b.group(3)):
                return False
            if b.group(4) and any(remote in ipaddr.ip_network(x.strip()) for x in b.group(4).split(",")):
                return False
        else:
            raise AssertionError(f"unknown peer match {peer!r}")
    if ports:
        p = _PROTO.match(ports)
        assert p is not None, ports
        if p.group(1) != proto.lower():
            return False
        rest = p.group(2)
        if rest:
            n = _NAMED.match(rest)
            q = _PORT.match(rest)
            if n:
                if n.group(1) != fam:
                    return False
                _, elems = desired.sets[n.group(2)]
                return f"{dst} . {proto.lower()} . {port}" in elems
            if q:
                lo, hi = int(q.group(1)), int(q.group(2) or q.group(1))
                return lo <= port <= hi
            raise AssertionError(f"unknown port match {rest!r}")
    return True


def _chain(desired: Desired, name: str, remote: ipaddr.IPv4Address | ipaddr.IPv6Address,
           dst: ipaddr.IPv4Address | ipaddr.IPv6Address, port: int, proto: str) -> str | None:
    """The verdict of chain ``name``: "accept", "drop", or None (fell off its end: return)."""
    for rule in desired.chains[name]:
        if rule == "drop":
            return "drop"
        if _LOG.match(rule):
            continue  # (a log rule: whether its limit matches or not, the next rule judges)
        if rule.startswith("jump "):
            v = _chain(desired, rule[5:], remote, dst, port, proto)
            if v is not None:
                return v
            continue
        j = _JUMP.match(rule)
        if j:
            if _match(desired, j.group(1), remote, dst, port, proto):
                v = _chain(desired, j.group(2), remote, dst, port, proto)
                if v is not None:
                    return v
            continue
        assert rule.endswith("accept"), rule
        if _match(desired, rule[: -len("accept")].strip(), remote, dst, port, proto):
            return "accept"
    return None


def side(desired: Desired, pod: Workload, other: Workload, direction: str, port: int, proto: str,
         version: int) -> bool:
    """Whether the table lets a new flow pass at ``pod``'s interface in ``direction``."""
    assert pod.iface in desired.covered, f"{pod.key} ({pod.iface}) is not covered: dropped"
    table = desired.ingress if direction == INGRESS else desired.egress
    verdict = table.get(pod.iface)
    if verdict is None:
        return True
    if verdict == "drop":
        return False
    remote, dst = other.address(version), (pod if direction == INGRESS else other).address(version)
    assert remote is not None and dst is not None
    if verdict.startswith("jump dd_"):  # (the default deny, through its log rule)
        return _chain(desired, verdict[5:], remote, dst, port, proto) == "accept"
    assert verdict.startswith("jump v_"), verdict
    return _chain(desired, verdict[5:], remote, dst, port, proto) == "accept"


def allowed(tables: dict[str, Desired], src: Workload, dst: Workload, port: int, proto: str, version: int) -> bool:
    """A flow between two pods through their nodes' tables (egress at the source, ingress at the
    destination)."""
    return (side(tables[src.node], src, dst, EGRESS, port, proto, version)
            and side(tables[dst.node], dst, src, INGRESS, port, proto, version))
