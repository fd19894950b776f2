"""The policy table's netlink writer (pycni.net.nftbatch, pycni.net.nftrule) against nft itself.

Every rule the policy compiler writes — each truth-table case's policies, with and without flow
logging, the verdict and fixed chains, and ipBlocks of every prefix shape and except list — is
written into one chain by nft (libnftables, from the text) and into another by our netlink batch,
in a throwaway namespace; the kernel must then hold the same expressions (``nft --debug=netlink``
prints them; an anonymous set's kernel-given number aside) and ``nft list`` must print the same
rules. Sets of every type the table uses and a chain's comment likewise. A rule outside the
encoded grammar answers None (its transaction then goes through libnftables) — never a different
rule.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from netns_util import have_root, new_namespace
from policy_cases import CASES, KEYS, policies_text

from pycni.cluster.policy import compile as pc
from pycni.cluster.policy.evaluate import EGRESS, INGRESS
from pycni.cluster.policy.model import parse_policies
from pycni.net import nftrule
from pycni.net.nftbatch import SET_TYPES, Batch

pytestmark = pytest.mark.skipif(not have_root(), reason="needs root (network namespaces)")

EXTRA = """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: shapes, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - ipBlock: {cidr: 10.16.0.0/12, except: [10.16.0.0/25]}
    - ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8]}
    - ipBlock: {cidr: 192.168.7.1/32}
    - ipBlock: {cidr: "fd00:0:0:10::/60", except: ["fd00:0:0:10::1/128"]}
    - ipBlock: {cidr: "fd00::/48"}
    - ipBlock: {cidr: "::/0"}
    - ipBlock: {cidr: 172.16.0.0/16, except: [172.16.1.0/24, 172.16.2.0/24]}
    - ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8, 172.16.0.0/12, 10.1.0.0/16, 192.168.0.1/32, 240.0.0.0/4]}
    - ipBlock: {cidr: 0.0.0.0/1, except: [0.0.0.0/8, 10.0.0.0/25, 10.0.0.128/25]}
    - ipBlock: {cidr: "::/0", except: ["fd00::/8", "fe80::/10", "ff00::/8"]}
    ports:
    - {protocol: SCTP, port: 9}
    - {protocol: UDP, port: 1000, endPort: 2000}
    - {protocol: TCP, port: web}
    - {protocol: UDP}
  egress:
  - to:
    - namespaceSelector: {matchLabels: {team: ops}}
      podSelector: {matchExpressions: [{key: app, operator: In, values: [a, b]}]}
    ports: [{port: 65535}]
"""


def _compiled_rules() -> list[str]:
    """Every distinct rule the compiler writes for the truth tables' policies and :data:`EXTRA`."""
    addresses = {k: f"10.77.0.{i + 1}" for i, k in enumerate(KEYS)}
    texts = [policies_text(c, addresses) for c in CASES if c["policies"]] + [EXTRA]
    rules: list[str] = []
    for text in texts:
        policies = parse_policies(text)
        for log in (None, pc.LOG):
            for p in policies:
                for d in (INGRESS, EGRESS):
                    rules += pc.render(p, d, log).rules
                    rules += pc.verdict_chain([p], d, log)
                    if log is not None:
                        rules += pc.accept_rules(p, d, log)
    for log in (None, pc.LOG):
        rules += [r for chain in pc.fixed_chains(log).values() for r in chain]
    return list(dict.fromkeys(rules))


def _set_type(name: str) -> str:
    v = int(name[-1])
    return (pc.SET_TYPES if name.startswith("s_") else pc.PORT_SET_TYPES)[v]


def _listed(ns_run, chain: str) -> tuple[list[str], list[str]]:  # type: ignore[no-untyped-def]
    """A chain's expressions (as nft's debug output prints them) and its listed rules."""
    debug = ns_run(["nft", "--debug=netlink", "list", "chain", "inet", "tb", chain]).stdout
    exprs = [re.sub(r"__set\d+", "__set", ln.strip()) for ln in debug.splitlines() if ln.strip().startswith("[")]
    listing = ns_run(["nft", "list", "chain", "inet", "tb", chain]).stdout
    rules = [ln.strip() for ln in listing.splitlines()[2:-2]]
    return exprs, rules


def test_every_compiled_rule_is_written_as_nft_writes_it() -> None:
    from pycni.net.nfnl import NETLINK_NETFILTER
    from pycni.net.nl import NetlinkSocket

    rules = _compiled_rules()
    b = Batch("inet", "tb")
    encodable = [r for r in rules if nftrule.encode(r, b.add_anonymous_set) is not None]
    assert encodable == rules and len(rules) > 100  # (every rule the compiler writes)
    assert sum(bool(re.search(r"!= \{ \S+, ", r)) for r in rules) >= 5  # (anonymous sets among them)
    sets = sorted(set(re.findall(r"@(\S+)", " ".join(rules))))
    chains = sorted(set(re.findall(r"jump (\S+)", " ".join(rules))))
    ns = new_namespace("nbt-rules")
    try:
        setup = ["add table inet tb", *(f"add set inet tb {s} {{ type {_set_type(s)}; }}" for s in sets),
                 *(f"add chain inet tb {c}" for c in chains), "add chain inet tb by_nft"]
        setup += [f'add rule inet tb by_nft {r} comment "{pc.rule_tag(r)}"' for r in encodable]
        ns.run(["nft", "-f", "-"], input="\n".join(setup) + "\n")
        b = Batch("inet", "tb")
        b.add_chain("by_netlink", "x/shapes ingress")
        for r in encodable:
            e = nftrule.encode(r, b.add_anonymous_set)
            assert e is not None
            b.add_rule("by_netlink", e, pc.rule_tag(r))
        with ns.enter(), NetlinkSocket(NETLINK_NETFILTER) as sock:
            b.commit(sock)
        ours_exprs, ours_rules = _listed(ns.run, "by_netlink")
        nft_exprs, nft_rules = _listed(ns.run, "by_nft")
        assert ours_rules[0] == 'comment "x/shapes ingress"'
        assert ours_rules[1:] == nft_rules and len(nft_rules) == len(encodable)
        assert ours_exprs == nft_exprs
    finally:
        ns.delete()


def test_sets_and_elements_are_written_as_nft_writes_them() -> None:
    from pycni.cluster.policy.nftsync import _key_bytes
    from pycni.net.nfnl import NETLINK_NETFILTER
    from pycni.net.nl import NetlinkSocket

    elements = {"ipv4_addr": ["10.1.2.3", "10.1.2.4"], "ipv6_addr": ["fd00::1", "fd00::2"],
                "ipv4_addr . inet_proto . inet_service": ["10.1.2.3 . tcp . 8080", "10.1.2.3 . sctp . 9"],
                "ipv6_addr . inet_proto . inet_service": ["fd00::1 . udp . 53", "fd00::2 . tcp . 443"]}
    assert set(elements) == set(SET_TYPES)
    names = {t: f"{'s' if '.' not in t else 'np'}_x_{4 if t.startswith('ipv4') else 6}" for t in elements}
    ns = new_namespace("nbt-sets")
    try:
        ns.run(["nft", "-f", "-"], input="add table inet tb\nadd table inet tn\n" + "".join(
            f"add set inet tn {names[t]} {{ type {t}; elements = {{ {', '.join(e)} }}; }}\n"
            for t, e in elements.items()))
        b = Batch("inet", "tb")
        for t, items in elements.items():
            assert b.add_set(names[t], t)
            keys = [_key_bytes(names[t], item) for item in items]
            b.elements(True, names[t], [(k, None) for k in keys if k is not None])
        with ns.enter(), NetlinkSocket(NETLINK_NETFILTER) as sock:
            b.commit(sock)
        for t in elements:
            ours = ns.run(["nft", "list", "set", "inet", "tb", names[t]]).stdout
            theirs = ns.run(["nft", "list", "set", "inet", "tn", names[t]]).stdout
            assert ours.replace("inet tb", "inet tn") == theirs, (ours, theirs)
    finally:
        ns.delete()


@pytest.mark.parametrize("text", [
    "ip saddr != { 10.0.0.1, 10.0.0.2 } accept",  # an anonymous set, with nothing to make it in
    "ip saddr != { 10.0.0.1 10.0.0.2 } accept",   # (not a list)
    "th dport 80 accept",                          # a port without its protocol
    "ip saddr 10.0.0.1/24 accept",                 # host bits set (nft refuses it too)
    "ip6 saddr 10.0.0.0/8 accept",                 # the wrong family
    "meta l4proto tcp",                            # no final statement
    "counter accept",
    'limit rate 100/second burst 50 packets log group 36 prefix "a"b"',
    "ip saddr @s_x_4 ip6 daddr @s_y_6 accept",     # two families in one rule
])
def test_what_is_not_in_the_grammar_is_refused(text: str) -> None:
    assert nftrule.encode(text) is None


def test_a_large_batch_goes_in_one_write() -> None:
    """A batch past the socket's default send buffer (2,000 rules, ~700 KB) is still one write."""
    from pycni.net.nfnl import NETLINK_NETFILTER
    from pycni.net.nl import NetlinkSocket

    ns = new_namespace("nbt-large")
    try:
        ns.run(["nft", "add", "table", "inet", "tb"])
        b = Batch("inet", "tb")
        b.add_chain("big")
        for i in range(2000):
            e = nftrule.encode(f"ip saddr 10.{i // 250}.{i % 250}.0/24 meta l4proto tcp th dport {i + 1} accept")
            assert e is not None
            b.add_rule("big", e, pc.rule_tag(str(i)))
        assert b.size > 300_000
        with ns.enter(), NetlinkSocket(NETLINK_NETFILTER) as sock:
            b.commit(sock)
        listing = subprocess.run(["ip", "netns", "exec", ns.name, "nft", "list", "chain", "inet", "tb", "big"],
                                 capture_output=True, text=True, check=True).stdout
        assert listing.count(" accept comment ") == 2000
    finally:
        ns.delete()


def test_the_reader_skips_anonymous_sets_only() -> None:
    """A rule's anonymous set (``{ a, b }``) is part of the rule, not read as a set of the table; a
    named constant set is (the flag tested is NFT_SET_ANONYMOUS, not NFT_SET_CONSTANT)."""
    from pycni.net import nftdump

    ns = new_namespace("nbt-read")
    try:
        ns.run(["nft", "-f", "-"], input="add table inet tb\n"
               "add set inet tb fixed { type ipv4_addr; flags constant; elements = { 10.0.0.1 }; }\n"
               "add chain inet tb c\nadd rule inet tb c ip saddr { 10.0.0.2, 10.0.0.3 } accept\n")
        with ns.enter():
            table = nftdump.read_table("inet", "tb")
        assert table is not None and set(table.sets) == {"fixed"} and len(table.sets["fixed"].elements) == 1
    finally:
        ns.delete()
