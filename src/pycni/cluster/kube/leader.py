"""One writer among kube-controllers replicas: an etcd lease, whose key guards every write.

The leader holds ``P/kube/leader`` on a lease of ``ttl`` seconds, refreshed every ttl/3. Every
record the mirror writes goes in a transaction that also compares the leader key's create
revision with the one this replica created (:attr:`Leadership.guard`): a replica that lost its
lease (paused, partitioned, its keepalives late) cannot write, even before it notices, because
the key it compares against is gone or is another replica's. A coordination.k8s.io Lease would
need the API for the election but could not guard the etcd writes in the same transaction: the
writes go to etcd, so the fence lives in etcd.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from pycni.cluster.etcd import EtcdError
from pycni.cluster.kv import if_absent, if_created, op_put

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("pycni.kube")
DEFAULT_TTL = 10


class Leadership:
    """Campaign for, hold and lose the leader key."""

    def __init__(self, kv: Any, key: str, ttl: int = DEFAULT_TTL, identity: str = "") -> None:
        self.kv, self.key, self.ttl = kv, key, max(2, ttl)
        self.identity = identity or f"{socket.gethostname()}/{os.getpid()}"
        self.lease = 0
        self.created = 0  # the leader key's create revision while we lead
        self.lost = threading.Event()

    @property
    def guard(self) -> list[dict[str, Any]]:
        """The compare every write carries: the leader key is still the one we created."""
        return [if_created(self.key, self.created)]

    def try_acquire(self) -> bool:
        """One attempt: True when this replica now leads."""
        lease = self.kv.lease_grant(self.ttl)
        res = self.kv.txn([if_absent(self.key)], [op_put(self.key, self.identity, lease=lease)])
        if not res.succeeded:
            self.kv.lease_revoke(lease)
            return False
        self.lease, self.created = lease, res.revision
        self.lost.clear()
        log.info("leading as %s (lease %x, ttl %ds)", self.identity, lease, self.ttl)
        return True

    def campaign(self, stop: threading.Event) -> bool:
        """Until this replica leads (True) or ``stop`` (False); a standby retries every ttl/3."""
        while not stop.is_set():
            try:
                if self.try_acquire():
                    return True
            except (EtcdError, OSError) as e:  # etcd away: keep trying
                log.warning("leader election: %s", e)
            stop.wait(self.ttl / 3)
        return False

    def keep(self, stop: threading.Event, kv: Any = None) -> None:
        """Refresh the lease until it is lost (sets :attr:`lost`) or ``stop``; ``kv``: this
        thread's own client (etcd clients are not shared between threads)."""
        kv = kv or self.kv
        last_ok = time.monotonic()
        while not stop.wait(self.ttl / 3):
            try:
                if kv.lease_keepalive(self.lease) <= 0:
                    break
                last_ok = time.monotonic()
            except (EtcdError, OSError) as e:
                log.warning("leader lease keepalive: %s", e)
                if time.monotonic() - last_ok >= self.ttl:
                    break
        if not stop.is_set():
            log.warning("leadership lost (lease %x)", self.lease)
        self.lost.set()

    def resign(self) -> None:
        """Give the key up at once (clean stop), so a standby takes over without waiting a ttl."""
        if self.lease:
            try:
                self.kv.lease_revoke(self.lease)
            except (EtcdError, OSError) as e:
                log.warning("resign: %s", e)
            self.lease = 0
