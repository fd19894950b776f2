"""host-local's store index (a long-lived process's memory of the reservation files).

The index must answer exactly what reading the directory answers, whoever changed it and
however: Go's host-local, another process, an in-place rewrite, a file deleted and recreated
under the same name (the inode number is usually reused at once), a replaced directory, lost
inotify events. Every check compares the indexed answer with a plain read of the directory.
No namespaces: everything lives in tmp_path.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_util import run

from pycni import ipaddr
from pycni.plugins.ipam import store as store_mod
from pycni.plugins.ipam.store import Store

GO_HOST_LOCAL = "/usr/lib/cni/host-local"
have_go = pytest.mark.skipif(not os.access(GO_HOST_LOCAL, os.X_OK), reason="Go host-local not installed")


def plain(directory: Path) -> dict[str, bytes]:
    """What a lookup must return: the directory read afresh, without the index."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return dict(store_mod._read_all(fd))
    finally:
        os.close(fd)


def key_of(directory: Path) -> tuple[int, int]:
    st = os.stat(directory)
    return st.st_dev, st.st_ino


@pytest.fixture
def indexed(tmp_path: Path) -> Iterator[Store]:
    """A store whose directory is indexed already (lookups two and on use the index)."""
    with Store("net", str(tmp_path)) as s:
        (Path(s.dir) / "10.0.0.2").write_bytes(b"a\r\neth0")
        for _ in range(3):
            s.entries()
        assert key_of(Path(s.dir)) in store_mod._INDEXES._by_key
        yield s


def check(s: Store) -> dict[str, bytes]:
    got = dict(s.entries())
    assert got == plain(Path(s.dir))
    assert key_of(Path(s.dir)) in store_mod._INDEXES._by_key  # answered from the index
    return got


def test_one_lookup_reads_plainly_and_builds_nothing(tmp_path: Path) -> None:
    with Store("net", str(tmp_path)) as s:
        (Path(s.dir) / "10.0.0.2").write_bytes(b"a\r\neth0")
        assert dict(s.entries()) == {"10.0.0.2": b"a\r\neth0"}
        assert key_of(Path(s.dir)) not in store_mod._INDEXES._by_key  # a one-shot plugin pays nothing
        assert dict(s.entries()) == {"10.0.0.2": b"a\r\neth0"}
        assert key_of(Path(s.dir)) in store_mod._INDEXES._by_key


def test_changes_behind_its_back(indexed: Store) -> None:
    d = Path(indexed.dir)
    (d / "10.0.0.3").write_bytes(b"b\r\neth0")  # created
    assert check(indexed)["10.0.0.3"] == b"b\r\neth0"
    assert indexed.get_by_id("b", "eth0") == [ipaddr.ip_address("10.0.0.3")]
    with open(d / "10.0.0.3", "r+b") as f:  # rewritten in place: same inode, same size
        f.write(b"c")
    assert check(indexed)["10.0.0.3"] == b"c\r\neth0"
    assert indexed.get_by_id("b", "eth0") == [] and indexed.get_by_id("c", "eth0") == [ipaddr.ip_address("10.0.0.3")]
    (d / "10.0.0.2").unlink()  # deleted
    assert "10.0.0.2" not in check(indexed)
    (d / "10.0.0.3").rename(d / "10.0.0.4")  # renamed
    assert set(check(indexed)) == {"10.0.0.4"}
    (d / "10.0.0.9").mkdir()  # not files: left out, as a plain read leaves them out
    (d / "10.0.0.8").symlink_to(d / "10.0.0.4")
    assert set(check(indexed)) == {"10.0.0.4"}
    os.rmdir(d / "10.0.0.9")
    (d / "10.0.0.8").unlink()
    (d / "10.0.0.8").write_bytes(b"legacy")  # a file where the symlink was
    assert check(indexed)["10.0.0.8"] == b"legacy"


def test_deleted_and_recreated_under_the_same_name(indexed: Store) -> None:
    """Same name, usually the same inode number and size, within one clock tick: still seen."""
    d = Path(indexed.dir)
    for i in range(50):
        ino = (d / "10.0.0.2").stat().st_ino
        (d / "10.0.0.2").unlink()
        (d / "10.0.0.2").write_bytes(f"x{i % 10}\r\neth0".encode())
        assert check(indexed)["10.0.0.2"] == f"x{i % 10}\r\neth0".encode(), (i, ino)


def test_our_own_reserve_and_release(indexed: Store) -> None:
    a = ipaddr.ip_address("10.0.0.7")
    with indexed.locked():
        assert indexed.reserve("me", "eth1", a, "0")
        assert indexed.get_by_id("me", "eth1") == [a]
        assert indexed.release_by_id("me", "eth1") == ["10.0.0.7"]
        assert indexed.get_by_id("me", "eth1") == []
    check(indexed)


def test_lost_events_mean_a_full_read(indexed: Store) -> None:
    """More events than the inotify queue holds: the overflow makes the next lookup read all."""
    d = Path(indexed.dir)
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    except OSError:
        pytest.skip("no inotify limits in /proc")
    if limit > 100_000:
        pytest.skip("inotify queue too large to overflow quickly")
    fds = [os.open(d / n, os.O_WRONLY | os.O_CREAT, 0o600) for n in ("notes.a", "notes.b")]
    try:
        for i in range(limit + 10):  # alternating, so the kernel cannot merge the events
            os.write(fds[i % 2], b"x")
    finally:
        for fd in fds:
            os.close(fd)
    (d / "10.0.0.5").write_bytes(b"late\r\neth0")  # its events are lost
    assert check(indexed)["10.0.0.5"] == b"late\r\neth0"
    (d / "10.0.0.5").unlink()
    assert "10.0.0.5" not in check(indexed)  # and incremental again afterwards


def test_directory_replaced(indexed: Store, tmp_path: Path) -> None:
    d = Path(indexed.dir)
    d.rename(tmp_path / "moved")
    d.mkdir()
    (d / "10.0.0.6").write_bytes(b"new\r\neth0")
    for _ in range(3):
        assert dict(indexed.entries()) == {"10.0.0.6": b"new\r\neth0"}
    (tmp_path / "moved" / "10.0.0.2").unlink()  # the old directory is no concern any more
    assert dict(indexed.entries()) == {"10.0.0.6": b"new\r\neth0"}


def test_directory_recreated_with_the_same_inode(tmp_path: Path) -> None:
    """A new directory at the store's path may get the deleted one's inode number back."""
    with Store("net", str(tmp_path)) as s:
        (Path(s.dir) / "10.0.0.2").write_bytes(b"old\r\neth0")
        for _ in range(3):
            s.entries()
    d = tmp_path / "net"
    old = d.stat().st_ino
    for name in os.listdir(d):
        (d / name).unlink()
    os.rmdir(d)  # with nothing open in it any more, the inode is freed (lazily)
    deadline = time.monotonic() + 5
    for i in itertools.count():  # new directories until one gets the number back
        candidate = tmp_path / f"candidate{i}"
        candidate.mkdir()
        if candidate.stat().st_ino == old:
            candidate.rename(d)
            break
        if time.monotonic() > deadline:
            pytest.skip("this file system did not reuse the inode number")
        time.sleep(0.02)
    (d / "10.0.0.7").write_bytes(b"new\r\neth0")
    with Store("net", str(tmp_path)) as s:
        assert key_of(d) in store_mod._INDEXES._by_key  # the old directory's entry, to be dropped
        for _ in range(3):
            assert dict(s.entries()) == {"10.0.0.7": b"new\r\neth0"}


def test_not_indexed_off_local_file_systems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "_LOCAL_FS", frozenset())  # as if the store were on NFS
    with Store("net", str(tmp_path)) as s:
        for i in range(4):
            (Path(s.dir) / f"10.0.0.{i + 2}").write_bytes(b"a\r\neth0")
            assert dict(s.entries()) == plain(Path(s.dir))
        assert key_of(Path(s.dir)) not in store_mod._INDEXES._by_key


def test_forked_child_starts_over(indexed: Store) -> None:
    """A child must not read its parent's inotify queue (it would steal the parent's events)."""
    d = Path(indexed.dir)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            (d / "10.0.0.3").write_bytes(b"child\r\neth0")
            ok = all(dict(indexed.entries()) == plain(d) for _ in range(3))
            os.write(w, json.dumps([ok, store_mod._INDEXES._pid == os.getpid()]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        answer = json.loads(f.read() or "null")
    _, status = os.waitpid(pid, 0)
    assert status == 0 and answer == [True, True]
    assert check(indexed)["10.0.0.3"] == b"child\r\neth0"  # the parent still sees the child's change


@have_go
def test_go_host_local_sharing_the_directory(tmp_path: Path) -> None:
    """Reservations the Go binary makes and frees are seen by the index at once."""
    conf = json.dumps({"cniVersion": "1.0.0", "name": "net", "type": "bridge",
                       "ipam": {"type": "host-local", "subnet": "10.3.0.0/24", "dataDir": str(tmp_path)}}).encode()

    def go(command: str, cid: str) -> None:
        out = run("host-local", command, conf, via="exec", container_id=cid, netns="/var/run/netns/unused")
        assert out.exit_code == 0, out.stdout + out.stderr

    with Store("net", str(tmp_path)) as s:
        for _ in range(3):
            s.get_by_id("nobody", "eth0")
        for i in range(5):
            go("ADD", f"go{i}")
            with s.locked():
                assert len(s.get_by_id(f"go{i}", "eth0")) == 1
        go("DEL", "go2")
        with s.locked():
            assert s.get_by_id("go2", "eth0") == []
            assert s.release_by_id("go3", "eth0") == ["10.3.0.5"]  # ours frees what Go made
        go("ADD", "go5")  # Go reuses nothing stale: the freed addresses are free on disk too
        with s.locked():
            check(s)
            assert {d.decode() for d in plain(Path(s.dir)).values()} == {
                f"go{i}\r\neth0" for i in (0, 1, 4, 5)}


@pytest.mark.parametrize("tmpfile", [True, False])
def test_a_reservation_is_never_visible_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    tmpfile: bool) -> None:
    """A write that dies part-way leaves no reservation file (an empty one no DEL could match), with
    O_TMPFILE + link and with the O_EXCL fallback for file systems without O_TMPFILE."""
    from pycni import ipaddr
    from pycni.plugins.ipam import store as store_mod

    if not tmpfile:
        real_open = os.open

        def no_tmpfile(path: str, flags: int, *a: object) -> int:
            if flags & os.O_TMPFILE == os.O_TMPFILE:
                raise OSError(errno.EOPNOTSUPP, "no O_TMPFILE here")
            return real_open(path, flags, *a)

        monkeypatch.setattr(store_mod.os, "open", no_tmpfile)

    def dies(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    ip = ipaddr.ip_address("10.9.0.2")
    with store_mod.Store("net", str(tmp_path)) as st, st.locked():
        monkeypatch.setattr(store_mod, "_write_all", dies)
        with pytest.raises(store_mod.CNIError):
            st.reserve("c1", "eth0", ip, "0")
        monkeypatch.undo()
        assert not (tmp_path / "net" / "10.9.0.2").exists()
        assert st.reserve("c1", "eth0", ip, "0")
        assert (tmp_path / "net" / "10.9.0.2").read_bytes() == b"c1\r\neth0"
        assert not st.reserve("c2", "eth0", ip, "0")
    assert sorted(os.listdir(tmp_path / "net")) == ["10.9.0.2", "last_reserved_ip.0", "lock"]
