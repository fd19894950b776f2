"""Shared fixtures: throwaway namespaces and temporary state directories."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

import hostguard
import pytest
from netns_util import NETNS_LOG_ENV, Namespace, have_root, new_namespace

# ---- the hermeticity guard: the machine is the same after the whole run as before ---------------
# Taken once in the process that runs the session (xdist's controller, whose workers inherit
# NETNS_LOG_ENV; or the only process). PYCNI_HOST_GUARD=off skips it (e.g. a debugging loop).
_GUARD = pytest.StashKey[dict[str, object]]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.environ.get("PYCNI_HOST_GUARD") == "off" or not have_root():
        return
    fd, log = tempfile.mkstemp(prefix="pycni-test-netns-", suffix=".log")
    os.close(fd)
    os.environ[NETNS_LOG_ENV] = log
    config.stash[_GUARD] = {"log": log, "before": hostguard.snapshot(), "netns": hostguard.netns_names()}


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers
def pytest_sessionfinish(session: pytest.Session) -> None:
    guard = session.config.stash.get(_GUARD, None)
    if guard is None or "report" in guard:
        return
    log = str(guard["log"])
    with open(log) as f:
        ours = set(f.read().split())
    os.unlink(log)
    report = hostguard.describe(guard["before"], hostguard.snapshot())  # type: ignore[arg-type]
    new = hostguard.netns_names() - guard["netns"]  # type: ignore[operator]
    if new & ours:
        report += ["network namespaces left behind:", *(f"  + {n}" for n in sorted(new & ours))]
    guard["report"] = report
    guard["others"] = sorted(new - ours)
    if report:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    guard = config.stash.get(_GUARD, None)
    if not guard:
        return
    others: list[str] = guard.get("others") or []  # type: ignore[assignment]
    if others:
        shown = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
        terminalreporter.write_line(f"host guard: {len(others)} namespace(s) appeared during the run, not made by "
                                    f"tests/netns_util (another process's?): {shown}")
    if guard.get("report"):
        terminalreporter.section("the machine changed during this test run (tests must be hermetic)", red=True)
        for line in guard["report"]:  # type: ignore[attr-defined]
            terminalreporter.write_line(line)


@pytest.fixture
def netns_factory() -> Iterator[Callable[[], Namespace]]:
    """Make as many throwaway namespaces as a test needs; all are deleted afterwards."""
    if not have_root():
        pytest.skip("network namespaces need root")
    made: list[Namespace] = []

    def make() -> Namespace:
        ns = new_namespace()
        made.append(ns)
        return ns

    yield make
    for ns in reversed(made):
        ns.delete()


@pytest.fixture
def host_ns(netns_factory: Callable[[], Namespace]) -> Namespace:
    """A namespace that plays the host: bridges, iptables/nft rules and plugins live here."""
    return netns_factory()


@pytest.fixture
def container_ns(netns_factory: Callable[[], Namespace]) -> Namespace:
    return netns_factory()


@pytest.fixture(scope="session")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CNI_PATH directory holding our plugins (every one written so far), installed once per
    session (per xdist worker): tests only read it; one that needs other executables makes its own."""
    from pycni.install_plugins import install

    d = tmp_path_factory.mktemp("cni-bin")
    install(str(d))
    return str(d)


GO_PLUGIN_DIR = "/usr/lib/cni"


@pytest.fixture(scope="session")
def go_libcni_tool(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tests/interop/gocnitool built once per session against the Go reference libcni."""
    from interop.gobuild import GoUnavailable, build

    try:
        return build("gocnitool", str(tmp_path_factory.mktemp("go-libcni-tool")))
    except GoUnavailable as e:
        pytest.skip(f"Go libcni runtime unavailable: {e}")
