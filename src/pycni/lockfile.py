"""One exclusive flock, for every place that serialises work across threads and processes.

flock locks belong to an open file description, so each holder opens its own descriptor:
threads of one process exclude each other as well as separate processes. Closing the
descriptor drops the lock, so nothing outlives the ``with`` body. Stdlib only.
"""

from __future__ import annotations

import fcntl
import os


class flocked:  # noqa: N801 - used like a function: ``with flocked(path):``
    """Hold an exclusive flock on ``path`` for the body (creating the file, 0600, if ``create``).

    With ``timeout`` (seconds) give up with TimeoutError when the lock is still held by then
    (polled: a blocking flock cannot be interrupted without signals, which threads cannot use).
    A class, not a contextlib generator: contextlib (with collections, functools, ...) costs a
    one-shot plugin ~3 ms to import.
    """

    __slots__ = ("_path", "_create", "_timeout", "_fd")

    def __init__(self, path: str, *, create: bool = False, timeout: float | None = None) -> None:
        self._path, self._create, self._timeout = path, create, timeout

    def __enter__(self) -> None:
        path = self._path
        if self._create:
            os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if self._timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                _poll_lock(fd, path, self._timeout)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def _poll_lock(fd: int, path: str, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise TimeoutError(f"{path} still locked after {timeout:g}s") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
