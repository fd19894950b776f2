"""Prometheus metrics: ``pycni daemon --metrics-address``, scraped by a real Prometheus server.

Everything listens inside a throwaway network namespace (its own loopback): the daemon's
metrics endpoint and Debian's ``prometheus``, which scrapes it every second; the test asks
Prometheus' query API, so what is checked is what an operator's dashboard would show.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import DaemonProc, needs_privileges, request
from netns_util import Namespace, new_namespace
from plugin_util import env
from prom_util import Prometheus, http, query, wait_value

from pycni.metrics import AddressError, parse_address

PREFIX = "pm36"
METRICS_PORT = 9464
NO_NETNS = "/var/run/netns/none"  # static IPAM never enters it
STATIC_CONF = {"cniVersion": "1.0.0", "name": "m", "type": "static",
               "ipam": {"type": "static", "addresses": [{"address": "10.9.0.5/24"}]}}


@pytest.mark.parametrize(("text", "want"), [
    ("9091", ("127.0.0.1", 9091)), (":9091", ("127.0.0.1", 9091)), ("0.0.0.0:80", ("0.0.0.0", 80)),
    ("[::1]:9091", ("::1", 9091)), ("10.0.0.1:65535", ("10.0.0.1", 65535))])
def test_address_forms(text: str, want: tuple[str, int]) -> None:
    assert parse_address(text) == want


@pytest.mark.parametrize("text", ["", "host:", "x:99999", "1.2.3.4:0", "abc", ":-1"])
def test_bad_address_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(AddressError, match="PORT, :PORT, HOST:PORT"):
        parse_address(text)


def test_bad_address_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pycni", "daemon", "--socket", str(tmp_path / "s.sock"),
                           "--metrics-address", "x:y"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--metrics-address" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture
def host() -> Iterator[Namespace]:
    ns = new_namespace(PREFIX)
    try:
        ns.run(["ip", "link", "set", "lo", "up"])
        yield ns
    finally:
        ns.delete()


def _call(ns: Namespace, sock: str, conf: dict[str, Any]) -> int:
    """One static ADD through the daemon, asked from inside ``ns`` (the daemon works in the
    caller's namespace; static IPAM changes nothing there)."""
    with ns.enter():
        code, _out, _err = request(sock, "static", env("ADD", netns=NO_NETNS, container_id="c1"),
                                   json.dumps(conf).encode())
    return code


@needs_privileges
@pytest.mark.parametrize("workers", [1, 2])
def test_prometheus_scrapes_the_daemons_plugin_calls(host: Namespace, tmp_path: Path, workers: int) -> None:
    sock = str(tmp_path / "pycni.sock")
    daemon = DaemonProc(sock, tmp_path / "daemon.log", "--workers", str(workers),
                        "--metrics-address", f"127.0.0.1:{METRICS_PORT}", prefix=["ip", "netns", "exec", host.name])
    prom = None
    try:
        daemon.ready(workers=workers if workers > 1 else 0)
        prom = Prometheus(host, tmp_path, [f"127.0.0.1:{METRICS_PORT}"])
        ok = 'sum(pycni_daemon_plugin_calls_total{plugin="static",command="ADD",result="success"})'
        bad = 'sum(pycni_daemon_plugin_calls_total{plugin="static",command="ADD",result="error"})'
        wait_value(host, "up", 1)
        for _ in range(3):
            assert _call(host, sock, STATIC_CONF) == 0
        assert _call(host, sock, {**STATIC_CONF, "ipam": {"type": "static", "addresses": "not a list"}}) != 0
        wait_value(host, ok, 3)
        wait_value(host, bad, 1)
        assert _call(host, sock, STATIC_CONF) == 0
        wait_value(host, ok, 4)  # the query moves with the calls
        wait_value(host, 'sum(pycni_daemon_plugin_call_duration_seconds_count{plugin="static"})', 5)
        wait_value(host, "sum(pycni_daemon_plugin_calls_in_flight)", 0)
        assert (query(host, "max(process_resident_memory_bytes)") or 0) > 0  # the library's process collector
    finally:
        if prom is not None:
            prom.stop()
        daemon.reap()
    assert not Path(sock + ".metrics").exists() or workers == 1 or daemon.proc.returncode != 0


@needs_privileges
def test_metrics_endpoint_serves_metrics_only(host: Namespace, tmp_path: Path) -> None:
    sock = str(tmp_path / "pycni.sock")
    daemon = DaemonProc(sock, tmp_path / "daemon.log", "--workers", "2", "--metrics-address", str(METRICS_PORT),
                        prefix=["ip", "netns", "exec", host.name])
    try:
        daemon.ready(workers=2)
        base = f"http://127.0.0.1:{METRICS_PORT}"
        status, body = http(host, base + "/metrics")
        assert status == 200 and "# TYPE pycni_daemon_plugin_calls_total counter" in body
        assert http(host, base + "/metrics", "HEAD")[0] == 200
        for path in ("/", "/metrics/", "/favicon.ico", "/debug", "/metrics/../etc/passwd"):
            assert http(host, base + path)[0] == 404, path
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert http(host, base + "/metrics", method)[0] == 405, method
        # a bare port listens on loopback only
        local = [line.split()[3] for line in host.run(["ss", "-Hltn", f"sport = :{METRICS_PORT}"]).stdout.splitlines()]
        assert local == [f"127.0.0.1:{METRICS_PORT}"]
        assert daemon.terminate() == 0
        assert not Path(sock + ".metrics").exists()  # the multi-process files go with the daemon
    finally:
        daemon.reap()


@needs_privileges
def test_daemon_refuses_a_metrics_address_in_use(host: Namespace, tmp_path: Path) -> None:
    holder = subprocess.Popen(["ip", "netns", "exec", host.name, "python3", "-c",
                               "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', 9464)); s.listen(); "
                               "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        sock = str(tmp_path / "pycni.sock")
        daemon = DaemonProc(sock, tmp_path / "daemon.log", "--workers", "1", "--metrics-address", str(METRICS_PORT),
                            prefix=["ip", "netns", "exec", host.name])
        try:
            assert daemon.wait() == 1
            err = daemon.stderr()
            assert "cannot serve metrics on 127.0.0.1:9464" in err and "Traceback" not in err
            assert not Path(sock).exists()  # it does not stay half-started
        finally:
            daemon.reap()
    finally:
        holder.kill()
        holder.wait()
