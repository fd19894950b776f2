"""One command's session with the cluster store: node lock, block hint, client, error mapping.

``with session(settings, lock=True) as store:`` gives a :class:`~pycni.cluster.ipam.ClusterStore`
for the network and node of ``settings``; on the way out, an etcd failure becomes the CNI
error the spec wants (code 11 "try again" when no endpoint answered, or ``unavailable_code``;
999 for a request etcd refused), and an :class:`~pycni.cluster.ipam.IpamError` its code. The
plugin, the CLI and tests share it; a test passes ``kv=`` (a :class:`~pycni.cluster.memkv.MemKV`)
to run the same path without a server.
"""

from __future__ import annotations

import ipaddress
import os

from pycni.cluster.etcd import EtcdError, EtcdUnavailable
from pycni.cluster.ipam import ClusterStore, IpamError
from pycni.cluster.settings import ClusterSettings, client
from pycni.spec.errors import INTERNAL, TRY_AGAIN, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

    from pycni.cluster.kv import KVStore


class Session:
    """The store for one command, with etcd failures mapped to CNI errors at this one boundary.

    With ``lock``, the commands of this node that change this network take turns (a flock in
    ``lockDir``, as calico-ipam's host lock): without it N parallel ADDs on a node race for the
    same block and all but one retry, N times over. The lock is an optimisation, not what keeps
    allocations right (the transactions' compares do): when the directory cannot be used, or
    the lock does not come within the budget (an overloaded node, a holder stuck on an etcd
    that does not answer), the command goes on without it. The etcd budget starts once the
    lock is settled, so a command is bounded by twice ``etcdTimeout``.
    """

    def __init__(self, cfg: ClusterSettings, unavailable_code: int = TRY_AGAIN, timeout: float | None = None,
                 lock: bool = False, kv: KVStore | None = None, who: str = "cluster-ipam") -> None:
        self.cfg = cfg
        self.code = unavailable_code
        self.timeout = timeout
        self.lock = lock and bool(cfg.lock_dir)
        self.who = who
        self._held: Any = None
        self._given = kv
        self.kv: KVStore | None = None
        self.store: Any = None
        self._hint_before: list[Any] = []

    def _take_lock(self) -> None:
        from pycni.lockfile import flocked

        cfg = self.cfg
        held = flocked(os.path.join(cfg.lock_dir, f"{cfg.network}.{cfg.node}.lock"), create=True,
                       timeout=self.timeout or cfg.etcd.timeout)
        try:
            held.__enter__()
        except (TimeoutError, OSError):
            return  # no usable lock directory, or a queue too long: transactions alone
        self._held = held

    def __enter__(self) -> ClusterStore:
        if self.lock:
            self._take_lock()
        try:
            self.kv = self._given if self._given is not None else client(self.cfg.etcd, self.timeout)
        except BaseException:
            self._release()
            raise
        self.store = ClusterStore(self.kv, self.cfg.network, self.cfg.node, self.cfg.etcd.prefix)
        if self.lock:
            self.store.hint = self._read_hint()
        self._hint_before = list(self.store.hint)
        return self.store

    # The hint (ClusterStore.hint) lives beside the lock: node-local, a cache, never trusted.
    def _hint_path(self) -> str:
        return os.path.join(self.cfg.lock_dir, f"{self.cfg.network}.{self.cfg.node}.blocks")

    def _read_hint(self) -> list[Any]:
        try:
            with open(self._hint_path(), encoding="ascii") as f:
                return [ipaddress.ip_network(line) for line in f.read().split()]
        except (OSError, ValueError):
            return []

    def _write_hint(self, hint: list[Any]) -> None:
        path = self._hint_path()
        tmp = f"{path}.{os.getpid()}.{id(self)}"
        try:
            with open(tmp, "w", encoding="ascii") as f:
                f.write("".join(f"{c}\n" for c in hint))
            os.replace(tmp, path)  # no fsync: a lost or stale hint costs a round trip, nothing else
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _release(self) -> None:
        if self._held is not None:
            self._held.__exit__(None, None, None)
            self._held = None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None and self.lock and self._held is not None and self.store.hint != self._hint_before:
            self._write_hint(self.store.hint)  # under the lock: writers take turns
        self._release()
        if self.kv is not None and self._given is None:
            self.kv.close()
        raise_mapped(exc, self.code, self.who)


def raise_mapped(exc: BaseException | None, unavailable_code: int = TRY_AGAIN, who: str = "cluster-ipam") -> None:
    """Raise the CNI error for an etcd or allocation failure (nothing for any other exception)."""
    if isinstance(exc, EtcdUnavailable):
        raise CNIError(unavailable_code, f"{who}: etcd unavailable: no endpoint of {', '.join(exc.endpoints)} "
                       f"answered within {exc.timeout:g}s",
                       "; ".join(f"{ep}: {err}" for ep, err in exc.errors.items())
                       + " (is etcd running, with a quorum of members?)") from None
    if isinstance(exc, EtcdError):
        raise CNIError(INTERNAL, f"{who}: etcd refused the request: {exc}") from None
    if isinstance(exc, IpamError):
        code = TRY_AGAIN if exc.kind == "contention" else INTERNAL
        raise CNIError(code, f"{who}: {exc.msg}", exc.details) from None


def session(cfg: ClusterSettings, unavailable_code: int = TRY_AGAIN, timeout: float | None = None,
            lock: bool = False, kv: KVStore | None = None) -> Session:
    """See :class:`Session`."""
    return Session(cfg, unavailable_code, timeout, lock, kv)
