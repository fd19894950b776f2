"""Shared fixtures: throwaway namespaces and temporary state directories."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from netns_util import Namespace, have_root, new_namespace


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
    from pycni.plugins.registry import install

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
