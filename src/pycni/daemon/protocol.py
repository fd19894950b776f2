"""Wire format between plugin shims and the daemon: length-prefixed JSON frames. Stdlib only.

A request carries the plugin type, the environment and stdin; a reply carries the exit code,
stdout and stderr, so the shim can relay them byte for byte.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
from typing import Any

DEFAULT_SOCKET = "/run/pycni/pycni.sock"
MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct("!I")


def send_frame(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection mid-frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte limit")
    obj = json.loads(_recv_exact(sock, length))
    if not isinstance(obj, dict):
        raise ValueError("frame is not a JSON object")
    return obj


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
