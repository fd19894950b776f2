"""Reading and writing sysctls through /proc/sys, in the calling thread's network namespace.

The kernel resolves ``/proc/sys/net/...`` against the network namespace of the task doing the
lookup, so after :func:`pycni.net.netns.enter` a plain open() here reads and writes the
container's values, without forking ``sysctl``. Stdlib only.

Keys may be dotted (``net.ipv4.ip_forward``) or slashed (``net/ipv4/ip_forward``). As in the
Go reference, the first separator decides: in a dotted key, dots and slashes swap, so an
interface name with a dot is written ``net.ipv4.conf.eth0/100.rp_filter``; a slashed key is
used as it is (``net/ipv4/conf/eth0.100/rp_filter``).

Opening ``/proc/sys/net/ipv4/...`` by its full path gets slower with every network namespace
on the host: all namespaces' ``ipv4`` (``ipv6``, ``core``...) directories hang under one shared
``/proc/sys/net`` entry with the same name, and the lookup walks past the others' (newest
first; the host's, made first, comes last: ~0.15 ms per open with 1,000 containers). So
``net/<dir>/...`` keys are opened relative to a descriptor of ``/proc/sys/net/<dir>`` kept per
namespace (~3 us), falling back to the full path when that fails.
"""

from __future__ import annotations

import _thread
import errno
import os

from pycni.spec.errors import IO_FAILURE, CNIError, invalid_config

PROC_SYS = "/proc/sys"
_DIR_CACHE_SIZE = 32
_dirs: dict[tuple[int, int, str], int] = {}  # (netns dev, ino, dir) -> O_PATH fd, least recent first
_dirs_lock = _thread.allocate_lock()  # held across each relative open, so no fd is closed under a user


def _forget_dirs_in_child() -> None:
    global _dirs_lock
    _dirs_lock = _thread.allocate_lock()


os.register_at_fork(after_in_child=_forget_dirs_in_child)


def _open(path: str, flags: int) -> int:
    """os.open of a /proc/sys path, relative to a cached ``/proc/sys/net/<dir>`` where it can."""
    parts = path.split("/", 5)  # "", "proc", "sys", "net", dir, rest
    if len(parts) == 6 and parts[1:4] == ["proc", "sys", "net"]:
        try:
            st = os.stat("/proc/thread-self/ns/net")
        except OSError:
            return os.open(path, flags)
        key = (st.st_dev, st.st_ino, parts[4])
        with _dirs_lock:
            fd = _dirs.get(key)
            if fd is None:
                try:
                    fd = os.open("/".join(parts[:5]), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                except OSError:
                    return os.open(path, flags)
                if len(_dirs) >= _DIR_CACHE_SIZE:
                    os.close(_dirs.pop(next(iter(_dirs))))
            else:
                del _dirs[key]  # re-inserted below: most recent last
            _dirs[key] = fd
            try:
                return os.open(parts[5], flags, dir_fd=fd)
            except FileNotFoundError:
                # Missing here, or the namespace died and a new one reuses its inode number:
                # forget the directory and let the full path decide.
                os.close(_dirs.pop(key))
    return os.open(path, flags)


_SWAP = str.maketrans("./", "/.")


def normalize_key(key: str) -> str:
    """The slash form of ``key`` (first separator decides, as in the Go reference)."""
    for c in key:
        if c == ".":
            return key.translate(_SWAP)
        if c == "/":
            break
    return key


def sysctl_path(key: str) -> str:
    """The /proc/sys file for ``key``; CNIError (code 7) for a key that leaves /proc/sys."""
    if not isinstance(key, str) or not key:
        raise invalid_config("invalid sysctl key",
                             f"sysctl key must be a non-empty string, got {key!r}")
    return proc_path(normalize_key(key), key)


def proc_path(name: str, key: str | None = None) -> str:
    """The /proc/sys file for an already slash-separated ``name`` (no separator swapping).

    Refuses (code 7) empty components, '.', '..' and absolute names, so the result always
    stays under /proc/sys. ``key`` is what to call it in the error (defaults to ``name``).
    """
    label = key if key is not None else name
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise invalid_config(f"invalid sysctl key {label!r}",
                       "a sysctl key is a relative name under /proc/sys such as net.ipv4.ip_forward; "
                       "empty components, '.', '..' and absolute paths are not allowed")
    return f"{PROC_SYS}/{name}"


def _io_error(action: str, key: str, path: str, e: OSError) -> CNIError:
    """An OSError on a sysctl file as a CNIError; a missing file says the key does not exist here."""
    if e.errno == errno.ENOENT:
        return CNIError(IO_FAILURE, f"sysctl {key!r} does not exist",
                        f"{path} not found in this network namespace (is the interface or module there?)")
    return CNIError(IO_FAILURE, f"failed to {action} sysctl {key!r}", f"{path}: {e.strerror or e}")


def read_sysctl(key: str) -> str:
    """The value of ``key`` without its trailing newline."""
    path = sysctl_path(key)
    try:
        fd = _open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
    except OSError as e:
        raise _io_error("read", key, path, e) from None
    text = data.decode(errors="replace")
    return text[:-1] if text.endswith("\n") else text


def write_sysctl(key: str, value: str) -> None:
    """Set ``key`` to ``value`` (no create, no truncate: /proc files take one write)."""
    path = sysctl_path(key)
    data = str(value).encode()
    try:
        fd = _open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        raise _io_error("write", key, path, e) from None
    try:
        os.write(fd, data)
    except OSError as e:
        raise CNIError(IO_FAILURE, f"failed to set sysctl {key!r} to {value!r}",
                       f"{path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def try_write_sysctl(key: str, value: str) -> bool:
    """:func:`write_sysctl`, best effort as in the reference (IPv6 disabled, say); True when it took."""
    try:
        write_sysctl(key, value)
    except CNIError:
        return False
    return True


def _forwarding_key(version: int) -> str:
    return "net/ipv4/ip_forward" if version == 4 else "net/ipv6/conf/all/forwarding"


def enable_forwarding(version: int) -> bool:
    """Turn on IPv4 (``version`` 4) or IPv6 forwarding here, as Go's ip.EnableIP4Forward/EnableIP6Forward:
    no write when it is already on; an unreadable value is simply written. True when this call
    turned it on (a failed ADD then turns it off again with :func:`disable_forwarding`)."""
    key = _forwarding_key(version)
    try:
        if read_sysctl(key).strip() == "1":
            return False
    except CNIError:
        pass
    write_sysctl(key, "1")
    return True


def disable_forwarding(version: int) -> None:
    """Undo :func:`enable_forwarding` (rollback of an ADD that turned it on)."""
    write_sysctl(_forwarding_key(version), "0")
