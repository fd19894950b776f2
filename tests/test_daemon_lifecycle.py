"""The daemon as an operator runs it: one per socket, workers tied to the main process, bounded
reads and shutdown, systemd socket activation, and a clear refusal without privileges.

Every daemon here is a process on a socket in a temporary directory, in a session of its own,
killed at teardown with everything it started. Waits are bounded by WAIT and never decide a
pass on speed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import plugin_util
import pytest
from daemon_proc import WAIT, DaemonProc, alive, answers, needs_privileges, request, wait_until
from netns_util import Namespace

from pycni.install_plugins import install


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., DaemonProc]]:
    """Start daemons (``start(sock, *options, **kw)``); all are killed at teardown."""
    made: list[DaemonProc] = []

    def _start(sock: str, *extra: str, **kw: object) -> DaemonProc:
        d = DaemonProc(sock, tmp_path / f"daemon{len(made)}.log", *extra, **kw)  # type: ignore[arg-type]
        made.append(d)
        return d

    yield _start
    for d in made:
        d.reap()


def inode(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def leftovers(directory: Path, keep: str = "") -> list[str]:
    return sorted(p for p in os.listdir(directory) if not p.endswith(".log") and p != keep)


# ---- one daemon per socket ---------------------------------------------------------------------

@needs_privileges
def test_second_daemon_refuses_a_live_socket(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    sock = str(tmp_path / "one.sock")
    first = start(sock, "--workers", "1").ready()
    before = inode(sock)
    second = start(sock, "--workers", "1")
    assert second.wait() != 0
    err = second.stderr()
    assert "already" in err and sock in err, err
    # the first keeps its socket and keeps serving
    assert inode(sock) == before and answers(sock)
    assert first.terminate() == 0
    assert leftovers(tmp_path) == []  # socket and lock files gone


@needs_privileges
def test_stale_socket_is_replaced(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    sock = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock)  # what a dead daemon leaves: a socket file nobody listens on
    s.close()
    d = start(sock, "--workers", "1").ready()
    assert d.terminate() == 0 and leftovers(tmp_path) == []


@needs_privileges
def test_what_is_not_a_socket_is_left_alone(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    path = tmp_path / "not-a-socket"
    path.write_text("precious\n")
    d = start(str(path), "--workers", "1")
    assert d.wait() != 0
    assert "not a socket" in d.stderr()
    assert path.read_text() == "precious\n"


@needs_privileges
def test_socket_it_does_not_own_is_not_unlinked(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    """Someone replaced the socket file while the daemon ran: on exit the daemon leaves it alone."""
    sock = str(tmp_path / "d.sock")
    d = start(sock, "--workers", "2").ready(workers=2)
    os.rename(sock, str(tmp_path / "moved.sock"))
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        other.bind(sock)
        other.listen(1)
        mine = inode(sock)
        assert d.terminate() == 0
        assert inode(sock) == mine
    finally:
        other.close()


# ---- workers never outlive the main process ----------------------------------------------------

@needs_privileges
def test_workers_die_with_the_main_process(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    sock = str(tmp_path / "w.sock")
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(private_tmp))
    d = start(sock, "--workers", "2", env=env).ready(workers=2)
    assert len(d.workers) == 2
    os.kill(d.pid, signal.SIGKILL)
    d.proc.wait(WAIT)
    wait_until(lambda: not any(alive(w) for w in d.workers), "workers to exit after the main process died")
    assert not answers(sock)
    assert list(private_tmp.iterdir()) == []  # nothing of the daemon's in $TMPDIR
    # what the killed daemon left (a stale socket, its lock files) does not stop the next one
    again = start(sock, "--workers", "2", env=env).ready(workers=2)
    assert again.terminate() == 0
    assert leftovers(tmp_path, keep="tmp") == []


# ---- bounded reads, bounded shutdown -----------------------------------------------------------

def _silent(sock: str, n: int) -> list[socket.socket]:
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        conns.append(s)
    return conns


def _closed_by_daemon(s: socket.socket) -> bytes:
    """What the daemon sends a client before closing it (b"" for a bare close); fails if it never does."""
    s.settimeout(WAIT)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@needs_privileges
def test_silent_and_stalled_clients_are_cut_off(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    sock = str(tmp_path / "t.sock")
    d = start(sock, "--workers", "2", "--read-timeout", "1").ready(workers=2)
    silent = _silent(sock, 8)
    stalled = _silent(sock, 4)
    for s in stalled:  # a frame header announcing 100 bytes, then 10 of them, then nothing
        s.sendall((100).to_bytes(4, "big") + b"PYCNI1abcd")
    # others are served meanwhile
    assert request(sock, "loopback", {"CNI_COMMAND": "VERSION"})[0] == 0
    for s in silent + stalled:
        data = _closed_by_daemon(s)
        if data:  # a spec error saying why, never a hang
            from pycni.daemon import protocol

            code, out, _ = protocol.decode_reply(data[4:])
            assert code == 1 and json.loads(out)["code"] == 11, out
        s.close()
    assert d.terminate() == 0


@needs_privileges
def test_sigterm_with_silent_clients_stops_promptly(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    """Connections that never send do not hold the shutdown (before: 30 s each, per worker)."""
    sock = str(tmp_path / "s.sock")
    d = start(sock, "--workers", "2").ready(workers=2)
    silent = _silent(sock, 6)
    try:
        assert d.terminate(WAIT) == 0
        assert not os.path.exists(sock)
    finally:
        for s in silent:
            s.close()


SLOW_IPAM = """#!/bin/sh
# A foreign IPAM delegate (exec'd by the daemon) that holds an ADD until the test opens its gate.
[ "$CNI_COMMAND" = ADD ] || exit 0
touch {entered}
while [ ! -e {gate} ]; do sleep 0.02; done
echo '{{"cniVersion": "1.0.0", "ips": [{{"address": "10.66.0.5/24", "gateway": "10.66.0.1"}}]}}'
"""


@needs_privileges
@pytest.mark.parametrize("workers", [1, 2])
def test_request_in_flight_finishes_after_sigterm(workers: int, tmp_path: Path, start: Callable[..., DaemonProc],
                                                  netns_factory: Callable[[], Namespace]) -> None:
    bindir = tmp_path / "bin"
    install(str(bindir), ["bridge"], daemon=True)
    slow = bindir / "slowipam"
    slow.write_text(SLOW_IPAM.format(entered=tmp_path / "entered", gate=tmp_path / "gate"))
    slow.chmod(0o755)
    home, host, ctr = netns_factory(), netns_factory(), netns_factory()
    sock = str(tmp_path / "f.sock")
    d = start(sock, "--workers", str(workers), prefix=["ip", "netns", "exec", home.name])
    d.ready(workers=workers if workers > 1 else 0)
    conf = json.dumps({"cniVersion": "1.0.0", "name": "inflight", "type": "bridge", "bridge": "br-if",
                       "ipam": {"type": "slowipam"}})
    env = plugin_util.env("ADD", "if1", ctr, cni_path=str(bindir), PYCNI_SOCKET=sock)
    (tmp_path / "conf.json").write_text(conf)
    with open(tmp_path / "conf.json", "rb") as stdin:
        add = subprocess.Popen(["ip", "netns", "exec", host.name, str(bindir / "bridge")], stdin=stdin,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        wait_until((tmp_path / "entered").exists, "the ADD to reach its IPAM delegate")
        d.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: not os.path.exists(sock), "the daemon to stop listening")
        (tmp_path / "gate").touch()
        out, err = add.communicate(timeout=WAIT)
        assert add.returncode == 0, out + err
        assert json.loads(out)["ips"][0]["address"] == "10.66.0.5/24"
        assert d.wait() == 0
    finally:
        (tmp_path / "gate").touch()
        if add.poll() is None:
            add.kill()
            add.wait()


# ---- systemd socket activation -----------------------------------------------------------------

ACTIVATE = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ['LISTEN_FDS'] = '1'; "
            "os.environ['LISTEN_PID'] = str(os.getpid()); os.execv(sys.argv[2], sys.argv[2:])")


@needs_privileges
def test_socket_activation(tmp_path: Path, start: Callable[..., DaemonProc]) -> None:
    """As systemd passes it (LISTEN_FDS=1, fd 3): served as is, never unlinked, never re-bound."""
    sock = str(tmp_path / "act.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(sock)
        os.chmod(sock, 0o600)
        listener.listen(16)
        before = inode(sock)
        d = start(sock, "--workers", "2", prefix=[sys.executable, "-c", ACTIVATE, str(listener.fileno())],
                  pass_fds=[listener.fileno()]).ready(workers=2)
        code, out, _ = request(sock, "bridge", {"CNI_COMMAND": "VERSION"})
        assert code == 0 and "supportedVersions" in json.loads(out)
        assert d.terminate() == 0
        assert inode(sock) == before and stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert "socket activation" in d.log.read_text()
    finally:
        listener.close()


# ---- privileges --------------------------------------------------------------------------------

@pytest.mark.parametrize("how", [["--reuid=65534", "--regid=65534", "--clear-groups"],
                                 ["--inh-caps=-net_admin", "--bounding-set=-net_admin"]],
                         ids=["not-root", "no-cap-net-admin"])
def test_refuses_to_start_without_privileges(how: list[str], start: Callable[..., DaemonProc]) -> None:
    import shutil
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to drop privileges")
    can_import = subprocess.run(["setpriv", *how, sys.executable, "-c", "import pycni.daemon.server"],
                                capture_output=True, text=True, cwd="/")
    if can_import.returncode != 0:  # e.g. a checkout under a home directory only its owner may read
        pytest.skip(f"pycni cannot be imported with these privileges here: {can_import.stderr.strip()[-200:]}")

    open_dir = tempfile.mkdtemp(prefix="pycni-priv-")  # writable by the unprivileged user too
    try:
        os.chmod(open_dir, 0o777)
        sock = os.path.join(open_dir, "p.sock")
        d = start(sock, "--log-file", os.path.join(open_dir, "d.log"), prefix=["setpriv", *how])
        assert d.wait() != 0
        err = d.stderr()
        assert "CAP_NET_ADMIN" in err and "root" in err, err
        assert not os.path.exists(sock)
    finally:
        shutil.rmtree(open_dir)


# ---- the documented systemd units --------------------------------------------------------------

def test_documented_units_use_the_default_socket_and_verify(tmp_path: Path) -> None:
    """docs/daemon.md's units: the default socket, the daemon's own bounds, and systemd accepts them."""
    import re
    import shutil

    from pycni.daemon import protocol, server

    doc = (Path(__file__).parent.parent / "docs" / "daemon.md").read_text()
    units = {m.group(1): m.group(2) for m in re.finditer(r"```ini\n# /etc/systemd/system/(\S+)\n(.*?)```", doc, re.S)}
    assert set(units) == {"pycni.socket", "pycni.service"}

    def setting(unit: str, key: str) -> list[str]:
        return re.findall(rf"^{key}=(.*)$", units[unit], re.M)

    assert setting("pycni.socket", "ListenStream") == [protocol.DEFAULT_SOCKET]
    assert setting("pycni.socket", "Accept") == ["no"]
    exec_start = setting("pycni.service", "ExecStart")
    assert len(exec_start) == 1 and exec_start[0].endswith(" daemon")  # no --socket: the one passed
    assert setting("pycni.service", "KillMode") == ["mixed"]
    assert setting("pycni.service", "RestartPreventExitStatus") == [str(server.EXIT_REFUSED)]
    worst_stop = server.STOP_TIMEOUT + server.STOP_GRACE + 2  # see Daemon._stop_workers
    assert float(setting("pycni.service", "TimeoutStopSec")[0]) >= 2 * worst_stop
    assert setting("pycni.service", "RuntimeDirectory") == []  # would remove the socket's directory
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("systemd-analyze not installed: units checked by content only")
        return
    true = shutil.which("true") or "/bin/true"
    for name, text in units.items():
        (tmp_path / name).write_text(text.replace(exec_start[0].split()[0], true))
    proc = subprocess.run([analyze, "verify", "--man=no", *(str(tmp_path / n) for n in units)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


# ---- a flood of connections --------------------------------------------------------------------

def test_connections_beyond_the_limit_are_told_to_try_again(tmp_path: Path) -> None:
    """Each open connection holds a thread (bounded in time); their number is bounded too."""
    import threading

    from pycni.daemon.server import Daemon

    sock = str(tmp_path / "busy.sock")
    daemon = Daemon(sock, preload=False, max_connections=4)
    daemon.bind()
    server = threading.Thread(target=daemon.serve_forever, daemon=True)
    server.start()
    silent: list[socket.socket] = []
    try:
        silent = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
        for s in silent:
            s.connect(sock)
        wait_until(lambda: len(daemon._active) == 4, "the four silent connections to be taken")
        code, out, _ = request(sock, "loopback", {"CNI_COMMAND": "VERSION"})
        assert code == 1 and json.loads(out)["code"] == 11 and "busy" in json.loads(out)["msg"]
        for s in silent:
            s.close()
        wait_until(lambda: not daemon._active, "the silent connections to be dropped")
        code, out, _ = request(sock, "loopback", {"CNI_COMMAND": "VERSION"})
        assert code == 0 and "supportedVersions" in json.loads(out)
    finally:
        for s in silent:
            s.close()
        daemon.stop()
        server.join(WAIT)
    assert not server.is_alive() and leftovers(tmp_path) == []


def test_socket_activation_variables_are_checked() -> None:
    """LISTEN_* meant for another process are ignored; more than one socket is refused, clearly."""
    from pycni.daemon.server import Refused, activated_socket

    other = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
    assert activated_socket(other) is None and other["LISTEN_FDS"] == "1"  # not ours: left alone
    assert activated_socket({}) is None
    two = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"}
    with pytest.raises(Refused, match="exactly one ListenStream"):
        activated_socket(two)
    assert two == {}  # consumed: a process it starts must not take them for its own
