"""Prometheus metrics for pycni's long-running processes (``--metrics-address HOST:PORT``).

One way for every component (``pycni daemon``, ``pycni node``, ``pycni kube-controllers``):
:func:`parse_address` reads the flag, :func:`serve` answers ``GET /metrics`` (and ``HEAD``) in
Prometheus' text format from a registry of :mod:`prometheus_client`, the maintained client
library — and, for a component that has them (the node agent: :class:`Health`), its
``/livez`` and ``/readyz`` probes, 200 or 503 with the reason — and nothing else: any other
path is 404, any other method 405, so the endpoint serves no more than it should and accepts
no write. Off unless the flag is given; an address without
a host listens on loopback only.

``prometheus_client`` costs ~50 ms of imports, so it is imported here, and this module only
where the flag is given: never on a plugin's start path.

Processes that fork workers (the daemon) count in every worker: :func:`multiprocess_dir`
prepares prometheus_client's multi-process mode, in which each process writes its samples to
memory-mapped files in one directory and the serving process sums them.
"""

from __future__ import annotations

import os
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, Protocol
    from wsgiref.simple_server import WSGIServer

    class Health(Protocol):
        """A component's own answers to its probes (Kubernetes' /livez and /readyz convention):
        each returns '' when well, else why not (one line, the 503's body)."""

        def live(self) -> str: ...

        def ready(self) -> str: ...

METRICS_PATH = "/metrics"
LOOPBACK = "127.0.0.1"
# Seconds: a plugin call or a kernel programming step (1 ms) to a slow etcd round (10 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AddressError(ValueError):
    """A --metrics-address that is not PORT, :PORT, HOST:PORT or [IPv6]:PORT."""


def parse_address(text: str) -> tuple[str, int]:
    """``(host, port)`` of a ``--metrics-address``: ``9091`` and ``:9091`` mean loopback,
    ``0.0.0.0:9091`` every IPv4 address, ``[::1]:9091`` an IPv6 one."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise AddressError(f"invalid metrics address {text!r}: give PORT, :PORT, HOST:PORT or [IPv6]:PORT "
                           "(e.g. 127.0.0.1:9091)")
    return host or LOOPBACK, int(port)


def argument_type(text: str) -> tuple[str, int]:
    """:func:`parse_address` as an argparse ``type`` (a usage error names the flag)."""
    import argparse

    try:
        return parse_address(text)
    except AddressError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_argument(parser: Any) -> None:
    """``--metrics-address HOST:PORT`` on a long-running verb."""
    parser.add_argument("--metrics-address", type=argument_type, default=None, metavar="HOST:PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default; a bare "
                             "PORT or :PORT listens on 127.0.0.1 only); see docs/metrics.md")


def multiprocess_dir(path: str) -> None:
    """Use ``path`` (made empty, mode 0700) for prometheus_client's multi-process mode. Must run
    before prometheus_client is first imported in this process, and before any fork."""
    import shutil

    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path, mode=0o700)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path


def registry(multiprocess: bool = False) -> Any:
    """The registry to serve: the library's global one (with its process and platform
    collectors), or a fresh one summing every process's files in multi-process mode."""
    import prometheus_client

    if not multiprocess:
        return prometheus_client.REGISTRY
    from prometheus_client import multiprocess as mp

    reg = prometheus_client.CollectorRegistry()
    mp.MultiProcessCollector(reg)
    prometheus_client.ProcessCollector(registry=reg)  # the serving process's own CPU and memory
    return reg


LIVE_PATH, READY_PATH = "/livez", "/readyz"


def _app(reg: Any, health: Health | None = None) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: GET/HEAD of /metrics, and of /livez and /readyz when ``health`` is given."""
    from prometheus_client import make_wsgi_app

    metrics = make_wsgi_app(reg)
    probes: dict[str, Callable[[], str]] = {} if health is None else {LIVE_PATH: health.live,
                                                                        READY_PATH: health.ready}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path != METRICS_PATH and path not in probes:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: metrics are at /metrics\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"),
                                                      ("Content-Type", "text/plain; charset=utf-8")])
            return [f"method not allowed: {path} is read-only\n".encode()]
        if path in probes:
            why = probes[path]()
            start_response("503 Service Unavailable" if why else "200 OK",
                           [("Content-Type", "text/plain; charset=utf-8")])
            body = f"{why}\n".encode() if why else b"ok\n"
            return [] if environ["REQUEST_METHOD"] == "HEAD" else [body]
        if environ["REQUEST_METHOD"] == "HEAD":  # the library answers GET only: the same, without a body
            b"".join(metrics({**environ, "REQUEST_METHOD": "GET"}, start_response))
            return []
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return app


def serve(address: tuple[str, int], reg: Any, health: Health | None = None) -> WSGIServer:
    """Serve ``reg`` at http://HOST:PORT/metrics (and ``health`` at /livez and /readyz) from a
    daemon thread; the server is returned so the caller can ``shutdown()`` it. Raises OSError
    when the address cannot be bound."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    host, port = address

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

    server = make_server(host, port, _app(reg, health), Server, Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
