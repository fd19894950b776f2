"""The flows query socket: the agent answers ``pycni flows`` on a local Unix socket.

Why a socket of its own: flows are the agent's memory, not etcd's; the CLI asks the agent of
this node. Listening goes through :mod:`pycni.unixsock` (the one listener: mode 0600, never
takes over a live socket, removes only its own). Two agents on one machine (the tests) use two
paths (``--flows-socket``).

The protocol, one connection per request: the client sends one JSON object on one line —
``{"namespace": "NS", "pod": "NS/POD", "verdict": "allowed"|"denied", "follow": true}``, every
field optional — and the server answers JSON lines: one flow each (:meth:`Flow.to_json`), then
``{"end": N}`` (N flows sent) unless following; a refused request gets one ``{"error": "..."}``
line. A follower gets the recent flows, then each new one, until it closes the connection or
the agent stops. A request is at most 4 KiB and must arrive within 5 s; at most 16 connections
are served at once (the next gets ``{"error": "busy..."}``); a client that reads nothing for
30 s while flows wait for it is dropped.
"""

from __future__ import annotations

import json
import socket
import threading

from pycni.cluster.flows import DEFAULT_SOCKET
from pycni.cluster.flows.model import QueryError, Ring, parse_query

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

__all__ = ["DEFAULT_SOCKET", "FlowServer", "NoAgent", "query"]
MAX_REQUEST = 4096
REQUEST_TIMEOUT = 5.0
MAX_CLIENTS = 16
SEND_TIMEOUT = 30.0


class NoAgent(Exception):
    """Nothing answers on the flows socket: the message names the path."""


def _send(conn: socket.socket, doc: dict[str, Any]) -> None:
    conn.sendall((json.dumps(doc, separators=(",", ":")) + "\n").encode())


def _gone(conn: socket.socket) -> bool:
    """True when the client closed its end (a follower that went away)."""
    import select

    try:
        if not select.select([conn], [], [], 0)[0]:
            return False  # nothing to read: still there (a socket timeout would make recv wait)
        return conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _drain(conn: socket.socket) -> None:
    """End our side and read (a little of) what the client still sends, so closing does not reset
    the connection before the client has read the error line."""
    import time

    try:
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 1.0
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if not conn.recv(65536):
                return
    except OSError:
        return


class FlowServer:
    """Serves ``ring`` on ``path`` from a thread; :meth:`stop` closes it and removes the socket."""

    def __init__(self, path: str, ring: Ring, mode: int = 0o600) -> None:
        self.path = path
        self.ring = ring
        self.mode = mode
        self._sock: socket.socket | None = None
        self._owned: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._clients = threading.BoundedSemaphore(MAX_CLIENTS)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen (``unixsock.Refused``/``AlreadyServing`` or OSError when it cannot) and serve."""
        import os

        from pycni.unixsock import listen

        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        self._sock, self._owned = listen(self.path, self.mode)
        self._sock.settimeout(0.5)
        self._thread = threading.Thread(target=self._accept, name="flows-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            if not self._clients.acquire(blocking=False):
                threading.Thread(target=self._busy, args=(conn,), name="flows-busy", daemon=True).start()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="flows-client", daemon=True).start()

    @staticmethod
    def _busy(conn: socket.socket) -> None:
        """Turn a connection away (at most a second of this thread's time)."""
        with conn:
            try:
                _send(conn, {"error": f"busy: {MAX_CLIENTS} requests are being served; try again"})
            except OSError:
                return
            _drain(conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(REQUEST_TIMEOUT)
                try:
                    query = parse_query(json.loads(self._request(conn)))
                except (QueryError, ValueError) as e:  # json's errors are ValueErrors too
                    _send(conn, {"error": f"bad request: {e}"})
                    _drain(conn)
                    return
                conn.settimeout(SEND_TIMEOUT)  # a client that stops reading is dropped, not waited for
                sent = 0
                for flow in self.ring.follow(query, stop=lambda: self._stop.is_set() or _gone(conn)):
                    _send(conn, flow.to_json())
                    sent += 1
                if not query.follow:
                    _send(conn, {"end": sent})
        except OSError:
            pass  # the client went away
        finally:
            self._clients.release()

    @staticmethod
    def _request(conn: socket.socket) -> str:
        data = b""
        while b"\n" not in data:
            try:
                chunk = conn.recv(MAX_REQUEST + 1 - len(data))
            except TimeoutError:
                raise QueryError(f"no complete request line within {REQUEST_TIMEOUT:g} s") from None
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REQUEST:
                raise QueryError(f"a request is at most {MAX_REQUEST} bytes")
        try:
            return data.split(b"\n", 1)[0].decode()
        except UnicodeDecodeError:
            raise QueryError("a request is UTF-8 JSON") from None

    def stop(self) -> None:
        """Stop answering, end the followers' streams, remove the socket if it is still ours."""
        from pycni.unixsock import unlisten

        self._stop.set()
        unlisten(self._sock, self.path, self._owned)
        self._sock = None
        if self._thread is not None:
            self._thread.join(2.0)
            self._thread = None


def query(path: str, request: dict[str, Any], timeout: float = 10.0) -> Iterator[dict[str, Any]]:
    """The flows the agent on ``path`` answers ``request`` with (each as its JSON object); a
    follow request yields until the agent stops or the caller stops iterating. :class:`NoAgent`
    when nothing answers there, :class:`QueryError` when the agent refuses the request."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        try:
            conn.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise NoAgent(f"no flows agent answers on {path} ({e.strerror}); is `pycni node` running with "
                          f"--flows-socket {path}?") from None
        except PermissionError:
            raise NoAgent(f"no permission to connect to {path} (the flows socket is root's)") from None
        conn.sendall((json.dumps(request) + "\n").encode())
        if request.get("follow"):
            conn.settimeout(None)
        buf = b""
        while True:
            try:
                chunk = conn.recv(1 << 16)
            except TimeoutError:
                raise NoAgent(f"the flows agent on {path} did not answer within {timeout:g} s") from None
            if not chunk:
                if request.get("follow"):
                    return  # the agent stopped
                raise NoAgent(f"the flows agent on {path} closed the connection before its answer ended")
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                doc = json.loads(line)
                if "error" in doc:
                    raise QueryError(str(doc["error"]))
                if "end" in doc:
                    return
                yield doc
    finally:
        conn.close()
