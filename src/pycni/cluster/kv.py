"""The key-value seam the cluster layer is written against: etcd v3's model, nothing more.

Two implementations: :class:`pycni.cluster.etcd.Etcd` (the real client) and
:class:`pycni.cluster.memkv.MemKV` (in memory, with etcd's revision semantics, for tests that
must exercise compare-and-swap, retry and lost answers without a server). Transactions are
built with the functions re-exported here (etcd's own request shape: ``compare`` entries on
VALUE/VERSION/CREATE/MOD, ``request_range``/``request_put``/``request_delete_range`` ops),
so a store written against this module runs unchanged on either.

``KV`` below is the interface, for the type checker only (``typing`` is not imported at run
time on a plugin's start path)::

    get(key, serializable=False) -> KV | None
    range(key, prefix=, limit=, keys_only=, serializable=, revision=) -> (list[KV], revision)
    get_prefix(prefix) -> (list[KV], revision)
    put(key, value, lease=0) -> revision;  delete(key) -> n;  delete_prefix(prefix) -> n
    txn(compare, success=(), failure=()) -> TxnResult
    lease_grant(ttl) -> id;  lease_keepalive(id) -> ttl (0: gone);  lease_revoke(id)
    watch(key, prefix=, start_revision=, prev_kv=) -> a stream with next(timeout) -> WatchBatch | None
    close()
"""

from __future__ import annotations

from pycni.cluster.etcd import (
    KV,
    EtcdCompacted,
    EtcdError,
    EtcdUnavailable,
    Event,
    TxnResult,
    WatchBatch,
    WatchBroken,
    if_absent,
    if_created,
    if_mod,
    if_value,
    if_version,
    op_delete,
    op_get,
    op_put,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Protocol

    class WatchStream(Protocol):
        def next(self, timeout: float | None = None) -> WatchBatch | None: ...
        def close(self) -> None: ...
        def __enter__(self) -> Any: ...
        def __exit__(self, *exc: object) -> None: ...

    class KVStore(Protocol):
        """What the cluster layer needs of etcd (see the module docstring)."""

        def get(self, key: str, serializable: bool = False) -> KV | None: ...
        def range(self, key: str, *, prefix: bool = False, range_end: str = "", limit: int = 0,
                  revision: int = 0, keys_only: bool = False, serializable: bool = False
                  ) -> tuple[list[KV], int]: ...
        def get_prefix(self, prefix: str) -> tuple[list[KV], int]: ...
        def put(self, key: str, value: str, lease: int = 0) -> int: ...
        def delete(self, key: str) -> int: ...
        def delete_prefix(self, prefix: str) -> int: ...
        def txn(self, compare: Sequence[dict[str, Any]], success: Sequence[dict[str, Any]] = (),
                failure: Sequence[dict[str, Any]] = ()) -> TxnResult: ...
        def lease_grant(self, ttl: int) -> int: ...
        def lease_keepalive(self, lease: int) -> int: ...
        def lease_revoke(self, lease: int) -> None: ...
        def watch(self, key: str, *, prefix: bool = False, start_revision: int = 0, prev_kv: bool = False,
                  progress_notify: bool = False) -> Any: ...
        def close(self) -> None: ...

__all__ = ["KV", "EtcdCompacted", "EtcdError", "EtcdUnavailable", "Event", "TxnResult", "WatchBatch",
           "WatchBroken", "if_absent", "if_created", "if_mod", "if_value", "if_version", "op_delete", "op_get",
           "op_put"]
