"""The plugin <-> daemon protocol: one JSON request and one JSON reply per unix-socket connection.

The reference uses Go's net/rpc; nothing else speaks to the daemon, so ours is simpler::

    request: {"method": "add"|"del"|"check"|"gc"|"status", "containerID": ..., "netns": ...,
              "ifname": ..., "args": CNI_ARGS, "stdin": the network configuration (text)}
    reply:   {"result": {...a 1.1.0 result...}}  |  {}  |  {"error": {"code", "msg", "details"}}

Each travels in the frame pycni's main daemon uses (:mod:`pycni.daemon.protocol`: a 4-byte
length, then the body), so a truncated message is told from a complete one. Stdlib only; the
plugin's side uses ``_socket`` and :mod:`pycni.jsonlite`, not :mod:`socket` (which imports
selectors and enum) and :mod:`json` (re): ~8 ms of a one-shot call's imports.
"""

from __future__ import annotations

import _socket

from pycni import jsonlite as json
from pycni.daemon.protocol import frame, recv_frame
from pycni.spec.errors import DECODE_FAILURE, TRY_AGAIN, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~3 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SOCKET_PATH = "/run/cni/dhcp.sock"
MAX_MESSAGE = 4 << 20
START_HINT = ("start it with `dhcp daemon` (the same executable as this plugin; add "
              "-socketpath PATH to match ipam.daemonSocketPath), or enable the cni-dhcp systemd "
              "socket/service units (see docs/dhcp.md)")


class DaemonUnavailable(CNIError):
    """Nothing listens on the daemon's socket."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(TRY_AGAIN, f"the DHCP daemon is not running (cannot connect to {path})",
                         f"{why}; {START_HINT}")


def send(sock: _socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(frame(json.dumps(message).encode()))


def receive(sock: _socket.socket) -> bytes:
    """One message's JSON text; ValueError when too large, ConnectionError when cut short."""
    return recv_frame(sock, MAX_MESSAGE)


def call(path: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Send one request to the daemon at ``path``; return its reply or raise its CNIError."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise DaemonUnavailable(path, e.strerror or str(e)) from None
        except PermissionError as e:
            raise CNIError(TRY_AGAIN, f"cannot connect to the DHCP daemon at {path}",
                           f"{e.strerror}: the plugin must run as a user allowed to use the socket") from None
        send(s, request)
        try:
            data = receive(s)
        except ConnectionError:
            data = b""  # closed before a whole reply: said below
        except ValueError as e:
            raise CNIError(DECODE_FAILURE, "undecodable reply from the DHCP daemon", str(e)) from None
    except TimeoutError:
        raise CNIError(TRY_AGAIN, "the DHCP daemon did not answer in time",
                       f"no reply on {path} after {timeout}s") from None
    except (ConnectionResetError, BrokenPipeError) as e:
        raise CNIError(TRY_AGAIN, "the DHCP daemon dropped the connection", f"{path}: {e}") from None
    finally:
        s.close()
    if not data:
        raise CNIError(TRY_AGAIN, "the DHCP daemon closed the connection without answering",
                       f"{path}: the daemon may be shutting down; retry")
    try:
        reply = json.loads(data)
    except ValueError as e:
        raise CNIError(DECODE_FAILURE, "undecodable reply from the DHCP daemon", str(e)) from None
    if not isinstance(reply, dict):
        raise CNIError(DECODE_FAILURE, "undecodable reply from the DHCP daemon", repr(data[:200]))
    if isinstance(reply.get("error"), dict):
        raise CNIError.from_dict(reply["error"])
    return reply
