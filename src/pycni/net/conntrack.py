"""Deleting conntrack entries by protocol and destination port, over raw ctnetlink.

A UDP flow that reached the host before a port mapping existed keeps its un-NATed conntrack
entry and would bypass the new DNAT until the entry times out; portmap deletes such entries
after ADD, as the Go reference does. Stdlib only (pyroute2's conntrack costs ~200 ms to
import): ctnetlink messages over :class:`pycni.net.nl.NetlinkSocket`, the one netlink codec; the
socket is opened in the calling thread's network namespace.
"""

from __future__ import annotations

import struct

from pycni.net.nfnl import NETLINK_NETFILTER, NFNL_SUBSYS_CTNETLINK
from pycni.net.nl import NLM_F_DUMP, NetlinkSocket, nla, raw_attrs

_CT_GET = (NFNL_SUBSYS_CTNETLINK << 8) | 1  # IPCTNL_MSG_CT_GET
_CT_DELETE = (NFNL_SUBSYS_CTNETLINK << 8) | 2  # IPCTNL_MSG_CT_DELETE
_NFGENMSG = struct.Struct("=BBH")  # family, version, res_id
CTA_TUPLE_ORIG, CTA_TUPLE_PROTO, CTA_PROTO_NUM, CTA_PROTO_DST_PORT = 1, 2, 1, 3


def _matches(tuple_orig: bytes, proto: int, dport: int) -> bool:
    for kind, val in raw_attrs(tuple_orig):
        if kind == CTA_TUPLE_PROTO:
            fields = dict(raw_attrs(val))
            num = fields.get(CTA_PROTO_NUM)
            port = fields.get(CTA_PROTO_DST_PORT)
            return bool(num and port and num[0] == proto and struct.unpack("!H", port[:2])[0] == dport)
    return False


def delete_by_dst_port(proto: int, dport: int, family: int) -> int:
    """Delete the entries whose original tuple is ``proto`` to ``dport``; return how many."""
    from pycni.net.probe import close_aside

    head = _NFGENMSG.pack(family, 0, 0)
    sock = NetlinkSocket(NETLINK_NETFILTER)
    try:
        sock.settimeout(10)
        stale = [val for _type, body in sock.exchange(_CT_GET, head, NLM_F_DUMP)
                 for kind, val in raw_attrs(body, _NFGENMSG.size)
                 if kind == CTA_TUPLE_ORIG and _matches(val, proto, dport)]
        deleted = 0
        for tuple_orig in stale:
            try:
                sock.exchange(_CT_DELETE, head + nla(CTA_TUPLE_ORIG, tuple_orig, nested=True))
                deleted += 1
            except OSError:
                pass  # gone meanwhile
        return deleted
    finally:
        close_aside(sock)  # a netfilter socket: its close waits out recent commits (portmap's, just made)
