"""pycni.net.sysctl: key normalisation, refusal of escaping keys, and per-thread netns effect."""

from __future__ import annotations

import threading

import pytest

from pycni.net.sysctl import normalize_key, read_sysctl, sysctl_path, write_sysctl
from pycni.spec.errors import INVALID_CONFIG, IO_FAILURE, CNIError


@pytest.mark.parametrize("key,expected", [
    ("net.ipv4.ip_forward", "net/ipv4/ip_forward"),
    ("net/ipv4/ip_forward", "net/ipv4/ip_forward"),
    ("net.ipv4.conf.eth0/100.rp_filter", "net/ipv4/conf/eth0.100/rp_filter"),
    ("net/ipv4/conf/eth0.100/rp_filter", "net/ipv4/conf/eth0.100/rp_filter"),
])
def test_normalize_key(key: str, expected: str) -> None:
    assert normalize_key(key) == expected
    assert sysctl_path(key) == f"/proc/sys/{expected}"


@pytest.mark.parametrize("key", [
    "", "/etc/passwd", "net/../../etc/passwd", "net.ipv4..ip_forward", "net/ipv4/", "..", "net/./ipv4",
])
def test_escaping_keys_refused(key: str) -> None:
    with pytest.raises(CNIError) as ei:
        sysctl_path(key)
    assert ei.value.code == INVALID_CONFIG


def test_read_write_in_thread_namespace(netns_factory) -> None:  # type: ignore[no-untyped-def]
    """A write after netns.enter lands in that namespace only; the root namespace is only read."""
    a, b = netns_factory(), netns_factory()
    root_before = read_sysctl("net.ipv4.ip_forward")
    with a.enter():
        assert read_sysctl("net.ipv4.ip_forward") == "0"
        write_sysctl("net.ipv4.ip_forward", "1")
        assert read_sysctl("net/ipv4/ip_forward") == "1"
    with b.enter():
        assert read_sysctl("net.ipv4.ip_forward") == "0"
    assert a.run(["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "1"
    assert b.run(["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "0"
    assert read_sysctl("net.ipv4.ip_forward") == root_before


def test_threads_see_their_own_namespace(netns_factory) -> None:  # type: ignore[no-untyped-def]
    """Two threads inside different namespaces at once each read their own value."""
    a, b = netns_factory(), netns_factory()
    a.run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
    seen: dict[str, list[str]] = {"a": [], "b": []}
    barrier = threading.Barrier(2)

    def work(ns, tag: str) -> None:  # type: ignore[no-untyped-def]
        with ns.enter():
            barrier.wait()
            for _ in range(50):
                seen[tag].append(read_sysctl("net.ipv4.ip_forward"))

    threads = [threading.Thread(target=work, args=(a, "a")), threading.Thread(target=work, args=(b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(seen["a"]) == {"1"} and set(seen["b"]) == {"0"}


def test_dotted_interface_name(netns_factory) -> None:  # type: ignore[no-untyped-def]
    """Per-interface keys for names with a dot, in both spellings."""
    ns = netns_factory()
    ns.run(["ip", "link", "add", "eth0.100", "type", "veth", "peer", "name", "p0"])
    with ns.enter():
        write_sysctl("net.ipv4.conf.eth0/100.rp_filter", "2")
        assert read_sysctl("net/ipv4/conf/eth0.100/rp_filter") == "2"
        write_sysctl("net/ipv4/conf/eth0.100/rp_filter", "1")
        assert read_sysctl("net.ipv4.conf.eth0/100.rp_filter") == "1"
    assert ns.run(["cat", "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"]).stdout.strip() == "1"


def test_missing_key_and_bad_value(netns_factory) -> None:  # type: ignore[no-untyped-def]
    ns = netns_factory()
    with ns.enter():
        with pytest.raises(CNIError) as ei:
            read_sysctl("net.ipv4.conf.nosuchif0.rp_filter")
        assert ei.value.code == IO_FAILURE and "does not exist" in ei.value.msg
        with pytest.raises(CNIError) as ei:
            write_sysctl("net.ipv4.conf.nosuchif0.rp_filter", "1")
        assert ei.value.code == IO_FAILURE
        with pytest.raises(CNIError) as ei:
            write_sysctl("net.ipv4.ip_forward", "not-a-number")
        assert ei.value.code == IO_FAILURE and "failed to set" in ei.value.msg
        assert read_sysctl("net.ipv4.ip_forward") == "0"
