"""Wire format between plugin shims and the daemon: length-prefixed binary fields.

The frame (:func:`frame`, :func:`recv_frame`) is also the dhcp daemon's (its bodies are JSON):
one framing for both of pycni's Unix-socket daemons.

The shim is on every plugin's start-up path, so this module imports nothing at all (no json,
base64, struct, typing or socket: each costs milliseconds in a fresh interpreter, which is
the whole budget of a shim). A frame is a 4-byte big-endian length and a body; a body is a
sequence of fields, each a 4-byte big-endian length and raw bytes, so environment values,
stdin, stdout and stderr travel byte for byte.

    request body: b"PYCNI1" field(plugin type) field(stdin) field(b"KEY=VALUE")...
    reply body:   b"PYCNI1" field(exit code, ASCII decimal) field(stdout) field(stderr)
"""

DEFAULT_SOCKET = "/run/pycni/pycni.sock"
MAGIC = b"PYCNI1"
MAX_FRAME = 64 * 1024 * 1024


def frame(body: bytes) -> bytes:
    """One frame: the body's length (4 bytes, big-endian), then the body."""
    return len(body).to_bytes(4, "big") + body


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def encode_request(plugin: str, stdin: bytes, env: dict[bytes, bytes]) -> bytes:
    """One framed request; ``env`` as bytes so nothing is re-encoded on the way."""
    parts = [MAGIC, _field(plugin.encode()), _field(stdin)]
    parts += [_field(k + b"=" + v) for k, v in env.items()]
    return frame(b"".join(parts))


def encode_reply(exit_code: int, stdout: bytes, stderr: bytes) -> bytes:
    return frame(MAGIC + _field(str(exit_code).encode()) + _field(stdout) + _field(stderr))


def _fields(body: bytes) -> list[bytes]:
    """Split a body into its fields; ValueError when it is not one of ours or is truncated."""
    if body[:len(MAGIC)] != MAGIC:
        raise ValueError("not a pycni daemon frame (bad magic)")
    out, i, n = [], len(MAGIC), len(body)
    while i < n:
        if i + 4 > n:
            raise ValueError("truncated field header")
        size = int.from_bytes(body[i:i + 4], "big")
        i += 4
        if i + size > n:
            raise ValueError("truncated field")
        out.append(body[i:i + size])
        i += size
    return out


def decode_request(body: bytes) -> tuple[str, bytes, dict[str, str]]:
    """(plugin type, stdin, environment) of a request body."""
    fields = _fields(body)
    if len(fields) < 2:
        raise ValueError("request lacks the plugin type or stdin")
    env: dict[str, str] = {}
    for item in fields[2:]:
        key, sep, value = item.partition(b"=")
        if not sep or not key:
            raise ValueError(f"malformed environment entry {item[:60]!r}")
        env[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return fields[0].decode("utf-8", "replace"), fields[1], env


def decode_reply(body: bytes) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of a reply body."""
    fields = _fields(body)
    if len(fields) != 3:
        raise ValueError(f"reply has {len(fields)} fields, expected 3")
    return int(fields[0]), fields[1], fields[2]


def recv_exact(sock: object, n: int) -> bytes:
    """Read exactly ``n`` bytes from a socket (``socket.socket`` or ``_socket.socket``)."""
    chunks = []
    recv = sock.recv  # type: ignore[attr-defined]
    while n:
        chunk = recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection mid-frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: object, limit: int = MAX_FRAME) -> bytes:
    """One frame's body; ValueError beyond ``limit`` bytes."""
    length = int.from_bytes(recv_exact(sock, 4), "big")
    if length > limit:
        raise ValueError(f"frame of {length} bytes exceeds the {limit}-byte limit")
    return recv_exact(sock, length)
