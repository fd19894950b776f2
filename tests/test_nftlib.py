"""nftables in-process (pycni.net.nftlib, the daemon's path) against the nft command, in throwaway namespaces."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator

import pytest
from netns_util import Namespace

from pycni.net import nft, nftlib

pytestmark = pytest.mark.skipif(not nftlib.available(), reason="libnftables.so.1 is not installed")

SCRIPT = """add table inet pycni_t { comment "test"; }
add map inet pycni_t ports { type inet_proto . inet_service : ipv4_addr . inet_service; }
add chain inet pycni_t pre { type nat hook prerouting priority dstnat; }
flush chain inet pycni_t pre
add rule inet pycni_t pre meta nfproto ipv4 dnat ip to meta l4proto . th dport map @ports
add element inet pycni_t ports { tcp . 8080 comment "id: a" : 10.1.0.2 . 80 }
"""


@pytest.fixture
def library() -> Iterator[None]:
    """nft.* through libnftables for the test; every context released afterwards."""
    assert nft.use_library()
    try:
        yield
    finally:
        nft.use_library(False)
        nftlib.release_idle(0)


def test_script_and_listing_match_the_nft_command(host_ns: Namespace, library: None) -> None:
    with host_ns.enter():
        nft.run(SCRIPT)
        ours = nft.list_json("table", "inet", "pycni_t")
    theirs = json.loads(host_ns.run(["nft", "-j", "list", "table", "inet", "pycni_t"]).stdout)
    assert ours == theirs
    assert any("elem" in m.get("map", {}) for m in ours["nftables"])
    # the same script again is a no-op transaction, as with nft -f
    with host_ns.enter():
        nft.run(SCRIPT)
    assert host_ns.run(["nft", "list", "map", "inet", "pycni_t", "ports"]).stdout.count("8080") == 1


def test_errors_read_like_the_command(host_ns: Namespace, library: None) -> None:
    with host_ns.enter():
        with pytest.raises(nft.NftError) as missing:
            nft.run("delete element inet pycni_t ports { tcp . 1 }\n", what="teardown")
        assert missing.value.not_found and "nftables teardown failed" in missing.value.msg
        assert "\n" not in missing.value.details.strip()  # (no misquoted line under a kernel refusal, no exec)
        assert nft.list_json("table", "inet", "nosuch", missing_ok=True) == {"nftables": []}
        nft.run(SCRIPT)
        with pytest.raises(nft.NftError) as clash:
            nft.run("add element inet pycni_t ports { tcp . 8080 : 10.1.0.9 . 80 }\n")
        assert clash.value.exists
        with pytest.raises(nft.NftError) as syntax:
            nft.run("add bogus thing\n", code=7)
        assert syntax.value.code == 7 and "syntax error" in syntax.value.details
        # the failing line is the one quoted (libnftables alone quotes a buffer's first line)
        with pytest.raises(nft.NftError) as third:
            nft.run("add table inet pycni_u\nadd chain inet pycni_u c\nadd rule inet pycni_u c frobnicate\n")
        assert "stdin:3:" in third.value.details and "frobnicate" in third.value.details
    # a failed transaction changed nothing
    assert "10.1.0.9" not in host_ns.run(["nft", "list", "ruleset"]).stdout


def test_unsupported_forms_fall_back_to_the_command() -> None:
    assert nftlib.run(["list", "ruleset"], None) is None
    assert nftlib.run(["-f", "/etc/nftables.conf"], None) is None


def test_each_namespace_gets_its_own_context(netns_factory: Callable[[], Namespace], library: None) -> None:
    """Threads in different namespaces at once: every change lands in its own namespace."""
    spaces = [netns_factory() for _ in range(4)]
    errors: list[BaseException] = []

    def work(i: int, ns: Namespace) -> None:
        try:
            with ns.enter():
                nft.run(SCRIPT)
                for port in range(20):
                    nft.run(f"add element inet pycni_t ports {{ tcp . {1000 + port} : 10.2.{i}.2 . 80 }}\n")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, ns)) for i, ns in enumerate(spaces)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, ns in enumerate(spaces):
        listing = ns.run(["nft", "list", "map", "inet", "pycni_t", "ports"]).stdout
        assert listing.count(f"10.2.{i}.2") == 20
        assert not [j for j in range(len(spaces)) if j != i and f"10.2.{j}.2" in listing]


def test_idle_contexts_are_released(host_ns: Namespace, library: None) -> None:
    """A held context pins its namespace, so it goes once idle."""
    with host_ns.enter():
        nft.run(SCRIPT)
    assert nftlib.release_idle(3600) == 0  # just used
    assert nftlib.release_idle(0) >= 1
    assert nftlib.release_idle(0) == 0
    with host_ns.enter():  # and a new one is made on demand
        assert nft.table_exists("inet", "pycni_t")


def test_forked_child_makes_its_own_context(host_ns: Namespace, container_ns: Namespace, library: None) -> None:
    """The daemon forks its workers: a child must not use the parent's socket (another namespace)."""
    with host_ns.enter():
        nft.run(SCRIPT)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with container_ns.enter():
                nft.run("add table inet pycni_child\n")
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "pycni_child" in container_ns.run(["nft", "list", "tables"]).stdout
    assert "pycni_child" not in host_ns.run(["nft", "list", "tables"]).stdout
