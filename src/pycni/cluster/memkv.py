"""An in-memory key-value store with etcd v3's revision semantics, for tests without a server.

What it keeps of etcd (what the cluster layer relies on):

- one store revision, bumped once per request that changes something (a put; a delete that
  deletes); every key written by that request gets it as ``mod_revision``; a key's
  ``create_revision`` is the revision that made it, ``version`` counts its writes since, and a
  deleted key starts again at version 1 under a new create revision;
- transactions: compares on VALUE, VERSION, CREATE, MOD (and LEASE) with EQUAL, NOT_EQUAL,
  GREATER, LESS, over one key or a ``range_end``; an absent key compares as zeros, and a VALUE
  compare on an absent key fails, as in etcd; then all the ops of one branch, atomically;
- ranges by prefix (``limit``, ``keys_only``) sorted by key; ``serializable`` reads are simply
  current;
- leases (grant, keepalive, revoke deleting their keys in one revision; :meth:`MemKV.expire`);
- watches from a revision, with ``prev_kv``; :meth:`MemKV.compact` makes an older start
  revision fail with :class:`~pycni.cluster.etcd.EtcdCompacted`.

The seam for fault tests: every request (reads included, each is a transaction) goes through
:attr:`MemKV.interceptor` when one is set, as a :class:`Pending` whose ``apply()`` runs it.
An interceptor can run other requests first (reorder: another writer's change lands between
this request's read and its write), call ``apply()`` and then raise (the lost answer: the
change is made, the caller hears a failure), or never apply (a request that never arrived)::

    kv = MemKV()
    def hook(p: Pending) -> TxnResult:
        if p.writes and not done:
            done.append(1)
            other_store.release("c1", "eth0")   # runs first, through the same hook
        return p.apply()
    kv.interceptor = hook
    kv.interceptor = lose_answer(lambda p: p.writes)  # the next write is applied, its answer lost

Requests from several threads are serialised; an interceptor runs outside the store's lock, so
it may block (a ``threading.Event``) to hold one request while others go on.
"""

from __future__ import annotations

import binascii
import threading

from pycni.cluster.etcd import KV, EtcdCompacted, EtcdError, EtcdUnavailable, Event, TxnResult, WatchBatch, op_get
from pycni.record import field, record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any


def _key(text: str | None) -> str:
    return binascii.a2b_base64(text).decode() if text else ""


def _end(req: dict[str, Any]) -> str | None:
    """The decoded ``range_end`` of a request: None for one key, "\\0" for every key from ``key``."""
    raw = req.get("range_end")
    if not raw:
        return None
    return binascii.a2b_base64(raw).decode("latin-1") if raw == "AA==" else _key(raw)


def _in(key: str, start: str, end: str | None) -> bool:
    if end is None:
        return key == start
    if end == "\0":
        return key >= start
    return start.encode() <= key.encode() < end.encode()


@record
class Pending:
    """One request on its way into the store: the interceptor sees it and decides when it applies."""

    compare: list[dict[str, Any]]
    success: list[dict[str, Any]]
    failure: list[dict[str, Any]]
    apply: Callable[[], TxnResult]

    @property
    def writes(self) -> bool:
        """Whether either branch puts or deletes (a read-only request is False)."""
        return any("request_range" not in op for op in (*self.success, *self.failure))

    def keys(self) -> list[str]:
        """The keys this request names (compares and ops), decoded: to pick a request in a hook."""
        out = [_key(c.get("key")) for c in self.compare]
        for op in (*self.success, *self.failure):
            for req in op.values():
                out.append(_key(req.get("key")))
        return out


def lose_answer(when: Callable[[Pending], bool], times: int = 1) -> Callable[[Pending], TxnResult]:
    """An interceptor that applies the first ``times`` requests ``when`` picks and then raises
    :class:`EtcdUnavailable`, as a client whose answer was lost on the way back."""
    left = [times]

    def hook(p: Pending) -> TxnResult:
        res = p.apply()
        if left[0] > 0 and when(p):
            left[0] -= 1
            raise EtcdUnavailable(["mem://"], {"mem://": "answer lost after the request was applied"}, 0)
        return res
    return hook


@record
class _Lease:
    ttl: int
    keys: set[str] = field(default_factory=set)


class MemKV:
    """See the module docstring. Keys and values are ``str`` like :class:`pycni.cluster.etcd.Etcd`'s."""

    def __init__(self) -> None:
        self.revision = 1  # etcd's first revision is 1 (an empty store)
        self.data: dict[str, KV] = {}
        self.history: list[tuple[int, Event]] = []
        self.compacted = 0
        self.leases: dict[int, _Lease] = {}
        self._next_lease = 0x1000
        self.interceptor: Callable[[Pending], TxnResult] | None = None
        self.requests = 0  # requests applied (reads included): what a round trip to etcd would be
        self.timeout = 0.0
        self.deadline = 0.0
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)

    # -- the interface of Etcd --

    def close(self) -> None:
        pass

    def __enter__(self) -> MemKV:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def txn(self, compare: Sequence[dict[str, Any]], success: Sequence[dict[str, Any]] = (),
            failure: Sequence[dict[str, Any]] = ()) -> TxnResult:
        c, s, f = list(compare), list(success), list(failure)
        p = Pending(compare=c, success=s, failure=f, apply=lambda: self._apply(c, s, f))
        hook = self.interceptor
        return hook(p) if hook is not None else p.apply()

    def range(self, key: str, *, prefix: bool = False, range_end: str = "", limit: int = 0, revision: int = 0,
              keys_only: bool = False, serializable: bool = False) -> tuple[list[KV], int]:
        if revision and revision != self.revision:
            raise EtcdError("MemKV keeps no history for reads at an old revision", 11)
        op = op_get(key, prefix=prefix, keys_only=keys_only)
        if range_end and not prefix:
            op["request_range"]["range_end"] = binascii.b2a_base64(range_end.encode(), newline=False).decode()
        if limit:
            op["request_range"]["limit"] = str(limit)
        res = self.txn([], [op])
        return res.responses[0], res.revision

    def get(self, key: str, serializable: bool = False) -> KV | None:
        kvs, _rev = self.range(key)
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KV], int]:
        return self.range(prefix, prefix=True)

    def put(self, key: str, value: str, lease: int = 0) -> int:
        from pycni.cluster.etcd import op_put

        return self.txn([], [op_put(key, value, lease)]).revision

    def delete(self, key: str) -> int:
        from pycni.cluster.etcd import op_delete

        return int(self.txn([], [op_delete(key)]).responses[0])

    def delete_prefix(self, prefix: str) -> int:
        from pycni.cluster.etcd import op_delete

        return int(self.txn([], [op_delete(prefix, prefix=True)]).responses[0])

    def lease_grant(self, ttl: int) -> int:
        with self._lock:
            self._next_lease += 1
            self.leases[self._next_lease] = _Lease(ttl=int(ttl))
            return self._next_lease

    def lease_keepalive(self, lease: int) -> int:
        with self._lock:
            got = self.leases.get(lease)
            return got.ttl if got else 0

    def lease_revoke(self, lease: int) -> None:
        """Drop the lease and its keys, in one revision (as etcd does when a lease expires)."""
        with self._lock:
            got = self.leases.pop(lease, None)
            if got is None:
                return
            keys = sorted(k for k in got.keys if k in self.data and self.data[k].lease == lease)
            if keys:
                self.revision += 1
                for k in keys:
                    self._delete_key(k)
                self._changed.notify_all()

    expire = lease_revoke  # a test's "the TTL ran out"

    def watch(self, key: str, *, prefix: bool = False, start_revision: int = 0, prev_kv: bool = False,
              progress_notify: bool = False) -> MemWatch:
        with self._lock:
            if start_revision and start_revision <= self.compacted:
                raise EtcdCompacted(self.compacted + 1)
            end = None
            if prefix:
                end = _end(op_get(key, prefix=True)["request_range"])
            return MemWatch(self, key, end, start_revision or self.revision + 1, prev_kv)

    # -- test controls --

    def compact(self, revision: int | None = None) -> None:
        """Forget the history up to ``revision`` (default: now): older watch starts fail."""
        with self._lock:
            self.compacted = revision if revision is not None else self.revision
            self.history = [(r, e) for r, e in self.history if r > self.compacted]

    def dump(self) -> dict[str, str]:
        """Every key and its value (for asserts)."""
        with self._lock:
            return {k: kv.value for k, kv in sorted(self.data.items())}

    # -- the machine --

    def _select(self, req: dict[str, Any]) -> list[str]:
        start, end = _key(req.get("key")), _end(req)
        if end is None:
            return [start] if start in self.data else []
        return sorted(k for k in self.data if _in(k, start, end))

    def _holds(self, c: dict[str, Any]) -> bool:
        start, end = _key(c.get("key")), _end(c)
        target = c.get("target", "VERSION")
        keys = self._select(c) if end is not None else [start]
        for k in keys:
            kv = self.data.get(k)
            if kv is None and target == "VALUE":
                return False
            if target == "VALUE":
                have: Any = kv.value if kv else ""
                want: Any = _key(c.get("value"))
            else:
                field_name = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision",
                              "LEASE": "lease"}[target]
                have = getattr(kv, field_name) if kv else 0
                want = int(c.get(field_name, 0))
            result = c.get("result", "EQUAL")
            ok = {"EQUAL": have == want, "NOT_EQUAL": have != want, "GREATER": have > want,
                  "LESS": have < want}[result]
            if not ok:
                return False
        return True

    def _apply(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
               failure: list[dict[str, Any]]) -> TxnResult:
        with self._lock:
            self.requests += 1
            ok = all(self._holds(c) for c in compare)
            ops = success if ok else failure
            for op in ops:  # validate before changing anything: a refused request changes nothing
                if not op.keys() <= {"request_range", "request_put", "request_delete_range"}:
                    raise EtcdError(f"MemKV does not support {sorted(op)}", 3)
                lease = int(op.get("request_put", {}).get("lease", 0))
                if lease and lease not in self.leases:
                    raise EtcdError("etcdserver: requested lease not found", 5)
            writes = any(("request_put" in op) or ("request_delete_range" in op and self._select(
                op["request_delete_range"])) for op in ops)
            rev = self.revision + 1 if writes else self.revision
            responses: list[Any] = []
            for op in ops:
                if "request_range" in op:
                    req = op["request_range"]
                    kvs = [self.data[k] for k in self._select(req)]
                    limit = int(req.get("limit", 0))
                    if limit:
                        kvs = kvs[:limit]
                    only = bool(req.get("keys_only"))
                    responses.append([KV(key=kv.key, value="" if only else kv.value,
                                         create_revision=kv.create_revision, mod_revision=kv.mod_revision,
                                         version=kv.version, lease=kv.lease) for kv in kvs])
                elif "request_put" in op:
                    req = op["request_put"]
                    self._put_key(_key(req.get("key")), _key(req.get("value")), int(req.get("lease", 0)), rev)
                    responses.append(None)
                else:
                    keys = self._select(op["request_delete_range"])
                    for k in keys:
                        self._delete_key(k, rev)
                    responses.append(len(keys))
            self.revision = rev
            if writes:
                self._changed.notify_all()
            return TxnResult(succeeded=ok, revision=rev, responses=responses)

    def _put_key(self, key: str, value: str, lease: int, rev: int) -> None:
        old = self.data.get(key)
        if old is not None and old.lease and old.lease != lease and old.lease in self.leases:
            self.leases[old.lease].keys.discard(key)
        kv = KV(key=key, value=value, create_revision=old.create_revision if old else rev, mod_revision=rev,
                version=old.version + 1 if old else 1, lease=lease)
        self.data[key] = kv
        if lease:
            self.leases[lease].keys.add(key)
        self.history.append((rev, Event(type="PUT", kv=kv, prev=old)))

    def _delete_key(self, key: str, rev: int | None = None) -> None:
        old = self.data.pop(key)
        rev = rev if rev is not None else self.revision
        self.history.append((rev, Event(type="DELETE", kv=KV(key=key, mod_revision=rev), prev=old)))


class MemWatch:
    """A watch on a :class:`MemKV`: ``next(timeout)`` returns the events from its revision on."""

    def __init__(self, kv: MemKV, key: str, end: str | None, start: int, prev_kv: bool) -> None:
        self.kv = kv
        self.key = key
        self.end = end
        self.next_revision = start
        self.prev_kv = prev_kv
        self.closed = False

    def next(self, timeout: float | None = None) -> WatchBatch | None:
        kv = self.kv
        with kv._changed:
            if self.next_revision <= kv.compacted:
                raise EtcdCompacted(kv.compacted + 1)
            if kv.revision < self.next_revision:
                kv._changed.wait(timeout)
            events = [Event(type=e.type, kv=e.kv, prev=e.prev if self.prev_kv else None)
                      for r, e in kv.history if r >= self.next_revision and _in(e.kv.key, self.key, self.end)]
            if kv.revision < self.next_revision:
                return None
            self.next_revision = kv.revision + 1
            if not events:
                return None
            return WatchBatch(revision=kv.revision, events=events)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> MemWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
