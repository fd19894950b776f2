"""An informer with client-go's semantics, feeding a key queue.

List (page by page, one snapshot), then watch from the list's resourceVersion with bookmarks
(each bookmark moves the resume point, so a quiet kind does not fall behind compaction); the
stream is re-opened from the last resourceVersion seen when the server ends it (every 5-10
minutes, randomised as client-go's reflector does). On 410 Gone the informer lists again and
diffs the new snapshot against its cache: what vanished in the gap is reported deleted, what
changed updated. Any other error backs off 0.8 s doubling to 30 s (with jitter), reset after a
success. Handlers get keys only ("NS/NAME" or "NAME"); readers take the object from the cache
(:meth:`Informer.get`), so a burst of changes to one object is one write (level-triggered).
"""

from __future__ import annotations

import logging
import random
import threading
import time

from pycni.cluster.kube.client import Expired, KubeClient, KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

log = logging.getLogger("pycni.kube")

BACKOFF_START, BACKOFF_MAX = 0.8, 30.0
WATCH_MIN, WATCH_MAX = 300, 600


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


class Backoff:
    """0.8 s doubling to 30 s with ±20 % jitter; :meth:`reset` after a success."""

    def __init__(self, start: float = BACKOFF_START, cap: float = BACKOFF_MAX) -> None:
        self.start, self.cap = start, cap
        self.delay = start

    def next(self) -> float:
        d = self.delay
        self.delay = min(self.cap, self.delay * 2)
        return d * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.delay = self.start


class Informer:
    """One kind's cache, kept by list + watch in its own thread. ``on_change(kind, key)`` is
    called (from that thread) for every key that was added, changed or deleted."""

    def __init__(self, client: KubeClient, kind: str, on_change: Callable[[str, str], None],
                 stop: threading.Event, page: int = 500, watch_seconds: tuple[int, int] = (WATCH_MIN, WATCH_MAX)
                 ) -> None:
        self.client, self.kind, self.on_change, self.stop = client, kind, on_change, stop
        self.page = page
        self.watch_seconds = watch_seconds
        self.cache: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.resource_version = ""
        self.relists = 0  # lists after the first (410s and errors): for tests and the log
        self.backoff = Backoff()
        self.thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> Informer:
        self.thread.start()
        return self

    def get(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            return self.cache.get(key)

    def keys(self) -> list[str]:
        with self.lock:
            return list(self.cache)

    # -- the loop --

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                if not self.resource_version:
                    self._list()
                began = time.monotonic()
                if self._watch() or time.monotonic() - began >= 1.0:
                    self.backoff.reset()
                else:  # a server that ends every watch at once must not be asked again in a tight loop
                    self.stop.wait(self.backoff.next())
            except Expired as e:
                log.info("%s: %s; listing again", self.kind, e)
                self.resource_version = ""  # relist at once: the gap's deletions come from the diff
            except KubeError as e:
                pause = self.backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self.kind, e, pause)
                self.stop.wait(pause)
            except Exception:  # noqa: BLE001 - a bug must not end the informer silently
                pause = self.backoff.next()
                log.exception("%s: informer error; retrying in %.1fs", self.kind, pause)
                self.resource_version = ""
                self.stop.wait(pause)

    def _list(self) -> None:
        items, rv = self.client.list_all(self.kind, self.page)
        fresh = {object_key(o): o for o in items}
        with self.lock:
            old = self.cache
            self.cache = fresh
        changed = [k for k, o in fresh.items() if _rv(old.get(k)) != _rv(o)]
        gone = [k for k in old if k not in fresh]
        if self.synced.is_set():
            self.relists += 1
            if gone or changed:
                log.info("%s: relist at %s: %d changed, %d deleted in the gap", self.kind, rv, len(changed),
                         len(gone))
        self.resource_version = rv
        for k in changed + gone:
            self.on_change(self.kind, k)
        self.synced.set()

    def _watch(self) -> bool:
        """Follow one watch stream until it ends; whether it carried any event."""
        seconds = random.randint(*self.watch_seconds)
        got = False
        for ev in self.client.watch(self.kind, self.resource_version, seconds):
            got = True
            if self.stop.is_set():
                return got
            obj = ev.get("object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            typ = ev.get("type")
            if typ == "BOOKMARK":
                if rv:
                    self.resource_version = rv
                continue
            key = object_key(obj)
            with self.lock:
                if typ == "DELETED":
                    self.cache.pop(key, None)
                elif typ in ("ADDED", "MODIFIED"):
                    self.cache[key] = obj
                else:
                    continue
            if rv:
                self.resource_version = rv
            self.on_change(self.kind, key)
        return got


def _rv(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")
