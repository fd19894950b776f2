"""The result cache, in libcni's on-disk layout and format, so Go runtimes and pycni share it.

One file per attachment, ``<cacheDir>/results/<network>-<containerID>-<ifname>``, holding::

    {"kind":"cniCacheV1","containerId":...,"config":"<base64 of the network config bytes>",
     "ifName":...,"networkName":...,"netns":...,"cniArgs":[["K","V"]],"capabilityArgs":{...},
     "result":{...}}

``config`` is base64 because Go marshals ``[]byte`` that way. A file in the older format
(a bare result object) is still read, as libcni reads it. Stdlib only.
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from pycni import statefile
from pycni.record import field, record
from pycni.runtime.conf import go_json, sorted_keys
from pycni.spec.errors import DECODE_FAILURE, IO_FAILURE, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a process ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_CACHE_DIR = "/var/lib/cni"
CACHE_KIND = "cniCacheV1"
# Beside libcni's results/ (which Go runtimes read), one marker per ADD in flight: GC must not
# take an attachment that is being added for a stale one.
IN_FLIGHT_DIR = "pycni-adding"


@record
class CacheEntry:
    """One cached attachment: what ADD was given and what it returned."""

    network_name: str
    container_id: str
    ifname: str
    config: bytes = b""
    netns: str = ""
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    legacy: bool = False  # the file was a bare result (pre-cniCacheV1)

    def to_json(self) -> bytes:
        """The file's bytes, field for field as libcni's cachedInfo marshals."""
        d: dict[str, Any] = {
            "kind": CACHE_KIND,
            "containerId": self.container_id,
            "config": base64.b64encode(self.config).decode(),
            "ifName": self.ifname,
            "networkName": self.network_name,
        }
        if self.netns:
            d["netns"] = self.netns
        if self.cni_args:
            d["cniArgs"] = [[k, v] for k, v in self.cni_args]
        if self.capability_args:
            d["capabilityArgs"] = sorted_keys(self.capability_args)
        if self.result:
            d["result"] = sorted_keys(self.result)
        return go_json(d)


def cache_file(cache_dir: str, network: str, container_id: str, ifname: str) -> str:
    """Path of one attachment's cache file (all three names are needed, as in libcni)."""
    if not network or not container_id or not ifname:
        raise CNIError(IO_FAILURE, "cannot locate cache file",
                       f"cache file path requires network name ({network!r}), container ID ({container_id!r}), "
                       f"and interface name ({ifname!r})")
    return os.path.join(cache_dir or DEFAULT_CACHE_DIR, "results", f"{network}-{container_id}-{ifname}")


def write_entry(cache_dir: str, entry: CacheEntry) -> str:
    """Write ``entry`` atomically (0600, directories 0700); return its path."""
    path = cache_file(cache_dir, entry.network_name, entry.container_id, entry.ifname)
    statefile.write_bytes(path, entry.to_json(), failure=f"failed to set network {entry.network_name!r} cached result")
    return path


def parse_entry(data: bytes, network: str = "", container_id: str = "", ifname: str = "",
                path: str = "") -> CacheEntry:
    """Decode a cache file; a bare result object is read as a legacy entry."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CNIError(DECODE_FAILURE, f"failed to decode cache file {path}", str(e)) from None
    if not isinstance(obj, dict):
        raise CNIError(DECODE_FAILURE, f"failed to decode cache file {path}", "expected a JSON object")
    if obj.get("kind") != CACHE_KIND:
        return CacheEntry(network, container_id, ifname, result=obj, legacy=True)
    try:
        raw_config = obj.get("config") or ""
        config = base64.b64decode(raw_config, validate=True) if raw_config else b""
        args = [(str(k), str(v)) for k, v in (obj.get("cniArgs") or [])]
        caps = obj.get("capabilityArgs") or {}
        result = obj.get("result")
        if not isinstance(caps, dict) or (result is not None and not isinstance(result, dict)):
            raise ValueError("capabilityArgs and result must be objects")
        for key in ("containerId", "ifName", "networkName", "netns"):
            if not isinstance(obj.get(key, ""), str):
                raise ValueError(f"{key} must be a string")
    except (binascii.Error, ValueError, TypeError) as e:
        raise CNIError(DECODE_FAILURE, f"failed to decode cache file {path}", str(e)) from None
    return CacheEntry(network_name=obj.get("networkName", ""), container_id=obj.get("containerId", ""),
                      ifname=obj.get("ifName", ""), config=config, netns=obj.get("netns", "") or "",
                      cni_args=args, capability_args=caps, result=result)


def read_entry(cache_dir: str, network: str, container_id: str, ifname: str) -> CacheEntry | None:
    """The cached entry, or None when there is none (a read error counts as none, as in libcni)."""
    path = cache_file(cache_dir, network, container_id, ifname)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return parse_entry(data, network, container_id, ifname, path)


def delete_entry(cache_dir: str, network: str, container_id: str, ifname: str) -> bool:
    """Remove the entry; False when there was none."""
    try:
        return statefile.remove(cache_file(cache_dir, network, container_id, ifname))
    except CNIError:
        return False


def list_entries(cache_dir: str, container_id: str = "") -> list[CacheEntry]:
    """Every readable cniCacheV1 entry (of one container, if given), as GetCachedAttachments."""
    directory = os.path.join(cache_dir or DEFAULT_CACHE_DIR, "results")
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out = []
    for name in names:
        if container_id:
            pos = name.find(f"-{container_id}-")
            if pos <= 0 or pos + len(container_id) + 2 >= len(name):
                continue
        try:
            with open(os.path.join(directory, name), "rb") as f:
                entry = parse_entry(f.read())
        except (OSError, CNIError):
            continue
        if entry.legacy or not entry.ifname or not entry.network_name:
            continue
        if container_id and entry.container_id != container_id:
            continue
        out.append(entry)
    return out


def _in_flight_path(cache_dir: str, network: str, container_id: str, ifname: str) -> str:
    digest = hashlib.sha256(f"{network}\0{container_id}\0{ifname}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir or DEFAULT_CACHE_DIR, IN_FLIGHT_DIR, digest)


@contextmanager
def adding(cache_dir: str, network: str, container_id: str, ifname: str) -> Iterator[None]:
    """Mark an ADD in flight for the body: an flock on a marker naming the attachment.

    The lock dies with the process, so a runtime killed mid-ADD leaves a marker that
    :func:`in_flight` recognises as stale (and removes).
    """
    path = _in_flight_path(cache_dir, network, container_id, ifname)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # Locked and named before it becomes visible, so in_flight never sees it unlocked.
        fd, tmp = tempfile.mkstemp(prefix=".", dir=directory)
    except OSError as e:
        raise CNIError(IO_FAILURE, "failed to mark the ADD in flight",
                       f"writing {directory}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps([network, container_id, ifname]).encode())
        os.rename(tmp, path)
    except OSError as e:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CNIError(IO_FAILURE, "failed to mark the ADD in flight",
                       f"writing {directory}: {e.strerror or e}") from None
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def in_flight(cache_dir: str) -> set[tuple[str, str, str]]:
    """(network, containerID, ifname) of every ADD running now; stale markers are removed."""
    directory = os.path.join(cache_dir or DEFAULT_CACHE_DIR, IN_FLIGHT_DIR)
    try:
        names = os.listdir(directory)
    except OSError:
        return set()
    busy: set[tuple[str, str, str]] = set()
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue
                data = os.read(fd, 1 << 20)
                try:
                    network, container_id, ifname = json.loads(data)
                except (ValueError, TypeError):
                    continue  # the holder has not written its name yet: it is not ours to judge
                busy.add((str(network), str(container_id), str(ifname)))
                continue
            try:
                os.unlink(path)  # nobody holds it: its ADD died
            except OSError:
                pass
        finally:
            os.close(fd)
    return busy
