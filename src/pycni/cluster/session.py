"""One command's session with the cluster store: node lock, block hint, client, error mapping.

``with session(settings, lock=True) as store:`` gives a :class:`~pycni.cluster.ipam.ClusterStore`
for the network and node of ``settings``; on the way out, an etcd failure becomes the CNI
error the spec wants (code 11 "try again" when no endpoint answered, or ``unavailable_code``;
999 for a request etcd refused), and an :class:`~pycni.cluster.ipam.IpamError` its code. The
plugin, the CLI and tests share it; a test passes ``kv=`` (a :class:`~pycni.cluster.memkv.MemKV`)
to run the same path without a server.
"""

from __future__ import annotations

import os

from pycni import ipaddr, statefile
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
        self._lock_held: Any = None
        self.unavailable = False  # the command failed because no etcd endpoint answered in time
        self._given = kv
        self.kv: KVStore | None = None
        self.store: Any = None
        self._hint_before: list[Any] = []
        self._floor_before = 0

    def _take_lock(self) -> None:
        from pycni.lockfile import flocked

        cfg = self.cfg
        lock = flocked(os.path.join(cfg.lock_dir, f"{cfg.network}.{cfg.node}.lock"), create=True,
                       timeout=self.timeout or cfg.etcd.timeout)
        try:
            lock.__enter__()
        except (TimeoutError, OSError):
            return  # no usable lock directory, or a queue too long: transactions alone
        self._lock_held = lock

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
            self.store.hint, self.store.floor = self._read_hint()
        self._hint_before = list(self.store.hint)
        self._floor_before = self.store.floor
        return self.store

    # The hint (ClusterStore.hint) lives beside the lock: node-local, a cache, never trusted. The
    # same file keeps the node's tombstone floor (ClusterStore.floor), a line "rev=N".
    def _hint_path(self) -> str:
        return os.path.join(self.cfg.lock_dir, f"{self.cfg.network}.{self.cfg.node}.blocks")

    def _read_hint(self) -> tuple[list[Any], int]:
        try:
            with open(self._hint_path(), encoding="ascii") as f:
                words = f.read().split()
            floor = max([int(w[4:]) for w in words if w.startswith("rev=")], default=0)
            return [ipaddr.ip_network(w) for w in words if not w.startswith("rev=")], floor
        except (OSError, ValueError):
            return [], 0

    def _write_hint(self, hint: list[Any], floor: int) -> None:
        text = "".join(f"{c}\n" for c in hint) + (f"rev={floor}\n" if floor else "")
        try:  # not durable: a lost or stale hint costs a round trip, a lost floor at worst one code 11
            statefile.write_bytes(self._hint_path(), text.encode(), durable=False)
        except CNIError:
            pass

    def _release(self) -> None:
        if self._lock_held is not None:
            self._lock_held.__exit__(None, None, None)
            self._lock_held = None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.lock and self._lock_held is not None and self.store is not None and (
                self.store.floor != self._floor_before or (exc is None and self.store.hint != self._hint_before)):
            # under the lock: writers take turns (the floor grows, or is forgotten when it proved bogus)
            self._write_hint(self.store.hint if exc is None else self._hint_before, self.store.floor)
        self._release()
        if self.kv is not None and self._given is None:
            self.kv.close()
        self.unavailable = isinstance(exc, EtcdUnavailable)
        raise_mapped(exc, self.code, self.who)


def raise_mapped(exc: BaseException | None, unavailable_code: int = TRY_AGAIN, who: str = "cluster-ipam") -> None:
    """Raise the CNI error for an etcd or allocation failure (nothing for any other exception).
    ``who`` starts the message (a plugin names itself); the CLI passes '' (it prints ``pycni:``)."""
    lead = f"{who}: " if who else ""
    if isinstance(exc, EtcdUnavailable) and exc.refused:
        raise CNIError(unavailable_code, f"{lead}etcd unavailable: every endpoint refused the connection",
                       f"{', '.join(exc.endpoints)} (is etcd running and listening there?)") from None
    if isinstance(exc, EtcdUnavailable):
        raise CNIError(unavailable_code, f"{lead}etcd unavailable: no endpoint of {', '.join(exc.endpoints)} "
                       f"answered within {exc.timeout:g}s",
                       "; ".join(f"{ep}: {err}" for ep, err in exc.errors.items())
                       + " (is etcd running, with a quorum of members?)") from None
    if isinstance(exc, EtcdError):
        raise CNIError(INTERNAL, f"{lead}etcd refused the request: {exc}") from None
    if isinstance(exc, IpamError):
        code = TRY_AGAIN if exc.kind in ("contention", "deleted") else INTERNAL
        raise CNIError(code, f"{lead}{exc.msg}", exc.details) from None


# ---- a failed ADD's note for its rollback DEL -------------------------------------------------------
#
# When an ADD fails because etcd does not answer, the runtime DELs the attachment right away (the
# CRI runtimes and pycni's own runtime roll a failed ADD back). Against the same silent etcd that
# DEL would wait a second full budget, doubling what the runtime waits. So the ADD leaves a note
# beside the lock: whether its transaction went out. If it did not, nothing of that ADD can be in
# etcd and the DEL has nothing to do; if it did (the answer was lost: it may have been applied),
# the DEL tries once, briefly, and otherwise fails saying what is left.
#
# "Nothing of that ADD" must also cover an earlier ADD of the same attachment that was killed with
# its transaction on the wire (a killed process writes no note afterwards): so an ADD writes
# "pending" just before its first transaction goes out and clears the note when it succeeds. A
# later ADD that fails without sending keeps an earlier "pending" or "sent" rather than claim
# "unsent", and a DEL that finds "pending" does a full DEL (its tombstone stops the late commit).

QUICK_DEL = 1.0  # seconds: the rollback DEL's budget after an ADD whose transaction went out
NOTE_FRESH = 30.0  # seconds: a note older than this is from another episode and is ignored


def _note_path(cfg: ClusterSettings, cid: str, ifname: str) -> str:
    return os.path.join(cfg.lock_dir, f"{cfg.network}.{cfg.node}.failed-add.{cid}.{ifname}")


def note_add(cfg: ClusterSettings, cid: str, ifname: str, state: str) -> None:
    """Record (best effort) what an ADD of this attachment left: "pending" (its transaction is
    going out now), "sent" (it failed with etcd unavailable after sending), "unsent"."""
    if not cfg.lock_dir:
        return
    try:
        with open(_note_path(cfg, cid, ifname), "w", encoding="ascii") as f:
            f.write(state + "\n")
    except OSError:
        pass


def note_failed_add(cfg: ClusterSettings, cid: str, ifname: str, sent: bool, prior: str = "") -> None:
    """Record that this ADD failed with etcd unavailable, and whether a write may be in etcd:
    this ADD's (``sent``) or an earlier ADD's (``prior``, the note found when this ADD began)."""
    note_add(cfg, cid, ifname, "sent" if sent else prior if prior in ("pending", "sent") else "unsent")


def failed_add(cfg: ClusterSettings, cid: str, ifname: str) -> str:
    """"pending", "sent" or "unsent" when a fresh note of an ADD of this attachment exists, else ''."""
    if not cfg.lock_dir:
        return ""
    path = _note_path(cfg, cid, ifname)
    try:
        import time

        if time.time() - os.stat(path).st_mtime > max(NOTE_FRESH, 2 * cfg.etcd.timeout):
            return ""
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, ValueError):
        return ""
    return text if text in ("pending", "sent", "unsent") else ""


def clear_failed_add(cfg: ClusterSettings, cid: str, ifname: str) -> None:
    if cfg.lock_dir:
        try:
            os.unlink(_note_path(cfg, cid, ifname))
        except OSError:
            pass


def session(cfg: ClusterSettings, unavailable_code: int = TRY_AGAIN, timeout: float | None = None,
            lock: bool = False, kv: KVStore | None = None, who: str = "cluster-ipam") -> Session:
    """See :class:`Session`."""
    return Session(cfg, unavailable_code, timeout, lock, kv, who)
