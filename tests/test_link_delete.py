"""link.delete_link returns once the link has left its namespace; the kernel's teardown after
that (an RCU barrier) is carried by a helper — a forked child in a single-threaded process, a
thread where there are others (the daemon). Both paths: the link and a veth's peer are gone
when it returns, the name is free again, and the kernel's refusal is still the caller's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest
from netns_util import Namespace

from pycni.net import link, tools
from pycni.spec.errors import CNIError

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

# Run in a fresh single-threaded interpreter: the forked-child path (a one-shot plugin's).
_ONE_SHOT = """
import os, sys
sys.path.insert(0, {src!r})
from pycni.net import link, netns
with netns.enter({path!r}):
    assert len(os.listdir("/proc/self/task")) == 1
    assert link.delete_link("ld-a") is True
    assert link.delete_link("ld-a") is False   # idempotent
    try:
        link.delete_link("lo")
    except Exception as e:
        print("refused:", type(e).__name__, e)
    else:
        print("lo deleted?!")
"""


def _links(ns: Namespace) -> set[str]:
    return {line.split(":")[1].strip().split("@")[0] for line in ns.run(["ip", "-o", "link"]).stdout.splitlines()}


def test_one_shot_path_forked_child(netns_factory: Callable[[], Namespace]) -> None:
    ctr, host = netns_factory(), netns_factory()
    ctr.run(["ip", "link", "add", "ld-a", "type", "veth", "peer", "name", "ld-b", "netns", host.name])
    out = subprocess.run([sys.executable, "-c", _ONE_SHOT.format(src=SRC, path=ctr.path)],
                         capture_output=True, text=True, check=True).stdout
    assert "refused: CNIError" in out, out  # the kernel's refusal (lo cannot be deleted), as before
    assert "ld-a" not in _links(ctr) and "ld-b" not in _links(host)  # the peer went with it
    ctr.run(["ip", "link", "add", "ld-a", "type", "veth", "peer", "name", "ld-b"])  # the names are free


def test_daemon_path_thread(netns_factory: Callable[[], Namespace]) -> None:
    ctr, host = netns_factory(), netns_factory()
    ctr.run(["ip", "link", "add", "ld-c", "type", "veth", "peer", "name", "ld-d", "netns", host.name])
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # a second thread, as in the daemon: no fork
    other.start()
    try:
        children = set(tools._unwaited)
        with ctr.enter():
            assert link.delete_link("ld-c") is True
            assert link.delete_link("ld-c") is False
            with pytest.raises(CNIError) as e:
                link.delete_link("lo")
        assert "failed to delete link 'lo'" in e.value.msg
        assert set(tools._unwaited) <= children  # no child was forked
    finally:
        stop.set()
        other.join()
    assert "ld-c" not in _links(ctr) and "ld-d" not in _links(host)
