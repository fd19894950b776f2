"""pycni.unixsock, the one listener of both daemons: nothing but a dead socket is replaced, the
socket appears listening with its final mode, and only our own inode is ever removed."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from pycni import unixsock
from pycni.plugins.ipam.dhcp import daemon as dhcp_daemon


def _connects(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_listens_with_mode_and_leaves_nothing_else(tmp_path: Path) -> None:
    path = str(tmp_path / "ar.sock")
    sock, owned = unixsock.listen(path, 0o660)
    try:
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert (st.st_dev, st.st_ino) == owned
        assert _connects(path)  # listening the moment the path exists
        assert sorted(os.listdir(tmp_path)) == ["ar.sock"]  # the private bind name is gone
    finally:
        assert unixsock.unlisten(sock, path, owned) is True
    assert not os.path.exists(path)


@pytest.mark.parametrize("kind", ["file", "dir", "symlink"])
def test_never_removes_what_is_not_a_socket(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ar.sock"
    if kind == "file":
        path.write_text("precious")
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(unixsock.Refused, match="not a socket"):
        unixsock.listen(str(path))
    assert os.path.lexists(path)
    if kind == "file":
        assert path.read_text() == "precious"
    assert sorted(os.listdir(tmp_path)) == ["ar.sock"]


def test_live_socket_refused_stale_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "ar.sock")
    live, owned = unixsock.listen(path)
    with pytest.raises(unixsock.AlreadyServing):
        unixsock.listen(path)
    assert os.lstat(path).st_ino == owned[1] and _connects(path)
    live.close()  # its daemon died: the socket file stays, refusing connections
    assert unixsock.socket_answers(path) is False
    again, owned2 = unixsock.listen(path)
    try:
        assert owned2 != owned and _connects(path)
    finally:
        unixsock.unlisten(again, path, owned2)


def test_unlisten_leaves_a_successor(tmp_path: Path) -> None:
    path = str(tmp_path / "ar.sock")
    sock, owned = unixsock.listen(path)
    os.unlink(path)
    successor, theirs = unixsock.listen(path)
    try:
        assert unixsock.unlisten(sock, path, owned) is False
        assert os.lstat(path).st_ino == theirs[1] and _connects(path)
    finally:
        unixsock.unlisten(successor, path, theirs)


def test_long_path_binds_in_place(tmp_path: Path) -> None:
    """A path near sun_path's 107 bytes leaves no room for the private name: bound in place, same mode."""
    directory = tmp_path / ("d" * max(1, 98 - len(str(tmp_path))))
    directory.mkdir()
    path = str(directory / "s.sock")
    assert len(path.encode()) <= 107
    sock, owned = unixsock.listen(path)
    try:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600 and _connects(path)
    finally:
        unixsock.unlisten(sock, path, owned)


def test_dhcp_daemon_listener_refuses_a_regular_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dhcp daemon used to unlink whatever was at its path when a connect failed."""
    monkeypatch.delenv("LISTEN_PID", raising=False)
    path = tmp_path / "dhcp.sock"
    path.write_text("not a socket")
    with pytest.raises(unixsock.Refused):
        dhcp_daemon._listener(str(path))
    assert path.read_text() == "not a socket"
    path.unlink()
    sock, owned = dhcp_daemon._listener(str(path))
    try:
        assert owned is not None and stat.S_IMODE(os.lstat(path).st_mode) == 0o660
    finally:
        unixsock.unlisten(sock, str(path), owned)
