"""The etcd v3 client of pycni: stdlib HTTP/1.1 to etcd's JSON gateway (``/v3/...``).

Why not grpc/``etcd3``: a one-shot CNI plugin pays for every import, and grpc + protobuf cost
hundreds of milliseconds (``etcd3`` does not even import with current protobuf). Why not
:mod:`http.client`: it drags in the ``email`` package (~15 ms). The gateway speaks plain JSON
over HTTP/1.1, so this module talks to it over a socket: ``socket``, ``json`` and ``binascii``,
plus ``ssl`` only when an endpoint is ``https://``.

Gateway facts the code relies on: keys and values travel base64-encoded; int64 fields
(revisions, lease IDs, TTLs) come back as JSON strings; fields at their default value are
left out (a txn whose compares failed has no ``succeeded``, an empty range no ``kvs``, a
zero ``count`` no ``count``); errors come back as ``{"error", "code", "message"}`` with a
gRPC status code.

Failure model: every call has a budget (``timeout``, seconds). Within it the client tries
the endpoints in turn, starting from the last one that answered, each attempt bounded by
``attempt_timeout``; an endpoint that refuses, times out, or answers "no leader"/"timed out"
(gRPC Unavailable and friends) is skipped. When the budget runs out, :class:`EtcdUnavailable`
names every endpoint and what each said — plugins map it to CNI code 11 (try again). A write
whose answer was lost may have been applied: callers make writes conditional (txn compares)
or idempotent, so a retry is safe. Watches report a compaction or a broken stream as
:class:`WatchBroken` (:class:`EtcdCompacted` for the former): the caller re-lists and watches
again from the listed revision.

API (keys and values are ``str``, UTF-8 on the wire)::

    with Etcd(["http://10.0.0.1:2379", ...], timeout=8.0) as etcd:
        kv = etcd.get("/k")                         # KV | None
        kvs, rev = etcd.get_prefix("/p/")           # list[KV] sorted by key, store revision
        rev = etcd.put("/k", "v", lease=0)
        n = etcd.delete("/k") ; n = etcd.delete_prefix("/p/")
        res = etcd.txn([if_absent("/k")], [op_put("/k", "v")], [op_get("/k")])
        res.succeeded, res.revision, res.responses  # responses: list[KV] per op_get, else counts/None
        lease = etcd.lease_grant(10); etcd.lease_keepalive(lease) -> ttl (0: gone); etcd.lease_revoke(lease)
        with etcd.watch("/p/", prefix=True, start_revision=rev + 1) as w:
            batch = w.next(timeout=1.0)             # WatchBatch | None (idle); raises WatchBroken
"""

from __future__ import annotations

import binascii
import time

from pycni import jsonlite as json
from pycni.record import field, record

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    import _socket
    import ssl
    from collections.abc import Callable, Iterator, Sequence
    from types import TracebackType
    from typing import Any

    Connect = Callable[[str, int, float], _socket.socket]

DEFAULT_TIMEOUT = 8.0
DEFAULT_ATTEMPT_TIMEOUT = 3.0

# gRPC codes worth trying another endpoint (or the same one again) for: Unknown (some
# "etcdserver: ..." transient errors), DeadlineExceeded, ResourceExhausted ("too many
# requests"), Aborted, Unavailable ("no leader", "leader changed", "request timed out").
_RETRIABLE_CODES = frozenset((2, 4, 8, 10, 14))
_OUT_OF_RANGE = 11  # "required revision has been compacted"


# ---- errors -------------------------------------------------------------------------------------


class EtcdError(Exception):
    """etcd refused a request (bad request, failed precondition...): retrying will not help."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the budget. ``errors`` maps each endpoint to its last failure;
    ``refused``: every endpoint refused the connection (nothing listens there), so the client
    gave up early (``refused_grace``) instead of waiting out the budget."""

    def __init__(self, endpoints: Sequence[str], errors: dict[str, str], timeout: float,
                 refused: bool = False) -> None:
        self.endpoints = list(endpoints)
        self.errors = dict(errors)
        self.timeout = timeout
        self.refused = refused
        said = "; ".join(f"{ep}: {errors.get(ep, 'not tried')}" for ep in self.endpoints)
        if refused:
            super().__init__(f"every etcd endpoint refused the connection ({', '.join(self.endpoints)})", 14)
        else:
            super().__init__(f"no etcd endpoint answered within {timeout:g}s ({said})", 14)


class WatchBroken(EtcdError):
    """A watch stream ended (member gone, stream cancelled): list again, then watch again."""


class EtcdCompacted(WatchBroken):
    """The watch's start revision was compacted away; ``compact_revision`` is the oldest still kept."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"watch start revision compacted (oldest kept: {compact_revision})", _OUT_OF_RANGE)
        self.compact_revision = compact_revision


# ---- data ---------------------------------------------------------------------------------------


@record
class KV:
    """One key as etcd stores it."""

    key: str
    value: str = ""
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0

    def json(self) -> Any:
        """The value decoded as JSON (what pycni stores)."""
        return json.loads(self.value)


@record
class TxnResult:
    """``succeeded``: did every compare hold; ``responses``: one per op of the branch that ran
    (``list[KV]`` for a get, the deleted count for a delete, None for a put)."""

    succeeded: bool
    revision: int
    responses: list[Any] = field(default_factory=list)


@record
class Event:
    """One watch event: ``type`` is "PUT" or "DELETE"; ``prev`` when the watch asked for it."""

    type: str
    kv: KV
    prev: KV | None = None


@record
class WatchBatch:
    """What one watch response carried: events (maybe none: a progress notice) and the revision."""

    revision: int
    events: list[Event] = field(default_factory=list)


def _b64(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _unb64(text: str | None) -> str:
    return binascii.a2b_base64(text).decode() if text else ""


def _kv(raw: dict[str, Any]) -> KV:
    return KV(key=_unb64(raw.get("key")), value=_unb64(raw.get("value")),
              create_revision=int(raw.get("create_revision", 0)), mod_revision=int(raw.get("mod_revision", 0)),
              version=int(raw.get("version", 0)), lease=int(raw.get("lease", 0)))


def prefix_end(prefix: str) -> str:
    """The ``range_end`` that makes a range cover every key starting with ``prefix`` (base64)."""
    data = bytearray(prefix.encode())
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return _b64(bytes(data))
        data.pop()
    return _b64(b"\0")  # every key


def _revision(obj: dict[str, Any]) -> int:
    return int(obj.get("header", {}).get("revision", 0))


# ---- txn building blocks ------------------------------------------------------------------------


def if_absent(key: str) -> dict[str, Any]:
    """Compare: the key does not exist (its create revision is 0)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def if_mod(key: str, revision: int) -> dict[str, Any]:
    """Compare: the key was last written at ``revision`` (0: it does not exist)."""
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def if_version(key: str, version: int) -> dict[str, Any]:
    """Compare: the key has been written ``version`` times since it was created (0: absent)."""
    return {"key": _b64(key), "target": "VERSION", "result": "EQUAL", "version": str(version)}


def if_created(key: str, revision: int) -> dict[str, Any]:
    """Compare: the key was created at ``revision`` (the same incarnation, not a re-creation)."""
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def if_value(key: str, value: str) -> dict[str, Any]:
    """Compare: the key holds exactly ``value``."""
    return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}


def op_put(key: str, value: str, lease: int = 0) -> dict[str, Any]:
    req: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        req["lease"] = str(lease)
    return {"request_put": req}


def op_delete(key: str, prefix: bool = False) -> dict[str, Any]:
    req = {"key": _b64(key)}
    if prefix:
        req["range_end"] = prefix_end(key)
    return {"request_delete_range": req}


def op_get(key: str, prefix: bool = False, serializable: bool = False, keys_only: bool = False) -> dict[str, Any]:
    """Read a key (or a prefix). A txn whose ops are all serializable gets is answered by the member
    itself, without a round to the leader: fast, maybe stale (guard writes based on it with compares)."""
    req: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        req["range_end"] = prefix_end(key)
    if serializable:
        req["serializable"] = True
    if keys_only:
        req["keys_only"] = True
    return {"request_range": req}


# ---- HTTP/1.1 over a socket ---------------------------------------------------------------------


class _HTTPError(OSError):
    """The endpoint said something that is not an HTTP response we can read."""


def _split_url(url: str) -> tuple[bool, str, int]:
    """(tls, host, port) of ``http[s]://host[:port]``; ValueError for anything else."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"etcd endpoint {url!r} must start with http:// or https://")
    hostport = rest.split("/", 1)[0]
    if hostport.startswith("["):
        host, _, port_s = hostport[1:].partition("]")
        port_s = port_s.lstrip(":")
    else:
        host, _, port_s = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    if not host:
        raise ValueError(f"etcd endpoint {url!r} has no host")
    try:
        port = int(port_s) if port_s else 2379
    except ValueError:
        raise ValueError(f"etcd endpoint {url!r} has an invalid port") from None
    return scheme == "https", host, port


def _default_connect(host: str, port: int, timeout: float) -> _socket.socket:
    """A TCP connection from the C socket module: ``socket.py`` (with ``selectors``) and, through
    ``create_connection``'s IDNA encoding of the host, ``unicodedata`` would cost a one-shot
    plugin ~9 ms. An address literal skips the resolver; a name is looked up as bytes."""
    import _socket

    targets: list[tuple[int, Any]] = []
    for family in (_socket.AF_INET, _socket.AF_INET6):
        try:
            _socket.inet_pton(family, host)
        except OSError:
            continue
        targets = [(family, (host, port))]
        break
    if not targets:
        targets = [(af, sa) for af, _t, _p, _c, sa in
                   _socket.getaddrinfo(host.encode("ascii", "replace"), port, 0, _socket.SOCK_STREAM)]
    err: OSError = OSError(f"cannot resolve {host}")
    for family, addr in targets:
        sock = _socket.socket(family, _socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(addr)
        except OSError as e:
            sock.close()
            err = e
            continue
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)  # one small request, answered at once
        return sock
    raise err


class _Conn:
    """One keep-alive connection to one endpoint."""

    def __init__(self, url: str, connect: Connect, tls: ssl.SSLContext | None) -> None:
        self.url = url
        self.tls, self.host, self.port = _split_url(url)
        self._connect = connect
        self._ctx = tls
        self.sock: _socket.socket | None = None
        self._buf = b""

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self._buf = b""

    def _open(self, timeout: float) -> _socket.socket:
        sock = self._connect(self.host, self.port, timeout)
        if self.tls:
            import socket

            if self._ctx is None:
                raise _HTTPError(f"{self.url}: https endpoint without a TLS context")
            if not isinstance(sock, socket.socket):  # ssl wraps socket.socket only
                sock = socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
            sock = self._ctx.wrap_socket(sock, server_hostname=self.host)
        return sock

    def send(self, path: str, body: bytes, timeout: float) -> None:
        """Write one POST; reconnect once if a kept-alive socket turns out to be closed."""
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        fresh = self.sock is None
        if self.sock is None:
            self.sock = self._open(timeout)
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(head + body)
        except OSError:
            self.close()
            if fresh:
                raise
            self.sock = self._open(timeout)
            self.sock.settimeout(timeout)
            self.sock.sendall(head + body)

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise _HTTPError("connection closed by the endpoint")
        self._buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self._buf:
            self._fill()
        line, _, self._buf = self._buf.partition(b"\r\n")
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def read_head(self) -> tuple[int, dict[str, str]]:
        """Status code and headers (lower-case names) of the next response."""
        status_line = self._line()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise _HTTPError(f"not an HTTP response: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        while True:
            line = self._line()
            if not line:
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    def read_chunk(self) -> bytes:
        """The next chunk of a chunked body (b"" at its end). Consumes nothing until the whole
        chunk is buffered, so a read timeout (an idle watch) leaves the stream intact."""
        while True:
            head, sep, rest = self._buf.partition(b"\r\n")
            if sep:
                size = int(head.split(b";")[0], 16)
                if len(rest) >= size + 2:
                    data, self._buf = rest[:size], rest[size + 2:]  # (etcd sends no trailers)
                    return data
            self._fill()

    def read_body(self, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", ""):
            parts = []
            while True:
                data = self.read_chunk()
                if not data:
                    break
                parts.append(data)
            body = b"".join(parts)
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        else:  # delimited by close
            try:
                while True:
                    self._fill()
            except _HTTPError:
                pass
            body, self._buf = self._buf, b""
            self.close()
            return body
        if headers.get("connection", "").lower() == "close":
            self.close()
        return body


# ---- the client ---------------------------------------------------------------------------------


def tls_context(ca_cert: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """A client TLS context: etcd's CA (else the system's), and a client certificate if given."""
    import ssl

    ctx = ssl.create_default_context(cafile=ca_cert or None)
    if cert:
        ctx.load_cert_chain(cert, key or None)
    return ctx


# Who is told of every request (verb, outcome, seconds): the long-running processes' metrics
# (pycni.cluster.metrics); None in a plugin, which pays nothing for it.
_observer: Callable[[str, str, float], None] | None = None


def observe(fn: Callable[[str, str, float], None] | None) -> None:
    """Have ``fn(verb, outcome, seconds)`` called after every request of every client in this
    process: verb as etcd's gRPC gateway names it (range, put, txn, deleterange, grant,
    keepalive, revoke), outcome ``success``, ``unavailable`` (no endpoint answered in time) or
    ``error`` (etcd refused it)."""
    global _observer
    _observer = fn


class Etcd:
    """A client for one etcd cluster (see the module docstring for the API and failure model).

    Not thread-safe: give each thread its own (they are cheap: one socket per endpoint, opened
    on first use). ``connect(host, port, timeout) -> socket`` replaces how sockets are made
    (tests open them inside a network namespace).
    """

    def __init__(self, endpoints: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                 attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT, ca_cert: str = "", cert: str = "",
                 key: str = "", connect: Connect | None = None, refused_grace: float | None = None) -> None:
        if isinstance(endpoints, str) or not endpoints:
            raise ValueError("etcd endpoints must be a non-empty list of URLs")
        for ep in endpoints:
            _split_url(ep)
        self.endpoints = [ep.rstrip("/") for ep in endpoints]
        self.timeout = float(timeout)
        self.attempt_timeout = float(attempt_timeout)
        self._connect: Connect = connect or _default_connect
        self._tls: ssl.SSLContext | None = None
        if any(ep.startswith("https://") for ep in self.endpoints) or ca_cert or cert:
            self._tls = tls_context(ca_cert, cert, key)
        self._conns = [_Conn(ep, self._connect, self._tls) for ep in self.endpoints]
        self._good = 0
        # An absolute time.monotonic() no call may run past (a command's whole budget), or None.
        self.deadline: float | None = None
        # Seconds after which a call gives up when every endpoint keeps refusing the connection
        # (None: wait out the budget, as a plugin does across an etcd restart). An operator's
        # command sets it: nothing listening is not worth a silent wait of the whole budget.
        self.refused_grace = refused_grace

    def _all_refused(self, first: float | None, refused: int) -> float | None:
        """After a round over the endpoints: when every one refused, the time the refusals began
        (raising once they have lasted ``refused_grace``); None when one did not refuse."""
        if self.refused_grace is None or refused < len(self.endpoints):
            return None
        now = time.monotonic()
        if first is not None and now - first >= self.refused_grace:
            raise EtcdUnavailable(self.endpoints, {ep: "connection refused" for ep in self.endpoints},
                                  self.timeout, refused=True)
        return now if first is None else first

    def close(self) -> None:
        for c in self._conns:
            c.close()

    def __enter__(self) -> Etcd:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- transport --

    def _attempt(self, conn: _Conn, path: str, body: bytes, timeout: float) -> tuple[int, Any]:
        conn.send(path, body, timeout)
        status, headers = conn.read_head()
        data = conn.read_body(headers)
        try:
            obj = json.loads(data) if data.strip() else {}
        except ValueError:
            raise _HTTPError(f"HTTP {status}: undecodable body {data[:120]!r}") from None
        # unary calls of a streaming RPC (lease keepalive) answer {"result": ...}
        if isinstance(obj, dict) and isinstance(obj.get("result"), dict) and len(obj) == 1:
            obj = obj["result"]
        if isinstance(obj, dict) and isinstance(obj.get("error"), dict):  # a stream's error
            obj = obj["error"]
        return status, obj

    def call(self, path: str, payload: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """POST ``payload`` to ``path`` on the first endpoint that answers; see the failure model."""
        if _observer is None:
            return self._call(path, payload, timeout)
        started = time.monotonic()
        outcome = "error"
        try:
            obj = self._call(path, payload, timeout)
            outcome = "success"
            return obj
        except EtcdUnavailable:
            outcome = "unavailable"
            raise
        finally:
            _observer(path.rsplit("/", 1)[-1], outcome, time.monotonic() - started)

    def _call(self, path: str, payload: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        if self.deadline is not None and self.deadline < deadline:
            deadline = self.deadline
        body = json.dumps(payload, separators=(",", ":")).encode()
        errors: dict[str, str] = {}
        n = len(self._conns)
        pause = 0.05
        refused_since: float | None = None
        while True:
            start = self._good
            refused = 0
            for i in range(n):
                idx = (start + i) % n
                conn = self._conns[idx]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EtcdUnavailable(self.endpoints, errors, budget)
                try:
                    status, obj = self._attempt(conn, path, body, min(remaining, self.attempt_timeout))
                except (OSError, ValueError) as e:  # refused, reset, timed out, TLS, garbage
                    conn.close()
                    errors[conn.url] = _describe(e)
                    refused += isinstance(e, ConnectionRefusedError)
                    continue
                if status == 200 and isinstance(obj, dict) and "code" not in obj:
                    self._good = idx
                    return obj
                msg = str(obj.get("message") or obj.get("error") or f"HTTP {status}") if isinstance(obj, dict) \
                    else f"HTTP {status}"
                code = int(obj.get("code", 0)) if isinstance(obj, dict) else 0
                if code in _RETRIABLE_CODES or (not code and status >= 500):
                    errors[conn.url] = msg
                    continue
                raise EtcdError(f"{conn.url}{path}: {msg}", code)
            refused_since = self._all_refused(refused_since, refused)
            if time.monotonic() + pause >= deadline:
                raise EtcdUnavailable(self.endpoints, errors, budget)
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    # -- kv --

    def range(self, key: str, *, prefix: bool = False, range_end: str = "", limit: int = 0, revision: int = 0,
              keys_only: bool = False, serializable: bool = False) -> tuple[list[KV], int]:
        """Keys from ``key`` (a whole prefix, or up to ``range_end``), and the store revision."""
        req: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            req["range_end"] = prefix_end(key)
        elif range_end:
            req["range_end"] = _b64(range_end)
        if limit:
            req["limit"] = str(limit)
        if revision:
            req["revision"] = str(revision)
        if keys_only:
            req["keys_only"] = True
        if serializable:
            req["serializable"] = True
        obj = self.call("/v3/kv/range", req)
        return [_kv(k) for k in obj.get("kvs", ())], _revision(obj)

    def get(self, key: str, serializable: bool = False) -> KV | None:
        kvs, _rev = self.range(key, serializable=serializable)
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KV], int]:
        return self.range(prefix, prefix=True)

    def put(self, key: str, value: str, lease: int = 0) -> int:
        """Write ``key``; returns the new store revision."""
        return _revision(self.call("/v3/kv/put", op_put(key, value, lease)["request_put"]))

    def delete(self, key: str) -> int:
        """Delete one key; returns how many were deleted (0 or 1)."""
        return int(self.call("/v3/kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix: str) -> int:
        return int(self.call("/v3/kv/deleterange", op_delete(prefix, prefix=True)["request_delete_range"])
                   .get("deleted", 0))

    def txn(self, compare: Sequence[dict[str, Any]], success: Sequence[dict[str, Any]] = (),
            failure: Sequence[dict[str, Any]] = ()) -> TxnResult:
        """If every compare holds run ``success``, else ``failure``; atomically, in one revision."""
        obj = self.call("/v3/kv/txn", {"compare": list(compare), "success": list(success),
                                       "failure": list(failure)})
        responses: list[Any] = []
        for r in obj.get("responses", ()):
            if "response_range" in r:
                responses.append([_kv(k) for k in r["response_range"].get("kvs", ())])
            elif "response_delete_range" in r:
                responses.append(int(r["response_delete_range"].get("deleted", 0)))
            else:
                responses.append(None)
        return TxnResult(succeeded=bool(obj.get("succeeded", False)), revision=_revision(obj),
                         responses=responses)

    # -- leases --

    def lease_grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its ID."""
        obj = self.call("/v3/lease/grant", {"TTL": str(int(ttl)), "ID": "0"})
        if obj.get("error"):
            raise EtcdError(f"lease grant: {obj['error']}")
        return int(obj["ID"])

    def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its TTL, 0 when the lease no longer exists."""
        return int(self.call("/v3/lease/keepalive", {"ID": str(lease)}).get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        """Drop a lease and every key bound to it (a lease already gone is fine)."""
        try:
            self.call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as e:
            if e.code != 5:  # NotFound: already gone
                raise

    # -- watch --

    def watch(self, key: str, *, prefix: bool = False, start_revision: int = 0, prev_kv: bool = False,
              progress_notify: bool = False) -> Watch:
        """Open a watch stream (on the first endpoint that accepts it, within the budget)."""
        req: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            req["range_end"] = prefix_end(key)
        if start_revision:
            req["start_revision"] = str(start_revision)
        if prev_kv:
            req["prev_kv"] = True
        if progress_notify:
            req["progress_notify"] = True
        body = json.dumps({"create_request": req}).encode()
        deadline = time.monotonic() + self.timeout
        errors: dict[str, str] = {}
        n = len(self.endpoints)
        refused_since: float | None = None
        while True:
            start = self._good
            refused = 0
            for i in range(n):
                idx = (start + i) % n
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EtcdUnavailable(self.endpoints, errors, self.timeout)
                conn = _Conn(self.endpoints[idx], self._connect, self._tls)
                try:
                    w = Watch(conn, body, min(remaining, self.attempt_timeout))
                except EtcdCompacted:
                    conn.close()
                    raise
                except (OSError, ValueError, WatchBroken) as e:
                    conn.close()
                    errors[conn.url] = _describe(e)
                    refused += isinstance(e, ConnectionRefusedError)
                    continue
                self._good = idx
                return w
            refused_since = self._all_refused(refused_since, refused)
            if time.monotonic() + 0.1 >= deadline:
                raise EtcdUnavailable(self.endpoints, errors, self.timeout)
            time.sleep(0.1)


class Watch:
    """One watch stream. ``next(timeout)`` returns the next :class:`WatchBatch`, or None when
    nothing came within ``timeout``; it raises :class:`WatchBroken` (or :class:`EtcdCompacted`)
    when the stream is gone — then list again and open a new watch."""

    def __init__(self, conn: _Conn, body: bytes, timeout: float) -> None:
        self._conn = conn
        self._pending = b""
        import json as stdjson  # the stream decoder: only the long-lived agent watches

        self._dec = stdjson.JSONDecoder()
        self.endpoint = conn.url
        conn.send("/v3/watch", body, timeout)
        status, headers = conn.read_head()
        if status != 200:
            data = conn.read_body(headers)
            raise WatchBroken(f"{conn.url}: watch refused: HTTP {status} {data[:200]!r}")
        if "chunked" not in headers.get("transfer-encoding", ""):
            raise WatchBroken(f"{conn.url}: watch answered without a stream")
        first = self._message(timeout)
        if first is None or not first.get("created"):
            raise WatchBroken(f"{conn.url}: watch was not created: {first!r}")
        self.watch_id = int(first.get("watch_id", 0))
        self.revision = _revision(first)

    def _message(self, timeout: float | None) -> dict[str, Any] | None:
        """The next JSON message of the stream; None on an idle timeout."""
        conn = self._conn
        if conn.sock is None:
            raise WatchBroken(f"{conn.url}: watch closed")
        conn.sock.settimeout(timeout)
        while True:
            text = self._pending.lstrip()
            if text:
                try:
                    obj, end = self._dec.raw_decode(text.decode())
                except ValueError:
                    obj = None
                else:
                    self._pending = text.decode()[end:].encode()
                    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
                        raise WatchBroken(f"{conn.url}: watch failed: {obj['error'].get('message', obj)}")
                    return obj.get("result", obj) if isinstance(obj, dict) else {}
            try:
                chunk = conn.read_chunk()
            except TimeoutError:
                return None
            except OSError as e:
                self.close()
                raise WatchBroken(f"{conn.url}: watch stream broken: {_describe(e)}") from None
            if not chunk:
                self.close()
                raise WatchBroken(f"{conn.url}: watch stream ended")
            self._pending += chunk

    def next(self, timeout: float | None = None) -> WatchBatch | None:
        msg = self._message(timeout)
        if msg is None:
            return None
        if msg.get("compact_revision") and msg.get("canceled"):
            self.close()
            raise EtcdCompacted(int(msg["compact_revision"]))
        if msg.get("canceled"):
            self.close()
            raise WatchBroken(f"{self.endpoint}: watch cancelled: {msg.get('cancel_reason', '')}")
        events = []
        for ev in msg.get("events", ()):
            prev = ev.get("prev_kv")
            events.append(Event(type=ev.get("type", "PUT"), kv=_kv(ev.get("kv", {})),
                                prev=_kv(prev) if prev else None))
        return WatchBatch(revision=_revision(msg), events=events)

    def ready(self) -> bool:
        """Whether more of the stream has arrived already (buffered, or readable now): the agent
        drains a burst without sleeping on an idle stream after every batch."""
        if self._pending.strip() or self._conn._buf:
            return True
        sock = self._conn.sock
        if sock is None:
            return True  # next() reports the broken stream
        if getattr(sock, "pending", lambda: 0)():  # TLS: decrypted bytes the socket itself no longer shows
            return True
        import select

        return bool(select.select([sock], [], [], 0)[0])

    def __iter__(self) -> Iterator[WatchBatch]:
        while True:
            batch = self.next(None)
            if batch is not None:
                yield batch

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _describe(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
