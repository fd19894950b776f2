"""Running a plugin the way a runtime does, for tests: env + stdin, inside a host namespace."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from netns_util import Namespace

from pycni.skel import Outcome, Plugin, dispatch


def cni_env(command: str, container: Namespace | None, cni_path: str, ifname: str = "eth0",
            container_id: str = "ctr", args: str = "") -> dict[str, str]:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname, "CNI_PATH": cni_path,
           "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "PYCNI_SOCKET": "off"}
    if container is not None:
        env["CNI_NETNS"] = container.path
    if args:
        env["CNI_ARGS"] = args
    return env


def runtime_env(command: str, container_id: str, netns: str = "", ifname: str = "eth0",
                path: str = "/usr/lib/cni") -> dict[str, str]:
    """The environment a runtime gives a plugin it executes (CNI_PATH: the Go plugins by default)."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname, "CNI_PATH": path,
           "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    if netns:
        env["CNI_NETNS"] = netns
    return env


def call(plugin: Plugin, host: Namespace, command: str, conf: dict[str, Any], container: Namespace | None,
         cni_path: str, **kw: Any) -> Outcome:
    """Dispatch ``plugin`` in-process with the calling thread inside ``host``."""
    with host.enter():
        return dispatch(plugin, cni_env(command, container, cni_path, **kw), json.dumps(conf).encode())


def ok(outcome: Outcome) -> dict[str, Any]:
    """The JSON result of a successful invocation (an AssertionError with the error otherwise)."""
    assert outcome.exit_code == 0, outcome.stdout.decode() + outcome.stderr.decode()
    return json.loads(outcome.stdout) if outcome.stdout else {}


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
