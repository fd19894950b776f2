"""One plugin call opens the container's namespace once and one netlink socket per namespace.

pycni.callscope holds them for the length of a call on one thread; these check the reuse, the
way back from nested entries, that another thread never sees a call's resources, and that every
fd is closed when the call ends, also when it fails.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plugin_util
import pytest
from netns_util import Namespace

from pycni import callscope
from pycni.install_plugins import install
from pycni.net import link, netns, nl
from pycni.plugins.registry import load
from pycni.shim import run_delegate
from pycni.skel import dispatch
from pycni.spec.errors import CNIError

SELF = "/proc/thread-self/ns/net"


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_call_opens_each_namespace_once_and_finds_its_way_back(netns_factory: Callable[[], Namespace]) -> None:
    a, b = netns_factory(), netns_factory()
    home = os.stat(SELF).st_ino
    before = _fds()
    with callscope.call():
        scope = callscope.current()
        assert scope is not None
        for _ in range(3):
            with netns.enter(a.path):
                assert netns.same_netns(SELF, a.path)
                with netns.enter(b.path):  # nested: the way back is a, not the thread's own
                    assert netns.same_netns(SELF, b.path)
                assert netns.same_netns(SELF, a.path)
            assert os.stat(SELF).st_ino == home
        netns.check_netns(a.path)
        with netns.opened(a.path) as fd:
            assert fd == scope.netns_fds[a.path]
        assert sorted(scope.netns_fds) == sorted([a.path, b.path])
        assert len(_fds() - before) == 3  # a, b and the thread's own namespace: opened once each
    assert _fds() == before
    assert callscope.current() is None


def test_a_nested_call_joins_the_outer_one_and_errors_still_close(netns_factory: Callable[[], Namespace]) -> None:
    a = netns_factory()
    before = _fds()
    with pytest.raises(RuntimeError), callscope.call():
        outer = callscope.current()
        with callscope.call():  # an in-process delegate's dispatch
            assert callscope.current() is outer
            with netns.enter(a.path):
                raise RuntimeError("handler failed")
    assert _fds() == before
    assert callscope.current() is None


def test_one_netlink_socket_per_namespace_closed_at_the_end(netns_factory: Callable[[], Namespace]) -> None:
    a = netns_factory()
    with callscope.call():
        with link.rtnl() as s1:
            pass
        with link.rtnl() as s2:
            assert s2 is s1 and link.get_link("lo") is not None  # the with left it open
        with netns.enter(a.path), link.rtnl() as s3:
            assert s3 is not s1
            assert [m.name for m in link.list_links()] == ["lo"]  # bound to a, not to the home namespace
    assert s1._sock.fileno() == -1 and s3._sock.fileno() == -1
    with link.rtnl() as s4:  # no call open: a socket of its own, closed by the with
        assert s4 is not s1
    assert s4._sock.fileno() == -1


def test_another_thread_sees_no_call(netns_factory: Callable[[], Namespace]) -> None:
    seen: list[object] = []
    with callscope.call():
        t = threading.Thread(target=lambda: seen.append(callscope.current()))
        t.start()
        t.join()
        assert callscope.current() is not None
    assert seen == [None]


def _open_ns_fds_and_sockets(before: set[int]) -> list[str]:
    """Namespace fds and sockets opened since ``before``, once helper threads are done (≤ 10 s)."""
    import time

    deadline = time.monotonic() + 10
    while True:
        left = []
        for f in _fds() - before:
            try:
                left.append(os.readlink(f"/proc/self/fd/{f}"))
            except OSError:
                pass
        left = [p for p in left if p.startswith(("net:", "socket:"))]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_bridge_add_and_del_open_the_container_namespace_once(
        netns_factory: Callable[[], Namespace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real bridge ADD (host-local in-process) and DEL through skel.dispatch: one open of CNI_NETNS
    and one rtnetlink socket per namespace each, and no namespace fd or socket left open afterwards."""
    host, ctr = netns_factory(), netns_factory()
    opens: list[str] = []
    sockets: list[int] = []
    real_open, real_init = netns.open_netns, nl.IPRoute.__init__

    def counting_open(path: str) -> int:
        opens.append(path)
        return real_open(path)

    caller = threading.get_ident()

    def counting_init(self: nl.IPRoute) -> None:
        # the call's own (a link deletion's helper thread opens one of its own: link.delete_link)
        if threading.get_ident() == caller:
            sockets.append(os.stat(SELF).st_ino)
        real_init(self)

    monkeypatch.setattr(netns, "open_netns", counting_open)
    monkeypatch.setattr(nl.IPRoute, "__init__", counting_init)
    conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": "spcs", "type": "bridge", "bridge": "spcs0",
                            "isGateway": True, "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                                                        "ranges": [[{"subnet": "10.73.0.0/24"}]]}}
    bin_dir = tmp_path / "bin"
    install(str(bin_dir), daemon=False)
    with host.enter():
        before = _fds()
        for command in ("ADD", "DEL"):
            opens.clear()
            sockets.clear()
            env = plugin_util.env(command, "spcs1", ctr, cni_path=str(bin_dir))
            out = dispatch(load("bridge"), env, json.dumps(conf).encode(), runner=run_delegate)
            assert out.exit_code == 0, out.stdout.decode()
            assert opens == [ctr.path], command
            # at most one per namespace (ADD talks to both, DEL may need only the container's)
            assert len(sockets) == len(set(sockets)), command
            assert set(sockets) <= {os.stat(host.path).st_ino, os.stat(ctr.path).st_ino}, command
            assert command == "DEL" or len(sockets) == 2
            # (pycni.net.sysctl keeps /proc/sys/net/<dir> fds across calls, on purpose; a link
            # deletion's helper thread holds its own socket until the kernel's teardown returns)
            assert _open_ns_fds_and_sockets(before) == [], command
    assert "eth0" not in ctr.run(["ip", "-o", "link", "show"]).stdout


def test_a_refused_path_is_not_kept_and_the_thread_stays(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    home = os.stat(SELF).st_ino
    before = _fds()
    with callscope.call():
        scope = callscope.current()
        assert scope is not None
        for path in (str(plain), str(tmp_path / "gone"), "/proc/self/ns/ipc"):
            with pytest.raises(CNIError), netns.enter(path):
                pytest.fail("body must not run")
            assert not netns.netns_exists(path)
        assert scope.netns_fds == {} and scope.stack == []
        assert os.stat(SELF).st_ino == home
    assert _fds() == before
