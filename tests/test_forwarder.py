"""The native forwarder: a daemon-served call starts no Python, and answers as the Python shim does.

Executables installed with ``daemon=True`` run ``.pycni-forward`` (built from
src/pycni/forward.c when a compiler is at hand) where they would run Python; with
``forwarder=False`` they are the Python shim alone. Both must give the same bytes and exit
code for every case, served by a daemon or not.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import daemon_in_thread, run

from pycni import forwarder
from pycni.install_plugins import install

pytestmark = pytest.mark.skipif(forwarder.compiler() is None, reason="no C compiler: the forwarder is not built")


def _conf(tmp_path: Path, name: str = "fwd") -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": name, "ipam": {
        "type": "host-local", "subnet": "10.68.0.0/24", "dataDir": str(tmp_path / "ipam")}}).encode()


def _run(ns: Namespace, exe: str, stdin: bytes, sock: str, **extra: str) -> tuple[int, bytes, bytes]:
    """An ADD by ``exe`` (host-local, its directory CNI_PATH) in ``ns`` with PYCNI_SOCKET ``sock``;
    ``extra`` overrides variables (CNI_COMMAND too)."""
    assert os.path.basename(exe) == "host-local"
    out = run("host-local", "ADD", stdin, via="exec", host=ns, cni_path=os.path.dirname(exe), container_id="f1",
              netns="/nonexistent", PYCNI_SOCKET=sock, **extra)
    return out.exit_code, out.stdout, out.stderr


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, str]:
    """host-local through the forwarder ("native") and through the Python shim alone ("python")."""
    native, python = str(tmp_path / "native"), str(tmp_path / "python")
    install(native, ["host-local"], daemon=True)
    install(python, ["host-local"], daemon=True, forwarder=False)
    assert os.access(os.path.join(native, forwarder.NAME), os.X_OK)
    assert forwarder.NAME in Path(native, "host-local").read_text()
    assert not os.path.exists(os.path.join(python, forwarder.NAME))
    return {"native": os.path.join(native, "host-local"), "python": os.path.join(python, "host-local")}


def test_served_calls_answer_as_the_python_shim(bins: dict[str, str], tmp_path: Path,
                                                netns_factory: Callable[[], Namespace]) -> None:
    host = netns_factory()
    sock = str(tmp_path / "d.sock")
    with daemon_in_thread(sock):
        conf = b"CONF"  # each kind's own config (its own dataDir), so both get the same address
        cases: list[tuple[bytes, dict[str, Any]]] = [
            (conf, {}), (conf, {"CNI_COMMAND": "CHECK"}), (b"{", {}), (conf, {"CNI_IFNAME": ""}),
            (conf, {"CNI_COMMAND": "DEL"}), (b"", {"CNI_COMMAND": "NOPE"}), (conf + b"\0\xff", {})]
        for stdin, extra in cases:
            answers = {}
            for kind, exe in bins.items():
                data = stdin.replace(conf, _conf(tmp_path / kind))
                answers[kind] = _run(host, exe, data, sock, **extra)
            assert answers["native"] == answers["python"], (stdin, extra)
            if stdin == conf and extra.get("CNI_COMMAND", "ADD") in ("ADD", "DEL") and "CNI_IFNAME" not in extra:
                assert answers["native"][0] == 0, answers["native"]
            elif stdin != conf:
                assert answers["native"][0] == 1 and json.loads(answers["native"][1])["code"]


def test_served_call_starts_no_python(tmp_path: Path, netns_factory: Callable[[], Namespace]) -> None:
    marker = tmp_path / "python-started"
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 3\n")
    fake.chmod(0o755)
    (exe,) = install(str(tmp_path / "bin"), ["host-local"], python=str(fake), daemon=True,
                     check_python=False)  # a stand-in that proves no Python starts
    host, sock = netns_factory(), str(tmp_path / "d.sock")
    with daemon_in_thread(sock):
        code, out, _ = _run(host, exe, _conf(tmp_path), sock)
        assert code == 0 and json.loads(out)["ips"][0]["address"] == "10.68.0.2/24"
        assert not marker.exists()
    # No daemon, PYCNI_SOCKET=off, arguments: the Python command line runs, as the shim would.
    for socket_setting in (sock, "off"):
        assert _run(host, exe, _conf(tmp_path), socket_setting)[0] == 3
    lines = marker.read_text().splitlines()
    assert len(lines) == 2 and all(line == f"-IS {exe}" for line in lines)


def test_without_a_daemon_the_plugin_runs_in_python(bins: dict[str, str], tmp_path: Path,
                                                    netns_factory: Callable[[], Namespace]) -> None:
    host = netns_factory()
    missing = str(tmp_path / "nobody.sock")
    code, out, err = _run(host, bins["native"], _conf(tmp_path), missing)
    assert code == 0, err
    assert json.loads(out)["ips"][0]["address"] == "10.68.0.2/24"


def test_a_daemon_that_fails_mid_request_is_error_11(bins: dict[str, str], tmp_path: Path,
                                                     netns_factory: Callable[[], Namespace]) -> None:
    """Read the request, then hang up: not retried (it may have run), reported as the shim does."""
    sock_path = str(tmp_path / "rude.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(4)

    def rude() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            conn.recv(65536)
            conn.close()

    t = threading.Thread(target=rude, daemon=True)
    t.start()
    host = netns_factory()
    answers = [_run(host, bins[k], _conf(tmp_path), sock_path)
               for k in ("native", "python")]
    t.join(10)
    srv.close()
    for code, out, _ in answers:
        err = json.loads(out)
        assert code == 1 and err["code"] == 11 and err["msg"] == "pycni daemon failed while serving the request"
        assert "PYCNI_SOCKET=off" in err["details"]


def test_daemon_gone_mid_request_is_error_json(bins: dict[str, str], tmp_path: Path) -> None:
    """A daemon that accepts and closes before reading a large request (killed mid-call): the
    forwarder answers the spec's error JSON, code 11, as the Python shim does — it is not killed
    by SIGPIPE with nothing printed."""
    path = str(tmp_path / "gone.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def close_at_once() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            conn.close()

    t = threading.Thread(target=close_at_once)
    t.start()
    try:
        big = json.dumps({"cniVersion": "1.0.0", "name": "gone", "pad": "x" * (4 << 20)}).encode()
        answers = {kind: run("host-local", "ADD", big, via="exec", cni_path=os.path.dirname(exe), container_id="f1",
                             netns="/nonexistent", PYCNI_SOCKET=path) for kind, exe in bins.items()}
    finally:
        t.join(30)
        srv.close()
    for kind, proc in answers.items():
        assert proc.exit_code == 1, (kind, proc.exit_code, proc.stderr)
        doc = json.loads(proc.stdout)
        assert doc["code"] == 11 and doc["msg"] == "pycni daemon failed while serving the request", (kind, doc)


# Run a command in a private mount namespace with a tmpfs over "$0": the directory of the
# interpreter baked in at install is empty there, as on a node whose host has no such Python.
_NO_PYTHON = 'mount -t tmpfs pn32-nopy "$0" && exec "$@"'


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a private mount namespace)")
def test_a_host_without_the_interpreter_is_served_by_the_daemon(tmp_path: Path,
                                                                netns_factory: Callable[[], Namespace]) -> None:
    """Executables with the forwarder on a host whose baked interpreter is gone (a Kubernetes node
    without python3; the daemon runs in its container): the daemon serves ADD and DEL; with the
    daemon down the answer is one CNI error, code 11, naming its socket and the interpreter;
    VERSION is answered by sh either way."""
    from plugin_util import env

    pydir = tmp_path / "hostpy"
    pydir.mkdir()
    python = pydir / "python3"
    python.symlink_to(sys.executable)
    sock = str(tmp_path / "d.sock")
    (exe,) = install(str(tmp_path / "bin"), ["host-local"], python=str(python), daemon=True, socket=sock)
    assert os.access(os.path.join(tmp_path, "bin", forwarder.NAME), os.X_OK)
    host = netns_factory()

    def call(command: str, stdin: bytes) -> tuple[int, bytes, bytes]:
        e = env(command, "nopy1", "/nonexistent", cni_path=str(tmp_path / "bin"))
        del e["PYCNI_SOCKET"]  # as kubelet calls it: the socket baked in at install
        if command == "VERSION":
            e = {k: v for k, v in e.items() if k in ("CNI_COMMAND", "CNI_PATH", "PATH")}
        proc = subprocess.run(["ip", "netns", "exec", host.name, "unshare", "--mount", "--propagation", "private",
                               "sh", "-c", _NO_PYTHON, str(pydir), exe], input=stdin, env=e, capture_output=True,
                              timeout=60)
        return proc.returncode, proc.stdout, proc.stderr

    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _NO_PYTHON, str(pydir),
                            "test", "-e", str(python)], capture_output=True, timeout=30)
    assert probe.returncode == 1, probe  # the interpreter is not there for the calls below
    conf = _conf(tmp_path)

    def version_works() -> None:
        code, out, err = call("VERSION", b'{"cniVersion":"1.0.0"}')
        assert code == 0 and json.loads(out)["cniVersion"] == "1.0.0", (out, err)
        assert "1.1.0" in json.loads(out)["supportedVersions"]

    def try_again(command: str) -> None:
        code, out, err = call(command, conf)
        assert code == 1 and err == b"", (out, err)
        doc = json.loads(out)  # one CNI error, nothing else on stdout
        assert doc["code"] == 11, doc
        assert sock in doc["msg"] and str(python) in doc["msg"] and "daemon" in doc["msg"], doc
        assert "try again" in doc["details"], doc

    version_works()
    try_again("ADD")  # no socket at all
    with daemon_in_thread(sock):
        code, out, err = call("ADD", conf)
        assert code == 0, (out, err)
        assert json.loads(out)["ips"][0]["address"] == "10.68.0.2/24"
        version_works()
        code, out, err = call("DEL", conf)
        assert (code, out) == (0, b""), err
    assert not (tmp_path / "ipam" / "fwd" / "10.68.0.2").exists()  # the DEL released it
    try_again("DEL")  # the daemon gone
    version_works()
    # with the interpreter there (outside the private mount), the same executable runs one-shot
    code, out, err = _run(host, exe, conf, sock)
    assert code == 0 and json.loads(out)["ips"][0]["address"].startswith("10.68.0."), err
