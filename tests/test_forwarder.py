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
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import daemon_in_thread, run

from pycni import forwarder
from pycni.plugins.registry import install

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
