"""The node agent's probes (``pycni node --metrics-address``: /livez and /readyz beside /metrics),
what the DaemonSet's liveness probe asks: an agent that is retrying an unreachable etcd is alive
(restarting it would not bring etcd back) but not ready; it is ready again once etcd answers.

Real etcd (one member) and a real agent, in a throwaway node namespace (prefix ph38).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from etcd_util import EtcdCluster, etcd_available, spawn_agent, stop_agent
from prom_util import http

from pycni.metrics import _app

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")

PORT = 9471


def _until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.2)


def test_probes_follow_etcd_and_the_loop(tmp_path: Path) -> None:
    with EtcdCluster(size=1, subnet="10.231.138.0/24", prefix="ph38") as etcd:
        node = etcd.nodes[0]
        log = tmp_path / "agent.log"
        agent = spawn_agent(node.ns.name, log, [
            "--etcd-endpoints", ",".join(etcd.endpoints), "--etcd-prefix", "/ph38", "--node-name", "n1",
            "--underlay-ip", node.ip, "--ttl", "10", "--flows-socket", "", "--metrics-address", f"{node.ip}:{PORT}"])
        base = f"http://{node.ip}:{PORT}"

        def probe(path: str) -> tuple[int, str]:
            try:
                return http(node.ns, base + path)
            except OSError:  # (not listening yet)
                return 0, ""

        try:
            _until(lambda: probe("/readyz")[0] == 200, "the agent ready")
            assert probe("/livez") == (200, "ok\n")
            assert http(node.ns, base + "/readyz", "HEAD")[0] == 200
            assert http(node.ns, base + "/readyz", "POST")[0] == 405
            etcd.kill(0)
            _until(lambda: probe("/readyz")[0] == 503, "not ready while etcd is down")
            status, why = probe("/readyz")
            assert status == 503 and ("etcd" in why), why
            assert probe("/livez")[0] == 200  # alive: it is retrying, as it should
            etcd.restart(0)
            _until(lambda: probe("/readyz")[0] == 200, "ready again once etcd answers")
            assert agent.poll() is None, log.read_text()
        finally:
            stop_agent(agent)


class _Probes:
    def __init__(self, live: str, ready: str) -> None:
        self._live, self._ready = live, ready

    def live(self) -> str:
        return self._live

    def ready(self) -> str:
        return self._ready


def _get(app: Callable[..., object], path: str, method: str = "GET") -> tuple[str, bytes]:
    said: list[str] = []
    body = app({"PATH_INFO": path, "REQUEST_METHOD": method}, lambda status, headers: said.append(status))
    return said[0], b"".join(body)  # type: ignore[call-overload]


def test_probe_paths_exist_only_for_a_component_that_has_them() -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    assert _get(_app(reg), "/livez")[0].startswith("404")
    assert _get(_app(reg), "/readyz")[0].startswith("404")
    app = _app(reg, _Probes("", "not following etcd: cannot reach etcd"))
    assert _get(app, "/livez") == ("200 OK", b"ok\n")
    assert _get(app, "/readyz") == ("503 Service Unavailable", b"not following etcd: cannot reach etcd\n")
    assert _get(app, "/readyz", "HEAD") == ("503 Service Unavailable", b"")
    assert _get(app, "/livez", "DELETE")[0].startswith("405")
    assert _get(app, "/metrics")[0].startswith("200")
    assert _get(app, "/healthz")[0].startswith("404")
