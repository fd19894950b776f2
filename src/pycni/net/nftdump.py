"""Read one nf_tables table back over netlink: its chains (with their hooks), each rule's chain
and comment, each set's and map's elements as raw bytes — no ``nft`` process, no JSON.

Why: the policy agent reconciles its table against the kernel on start and when its periodic
check finds a commit not its own (:func:`generation` tells), and at 10,000 endpoints ``nft -j
list table`` took 1.3 s and a hundred megabytes to render and parse rules the agent only
compares by their comment tags. The kernel's dumps answer the same in milliseconds; rule
expressions (and the anonymous sets that belong to them) are skipped, not decoded. Values stay
bytes: the caller knows what its keys mean (an ifname, an address, a concatenation).
"""

from __future__ import annotations

import struct

from pycni.net.nfnl import (
    FAMILIES,
    NETLINK_NETFILTER,
    NFNL_SUBSYS_NFTABLES,
    NFT_MSG_GETCHAIN,
    NFT_MSG_GETGEN,
    NFT_MSG_GETRULE,
    NFT_MSG_GETSET,
    NFT_MSG_GETSETELEM,
    NFT_MSG_GETTABLE,
    NFT_SET_ANONYMOUS,
    NFT_SET_MAP,
    NFTA_CHAIN_HOOK,
    NFTA_CHAIN_NAME,
    NFTA_CHAIN_POLICY,
    NFTA_CHAIN_TABLE,
    NFTA_DATA_VALUE,
    NFTA_DATA_VERDICT,
    NFTA_GEN_ID,
    NFTA_HOOK_HOOKNUM,
    NFTA_HOOK_PRIORITY,
    NFTA_LIST_ELEM,
    NFTA_RULE_CHAIN,
    NFTA_RULE_TABLE,
    NFTA_RULE_USERDATA,
    NFTA_SET_ELEM_DATA,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_LIST_SET,
    NFTA_SET_ELEM_LIST_TABLE,
    NFTA_SET_FLAGS,
    NFTA_SET_NAME,
    NFTA_SET_TABLE,
    NFTA_TABLE_NAME,
    NFTA_VERDICT_CHAIN,
    NFTA_VERDICT_CODE,
    NFTNL_UDATA_COMMENT,
    VERDICTS,
)
from pycni.net.nl import NLM_F_DUMP, NetlinkSocket, nla, raw_attrs


class Chain:
    """A chain: its hook when a base chain, and each rule's comment in order."""

    __slots__ = ("name", "hook", "priority", "policy", "rules")

    def __init__(self, name: str) -> None:
        self.name = name
        self.hook: int | None = None       # NF_INET_* when a base chain
        self.priority: int | None = None
        self.policy: int | None = None     # NF_DROP / NF_ACCEPT
        self.rules: list[str | None] = []


class Set:
    """A named set or map: its elements' keys (raw) and, for a map, their verdicts."""

    __slots__ = ("name", "is_map", "elements")

    def __init__(self, name: str) -> None:
        self.name = name
        self.is_map = False
        self.elements: list[tuple[bytes, str | None]] = []


class Table:
    __slots__ = ("chains", "sets")

    def __init__(self) -> None:
        self.chains: dict[str, Chain] = {}
        self.sets: dict[str, Set] = {}


def _str(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")


def _comment(userdata: bytes) -> str | None:
    """The comment item of libnftnl's userdata (u8 type, u8 length, value)."""
    i = 0
    while i + 2 <= len(userdata):
        kind, n = userdata[i], userdata[i + 1]
        if kind == NFTNL_UDATA_COMMENT:
            return _str(userdata[i + 2:i + 2 + n])
        i += 2 + n
    return None


def _verdict(data: bytes) -> str:
    code, chain = 0, ""
    for kind, value in raw_attrs(data):
        if kind == NFTA_DATA_VERDICT:
            for k, v in raw_attrs(value):
                if k == NFTA_VERDICT_CODE:
                    code = struct.unpack(">i", v[:4])[0]
                elif k == NFTA_VERDICT_CHAIN:
                    chain = _str(v)
    word = VERDICTS.get(code, str(code))
    return f"{word} {chain}" if chain else word


def _dump(sock: NetlinkSocket, fam: int, mtype: int, attrs: bytes) -> list[bytes]:
    body = struct.pack("=BBH", fam, 0, 0) + attrs
    return [b[4:] for _, b in sock.exchange((NFNL_SUBSYS_NFTABLES << 8) | mtype, body, NLM_F_DUMP)]


def _generation(sock: NetlinkSocket) -> int:
    from pycni.net.nl import NetlinkError

    for _mtype, body in sock.exchange((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN, struct.pack("=BBH", 0, 0, 0)):
        for kind, value in raw_attrs(body[4:]):
            if kind == NFTA_GEN_ID and len(value) >= 4:
                return int(struct.unpack(">I", value[:4])[0])
    raise NetlinkError(71, "the kernel's generation answer had no id")  # EPROTO


def generation() -> int:
    """The namespace's nf_tables generation id: every commit, anyone's, moves it on by one. One
    small request, so a reader can tell "nothing was committed since" without reading anything
    back. Raises :class:`pycni.net.nl.NetlinkError` / OSError when the kernel does not answer.
    (A socket of its own: see :class:`Generation` for asking often.)"""
    with NetlinkSocket(NETLINK_NETFILTER) as sock:
        sock.settimeout(5)
        return _generation(sock)


class Generation:
    """:func:`generation` over one socket kept open, for a caller that asks after each of its
    commits: closing a netfilter netlink socket waits for the kernel to reclaim what the last
    commit removed (7-20 ms after a transaction that replaced a chain, measured), which a socket
    per question would put on the caller's path. The socket belongs to the namespace it was
    opened in; it is opened again when the calling thread's namespace is another."""

    def __init__(self) -> None:
        self._sock: NetlinkSocket | None = None
        self._netns: tuple[int, int] | None = None

    def socket(self) -> NetlinkSocket:
        """The kept socket of the calling thread's namespace (also for the caller's own batches,
        :mod:`pycni.net.nftbatch`; after an error, :meth:`close` it)."""
        import os

        st = os.stat("/proc/thread-self/ns/net")
        if self._sock is None or self._netns != (st.st_dev, st.st_ino):
            self.close()
            self._sock = NetlinkSocket(NETLINK_NETFILTER)
            self._sock.settimeout(5)
            self._netns = (st.st_dev, st.st_ino)
        return self._sock

    def __call__(self) -> int:
        sock = self.socket()
        try:
            return _generation(sock)
        except OSError:
            self.close()  # (a late answer must not be read as the next one's)
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def read_table(family: str, table: str) -> Table | None:
    """Table ``family table`` as the kernel holds it now; None when it does not exist. Raises
    :class:`pycni.net.nl.NetlinkError` / OSError when the kernel does not answer."""
    from pycni.net.nl import NetlinkError

    fam = FAMILIES[family]
    name = table.encode() + b"\0"
    with NetlinkSocket(NETLINK_NETFILTER) as sock:
        sock.settimeout(30)
        try:
            sock.exchange((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE,
                          struct.pack("=BBH", fam, 0, 0) + nla(NFTA_TABLE_NAME, name))
        except NetlinkError as e:
            if e.code == 2:  # ENOENT
                return None
            raise
        out = Table()
        for msg in _dump(sock, fam, NFT_MSG_GETCHAIN, nla(NFTA_CHAIN_TABLE, name)):
            c = Chain(name="")
            mine = False
            for kind, value in raw_attrs(msg):
                if kind == NFTA_CHAIN_TABLE:
                    mine = _str(value) == table
                elif kind == NFTA_CHAIN_NAME:
                    c.name = _str(value)
                elif kind == NFTA_CHAIN_POLICY:
                    c.policy = struct.unpack(">I", value[:4])[0]
                elif kind == NFTA_CHAIN_HOOK:
                    for k, v in raw_attrs(value):
                        if k == NFTA_HOOK_HOOKNUM:
                            c.hook = struct.unpack(">I", v[:4])[0]
                        elif k == NFTA_HOOK_PRIORITY:
                            c.priority = struct.unpack(">i", v[:4])[0]
            if mine:
                out.chains[c.name] = c
        for msg in _dump(sock, fam, NFT_MSG_GETRULE, nla(NFTA_RULE_TABLE, name)):
            chain, comment, mine = "", None, False
            for kind, value in raw_attrs(msg):
                if kind == NFTA_RULE_TABLE:
                    mine = _str(value) == table
                elif kind == NFTA_RULE_CHAIN:
                    chain = _str(value)
                elif kind == NFTA_RULE_USERDATA:
                    comment = _comment(value)
            if mine and chain in out.chains:
                out.chains[chain].rules.append(comment)
        for msg in _dump(sock, fam, NFT_MSG_GETSET, nla(NFTA_SET_TABLE, name)):
            s = Set(name="")
            mine = anonymous = False
            for kind, value in raw_attrs(msg):
                if kind == NFTA_SET_TABLE:
                    mine = _str(value) == table
                elif kind == NFTA_SET_NAME:
                    s.name = _str(value)
                elif kind == NFTA_SET_FLAGS:
                    flags = struct.unpack(">I", value[:4])[0]
                    s.is_map, anonymous = bool(flags & NFT_SET_MAP), bool(flags & NFT_SET_ANONYMOUS)
            if mine and not anonymous:  # (an anonymous set is part of its rule: `{ a, b }`)
                out.sets[s.name] = s
        for s in out.sets.values():
            which = nla(NFTA_SET_ELEM_LIST_TABLE, name) + nla(NFTA_SET_ELEM_LIST_SET, s.name.encode() + b"\0")
            for msg in _dump(sock, fam, NFT_MSG_GETSETELEM, which):
                for kind, value in raw_attrs(msg):
                    if kind != NFTA_SET_ELEM_LIST_ELEMENTS:
                        continue
                    for k, elem in raw_attrs(value):
                        if k != NFTA_LIST_ELEM:
                            continue
                        key, verdict = b"", None
                        for ek, ev in raw_attrs(elem):
                            if ek == NFTA_SET_ELEM_KEY:
                                key = next((v for kk, v in raw_attrs(ev) if kk == NFTA_DATA_VALUE), b"")
                            elif ek == NFTA_SET_ELEM_DATA:
                                verdict = _verdict(ev)
                        s.elements.append((key, verdict))
    return out
