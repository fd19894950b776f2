"""Entering a network namespace by path, for the calling thread only.

setns(2) with CLONE_NEWNET switches the calling thread, so a handler can do its work in the
container's namespace and come back without disturbing other threads (the daemon runs many).
Processes forked while inside inherit the namespace. Stdlib only (ctypes).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from pycni.spec.errors import INVALID_ENV, CNIError

TYPE_CHECKING = False  # true for mypy only (see pycni.record); at run time ctypes is imported where used
if TYPE_CHECKING:
    import ctypes

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3)
_NS_NAMES = {0x00020000: "mount", 0x02000000: "cgroup", 0x04000000: "uts", 0x08000000: "ipc",
             0x10000000: "user", 0x20000000: "pid", 0x00000080: "time"}
NSFS_MAGIC = 0x6E736673
PROC_SUPER_MAGIC = 0x9FA0

# ctypes is imported on first use, not with the module: a plugin's VERSION (or an ADD that never
# enters a namespace) should not pay ~4 ms for it.
_libc: ctypes.CDLL | None = None


def _get_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        import ctypes

        # dlopen(NULL): the C library the interpreter is linked with. ctypes.util.find_library("c")
        # names the same library but imports shutil, tempfile and random and runs ldconfig (~15 ms).
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _libc_call(name: str, *args: object) -> None:
    """Call a libc function that returns 0 or -1; OSError (from errno) when it fails."""
    import ctypes

    if getattr(_get_libc(), name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _fs_type(fd: int) -> int:
    import ctypes

    buf = (ctypes.c_long * 32)()  # room for a struct statfs (120 bytes on 64-bit); f_type, a long, is first
    _libc_call("fstatfs", fd, buf)
    return int(buf[0]) & 0xFFFFFFFF


def _setns(fd: int) -> None:
    _libc_call("setns", fd, CLONE_NEWNET)


def current_netns_path() -> str:
    """Path naming the calling thread's network namespace (stable while the thread lives)."""
    import threading

    return f"/proc/{os.getpid()}/task/{threading.get_native_id()}/ns/net"


def _ns_type(fd: int) -> int | None:
    """The namespace type of an nsfs fd (NS_GET_NSTYPE, Linux 4.11+); None when unknown."""
    try:
        return int(fcntl.ioctl(fd, NS_GET_NSTYPE))
    except OSError:
        return None


def open_netns(path: str) -> int:
    """Open ``path`` and check that it is a network namespace; return the fd."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CNIError(INVALID_ENV, "network namespace does not exist",
                       f"failed to open netns {path!r}: no such file") from None
    except OSError as e:
        raise CNIError(INVALID_ENV, "cannot open network namespace", f"failed to open netns {path!r}: {e}") from None
    try:
        fstype = _fs_type(fd)
    except OSError as e:
        os.close(fd)
        raise CNIError(INVALID_ENV, "cannot inspect network namespace", f"{path!r}: {e}") from None
    nstype = _ns_type(fd) if fstype == NSFS_MAGIC else None
    # procfs is what ns files were before nsfs (Linux < 3.19); accept only those, as Go does.
    old_proc_ns = fstype == PROC_SUPER_MAGIC and os.path.basename(os.path.dirname(path)) == "ns"
    if not (fstype == NSFS_MAGIC or old_proc_ns) or (nstype is not None and nstype != CLONE_NEWNET):
        os.close(fd)
        what = f"a {_NS_NAMES.get(nstype, 'non-network')} namespace" if nstype is not None else \
            f"on a filesystem of type {fstype:#x}"
        raise CNIError(INVALID_ENV, "not a network namespace",
                       f"{path!r} is {what}; expected a network namespace such as /proc/<pid>/ns/net "
                       "or a bind mount of one (/var/run/netns/<name>)")
    return fd


def check_netns(path: str) -> None:
    """Raise a CNIError unless ``path`` is an existing network namespace."""
    os.close(open_netns(path))


def netns_exists(path: str) -> bool:
    try:
        check_netns(path)
    except CNIError:
        return False
    return True


@contextmanager
def enter(path: str) -> Iterator[None]:
    """Run the body with the calling thread inside the network namespace at ``path``."""
    target = open_netns(path)
    origin = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            _setns(target)
        except OSError as e:
            raise CNIError(INVALID_ENV, "cannot enter network namespace", f"setns({path!r}): {e}") from None
        try:
            yield
        finally:
            try:
                _setns(origin)
            except OSError as e:  # pragma: no cover - the thread is unusable; fail loudly
                raise RuntimeError(f"failed to return to the original network namespace: {e}") from e
    finally:
        os.close(target)
        os.close(origin)


def same_netns(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


@contextmanager
def locked(path: str = "/proc/thread-self/ns/net") -> Iterator[None]:
    """Hold an exclusive flock on a namespace file (default: the calling thread's own netns).

    Serialises concurrent plugin invocations that read-modify-write state shared inside one
    namespace (iptables chains, routing tables), as the Go plugins lock on the netns path.
    Every opener of the same namespace sees the same nsfs inode, so processes and threads
    exclude each other; the lock is released when the body ends.
    """
    from pycni.lockfile import flocked

    with flocked(path):
        yield
