"""pycni.net.sysctl: key normalisation, refusal of escaping keys, and per-thread netns effect."""

from __future__ import annotations

import threading
import time

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


def test_directory_cache_follows_the_namespace(netns_factory) -> None:  # type: ignore[no-untyped-def]
    """net/<dir> keys open relative to a per-namespace directory descriptor: still each namespace's own."""
    from pycni.net import sysctl

    spaces = [netns_factory() for _ in range(3)]
    for i, ns in enumerate(spaces):
        with ns.enter():
            write_sysctl("net/ipv4/conf/lo/arp_notify", str(i % 2))
            write_sysctl("net/ipv6/conf/lo/keep_addr_on_down", "1")
    for i, ns in enumerate(spaces):
        with ns.enter():  # the cached directories again, in another order
            assert read_sysctl("net/ipv4/conf/lo/arp_notify") == str(i % 2)
        assert ns.run(["cat", "/proc/sys/net/ipv4/conf/lo/arp_notify"]).stdout.strip() == str(i % 2)
    assert len(sysctl._dirs) <= sysctl._DIR_CACHE_SIZE


def test_stale_directory_falls_back_to_the_full_path(netns_factory) -> None:  # type: ignore[no-untyped-def]
    """A cached directory of a namespace that died (its inode number reused) is dropped, not trusted."""
    import os

    from pycni.net import sysctl

    live, doomed = netns_factory(), netns_factory()
    with doomed.enter():
        stale = os.open("/proc/sys/net/ipv4", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        stale_ino = os.fstat(stale).st_ino
    doomed.delete()
    for _ in range(200):  # the kernel tears the namespace down in the background
        try:
            os.close(os.open("ip_forward", os.O_RDONLY, dir_fd=stale))
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the deleted namespace's sysctls never went away")
    with live.enter():
        st = os.stat("/proc/thread-self/ns/net")
        key = (st.st_dev, st.st_ino, "ipv4")
        with sysctl._dirs_lock:
            old = sysctl._dirs.pop(key, None)
            if old is not None:
                os.close(old)
            sysctl._dirs[key] = stale  # as if this namespace reused the dead one's inode
        write_sysctl("net/ipv4/ip_forward", "1")
        assert read_sysctl("net/ipv4/ip_forward") == "1"
        assert os.fstat(sysctl._dirs[key]).st_ino != stale_ino  # replaced by this namespace's own
    assert live.run(["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "1"


def test_bounded_directory_cache(netns_factory) -> None:  # type: ignore[no-untyped-def]
    from pycni.net import sysctl

    for _ in range(sysctl._DIR_CACHE_SIZE // 2 + 2):
        with netns_factory().enter():
            read_sysctl("net/ipv4/ip_forward")
            read_sysctl("net/ipv6/conf/all/forwarding")
    assert len(sysctl._dirs) <= sysctl._DIR_CACHE_SIZE
