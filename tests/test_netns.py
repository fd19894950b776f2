"""Entering network namespaces per thread, and refusing paths that are not one."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from netns_util import Namespace

from pycni.net import netns
from pycni.spec import errors as E
from pycni.spec.errors import CNIError

SELF = "/proc/thread-self/ns/net"


def links_here() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def test_enter_and_leave(netns_factory: Callable[[], Namespace]) -> None:
    ns = netns_factory()
    before = os.stat(SELF).st_ino
    with ns.enter():
        assert netns.same_netns(SELF, ns.path)
        assert netns.same_netns(netns.current_netns_path(), ns.path)
        # Children inherit the namespace: make a link there and see it from here.
        subprocess.run(["ip", "link", "add", "pt-a0", "type", "veth", "peer", "name", "pt-b0"], check=True)
        assert sorted(links_here()) == ["lo", "pt-a0", "pt-b0"]
    assert os.stat(SELF).st_ino == before
    assert "pt-a0" not in links_here()
    assert "pt-a0" in ns.run(["ip", "-o", "link", "show"]).stdout


def test_leaves_even_when_the_body_fails(netns_factory: Callable[[], Namespace]) -> None:
    ns = netns_factory()
    before = os.stat(SELF).st_ino
    with pytest.raises(ZeroDivisionError), ns.enter():
        assert netns.same_netns(SELF, ns.path)
        _ = 1 / 0
    assert os.stat(SELF).st_ino == before


def test_nested_enter_returns_step_by_step(netns_factory: Callable[[], Namespace]) -> None:
    a, b = netns_factory(), netns_factory()
    before = os.stat(SELF).st_ino
    with a.enter():
        with b.enter():
            assert netns.same_netns(SELF, b.path)
        assert netns.same_netns(SELF, a.path)
    assert os.stat(SELF).st_ino == before


def test_only_the_calling_thread_moves(netns_factory: Callable[[], Namespace]) -> None:
    ns = netns_factory()
    main_ino = os.stat(SELF).st_ino
    inside = threading.Event()
    release = threading.Event()
    seen: dict[str, bool] = {}

    def worker() -> None:
        with ns.enter():
            seen["worker"] = netns.same_netns(SELF, ns.path)
            inside.set()
            release.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    seen["main"] = os.stat(SELF).st_ino == main_ino
    release.set()
    t.join(10)
    assert seen == {"worker": True, "main": True}


def test_check_accepts_namespaces(netns_factory: Callable[[], Namespace]) -> None:
    ns = netns_factory()
    netns.check_netns(ns.path)
    netns.check_netns("/proc/self/ns/net")
    assert netns.netns_exists(ns.path)


@pytest.mark.parametrize(("path", "why"), [
    ("/proc/self/ns/mnt", "mount namespace"),
    ("/proc/self/ns/uts", "uts namespace"),
    ("/proc/self/status", "filesystem"),
    ("/etc/hostname", "filesystem"),
    ("/", "filesystem"),
])
def test_check_refuses_what_is_not_a_network_namespace(path: str, why: str) -> None:
    with pytest.raises(CNIError) as ei:
        netns.check_netns(path)
    assert (ei.value.code, ei.value.msg) == (E.INVALID_ENV, "not a network namespace")
    assert why in ei.value.details and path in ei.value.details
    assert not netns.netns_exists(path)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as ei:
        netns.check_netns(str(tmp_path / "gone"))
    assert (ei.value.code, ei.value.msg) == (E.INVALID_ENV, "network namespace does not exist")


def test_enter_refuses_non_namespaces_without_moving(tmp_path: Path) -> None:
    f = tmp_path / "plain"
    f.write_text("")
    before = os.stat(SELF).st_ino
    for path in (str(f), str(tmp_path / "gone"), "/proc/self/ns/ipc"):
        with pytest.raises(CNIError) as ei, netns.enter(path):
            pytest.fail("body must not run")
        assert ei.value.code == E.INVALID_ENV
    assert os.stat(SELF).st_ino == before


def test_deleted_namespace_is_gone(netns_factory: Callable[[], Namespace]) -> None:
    ns = netns_factory()
    ns.delete()
    assert not netns.netns_exists(ns.path)


def test_same_netns(netns_factory: Callable[[], Namespace]) -> None:
    a, b = netns_factory(), netns_factory()
    assert netns.same_netns(a.path, a.path)
    assert not netns.same_netns(a.path, b.path)
    assert not netns.same_netns(a.path, "/nonexistent/ns")
