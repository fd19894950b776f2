"""Deleting conntrack entries by protocol and destination port, over raw ctnetlink.

A UDP flow that reached the host before a port mapping existed keeps its un-NATed conntrack
entry and would bypass the new DNAT until the entry times out; portmap deletes such entries
after ADD, as the Go reference does. Stdlib only (pyroute2's conntrack costs ~200 ms to
import); the socket is opened in the calling thread's network namespace.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

NETLINK_NETFILTER = 12
_CT_GET = (1 << 8) | 1  # NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET
_CT_DELETE = (1 << 8) | 2
_F_REQUEST, _F_ACK, _F_DUMP = 0x1, 0x4, 0x300
_DONE, _ERROR = 3, 2
_NESTED = 0x8000
CTA_TUPLE_ORIG, CTA_TUPLE_PROTO, CTA_PROTO_NUM, CTA_PROTO_DST_PORT = 1, 2, 1, 3


def _attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    off = 0
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        if length < 4:
            return
        yield kind & ~_NESTED & 0xFFFF, data[off + 4:off + length]
        off += (length + 3) & ~3


def _attr(kind: int, payload: bytes, nested: bool = False) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind | (_NESTED if nested else 0)) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _request(sock: socket.socket, msg_type: int, flags: int, family: int, body: bytes, seq: int) -> None:
    payload = struct.pack("=BBH", family, 0, 0) + body
    sock.send(struct.pack("=IHHII", 16 + len(payload), msg_type, flags, seq, 0) + payload)


def _messages(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """(type, payload after the nfgenmsg) of each reply until DONE or an ACK/error."""
    while True:
        data = sock.recv(1 << 16)
        off = 0
        while off + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, off)
            if length < 16:
                return
            if kind == _DONE:
                return
            if kind == _ERROR:
                errno = -struct.unpack_from("=i", data, off + 16)[0]
                if errno:
                    raise OSError(errno, os.strerror(errno))
                return
            yield kind, data[off + 20:off + length]
            off += (length + 3) & ~3


def _matches(tuple_orig: bytes, proto: int, dport: int) -> bool:
    for kind, val in _attrs(tuple_orig):
        if kind == CTA_TUPLE_PROTO:
            fields = dict(_attrs(val))
            num = fields.get(CTA_PROTO_NUM)
            port = fields.get(CTA_PROTO_DST_PORT)
            return bool(num and port and num[0] == proto and struct.unpack("!H", port[:2])[0] == dport)
    return False


def delete_by_dst_port(proto: int, dport: int, family: int) -> int:
    """Delete the entries whose original tuple is ``proto`` to ``dport``; return how many."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as sock:
        sock.settimeout(10)
        _request(sock, _CT_GET, _F_REQUEST | _F_DUMP, family, b"", 1)
        stale = []
        for _kind, body in _messages(sock):
            for kind, val in _attrs(body):
                if kind == CTA_TUPLE_ORIG and _matches(val, proto, dport):
                    stale.append(val)
        deleted = 0
        for i, tuple_orig in enumerate(stale, start=2):
            _request(sock, _CT_DELETE, _F_REQUEST | _F_ACK, family, _attr(CTA_TUPLE_ORIG, tuple_orig, True), i)
            try:
                for _ in _messages(sock):
                    pass
                deleted += 1
            except OSError:
                pass  # gone meanwhile
        return deleted
