"""Set and map elements added and removed as one nf_tables transaction over netlink, without
libnftables.

Why: libnftables reads the namespace's tables, chains and sets into its cache before every
transaction, and every commit (ours too) leaves that cache stale, so each transaction pays for
it again: beside 3,000 chains and sets a one-element transaction took 6.1 ms that way, 0.07 ms
in an empty namespace (measured). A transaction that only adds and removes elements — what a
new pod needs: its interface in a set, its verdicts in two maps, its addresses in selector
sets — needs no cache: the kernel resolves the set by name and the verdict's chain by name.
The batch is one write: the kernel applies all of it or none.
"""

from __future__ import annotations

import socket
import struct

from pycni.net.nl import NLM_F_ACK, NLM_F_CREATE, NetlinkSocket, nla
from pycni.net.probe import FAMILIES, NFNL_SUBSYS_NFTABLES

NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_DATA = 1, 2
NFTA_DATA_VALUE, NFTA_DATA_VERDICT = 1, 2
NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN = 1, 2
VERDICT_CODES = {"drop": 0, "accept": 1, "continue": -1, "jump": -3, "goto": -4, "return": -5}
PER_MESSAGE = 200  # elements per message (a nested attribute's length is 16 bits)


class ElementChange:
    """Elements of one set or map to add (or delete): each a key as the kernel holds it and, in a
    map, its verdict (code, chain name or '')."""

    __slots__ = ("add", "set_name", "elements")

    def __init__(self, add: bool, set_name: str, elements: list[tuple[bytes, tuple[int, str] | None]]) -> None:
        self.add = add
        self.set_name = set_name
        self.elements = elements


def _element(key: bytes, verdict: tuple[int, str] | None) -> bytes:
    body = nla(NFTA_SET_ELEM_KEY, nla(NFTA_DATA_VALUE, key), nested=True)
    if verdict is not None:
        code, chain = verdict
        v = nla(NFTA_VERDICT_CODE, struct.pack(">i", code))
        if chain:
            v += nla(NFTA_VERDICT_CHAIN, chain.encode() + b"\0")
        body += nla(NFTA_SET_ELEM_DATA, nla(NFTA_DATA_VERDICT, v, nested=True), nested=True)
    return nla(NFTA_LIST_ELEM, body, nested=True)


def commit(sock: NetlinkSocket, family: str, table: str, changes: list[ElementChange]) -> None:
    """Send ``changes``, in order, as one batch on ``sock`` (NETLINK_NETFILTER, in the table's
    namespace). Raises :class:`pycni.net.nl.NetlinkError` (nothing applied) or OSError."""
    fam = FAMILIES[family]
    batch = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(NFNL_SUBSYS_NFTABLES))
    head = struct.pack("=BBH", fam, 0, 0) + nla(NFTA_SET_ELEM_LIST_TABLE, table.encode() + b"\0")
    messages = [(NFNL_MSG_BATCH_BEGIN, batch, 0)]
    for change in changes:
        mtype = (NFNL_SUBSYS_NFTABLES << 8) | (NFT_MSG_NEWSETELEM if change.add else NFT_MSG_DELSETELEM)
        name = nla(NFTA_SET_ELEM_LIST_SET, change.set_name.encode() + b"\0")
        for i in range(0, len(change.elements), PER_MESSAGE):
            elements = b"".join(_element(k, v) for k, v in change.elements[i:i + PER_MESSAGE])
            messages.append((mtype, head + name + nla(NFTA_SET_ELEM_LIST_ELEMENTS, elements, nested=True),
                             (NLM_F_CREATE if change.add else 0) | NLM_F_ACK))
    messages.append((NFNL_MSG_BATCH_END, batch, 0))
    sock.send_batch(messages)
