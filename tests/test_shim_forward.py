"""The shim's answer when the daemon drops a request it had accepted: the spec's error JSON, code 11."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

from pycni import shim


def test_forward_failure_is_error_json(tmp_path: Path) -> None:
    path = str(tmp_path / "ar.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def drop_after_accept() -> None:
        conn, _ = srv.accept()
        conn.recv(1 << 16)
        conn.close()  # no reply: the request may have been served, so the shim must not retry

    t = threading.Thread(target=drop_after_accept)
    t.start()
    try:
        answer = shim._forward(path, "bridge", b'{"quote": "\\"", "backslash": "\\\\"}')
    finally:
        t.join()
        srv.close()
    assert answer is not None
    code, out, err = answer
    assert code == 1 and err == b""
    doc = json.loads(out)
    assert doc["code"] == 11
    assert doc["msg"] == "pycni daemon failed while serving the request"
    assert "PYCNI_SOCKET=off" in doc["details"]


def test_no_listener_runs_here(tmp_path: Path) -> None:
    assert shim._forward(str(tmp_path / "ar-none.sock"), "bridge", b"{}") is None
