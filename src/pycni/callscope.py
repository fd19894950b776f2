"""What one plugin call opens once and shares: namespace fds and netlink sockets.

One bridge ADD enters the container's namespace several times and sends a few dozen netlink
requests (host-local runs in the same call, in-process). Opening and type-checking the namespace
file, the thread's own namespace and a netlink socket for each of those cost syscalls and Python
every time. :class:`call` opens a per-call cache that :func:`pycni.skel.dispatch` holds around the
handler: :mod:`pycni.net.netns` keeps each namespace it opens there (keyed by path) and
:func:`pycni.net.link.rtnl` one NETLINK_ROUTE socket per namespace. Everything in it is closed when
the outermost dispatch on the thread returns, also on errors.

Re-entrant: the cache hangs off the calling thread (``_thread._local``) for the length of one call,
so the daemon's many calls on many threads never share one and nothing outlives a call; an
in-process delegate (same thread) shares its caller's. Code that runs with no call open (another
thread, a test calling the net helpers directly) opens and closes per use, as before.
Stdlib only (``_thread``: a one-shot plugin need not import threading).
"""

from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False  # not typing's (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

_tls = _thread._local()


class Scope:
    """One call's open resources on one thread."""

    __slots__ = ("netns_fds", "home_fd", "stack", "socks")

    def __init__(self) -> None:
        self.netns_fds: dict[str, int] = {}  # namespace path -> open, checked fd
        self.home_fd = -1  # the thread's namespace when the call began (opened on first entry)
        self.stack: list[int] = []  # fds of the namespaces entered, innermost last
        self.socks: dict[tuple[int, int], Any] = {}  # (st_dev, st_ino) of a namespace -> its rtnl socket

    def close(self) -> None:
        for sock in self.socks.values():
            try:
                sock.close()
            except OSError:
                pass
        fds = [*self.netns_fds.values(), self.home_fd]
        self.socks, self.netns_fds, self.home_fd = {}, {}, -1
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def current() -> Scope | None:
    """The calling thread's open call, if any."""
    return getattr(_tls, "scope", None)


class call:  # noqa: N801 - used like a function: ``with callscope.call():``
    """Open a call scope on this thread for the body (a nested one joins the outer)."""

    __slots__ = ("_own",)

    def __enter__(self) -> None:
        self._own = current() is None
        if self._own:
            _tls.scope = Scope()

    def __exit__(self, *exc: object) -> None:
        if self._own:
            scope, _tls.scope = _tls.scope, None
            scope.close()
