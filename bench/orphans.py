"""Counting the CPU of what a one-shot plugin leaves to finish on its own.

A one-shot plugin call does not wait for two kinds of child (see docs/architecture.md, "The
kernel's teardown is not the caller's time"): an ``iptables-restore`` told to end after its
commit, and the helper carrying a link deletion's kernel teardown. When the plugin exits they
are reparented — to init, normally, so the benchmark's ``RUSAGE_CHILDREN`` and ``wait4`` would
never see their CPU. The benchmark makes itself their child subreaper instead, waits for them
after each measured call (outside its wall time) and counts their CPU with the call's.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_CHILD_SUBREAPER = 36


def adopt() -> None:
    """Orphans of any descendant become this process's children (prctl PR_SET_CHILD_SUBREAPER)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def children() -> set[int]:
    pids: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return pids


def wait(pids: set[int]) -> float:
    """Wait for these children (adopted orphans end within milliseconds); their CPU seconds
    (also added to this process's RUSAGE_CHILDREN by the wait)."""
    total = 0.0
    for pid in sorted(pids):
        try:
            _, _, ru = os.wait4(pid, 0)
        except ChildProcessError:
            continue
        total += ru.ru_utime + ru.ru_stime
    return total


def reap(keep: set[int] | frozenset[int] = frozenset()) -> float:
    """:func:`wait` for every child not in ``keep``."""
    return wait(children() - set(keep))
