"""State files: written whole or not at all, removed quietly. Stdlib only.

Why one helper: a plugin's DEL depends on what its ADD saved (host-device's original device
state, tuning's backup, flannel's delegate config, the runtime's result cache), and a crash
or a full disk must leave the old file or the new one, never half of one. So: write a
temporary file beside the target with the final mode, fsync it, then rename it over the
target (atomic within a directory); directories are made private (0700).
"""

from __future__ import annotations

import os

from pycni import jsonlite as json
from pycni.spec.errors import IO_FAILURE, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

TMP_PREFIX = ".tmp-"  # directory listings skip names starting with it


def write_bytes(path: str, data: bytes, *, mode: int = 0o600, dir_mode: int = 0o700,
                failure: str = "failed to write state file", durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (and durably unless ``durable`` is False: a cache
    whose loss costs nothing skips the fsync); CNIError 5 ``failure`` on an I/O error."""
    directory = os.path.dirname(path) or "."
    # A short name of its own, so any target name a directory can hold has room for its temporary.
    tmp = os.path.join(directory, f"{TMP_PREFIX}{os.getpid()}.{os.urandom(4).hex()}")
    try:
        os.makedirs(directory, mode=dir_mode, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not loosen (or tighten) what the caller asked for
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        remove(tmp)
        raise CNIError(IO_FAILURE, failure, f"writing {path}: {e.strerror or e}") from None


def write_json(path: str, obj: Any, *, mode: int = 0o600, dir_mode: int = 0o700, indent: int | None = None,
               failure: str = "failed to write state file") -> None:
    """:func:`write_bytes` of ``obj`` as JSON."""
    write_bytes(path, json.dumps(obj, indent=indent).encode(), mode=mode, dir_mode=dir_mode, failure=failure)


def read_json(path: str) -> Any:
    """What :func:`write_json` wrote; None when the file is missing, unreadable or not JSON."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None


def remove(path: str) -> bool:
    """Delete ``path``; True when it was there. Never raises: a missing file is already gone."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


__all__ = ["write_bytes", "write_json", "read_json", "remove", "TMP_PREFIX"]
