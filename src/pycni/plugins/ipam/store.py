"""host-local's disk store, byte for byte the Go reference's layout. Stdlib only.

``<dataDir>/<network>/`` holds one file per reserved address, named by the address and
holding ``<containerID>\\r\\n<ifname>`` (older Go versions wrote only the container ID; both
are understood), ``last_reserved_ip.<rangeset index>`` with the last address handed out, and
``lock``, which every writer flocks. Because Go's host-local flocks the same file, the two
implementations can share one directory, and a node can switch between them.

Reserving is one ``O_EXCL`` create, so no scan is needed to find a free address; only
lookups by owner (duplicate check, DEL, CHECK, GC) read the directory, as the reference does.
A long-lived process (the daemon) keeps what it read in an index that inotify keeps exact, so
from its third lookup in a directory on it re-reads only the files changed since, by whoever
changed them (see :class:`_Indexes`); a one-shot plugin simply reads the directory.
"""

from __future__ import annotations

import _thread
import errno
import fcntl
import os
import sys
import time

from pycni import ipaddr
from pycni.spec.errors import IO_FAILURE, TRY_AGAIN, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~3 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Collection, Iterator
    from typing import Any

    from pycni.spec.types import IPAddress

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
LAST_IP_PREFIX = "last_reserved_ip."
LOCK_NAME = "lock"
LINE_BREAK = b"\r\n"
LOCK_TIMEOUT = 120.0  # seconds to wait for another invocation before answering "try again"


def _io_error(what: str, err: OSError) -> CNIError:
    return CNIError(IO_FAILURE, f"host-local: {what}", f"{err.filename or ''}: {err.strerror or err}")


def owner_key(container_id: str, ifname: str) -> bytes:
    """What a reservation file holds for (container, interface), as Go writes it."""
    return container_id.strip().encode() + LINE_BREAK + ifname.encode()


def parse_owner(data: bytes) -> tuple[str, str | None]:
    """(container ID, ifname) from a reservation's bytes; ifname None for the old format."""
    text = data.strip().decode("utf-8", "replace")
    cid, sep, ifname = text.partition("\r\n")
    return cid, (ifname if sep else None)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (one write call may take only part of a long container ID)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _as_ip(name: str) -> IPAddress | None:
    """The address a reservation file is named after; None for other files."""
    if not name or not (name[0].isdigit() or name[0] in "abcdefABCDEF:"):
        return None
    try:
        return ipaddr.ip_address(name)
    except ValueError:
        return None


class Store:
    """One network's reservations. Open per invocation; hold :meth:`locked` while mutating."""

    def __init__(self, network: str, data_dir: str = "", lock_timeout: float = LOCK_TIMEOUT) -> None:
        self.dir = os.path.join(data_dir or DEFAULT_DATA_DIR, network)
        self.lock_timeout = lock_timeout
        try:
            os.makedirs(self.dir, 0o755, exist_ok=True)
            # Each Store opens its own lock file description, so flock also excludes
            # other threads of this process, not only other processes.
            self._lock_fd = os.open(os.path.join(self.dir, LOCK_NAME), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC,
                                    0o750)
        except OSError as e:
            raise _io_error(f"cannot open data directory {self.dir}", e) from None

    # ---- life cycle -----------------------------------------------------------------------
    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def locked(self) -> _Locked:
        """Exclusive access among every host-local (ours or Go's) using this network."""
        return _Locked(self)

    def _lock(self) -> None:
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.0002
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                    raise _io_error("cannot lock the data directory", e) from None
            if time.monotonic() >= deadline:
                raise CNIError(TRY_AGAIN, "host-local: data directory is busy",
                               f"{self.dir}/lock held by another invocation for over {self.lock_timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    # ---- reservations ---------------------------------------------------------------------
    def _path(self, name: str) -> str:
        """The file ``name`` in this network's store directory."""
        return os.path.join(self.dir, name)

    def reserve(self, container_id: str, ifname: str, ip: IPAddress, range_id: str) -> bool:
        """Claim ``ip`` for the owner; False if someone holds it. Records the round-robin cursor."""
        path = self._path(str(ip))
        try:
            if not self._create_whole(path, owner_key(container_id, ifname)):
                return False
        except OSError as e:
            raise _io_error(f"cannot reserve {ip}", e) from None
        try:
            self._write_file(LAST_IP_PREFIX + range_id, str(ip).encode())
        except OSError as e:
            self._unlink(path)
            raise _io_error(f"cannot reserve {ip}", e) from None
        return True

    def names(self) -> set[str]:
        """The names in the store directory (addresses taken, and the store's own files); hold
        :meth:`locked` for it to stay true."""
        try:
            return set(os.listdir(self.dir))
        except FileNotFoundError:
            return set()
        except OSError as e:
            raise _io_error("cannot list the data directory", e) from None

    def _create_whole(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists (False then), never visible half-written.

        The owner is written into an unnamed file (O_TMPFILE) that is then linked in place: a
        process killed at any point leaves either no reservation or a complete one, never the
        empty file an O_EXCL create followed by a write can leave (which no DEL could match).
        Where the file system has no O_TMPFILE, the O_EXCL create is the fallback.
        """
        if os.path.lexists(path):  # the common answer while walking a full range: one stat, as O_EXCL was
            return False
        try:
            fd = os.open(self.dir, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            return self._create_excl(path, data)
        dfd = -1
        try:
            _write_all(fd, data)
            # linkat(AT_SYMLINK_FOLLOW) names the unnamed file; os.link uses linkat (not link(2),
            # which would try to link the /proc symlink itself) only when given a dir fd.
            dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.link(f"/proc/self/fd/{fd}", os.path.basename(path), dst_dir_fd=dfd, follow_symlinks=True)
            except FileExistsError:
                return False
        finally:
            os.close(fd)
            if dfd >= 0:
                os.close(dfd)
        return True

    def _create_excl(self, path: str, data: bytes) -> bool:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        try:
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        except OSError:
            self._unlink(path)
            raise
        return True

    def _write_file(self, name: str, data: bytes) -> None:
        """Overwrite file ``name`` in the store directory (0600)."""
        fd = os.open(self._path(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    @staticmethod
    def _unlink(path: str) -> bool:
        """Remove ``path``; False when it was already gone."""
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False

    def _release(self, name: str) -> bool:
        """Remove reservation file ``name``; False when it was already gone, CNIError on I/O failure."""
        try:
            return self._unlink(self._path(name))
        except OSError as e:
            raise _io_error(f"cannot release {name}", e) from None

    def last_reserved_ip(self, range_id: str) -> IPAddress | None:
        """Where the allocator's round robin continues for range set ``range_id`` (None if unknown)."""
        try:
            with open(self._path(LAST_IP_PREFIX + range_id), "rb") as f:
                text = f.read(256).decode("ascii", "replace").strip()
        except OSError:
            return None
        try:
            addr = ipaddr.ip_address(text)
        except ValueError:
            return None
        if isinstance(addr, ipaddr.IPv6Address) and addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        return addr

    def owner_of(self, ip: IPAddress) -> tuple[str, str | None] | None:
        """(containerID, ifname or None for old-format files) holding ``ip``; None when free."""
        try:
            with open(self._path(str(ip)), "rb") as f:
                return parse_owner(f.read())
        except OSError:
            return None

    def release_ip(self, ip: IPAddress, container_id: str, ifname: str) -> bool:
        """Free one address if (and only if) it is still held by this owner."""
        path = self._path(str(ip))
        try:
            with open(path, "rb") as f:
                if f.read().strip() != owner_key(container_id, ifname):
                    return False
        except FileNotFoundError:
            return False
        except OSError as e:
            raise _io_error(f"cannot release {ip}", e) from None
        return self._unlink(path)

    # ---- lookups by owner (directory scans, as the reference) ----------------------------
    def entries(self) -> list[tuple[str, bytes]]:
        """(file name, contents) of every reservation-like file (all but lock and cursors)."""
        try:
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise _io_error(f"cannot read data directory {self.dir}", e) from None
        try:
            try:
                found = _INDEXES.lookup(dfd)
            except OSError:
                found = None  # the index is only a shortcut
            return found if found is not None else list(_read_all(dfd))
        except OSError as e:
            raise _io_error(f"cannot read data directory {self.dir}", e) from None
        finally:
            os.close(dfd)

    def get_by_id(self, container_id: str, ifname: str) -> list[IPAddress]:
        """Addresses held by the owner, in either file format (Go's GetByID)."""
        key = owner_key(container_id, ifname)
        old = container_id.strip().encode()
        out = []
        for name, data in self.entries():
            data = data.strip()
            if data == key or data == old:
                ip = _as_ip(name)
                if ip is not None:
                    out.append(ip)
        return out

    def release_by_id(self, container_id: str, ifname: str) -> list[str]:
        """Free everything the owner holds; old-format files only when no new-format one matched."""
        key = owner_key(container_id, ifname)
        old = container_id.strip().encode()
        new_matches: list[str] = []
        old_matches: list[str] = []
        for name, data in self.entries():
            data = data.strip()
            if data == key:
                new_matches.append(name)
            elif data == old:
                old_matches.append(name)
        released = []
        for name in new_matches or old_matches:
            if self._release(name):
                released.append(name)
        return released

    def gc(self, valid: Collection[tuple[str, str]]) -> list[str]:
        """Free every reservation whose (containerID, ifname) is not in ``valid``.

        An old-format reservation (container ID only) survives if any valid attachment has
        that container ID. Files not named by an address are left alone.
        """
        valid_set = {(cid.strip(), ifn) for cid, ifn in valid}
        valid_ids = {cid for cid, _ in valid_set}
        released = []
        for name, data in self.entries():
            if _as_ip(name) is None:
                continue
            cid, ifname = parse_owner(data)
            if (ifname is None and cid in valid_ids) or (cid, ifname) in valid_set:
                continue
            if self._release(name):
                released.append(name)
        return released


# ---- reading the directory ------------------------------------------------------------------
class _Locked:
    """:meth:`Store.locked`'s hold (a class: contextlib costs a one-shot plugin ~3 ms to import)."""

    __slots__ = ("_store",)

    def __init__(self, store: Store) -> None:
        self._store = store

    def __enter__(self) -> Store:
        self._store._lock()
        return self._store

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._store._lock_fd, fcntl.LOCK_UN)


def _skipped(name: str) -> bool:
    return name == LOCK_NAME or name.startswith(LAST_IP_PREFIX)


def _read_one(dfd: int, name: str) -> bytes | None:
    """The bytes of regular file ``name``; None if it is gone, a symlink or unreadable.

    All of them, as Go's os.ReadFile: a container ID may be far longer than a page (the
    kernel allows 128 KiB per environment string), and a reservation read short would
    never match its owner, so DEL would leave it behind.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None  # vanished meanwhile, a symlink, or unreadable
    try:
        data = os.read(fd, 4096)  # one read for every ordinary reservation
        if len(data) < 4096:
            return data
        chunks = [data]
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None  # a directory
    finally:
        os.close(fd)


def _read_all(dfd: int) -> Iterator[tuple[str, bytes]]:
    """Every reservation-like file of the open directory ``dfd``, as Go's GetByID reads them."""
    for name in os.listdir(dfd):
        if not _skipped(name):
            data = _read_one(dfd, name)
            if data is not None:
                yield name, data


# ---- the index of a long-lived process --------------------------------------------------------
# inotify(7): what is watched, and what an event says.
_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_FROM, _IN_MOVED_TO = 0x2, 0x8, 0x40, 0x80
_IN_CREATE, _IN_DELETE, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
_IN_UNMOUNT, _IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR = 0x2000, 0x4000, 0x8000, 0x01000000
_WATCH_MASK = (_IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
               | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR)
_GONE = _IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT
_EVENT = "iIII"  # struct inotify_event: wd, mask, cookie, len; then the name (16 bytes)
# File systems whose every change reaches inotify (statfs f_type). Not network or FUSE file
# systems, where another host's changes are never reported: those are always read afresh.
_LOCAL_FS = frozenset({0xEF53, 0x58465342, 0x9123683E,  # ext2/3/4, xfs, btrfs
                       0x01021994, 0x858458F6, 0xF2F52010, 0x2FC12FC1})  # tmpfs, ramfs, f2fs, zfs
_MAX_DIRS = 64  # directories indexed at once (least recently used dropped first)


class _Dir:
    """One watched directory: its files' bytes, and the names changed since they were read."""

    def __init__(self, wd: int, key: tuple[int, int]) -> None:
        self.wd, self.key = wd, key
        self.files: dict[str, bytes] = {}
        self.changed: set[str] | None = None  # None: read everything (new, or events were lost)


class _Indexes:
    """What each store directory held when last read, kept exact by inotify.

    inotify reports every create, delete, rename and write in a watched directory,
    synchronously in the writer's system call, whoever the writer is (Go's host-local, another
    process, an administrator): so once the store lock is ours, every change made before it is
    queued, and re-reading just the names the events carry gives what a full read would. Nothing
    here depends on timestamps or inode numbers, so neither coarse clocks nor a reused inode
    can hide a change. Lost events (queue overflow) mean a full read; a directory deleted,
    moved or unmounted is forgotten; a path that now leads to another directory is another
    key (device, inode).

    A directory is indexed from its second lookup in a process, so a one-shot plugin (one
    lookup) pays nothing; anything unavailable (no inotify, the watch limit, a non-local file
    system, no /proc) means reading the directory, as before. After fork the child starts over.
    """

    def __init__(self) -> None:
        self._guard = _thread.allocate_lock()  # not threading: a one-shot plugin need not import it
        self._pid = -1
        self._fd = -1
        self._libc: Any = None
        self._by_wd: dict[int, _Dir] = {}
        self._by_key: dict[tuple[int, int], _Dir] = {}  # least recently used first
        self._seen: set[tuple[int, int]] = set()
        self._refused: set[tuple[int, int]] = set()  # not on a local file system
        self.enabled = True

    def lookup(self, dfd: int) -> list[tuple[str, bytes]] | None:
        """Every (name, bytes) of the open directory ``dfd``, or None when it is not indexed."""
        if not self.enabled:
            return None
        st = os.fstat(dfd)
        key = (st.st_dev, st.st_ino)
        with self._guard:
            if self._pid != os.getpid():
                self._reset()
            if key not in self._by_key:
                if key not in self._seen:  # first use: a plain read, and remember the directory
                    if len(self._seen) >= 1024:
                        self._seen.clear()
                    self._seen.add(key)
                    return None
                if key in self._refused or not self._watch(dfd, key):
                    return None
            self._drain()
            d = self._by_key.get(key)
            if d is None:  # forgotten by an event just now (the directory went away meanwhile)
                return None
            self._by_key[key] = self._by_key.pop(key)  # most recently used
            if d.changed is None:
                d.files = dict(_read_all(dfd))
                d.changed = set()  # events queued meanwhile are applied at the next lookup
            else:
                for name in d.changed:
                    data = None if _skipped(name) else _read_one(dfd, name)
                    if data is None:
                        d.files.pop(name, None)
                    else:
                        d.files[name] = data
                d.changed.clear()
            return list(d.files.items())

    # ---- the inotify instance (call with the guard held) ------------------------------------
    def after_fork(self) -> None:
        """In a forked child: a lock nobody holds, and no use of the parent's inotify instance."""
        self._guard = _thread.allocate_lock()
        self._reset()

    def _reset(self) -> None:
        """A fresh start (first use, or in a forked child: the inherited instance is the parent's)."""
        if self._fd >= 0:
            os.close(self._fd)
        self._pid, self._fd = os.getpid(), -1
        self._by_wd.clear()
        self._by_key.clear()
        self._seen.clear()
        self._refused.clear()

    def _watch(self, dfd: int, key: tuple[int, int]) -> bool:
        """Start indexing the open directory ``dfd``; False when that is not possible here."""
        import ctypes

        try:
            if self._libc is None:
                self._libc = ctypes.CDLL(None, use_errno=True)
            libc = self._libc
            if self._fd < 0:
                fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
                if fd < 0:
                    return False
                self._fd = fd
            buf = bytearray(256)  # struct statfs; f_type comes first
            if libc.fstatfs(dfd, (ctypes.c_char * len(buf)).from_buffer(buf)) != 0:
                return False
            if int.from_bytes(buf[:ctypes.sizeof(ctypes.c_long)], sys.byteorder) & 0xFFFFFFFF not in _LOCAL_FS:
                self._refused.add(key)
                return False
            wd = libc.inotify_add_watch(self._fd, f"/proc/self/fd/{dfd}".encode(), _WATCH_MASK)
        except (OSError, AttributeError):  # no libc or no inotify here
            self.enabled = False
            return False
        if wd < 0:
            return False  # e.g. the watch limit
        if len(self._by_key) >= _MAX_DIRS:
            self._forget(next(iter(self._by_key.values())))
        d = self._by_wd.get(wd) or _Dir(wd, key)  # one inode, one watch: an earlier key moved here
        self._by_key.pop(d.key, None)
        d.key, d.changed = key, None
        self._by_wd[wd] = self._by_key[key] = d
        return True

    def _forget(self, d: _Dir, rm_watch: bool = True) -> None:
        self._by_wd.pop(d.wd, None)
        if self._by_key.get(d.key) is d:
            del self._by_key[d.key]
        if rm_watch:
            self._libc.inotify_rm_watch(self._fd, d.wd)

    def _drain(self) -> None:
        """Apply every queued event: note changed names, forget directories that went away."""
        import struct

        event = struct.Struct(_EVENT)
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                for d in self._by_wd.values():
                    d.changed = None  # events may be lost: read everything again
                return
            off = 0
            while off + event.size <= len(buf):
                wd, mask, _cookie, length = event.unpack_from(buf, off)
                raw = buf[off + event.size:off + event.size + length].split(b"\0", 1)[0]
                off += event.size + length
                if mask & _IN_Q_OVERFLOW:
                    for d in self._by_wd.values():
                        d.changed = None
                    continue
                watched = self._by_wd.get(wd)
                if watched is None:
                    continue
                if mask & _GONE:
                    self._forget(watched, rm_watch=not mask & _IN_IGNORED)
                elif watched.changed is not None and raw:
                    watched.changed.add(os.fsdecode(raw))


_INDEXES = _Indexes()
os.register_at_fork(after_in_child=_INDEXES.after_fork)
