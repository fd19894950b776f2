"""The pycni daemon itself: wire format, robustness, locking, shutdown, permissions, fallback.

Daemons here listen on sockets in temporary directories; requests that need a namespace name
a throwaway one. Nothing waits on wall-clock time for an assertion: ordering is observed
through events and the daemon's own lock bookkeeping.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import plugin_util
import pytest
from daemon_proc import needs_privileges
from netns_util import Namespace
from plugin_util import daemon_in_thread

from pycni.daemon import protocol
from pycni.daemon.server import Daemon
from pycni.install_plugins import install
from pycni.skel import CmdArgs, Plugin
from pycni.spec.types import Result

WAIT = 30.0  # upper bound for events that should happen promptly (never a pass/fail on speed)


def request(sock_path: str, plugin: str, env: dict[str, str], stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock_path)
        s.sendall(protocol.encode_request(plugin, stdin, {k.encode(): v.encode() for k, v in env.items()}))
        return protocol.decode_reply(protocol.recv_frame(s))
    finally:
        s.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_in_thread(str(tmp_path / "d.sock")) as d:
        yield d


@pytest.fixture
def ctr(netns_factory: Callable[[], Namespace]) -> Namespace:
    return netns_factory()


def env_for(ctr: Namespace, cid: str, command: str = "ADD") -> dict[str, str]:
    """The environment a shim forwards in its request (the subprocess test below imports it)."""
    return plugin_util.env(command, cid, ctr, cni_path="/nonexistent")


CONF = json.dumps({"cniVersion": "1.0.0", "name": "dtest", "type": "host-local"}).encode()


# ---- wire format -------------------------------------------------------------------------------

def test_protocol_round_trip_is_byte_exact() -> None:
    env = {b"A": b"1", b"WEIRD": b"x=y=\xff\x00z", b"EMPTY": b""}
    stdin = bytes(range(256)) * 3
    body = protocol.encode_request("bridge", stdin, env)[4:]
    name, got_stdin, got_env = protocol.decode_request(body)
    assert (name, got_stdin) == ("bridge", stdin)
    assert {k.encode(): v.encode("utf-8", "surrogateescape") for k, v in got_env.items()} == env
    reply = protocol.encode_reply(-9, b"\x00out\xff", b"err\n")[4:]
    assert protocol.decode_reply(reply) == (-9, b"\x00out\xff", b"err\n")


@pytest.mark.parametrize("body", [b"", b"garbage", protocol.MAGIC + b"\x00\x00\x00\x09abc",
                                  protocol.MAGIC + b"\x00\x00"])
def test_protocol_rejects_malformed_bodies(body: bytes) -> None:
    with pytest.raises(ValueError):
        protocol.decode_request(body)


# ---- robustness --------------------------------------------------------------------------------

def test_malformed_requests_do_not_kill_it(daemon: Daemon, ctr: Namespace) -> None:
    for junk in (b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff", b"\x00\x00\x00\x10short"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(daemon.socket_path)
        s.sendall(junk)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(WAIT)
        data = s.recv(65536)
        s.close()
        if data:  # a decodable complaint, never a traceback
            code, out, _ = protocol.decode_reply(data[4:])
            assert code == 1 and json.loads(out)["code"] == 4
    code, out, _ = request(daemon.socket_path, "no-such-plugin", env_for(ctr, "c1"), CONF)
    assert code == 1 and "unknown plugin" in json.loads(out)["details"]
    # still serving
    code, out, _ = request(daemon.socket_path, "host-local", {"CNI_COMMAND": "VERSION"}, b"")
    assert code == 0 and "supportedVersions" in json.loads(out)


def test_plugin_exceptions_become_error_replies(daemon: Daemon, ctr: Namespace, monkeypatch: Any) -> None:
    def boom(args: CmdArgs) -> Result:
        raise RuntimeError("kaboom")

    def leave(args: CmdArgs) -> Result:
        sys.exit(3)

    daemon.plugins["host-local"] = Plugin(add=boom, delete=leave, about="test")
    code, out, _ = request(daemon.socket_path, "host-local", env_for(ctr, "c1"), CONF)
    assert code == 1 and json.loads(out)["msg"] == "kaboom" and json.loads(out)["code"] == 999
    code, out, _ = request(daemon.socket_path, "host-local", env_for(ctr, "c1", "DEL"), CONF)
    assert code == 1 and json.loads(out)["code"] == 999

    import pycni.daemon.server as server

    def broken_dispatch(*a: Any, **k: Any) -> Any:
        raise MemoryError("simulated failure outside the handler")

    monkeypatch.setattr(server, "dispatch", broken_dispatch)
    code, out, _ = request(daemon.socket_path, "host-local", env_for(ctr, "c1"), CONF)
    assert code == 1 and "simulated failure" in json.loads(out)["msg"]
    monkeypatch.undo()
    daemon.plugins["host-local"] = Plugin(add=lambda a: Result(cni_version="1.0.0"), about="ok")
    code, out, _ = request(daemon.socket_path, "host-local", env_for(ctr, "c2"), CONF)
    assert code == 0 and json.loads(out)["cniVersion"] == "1.0.0"


def test_caller_namespace_is_used(daemon: Daemon, netns_factory: Callable[[], Namespace], tmp_path: Path) -> None:
    """The handler runs in the namespace of the process that connected, not the daemon's."""
    seen: list[tuple[int, int]] = []

    def add(args: CmdArgs) -> Result:
        st = os.stat("/proc/thread-self/ns/net")
        seen.append((st.st_dev, st.st_ino))
        return Result(cni_version="1.0.0")

    daemon.plugins["host-local"] = Plugin(add=add, about="test")
    caller, ctr = netns_factory(), netns_factory()
    script = (f"import sys; sys.path[:0] = {sys.path!r}\n"
              "from test_daemon import request, env_for, CONF\nfrom netns_util import Namespace\n"
              f"code, out, err = request({daemon.socket_path!r}, 'host-local', "
              f"env_for(Namespace({ctr.name!r}), 'ns1'), CONF)\nsys.stdout.write(out.decode())\nsys.exit(code)\n")
    caller.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)))
    st = os.stat(caller.path)
    assert seen == [(st.st_dev, st.st_ino)]


# ---- locking -----------------------------------------------------------------------------------

class Gate:
    """A handler that blocks until released and records how many run at once per container."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.guard = threading.Lock()
        self.active: dict[str, int] = {}
        self.max_active: dict[str, int] = {}
        self.total_active = 0
        self.max_total = 0

    def add(self, args: CmdArgs) -> Result:
        with self.guard:
            self.active[args.container_id] = self.active.get(args.container_id, 0) + 1
            self.max_active[args.container_id] = max(self.max_active.get(args.container_id, 0),
                                                     self.active[args.container_id])
            self.total_active += 1
            self.max_total = max(self.max_total, self.total_active)
        self.entered.release()
        self.release.wait(WAIT)
        with self.guard:
            self.active[args.container_id] -= 1
            self.total_active -= 1
        return Result(cni_version="1.0.0")


def _in_threads(fn: Callable[[], Any], n: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=fn) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_same_attachment_is_serialised(daemon: Daemon, ctr: Namespace) -> None:
    gate = Gate()
    daemon.plugins["host-local"] = Plugin(add=gate.add, about="gate")
    codes: list[int] = []
    threads = _in_threads(lambda: codes.append(request(daemon.socket_path, "host-local",
                                                       env_for(ctr, "same"), CONF)[0]), 3)
    assert gate.entered.acquire(timeout=WAIT)
    # all three requests are in the daemon: one runs, two wait on the container's lock
    for _ in range(int(WAIT * 100)):
        with daemon.locks._guard:
            users = daemon.locks._locks.get("same\0eth0", (None, 0))[1]
        if users == 3:
            break
        threading.Event().wait(0.01)
    assert users == 3
    assert gate.active["same"] == 1
    gate.release.set()
    for t in threads:
        t.join(WAIT)
    assert codes == [0, 0, 0] and gate.max_active["same"] == 1
    assert "same\0eth0" not in daemon.locks._locks  # dropped when unused


def test_two_interfaces_of_one_container_run_concurrently(daemon: Daemon, ctr: Namespace) -> None:
    """go-cni runs a sandbox's loopback network (CNI_IFNAME lo) and its pod network (eth0) at once:
    neither waits for the other, as with plugin processes; each attachment is still serialised."""
    gate = Gate()
    daemon.plugins["host-local"] = Plugin(add=gate.add, about="gate")
    codes: list[int] = []
    names = iter(["lo", "eth0"])
    threads = _in_threads(lambda: codes.append(request(
        daemon.socket_path, "host-local", {**env_for(ctr, "pod"), "CNI_IFNAME": next(names)}, CONF)[0]), 2)
    for _ in range(2):  # both handlers are inside at the same time
        assert gate.entered.acquire(timeout=WAIT)
    assert gate.total_active == 2
    gate.release.set()
    for t in threads:
        t.join(WAIT)
    assert codes == [0, 0] and gate.max_total == 2


def test_different_containers_run_concurrently(daemon: Daemon, ctr: Namespace) -> None:
    gate = Gate()
    daemon.plugins["host-local"] = Plugin(add=gate.add, about="gate")
    codes: list[int] = []
    ids = iter(range(4))
    threads = _in_threads(lambda: codes.append(request(daemon.socket_path, "host-local",
                                                       env_for(ctr, f"c{next(ids)}"), CONF)[0]), 4)
    for _ in range(4):  # all four handlers are inside at the same time
        assert gate.entered.acquire(timeout=WAIT)
    assert gate.total_active == 4
    gate.release.set()
    for t in threads:
        t.join(WAIT)
    assert codes == [0, 0, 0, 0] and gate.max_total == 4


def test_nested_request_skips_the_container_lock(daemon: Daemon, ctr: Namespace) -> None:
    """A delegate exec'd by a request being served (PYCNI_IN_DAEMON=1) must not deadlock on its parent."""
    inner: list[int] = []

    def outer(args: CmdArgs) -> Result:
        env = dict(env_for(ctr, args.container_id), PYCNI_IN_DAEMON="1")
        inner.append(request(daemon.socket_path, "static", env, b'{"cniVersion": "1.0.0", "name": "x"}')[0])
        return Result(cni_version="1.0.0")

    daemon.plugins["host-local"] = Plugin(add=outer, about="outer")
    daemon.plugins["static"] = Plugin(add=lambda a: Result(cni_version="1.0.0"), about="inner")
    code, out, _ = request(daemon.socket_path, "host-local", env_for(ctr, "nest"), CONF)
    assert code == 0 and inner == [0]


# ---- lifecycle and permissions -----------------------------------------------------------------

def _start_daemon_process(sock: str, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "pycni.daemon", "--socket", sock, "--no-preload", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(int(WAIT * 20)):
        if os.path.exists(sock) or proc.poll() is not None:
            break
        threading.Event().wait(0.05)
    assert os.path.exists(sock), proc.stderr.read().decode() if proc.poll() is not None else "no socket"
    return proc


@needs_privileges
def test_sigterm_shuts_down_cleanly_and_removes_the_socket(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()  # the daemon creates no directory but its default's
    sock = str(tmp_path / "run" / "pycni.sock")
    proc = _start_daemon_process(sock)
    try:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        code, out, _ = request(sock, "loopback", {"CNI_COMMAND": "VERSION"})
        assert code == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
        assert not os.path.exists(sock)
        assert b"stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_privileges
def test_cli_verb_runs_the_daemon(tmp_path: Path) -> None:
    sock = str(tmp_path / "cli.sock")
    proc = subprocess.Popen([sys.executable, "-m", "pycni", "daemon", "--socket", sock, "--no-preload",
                             "--log-file", str(tmp_path / "d.log")])
    try:
        for _ in range(int(WAIT * 20)):
            if os.path.exists(sock) or proc.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert request(sock, "loopback", {"CNI_COMMAND": "VERSION"})[0] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0 and not os.path.exists(sock)
        assert "listening on" in (tmp_path / "d.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _as_nobody(path: str, frame: bytes) -> bytes:
    """Connect to ``path`` from a forked child running as uid 65534; b"EACCES" or the raw reply."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery from here on
        result = b""
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
            except PermissionError:
                result = b"EACCES"
            else:
                s.sendall(frame)
                while chunk := s.recv(65536):
                    result += chunk
        except BaseException as e:  # noqa: BLE001
            result = f"ERROR {e!r}".encode()
        finally:
            os.write(w, result)
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data


def test_other_users_are_refused(daemon: Daemon) -> None:
    """Mode 0600 keeps others out; if the mode is loosened the daemon still refuses them itself."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to another uid")
    assert stat.S_IMODE(os.stat(daemon.socket_path).st_mode) == 0o600
    open_dir = tempfile.mkdtemp(prefix="pycni-perm-")
    moved = os.path.join(open_dir, "own.sock")
    frame = protocol.encode_request("loopback", b"", {b"CNI_COMMAND": b"VERSION"})
    try:
        os.chmod(open_dir, 0o755)
        os.rename(daemon.socket_path, moved)
        # the socket as created: another uid cannot even connect
        assert _as_nobody(moved, frame) == b"EACCES"
        # mode loosened by mistake: the daemon checks the peer's uid and refuses anyway
        os.chmod(moved, 0o666)
        reply = _as_nobody(moved, frame)
        assert reply[4:10] == protocol.MAGIC, reply
        code, out, _ = protocol.decode_reply(reply[4:])
        assert code == 1 and json.loads(out)["msg"] == "permission denied"
        # root still gets through
        assert request(moved, "loopback", {"CNI_COMMAND": "VERSION"})[0] == 0
    finally:
        if os.path.exists(moved):
            os.rename(moved, daemon.socket_path)
        os.rmdir(open_dir)


# ---- the shim without a daemon -----------------------------------------------------------------

@pytest.mark.parametrize("state", ["missing", "stale"])
def test_shim_runs_in_process_without_a_daemon(state: str, tmp_path: Path,
                                               netns_factory: Callable[[], Namespace]) -> None:
    exe = install(str(tmp_path / "bin"), ["host-local"], daemon=True)[0]
    sock = tmp_path / "nobody-home.sock"
    if state == "stale":  # a socket file left behind by a dead daemon: connect is refused
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(sock))
        s.close()
    host, ctr = netns_factory(), netns_factory()
    conf = {"cniVersion": "1.0.0", "name": "nodaemon", "type": "bridge",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.79.0.0/24"}]], "dataDir": str(tmp_path / "ipam")}}
    shim: dict[str, Any] = {"via": "exec", "host": host, "cni_path": os.path.dirname(exe), "container_id": "nd1",
                            "netns": ctr, "PYCNI_SOCKET": str(sock)}
    assert plugin_util.ok(plugin_util.run("host-local", "ADD", conf, **shim))["ips"][0]["address"] == "10.79.0.2/24"
    plugin_util.ok(plugin_util.run("host-local", "DEL", conf, **shim))
