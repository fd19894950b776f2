"""Running a plugin the way a runtime does, for tests: env + stdin, inside a host namespace.

The one harness: :func:`env` builds the environment a runtime gives a plugin, :func:`run` drives a
plugin by its CNI type ``via`` one of :data:`VIAS` — ``"dispatch"`` (skel.dispatch in this process,
the calling thread in the host namespace), ``"exec"`` (the installed executable, in the host
namespace, as a runtime runs it) or ``"runtime"`` (pycni.runtime's ADD/CHECK/DEL of a one-plugin
network, which execs the executable and keeps its result cache in ``cache_dir``) — and returns the
same :class:`pycni.skel.Outcome` every way, so a test parametrized with :data:`each_way` checks
all of them. The session-wide ``plugin_dir`` fixture
(conftest.py) holds the installed executables.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
from netns_util import Namespace

from pycni.skel import Outcome, Plugin, dispatch

VIAS = ("dispatch", "exec", "runtime")
each_way = pytest.mark.parametrize("via", VIAS)
# GC and STATUS: a runtime runs them over a whole network list, never one plugin's config alone
each_plugin_way = pytest.mark.parametrize("via", VIAS[:2])
_PATH = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")


def env(command: str, container_id: str | None = None, netns: Namespace | str | None = None,
        ifname: str | None = None, cni_path: str = "/usr/lib/cni", args: str = "", **extra: str) -> dict[str, str]:
    """The environment a runtime gives a plugin (``netns`` a Namespace or a path; none for GC/STATUS).

    ``container_id`` and ``ifname`` default to "ctr" and "eth0" for a per-container command and
    are left out of GC, STATUS and VERSION (which concern no container) unless given.
    ``PYCNI_SOCKET=off``: an executable of ours runs the plugin itself, never a daemon the
    machine may be running.
    """
    e = {"CNI_COMMAND": command, "CNI_PATH": cni_path, "PATH": _PATH, "PYCNI_SOCKET": "off"}
    per_container = command not in ("GC", "STATUS", "VERSION")
    if container_id is not None or per_container:
        e["CNI_CONTAINERID"] = "ctr" if container_id is None else container_id
    if ifname is not None or per_container:
        e["CNI_IFNAME"] = "eth0" if ifname is None else ifname
    if netns:
        e["CNI_NETNS"] = netns.path if isinstance(netns, Namespace) else netns
    if args:
        e["CNI_ARGS"] = args
    e.update(extra)
    return e


def run(plugin_type: str | Plugin, command: str, conf: dict[str, Any] | bytes, *, via: str = "dispatch",
        host: Namespace | None = None, cni_path: str = "/usr/lib/cni", environ: dict[str, str] | None = None,
        cache_dir: str = "", **env_kw: Any) -> Outcome:
    """Run ``plugin_type`` once ``via`` "dispatch", "exec" (the executable in the first CNI_PATH entry)
    or "runtime" (ADD, CHECK or DEL only; ``cache_dir`` required: the runtime's result cache).

    ``environ`` replaces the environment :func:`env` would build from ``command`` and ``env_kw``.
    A :class:`Plugin` object instead of a type (a test's own plugin, not in the registry) runs
    by dispatch only.
    """
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    e = environ if environ is not None else env(command, cni_path=cni_path, **env_kw)
    if isinstance(plugin_type, Plugin):
        assert via == "dispatch", "a Plugin object runs by dispatch only"
    if via == "dispatch":
        from pycni.plugins.registry import load

        plugin = plugin_type if isinstance(plugin_type, Plugin) else load(plugin_type)
        with host.enter() if host is not None else nullcontext():
            return dispatch(plugin, e, stdin)
    if via == "exec":
        exe = os.path.join(e["CNI_PATH"].split(":")[0], plugin_type)
        cmd = ["ip", "netns", "exec", host.name, exe] if host is not None else [exe]
        proc = subprocess.run(cmd, input=stdin, env=e, capture_output=True, timeout=120)
        return Outcome(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
    if via == "runtime":
        return _via_runtime(command, stdin, e, host, cache_dir)
    raise ValueError(f"via must be one of {VIAS}, not {via!r}")


def _via_runtime(command: str, stdin: bytes, e: dict[str, str], host: Namespace | None, cache_dir: str) -> Outcome:
    from pycni.runtime import CNI
    from pycni.runtime.conf import conf_from_bytes
    from pycni.spec.errors import CNIError

    assert cache_dir, "via='runtime' needs a cache_dir"
    rt = CNI(conf_dir=os.path.join(cache_dir, "no-conf-dir"), plugin_path=e["CNI_PATH"].split(":"),
             cache_dir=cache_dir, env={"PATH": _PATH, "PYCNI_SOCKET": "off"})
    op = {"ADD": rt.add, "CHECK": rt.check, "DEL": rt.delete}[command]
    with host.enter() if host is not None else nullcontext():
        try:
            result = op(conf_from_bytes(stdin), e["CNI_CONTAINERID"], e.get("CNI_NETNS", ""), e["CNI_IFNAME"],
                        args=e.get("CNI_ARGS") or None)
        except CNIError as err:
            return Outcome(exit_code=1, stdout=err.to_json().encode())
    return Outcome(exit_code=0, stdout=result.to_json().encode() if result is not None else b"")


def ok(outcome: Outcome) -> dict[str, Any]:
    """The JSON result of a successful invocation (an AssertionError with the error otherwise)."""
    assert outcome.exit_code == 0, outcome.stdout.decode() + outcome.stderr.decode()
    return json.loads(outcome.stdout) if outcome.stdout else {}


def answer(outcome: Outcome) -> tuple[int, Any]:
    """The exit code and the decoded JSON the plugin wrote ({} when it wrote nothing), for tests that
    compare both — ours with the Go reference's, or a refusal's code."""
    return outcome.exit_code, json.loads(outcome.stdout) if outcome.stdout.strip() else {}


def err(outcome: Outcome) -> dict[str, Any]:
    assert outcome.exit_code != 0, f"expected failure, got {outcome.stdout.decode()}"
    return json.loads(outcome.stdout)


@contextmanager
def daemon_in_thread(socket_path: str) -> Iterator[Any]:
    """A pycni Daemon serving ``socket_path`` from a thread of this process, stopped afterwards."""
    from pycni.daemon.server import Daemon

    daemon = Daemon(socket_path, preload=False)
    daemon.bind()
    thread = threading.Thread(target=daemon.serve_forever, daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(timeout=30)
