"""The part of nft's rule language the policy compiler writes, encoded as nf_tables expressions
(what ``nft`` itself would send for the same text), so a rule can go to the kernel in a netlink
batch (:mod:`pycni.net.nftbatch`) without libnftables.

Why not libnftables: before every transaction it reads every table, chain and set of the
namespace into its cache, and every commit (ours too) makes that cache stale — beside the 3,000
chains and sets of a node's policy table at 10,000 endpoints that was ~6 ms of CPU per
transaction, most of an agent's cost per policy change.

The grammar (:mod:`pycni.cluster.policy.compile` writes nothing else into its chains):

    rule      := match* final
    match     := FAM DIR '@'SET | FAM DIR PREFIX | FAM DIR '!=' '{' PREFIX (',' PREFIX)* '}'
               | 'meta l4proto' PROTO | 'th dport' PORT | 'th dport' PORT'-'PORT
               | FAM 'daddr . meta l4proto . th dport @'SET
    final     := 'accept' | 'drop' | 'jump' CHAIN
               | 'limit rate' N'/second burst' N 'packets log group' N 'prefix "'TEXT'"'
    FAM DIR   := ('ip' | 'ip6') ('saddr' | 'daddr')

An ``!=`` of several prefixes (an ipBlock's excepts) is a lookup in an anonymous interval set,
which the batch makes just before the rule (``anonymous_set``: :meth:`pycni.net.nftbatch.Batch.add_anonymous_set`),
with the ranges merged and bounded as nft writes them. :func:`encode` answers None for anything
else: the caller then sends its transaction through libnftables. tests/test_nft_batch.py has every shape
written both ways and the kernel's listing of the two compared.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pycni import ipaddr
from pycni.net.nfnl import (
    NFTA_DATA_VALUE,
    NFTA_DATA_VERDICT,
    NFTA_LIST_ELEM,
    NFTA_VERDICT_CHAIN,
    NFTA_VERDICT_CODE,
    VERDICT_CODES,
)
from pycni.net.nl import nla

# expressions' attributes (linux/netfilter/nf_tables.h)
NFTA_EXPR_NAME, NFTA_EXPR_DATA = 1, 2
NFTA_META_DREG, NFTA_META_KEY = 1, 2
NFT_META_NFPROTO, NFT_META_L4PROTO = 15, 16
NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA = 1, 2, 3
NFT_CMP_EQ, NFT_CMP_NEQ, NFT_CMP_LTE, NFT_CMP_GTE = 0, 1, 3, 5
NFTA_PAYLOAD_DREG, NFTA_PAYLOAD_BASE, NFTA_PAYLOAD_OFFSET, NFTA_PAYLOAD_LEN = 1, 2, 3, 4
NFT_PAYLOAD_NETWORK_HEADER, NFT_PAYLOAD_TRANSPORT_HEADER = 1, 2
NFTA_LOOKUP_SET, NFTA_LOOKUP_SREG, NFTA_LOOKUP_SET_ID, NFTA_LOOKUP_FLAGS = 1, 2, 4, 5
NFT_LOOKUP_F_INV = 1
NFTA_BITWISE_SREG, NFTA_BITWISE_DREG, NFTA_BITWISE_LEN, NFTA_BITWISE_MASK, NFTA_BITWISE_XOR = 1, 2, 3, 4, 5
NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA = 1, 2
NFTA_LIMIT_RATE, NFTA_LIMIT_UNIT, NFTA_LIMIT_BURST, NFTA_LIMIT_TYPE, NFTA_LIMIT_FLAGS = 1, 2, 3, 4, 5
NFT_LIMIT_PKTS = 0
NFTA_LOG_GROUP, NFTA_LOG_PREFIX = 1, 2
NFT_REG_VERDICT, NFT_REG_1 = 0, 1
NFPROTO_IPV4, NFPROTO_IPV6 = 2, 10
PROTOCOLS = {"tcp": 6, "udp": 17, "sctp": 132}
# (family word) -> (nfproto, address length, offset of saddr, offset of daddr)
_FAMILIES = {"ip": (NFPROTO_IPV4, 4, 12, 16), "ip6": (NFPROTO_IPV6, 16, 8, 24)}
_CONCAT_TAIL = ["meta", "l4proto", ".", "th", "dport"]  # (after FAM 'daddr' '.')


def _u32(value: int) -> bytes:
    return struct.pack(">I", value)


def _expr(name: str, *attrs: bytes) -> bytes:
    return nla(NFTA_LIST_ELEM, nla(NFTA_EXPR_NAME, name.encode() + b"\0")
               + nla(NFTA_EXPR_DATA, b"".join(attrs), nested=True), nested=True)


def _value(data: bytes) -> bytes:
    return nla(NFTA_DATA_VALUE, data)


def register(index: int) -> int:
    """nft's register for the 32-bit slot ``index``: a 128-bit register where one starts there
    (NFT_REG_1..4), else the 32-bit one (NFT_REG32_00 + index) — the numbers nft itself sends."""
    return NFT_REG_1 + index // 4 if index % 4 == 0 else 8 + index


def meta(key: int, reg: int = NFT_REG_1) -> bytes:
    return _expr("meta", nla(NFTA_META_DREG, _u32(reg)), nla(NFTA_META_KEY, _u32(key)))


def cmp(op: int, data: bytes) -> bytes:
    return _expr("cmp", nla(NFTA_CMP_SREG, _u32(NFT_REG_1)), nla(NFTA_CMP_OP, _u32(op)),
                 nla(NFTA_CMP_DATA, _value(data), nested=True))


def payload(base: int, offset: int, length: int, reg: int = NFT_REG_1) -> bytes:
    return _expr("payload", nla(NFTA_PAYLOAD_DREG, _u32(reg)), nla(NFTA_PAYLOAD_BASE, _u32(base)),
                 nla(NFTA_PAYLOAD_OFFSET, _u32(offset)), nla(NFTA_PAYLOAD_LEN, _u32(length)))


def bitwise(mask: bytes) -> bytes:
    return _expr("bitwise", nla(NFTA_BITWISE_SREG, _u32(NFT_REG_1)), nla(NFTA_BITWISE_DREG, _u32(NFT_REG_1)),
                 nla(NFTA_BITWISE_LEN, _u32(len(mask))), nla(NFTA_BITWISE_MASK, _value(mask), nested=True),
                 nla(NFTA_BITWISE_XOR, _value(bytes(len(mask))), nested=True))


def lookup(set_name: str) -> bytes:
    return _expr("lookup", nla(NFTA_LOOKUP_SET, set_name.encode() + b"\0"), nla(NFTA_LOOKUP_SREG, _u32(NFT_REG_1)))


ANONYMOUS_NAME = "__set%d"  # (the kernel numbers it)


def lookup_anonymous(set_id: int, invert: bool) -> bytes:
    """A lookup in an anonymous set made earlier in the same batch (found by its id there)."""
    return _expr("lookup", nla(NFTA_LOOKUP_SREG, _u32(NFT_REG_1)),
                 nla(NFTA_LOOKUP_SET, ANONYMOUS_NAME.encode() + b"\0"), nla(NFTA_LOOKUP_SET_ID, _u32(set_id)),
                 nla(NFTA_LOOKUP_FLAGS, _u32(NFT_LOOKUP_F_INV if invert else 0)))


class AnonymousSet:
    """An interval set a rule owns: nft's key type and length, the userdata nft stores with it
    (the key's byte order, "merge elements", and the typeof of the field it is matched against),
    and its elements as the kernel keeps an interval set — each range's start, then its end flagged
    as one (none after a range reaching the top of the address space), a range-end at 0 first
    when the first range does not start there."""

    __slots__ = ("key_type", "key_len", "userdata", "elements")

    def __init__(self, key_type: int, key_len: int, userdata: bytes, elements: list[tuple[bytes, bool]]) -> None:
        self.key_type = key_type
        self.key_len = key_len
        self.userdata = userdata
        self.elements = elements  # (key, interval end)


# (family word, field) -> nft's ids for the typeof in the set's userdata (protocol, field)
_TYPEOF = {("ip", "saddr"): (0x0C, 0x0B), ("ip", "daddr"): (0x0C, 0x0C),
           ("ip6", "saddr"): (0x0D, 0x08), ("ip6", "daddr"): (0x0D, 0x09)}


def interval_set(fam: str, field: str, prefixes: list[str]) -> AnonymousSet | None:
    """The anonymous set nft makes for ``FAM FIELD != { PREFIX, ... }``; None for a bad prefix."""
    _, size, _, _ = _FAMILIES[fam]
    bits = size * 8
    ranges: list[tuple[int, int]] = []
    for text in prefixes:
        try:
            net = ipaddr.ip_network(text, strict=True)
        except ValueError:
            return None
        if net.version != (4 if size == 4 else 6):
            return None
        start = int(net.network_address)
        ranges.append((start, start + (1 << (bits - net.prefixlen))))
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:  # (overlapping or adjacent: one range, as nft merges them)
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    elements: list[tuple[bytes, bool]] = [] if merged[0][0] == 0 else [(bytes(size), True)]
    for start, end in merged:
        elements.append((start.to_bytes(size, "big"), False))
        if end < 1 << bits:
            elements.append((end.to_bytes(size, "big"), True))
    proto, field_id = _TYPEOF[(fam, field)]
    userdata = (bytes.fromhex("000402000000" "020401000000" "0314" "000407000000" "010c" "0004")
                + bytes([proto, 0, 0, 0]) + bytes.fromhex("0104") + bytes([field_id, 0, 0, 0]))
    return AnonymousSet(7 if size == 4 else 8, size, userdata, elements)


def verdict_data(code: int, chain: str = "") -> bytes:
    """A verdict as nf_tables data (an immediate's, a verdict map element's)."""
    body = nla(NFTA_VERDICT_CODE, struct.pack(">i", code))
    if chain:
        body += nla(NFTA_VERDICT_CHAIN, chain.encode() + b"\0")
    return nla(NFTA_DATA_VERDICT, body, nested=True)


def parse_verdict(text: str) -> tuple[int, str] | None:
    """``accept`` / ``drop`` / ``jump CHAIN`` ... as (code, chain or ''); None for anything else."""
    words = text.split()
    code = VERDICT_CODES.get(words[0]) if words else None
    if code is None or len(words) != (2 if words[0] in ("jump", "goto") else 1):
        return None
    return code, words[1] if len(words) == 2 else ""


def immediate(code: int, chain: str = "") -> bytes:
    return _expr("immediate", nla(NFTA_IMMEDIATE_DREG, _u32(NFT_REG_VERDICT)),
                 nla(NFTA_IMMEDIATE_DATA, verdict_data(code, chain), nested=True))


def _prefix(fam: str, base_offset: int, text: str, op: int) -> bytes | None:
    """An address or prefix match, as nft writes it: whole bytes compared when the prefix ends on
    a byte, else the address loaded, masked and compared."""
    try:
        net = ipaddr.ip_network(text, strict=True)
    except ValueError:
        return None
    _, size, _, _ = _FAMILIES[fam]
    if net.version != (4 if size == 4 else 6):
        return None
    bits = net.prefixlen
    addr = net.network_address.packed
    if bits and bits % 8 == 0:
        return payload(NFT_PAYLOAD_NETWORK_HEADER, base_offset, bits // 8) + cmp(op, addr[:bits // 8])
    return (payload(NFT_PAYLOAD_NETWORK_HEADER, base_offset, size) + bitwise(net.netmask.packed)
            + cmp(op, addr))


def _final(words: list[str]) -> bytes | None:
    """The rule's last statement: a verdict, or the log rule (a limit, then log)."""
    text = " ".join(words)
    v = parse_verdict(text)
    if v is not None:
        return immediate(*v)
    # limit rate R/second burst B packets log group G prefix "P"
    if (len(words) >= 11 and words[0:2] == ["limit", "rate"] and words[2].endswith("/second")
            and words[3] == "burst" and words[5:8] == ["packets", "log", "group"] and words[9] == "prefix"):
        prefix = " ".join(words[10:])
        rate, burst, group = words[2][:-len("/second")], words[4], words[8]
        if not (rate.isdigit() and burst.isdigit() and group.isdigit()):
            return None
        if len(prefix) < 2 or prefix[0] != '"' or prefix[-1] != '"' or '"' in prefix[1:-1]:
            return None
        return (_expr("limit", nla(NFTA_LIMIT_RATE, struct.pack(">Q", int(rate))),
                      nla(NFTA_LIMIT_UNIT, struct.pack(">Q", 1)), nla(NFTA_LIMIT_BURST, _u32(int(burst))),
                      nla(NFTA_LIMIT_TYPE, _u32(NFT_LIMIT_PKTS)), nla(NFTA_LIMIT_FLAGS, _u32(0)))
                + _expr("log", nla(NFTA_LOG_GROUP, struct.pack(">H", int(group))),
                        nla(NFTA_LOG_PREFIX, prefix[1:-1].encode() + b"\0")))
    return None


def encode(text: str, anonymous_set: Callable[[AnonymousSet], int] | None = None) -> bytes | None:
    """The rule ``text`` as nf_tables expressions (the body of NFTA_RULE_EXPRESSIONS) in an
    ``inet`` table; None when it is not in the grammar above, or needs an anonymous set and there
    is no ``anonymous_set`` (which makes one in the batch and answers its id)."""
    words = text.split()
    out: list[bytes] = []
    nfproto_checked: int | None = None
    l4proto_known = False
    i = 0
    while i < len(words):
        w = words[i]
        if w in _FAMILIES and i + 2 < len(words) and words[i + 1] in ("saddr", "daddr"):
            nfproto, size, soff, doff = _FAMILIES[w]
            if nfproto_checked not in (None, nfproto):
                return None
            if nfproto_checked is None:
                out.append(meta(NFT_META_NFPROTO) + cmp(NFT_CMP_EQ, bytes([nfproto])))
                nfproto_checked = nfproto
            offset = soff if words[i + 1] == "saddr" else doff
            arg = words[i + 2]
            if arg.startswith("@"):
                out.append(payload(NFT_PAYLOAD_NETWORK_HEADER, offset, size) + lookup(arg[1:]))
                i += 3
            elif (arg == "." and words[i + 1] == "daddr" and words[i + 3:i + 8] == _CONCAT_TAIL
                  and i + 8 < len(words) and words[i + 8].startswith("@") and l4proto_known):
                # address . protocol . port, each in its own 32-bit slot from register 1 on
                slots = size // 4
                out.append(payload(NFT_PAYLOAD_NETWORK_HEADER, offset, size, register(0))
                           + meta(NFT_META_L4PROTO, register(slots))
                           + payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, register(slots + 1))
                           + lookup(words[i + 8][1:]))
                i += 9
            elif arg == "!=" and words[i + 3:i + 4] == ["{"] and "}" in words[i + 4:]:
                close = words.index("}", i + 4)
                items = [t.rstrip(",") for t in words[i + 4:close]]
                if not items or any(not t for t in items) or any(not t.endswith(",") for t in words[i + 4:close - 1]):
                    return None
                if len(items) == 1:  # (nft writes a one-element set as a comparison)
                    enc = _prefix(w, offset, items[0], NFT_CMP_NEQ)
                else:
                    spec = interval_set(w, words[i + 1], items)
                    enc = None if spec is None or anonymous_set is None else (
                        payload(NFT_PAYLOAD_NETWORK_HEADER, offset, size) + lookup_anonymous(anonymous_set(spec), True))
                if enc is None:
                    return None
                out.append(enc)
                i = close + 1
            else:
                enc = _prefix(w, offset, arg, NFT_CMP_EQ)
                if enc is None:
                    return None
                out.append(enc)
                i += 3
        elif w == "meta" and words[i + 1:i + 2] == ["l4proto"] and i + 2 < len(words) and words[i + 2] in PROTOCOLS:
            out.append(meta(NFT_META_L4PROTO) + cmp(NFT_CMP_EQ, bytes([PROTOCOLS[words[i + 2]]])))
            l4proto_known = True
            i += 3
        elif w == "th" and words[i + 1:i + 2] == ["dport"] and i + 2 < len(words) and l4proto_known:
            low, dash, high = words[i + 2].partition("-")
            if not low.isdigit() or (dash and not high.isdigit()):
                return None
            if int(low) > 65535 or (dash and not int(low) <= int(high) <= 65535):
                return None
            load = payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
            if dash:
                out.append(load + cmp(NFT_CMP_GTE, struct.pack(">H", int(low)))
                           + cmp(NFT_CMP_LTE, struct.pack(">H", int(high))))
            else:
                out.append(load + cmp(NFT_CMP_EQ, struct.pack(">H", int(low))))
            i += 3
        else:
            final = _final(words[i:])
            if final is None:
                return None
            out.append(final)
            return b"".join(out)
    return None  # (no final statement)
