"""host-local's disk store, byte for byte the Go reference's layout. Stdlib only.

``<dataDir>/<network>/`` holds one file per reserved address, named by the address and
holding ``<containerID>\\r\\n<ifname>`` (older Go versions wrote only the container ID; both
are understood), ``last_reserved_ip.<rangeset index>`` with the last address handed out, and
``lock``, which every writer flocks. Because Go's host-local flocks the same file, the two
implementations can share one directory, and a node can switch between them.

Reserving is one ``O_EXCL`` create, so no scan is needed to find a free address; only
lookups by owner (duplicate check, DEL, CHECK, GC) read the directory, as the reference does.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

from pycni.spec.errors import IO_FAILURE, TRY_AGAIN, CNIError

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
LAST_IP_PREFIX = "last_reserved_ip."
LOCK_NAME = "lock"
LINE_BREAK = b"\r\n"
LOCK_TIMEOUT = 120.0  # seconds to wait for another invocation before answering "try again"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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


def _as_ip(name: str) -> IPAddress | None:
    """The address a reservation file is named after; None for other files."""
    if not name or not (name[0].isdigit() or name[0] in "abcdefABCDEF:"):
        return None
    try:
        return ipaddress.ip_address(name)
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

    @contextmanager
    def locked(self) -> Iterator[Store]:
        """Exclusive access among every host-local (ours or Go's) using this network."""
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.0002
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                    raise _io_error("cannot lock the data directory", e) from None
            if time.monotonic() >= deadline:
                raise CNIError(TRY_AGAIN, "host-local: data directory is busy",
                               f"{self.dir}/lock held by another invocation for over {self.lock_timeout:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        try:
            yield self
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # ---- reservations ---------------------------------------------------------------------
    def _path(self, name: str) -> str:
        """The file ``name`` in this network's store directory."""
        return os.path.join(self.dir, name)

    def reserve(self, container_id: str, ifname: str, ip: IPAddress, range_id: str) -> bool:
        """Claim ``ip`` for the owner; False if someone holds it. Records the round-robin cursor."""
        path = self._path(str(ip))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        except OSError as e:
            raise _io_error(f"cannot reserve {ip}", e) from None
        try:
            try:
                os.write(fd, owner_key(container_id, ifname))
            finally:
                os.close(fd)
            self._write_file(LAST_IP_PREFIX + range_id, str(ip).encode())
        except OSError as e:
            self._unlink(path)
            raise _io_error(f"cannot reserve {ip}", e) from None
        return True

    def _write_file(self, name: str, data: bytes) -> None:
        """Overwrite file ``name`` in the store directory (0600)."""
        fd = os.open(self._path(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
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
            addr = ipaddress.ip_address(text)
        except ValueError:
            return None
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        return addr

    def owner_of(self, ip: IPAddress) -> tuple[str, str | None] | None:
        """(containerID, ifname or None for old-format files) holding ``ip``; None when free."""
        try:
            with open(self._path(str(ip)), "rb") as f:
                return parse_owner(f.read(4096))
        except OSError:
            return None

    def release_ip(self, ip: IPAddress, container_id: str, ifname: str) -> bool:
        """Free one address if (and only if) it is still held by this owner."""
        path = self._path(str(ip))
        try:
            with open(path, "rb") as f:
                if f.read(4096).strip() != owner_key(container_id, ifname):
                    return False
        except FileNotFoundError:
            return False
        except OSError as e:
            raise _io_error(f"cannot release {ip}", e) from None
        return self._unlink(path)

    # ---- lookups by owner (directory scans, as the reference) ----------------------------
    def entries(self) -> Iterator[tuple[str, bytes]]:
        """(file name, contents) of every reservation-like file (all but lock and cursors)."""
        try:
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            names = os.listdir(dfd)
        except OSError as e:
            raise _io_error(f"cannot read data directory {self.dir}", e) from None
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            for name in names:
                if name == LOCK_NAME or name.startswith(LAST_IP_PREFIX):
                    continue
                try:
                    fd = os.open(name, flags, dir_fd=dfd)
                except OSError:
                    continue  # vanished meanwhile, a symlink, or unreadable
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    continue  # a directory
                finally:
                    os.close(fd)
                yield name, data
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
