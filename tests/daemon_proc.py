"""`pycni daemon` processes for tests: started on sockets in temporary directories, always killed.

Each daemon runs in a session (process group) of its own so a test can kill it and its workers
together, and :func:`reap` finds every process it made even after the main one died.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from pycni.daemon import protocol
from pycni.daemon.server import missing_capabilities

WAIT = 30.0  # upper bound for what should happen promptly (never a pass/fail on speed)

# A daemon process refuses to start without these (tests that run one need root).
needs_privileges = pytest.mark.skipif(bool(missing_capabilities()),
                                      reason=f"a pycni daemon needs {', '.join(missing_capabilities())}")


def request(sock_path: str, plugin: str, env: dict[str, str], stdin: bytes = b"",
            timeout: float | None = WAIT) -> tuple[int, bytes, bytes]:
    """One request as a shim sends it; the decoded reply."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(protocol.encode_request(plugin, stdin, {k.encode(): v.encode() for k, v in env.items()}))
        return protocol.decode_reply(protocol.recv_frame(s))
    finally:
        s.close()


def answers(sock_path: str) -> bool:
    """Whether a daemon on ``sock_path`` answers a VERSION request."""
    try:
        return request(sock_path, "loopback", {"CNI_COMMAND": "VERSION"}, timeout=5)[0] == 0
    except (OSError, ValueError):
        return False


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None and fields[1] == str(pid) and fields[0] not in ("Z", "X"):
                out.append(int(name))
    return out


def running_with(arg: str) -> list[int]:
    """Live processes with ``arg`` in their command line (a daemon's socket path names its processes)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if arg.encode() not in f.read().split(b"\0"):
                        continue
            except OSError:
                continue
            if alive(int(name)):
                out.append(int(name))
    return out


def wait_until(cond: object, what: str, timeout: float = WAIT) -> None:
    """Poll ``cond()`` every 20 ms until true; AssertionError naming ``what`` after ``timeout``."""
    for _ in range(int(timeout * 50)):
        if cond():  # type: ignore[operator]
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class DaemonProc:
    """A ``python -m pycni.daemon`` process on ``sock`` (log in ``log``), in its own session."""

    def __init__(self, sock: str, log: Path, *extra: str, prefix: Sequence[str] = (),
                 env: dict[str, str] | None = None, preload: bool = False, pass_fds: Sequence[int] = ()) -> None:
        self.sock, self.log = sock, log
        cmd = [*prefix, sys.executable, "-m", "pycni.daemon", "--socket", sock, "--log-file", str(log), *extra]
        if not preload:
            cmd.append("--no-preload")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                     env=env, pass_fds=pass_fds)
        self.pid = self.proc.pid
        self.workers: list[int] = []

    def ready(self, workers: int = 0) -> DaemonProc:
        """Wait until it answers (and, with workers, until they all run); fail if it exits first."""
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.stderr()}")
            return answers(self.sock) and len(children_of(self.pid)) >= workers

        wait_until(up, f"daemon on {self.sock}")
        self.workers = children_of(self.pid)
        return self

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode()

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout)

    def terminate(self, timeout: float = WAIT) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def reap(self) -> None:
        """Kill everything this daemon started: its session while the main pid is still ours, then
        any worker seen that still runs this daemon (checked by its command line: pids get reused)."""
        if self.proc.returncode is None:  # not reaped yet: the pid (= the session's id) cannot be reused
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for pid in self.workers:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    ours = self.sock.encode() in f.read()
            except OSError:
                continue
            if ours and alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
