"""Entering a network namespace by path, for the calling thread only.

setns(2) with CLONE_NEWNET switches the calling thread, so a handler can do its work in the
container's namespace and come back without disturbing other threads (the daemon runs many).
Processes forked while inside inherit the namespace.

Within one plugin call (:mod:`pycni.callscope`) a namespace path is opened and checked once and
its fd reused by every later :func:`enter`, :func:`opened` and :func:`check_netns` of the call;
the thread's own namespace is opened once too. Stdlib only: setns through ``_ctypes`` (the
``ctypes`` package costs a one-shot call ~3 ms to import), no contextlib.
"""

from __future__ import annotations

import errno
import fcntl
import os

from pycni import callscope
from pycni.lockfile import flocked
from pycni.spec.errors import INVALID_ENV, CNIError

TYPE_CHECKING = False  # true for mypy only (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3)
_NS_NAMES = {0x00020000: "mount", 0x02000000: "cgroup", 0x04000000: "uts", 0x08000000: "ipc",
             0x10000000: "user", 0x20000000: "pid", 0x00000080: "time"}
NSFS_MAGIC = 0x6E736673
PROC_SUPER_MAGIC = 0x9FA0
_SELF = "/proc/thread-self/ns/net"

# libc's setns, made on first use. Immutable once made (a race makes it twice, harmlessly).
_setns_fn: Callable[[int, int], int] | None = None


def _libc_setns() -> Callable[[int, int], int]:
    """setns(2) from the C library the interpreter is linked with, through _ctypes alone.

    dlopen(NULL) names the process's own libc; the function pointer class is what
    ``ctypes.CDLL(None, use_errno=True).setns`` would build, without importing the ctypes package.
    """
    global _setns_fn
    if _setns_fn is None:
        import _ctypes

        class _Int(_ctypes._SimpleCData):  # type: ignore[name-defined,misc]
            _type_ = "i"

        class _Fn(_ctypes.CFuncPtr):  # type: ignore[name-defined,misc]
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _Int

        class _Libc:
            _handle = _ctypes.dlopen(None, os.RTLD_LOCAL)  # type: ignore[arg-type]

        _setns_fn = _Fn(("setns", _Libc()))  # type: ignore[arg-type]
    return _setns_fn


def _setns(fd: int) -> None:
    if _libc_setns()(fd, CLONE_NEWNET) != 0:
        import _ctypes

        err = _ctypes.get_errno()  # type: ignore[attr-defined]
        raise OSError(err, os.strerror(err))


def _fs_type(fd: int) -> int:
    """fstatfs(2)'s f_type: only for files NS_GET_NSTYPE does not answer for (old kernels, non-nsfs
    files, to say what they are), so ctypes is imported only on that path."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_long * 32)()  # room for a struct statfs (120 bytes on 64-bit); f_type, a long, is first
    if libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(buf[0]) & 0xFFFFFFFF


def current_netns_path() -> str:
    """Path naming the calling thread's network namespace (stable while the thread lives)."""
    import _thread

    return f"/proc/{os.getpid()}/task/{_thread.get_native_id()}/ns/net"


def _ns_type(fd: int) -> int | None:
    """The namespace type of an nsfs fd (NS_GET_NSTYPE, Linux 4.11+); None when unknown."""
    try:
        return int(fcntl.ioctl(fd, NS_GET_NSTYPE))
    except OSError:
        return None


def _not_netns(path: str, what: str) -> CNIError:
    return CNIError(INVALID_ENV, "not a network namespace",
                    f"{path!r} is {what}; expected a network namespace such as /proc/<pid>/ns/net "
                    "or a bind mount of one (/var/run/netns/<name>)")


def open_netns(path: str) -> int:
    """Open ``path`` and check that it is a network namespace; return the fd (the caller's to close).

    NS_GET_NSTYPE answers for every nsfs file on Linux 4.11+, so a network namespace needs one
    ioctl; fstatfs is asked only when it does not answer (an older kernel's nsfs or procfs ns
    file, which Go accepts too, or some other file, named in the error).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CNIError(INVALID_ENV, "network namespace does not exist",
                       f"failed to open netns {path!r}: no such file") from None
    except OSError as e:
        raise CNIError(INVALID_ENV, "cannot open network namespace", f"failed to open netns {path!r}: {e}") from None
    nstype = _ns_type(fd)
    if nstype == CLONE_NEWNET:
        return fd
    if nstype is not None:
        os.close(fd)
        raise _not_netns(path, f"a {_NS_NAMES.get(nstype, 'non-network')} namespace")
    try:
        fstype = _fs_type(fd)
    except OSError as e:
        os.close(fd)
        raise CNIError(INVALID_ENV, "cannot inspect network namespace", f"{path!r}: {e}") from None
    # procfs is what ns files were before nsfs (Linux < 3.19); accept only those, as Go does.
    old_proc_ns = fstype == PROC_SUPER_MAGIC and os.path.basename(os.path.dirname(path)) == "ns"
    if fstype == NSFS_MAGIC or old_proc_ns:
        return fd
    os.close(fd)
    raise _not_netns(path, f"on a filesystem of type {fstype:#x}")


def _scoped_fd(scope: callscope.Scope, path: str) -> int:
    """``path`` opened and checked once per call."""
    fd = scope.netns_fds.get(path)
    if fd is None:
        fd = scope.netns_fds[path] = open_netns(path)
    return fd


def check_netns(path: str) -> None:
    """Raise a CNIError unless ``path`` is an existing network namespace."""
    scope = callscope.current()
    if scope is not None:
        _scoped_fd(scope, path)  # kept open: the call enters it next
    else:
        os.close(open_netns(path))


def netns_exists(path: str) -> bool:
    try:
        check_netns(path)
    except CNIError:
        return False
    return True


class opened:  # noqa: N801 - used like a function: ``with netns.opened(path) as fd:``
    """The fd of the network namespace at ``path`` for the body (the call's own when one is open;
    then it stays open for the rest of the call, else it is closed when the body ends)."""

    __slots__ = ("_path", "_fd", "_own")

    def __init__(self, path: str) -> None:
        self._path = path

    def __enter__(self) -> int:
        scope = callscope.current()
        self._own = scope is None
        self._fd = open_netns(self._path) if scope is None else _scoped_fd(scope, self._path)
        return self._fd

    def __exit__(self, *exc: object) -> None:
        if self._own:
            os.close(self._fd)


class enter:  # noqa: N801 - used like a function: ``with netns.enter(path):``
    """Run the body with the calling thread inside the network namespace at ``path``.

    Inside a call (:mod:`pycni.callscope`) the target and the way back are the call's fds: the
    namespace is opened once per call, and since every switch of the thread goes through here,
    the way back is the namespace entered last (or the thread's own, opened once).
    """

    __slots__ = ("_path", "_target", "_origin", "_scope")

    def __init__(self, path: str) -> None:
        self._path = path

    def __enter__(self) -> None:
        scope = self._scope = callscope.current()
        if scope is None:
            self._target = open_netns(self._path)
            try:
                self._origin = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
            except BaseException:
                os.close(self._target)
                raise
        else:
            self._target = _scoped_fd(scope, self._path)
            if scope.stack:
                self._origin = scope.stack[-1]
            else:
                if scope.home_fd < 0:
                    scope.home_fd = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
                self._origin = scope.home_fd
        try:
            _setns(self._target)
        except OSError as e:
            self._release()
            raise CNIError(INVALID_ENV, "cannot enter network namespace", f"setns({self._path!r}): {e}") from None
        if scope is not None:
            scope.stack.append(self._target)

    def __exit__(self, *exc: object) -> None:
        try:
            _setns(self._origin)
        except OSError as e:  # pragma: no cover - the thread is unusable; fail loudly
            raise RuntimeError(f"failed to return to the original network namespace: {e}") from e
        finally:
            if self._scope is not None:
                self._scope.stack.pop()
            self._release()

    def _release(self) -> None:
        if self._scope is None:
            os.close(self._target)
            os.close(self._origin)


def same_netns(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def locked(path: str = _SELF) -> flocked:
    """Hold an exclusive flock on a namespace file (default: the calling thread's own netns).

    Serialises concurrent plugin invocations that read-modify-write state shared inside one
    namespace (iptables chains, routing tables), as the Go plugins lock on the netns path.
    Every opener of the same namespace sees the same nsfs inode, so processes and threads
    exclude each other; the lock is released when the body ends.
    """
    return flocked(path)
