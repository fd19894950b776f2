"""pycni.net.nflog against the kernel: nftables rules in a throwaway router namespace log real
TCP, UDP, SCTP, ICMP and ICMPv6 packets to an NFLOG group, and the reader decodes each exactly
(prefix, family, addresses, protocol, ports, interfaces)."""

from __future__ import annotations

import errno
import time

import pytest
from flows_util import A4, A6, B4, B6, Trio, log_table, serve_tcp, trio
from netns_util import have_root

from pycni.net.nflog import NF_LOG_PREFIXLEN, GroupBusy, LoggedPacket, NflogReader, decode_payload

pytestmark = pytest.mark.skipif(not have_root(), reason="needs root for network namespaces")
GROUP = 36


def _collect(reader: NflogReader, want: int, timeout: float = 10.0) -> list[LoggedPacket]:
    got: list[LoggedPacket] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += reader.read(0.5)
    return got


@pytest.fixture
def net() -> Trio:
    with trio() as t:
        t.nft(log_table(GROUP))
        yield t


def test_each_protocol_and_family_decoded_exactly(net: Trio) -> None:
    server = serve_tcp(net.b)
    try:
        with net.r.enter():
            reader = NflogReader(GROUP)
        with reader:
            net.a.run(["ping", "-c1", "-W2", B4])
            net.a.run(["ping", "-6", "-c1", "-W2", B6])
            net.send(net.a, f"""
for dst in ("{B4}", "{B6}"):
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    t = socket.socket(fam, socket.SOCK_STREAM); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("", 40001)); t.settimeout(5)
    t.connect((dst, 8080)); t.close()
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind(("", 40002)); u.sendto(b"x", (dst, 5353)); u.close()
""")
            got = _collect(reader, 6)
    finally:
        server.kill()
        server.wait()
    seen = {(p.prefix, p.family, p.src, p.dst, p.proto, p.sport, p.dport, p.indev_name, p.outdev_name) for p in got}
    assert seen == {
        ("pycni:A:p_0123456789_in", 4, A4, B4, "TCP", 40001, 8080, "fa0", "fb0"),
        ("pycni:A:p_0123456789_in", 6, A6, B6, "TCP", 40001, 8080, "fa0", "fb0"),
        ("pycni:D:v_fb0_in", 4, A4, B4, "UDP", 40002, 5353, "fa0", "fb0"),
        ("pycni:D:v_fb0_in", 6, A6, B6, "UDP", 40002, 5353, "fa0", "fb0"),
        ("pycni:A:na_in", 4, A4, B4, "ICMP", 8, 0, "fa0", "fb0"),  # echo request: type 8, code 0
        ("pycni:A:na_in", 6, A6, B6, "ICMPv6", 128, 0, "fa0", "fb0"),
    }, got
    assert len(got) == 6, "\n".join(map(repr, got))  # the SYN only: the rest is established
    for p in got:
        assert p.group == GROUP and p.indev and p.outdev and abs(p.time - time.time()) < 30
        assert p.protocol == {"TCP": 6, "UDP": 17, "ICMP": 1, "ICMPv6": 58}[p.proto]


def test_sctp_ports(net: Trio) -> None:
    with net.r.enter():
        reader = NflogReader(GROUP)
    with reader:
        # a raw SCTP INIT header (no kernel SCTP module needed): sport 40003, dport 9
        net.send(net.a, f"""
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, 132)
s.sendto((40003).to_bytes(2, "big") + (9).to_bytes(2, "big") + bytes(8) + bytes([1, 0, 0, 20]) + bytes(16),
         ("{B4}", 0))
""")
        got = _collect(reader, 1)
    assert [(p.prefix, p.proto, p.sport, p.dport, p.src, p.dst) for p in got] == [
        ("pycni:D:dd_in", "SCTP", 40003, 9, A4, B4)]


def test_nothing_logged_returns_empty_within_the_timeout(net: Trio) -> None:
    with net.r.enter():
        reader = NflogReader(GROUP)
    with reader:
        start = time.monotonic()
        assert reader.read(0.3) == []
        assert time.monotonic() - start < 2


def test_one_reader_per_group_and_unbind_frees_it(net: Trio) -> None:
    with net.r.enter():
        first = NflogReader(GROUP)
        with pytest.raises(GroupBusy, match=f"NFLOG group {GROUP} is already bound") as e:
            NflogReader(GROUP)
        assert e.value.errno == errno.EBUSY
        first.close()
        second = NflogReader(GROUP)  # free again at once
        second.close()
        with pytest.raises(ValueError, match="out of range"):
            NflogReader(70000)


def test_prefix_length_limit_is_the_kernels(net: Trio) -> None:
    """docs/flows.md: a prefix is at most NF_LOG_PREFIXLEN - 1 = 127 bytes; nft refuses longer."""
    ok = "p" * (NF_LOG_PREFIXLEN - 1)
    net.nft(f'add rule inet pf36_flows flows udp dport 1 log group {GROUP} prefix "{ok}"\n')
    bad = net.r.run(["nft", f'add rule inet pf36_flows flows udp dport 1 log group {GROUP} prefix "{ok}p"'],
                    check=False)
    assert bad.returncode != 0


def test_payload_decoder_edges() -> None:
    assert decode_payload(b"") == (0, "", "", 0, None, None)
    assert decode_payload(b"\x45" + bytes(10)) == (0, "", "", 0, None, None)  # too short for IPv4
    # an IPv4 non-first fragment of UDP: addresses and protocol, no ports
    hdr = bytes([0x45, 0, 0, 28, 0, 0, 0, 10, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]) + bytes(8)
    assert decode_payload(hdr) == (4, "10.0.0.1", "10.0.0.2", 17, None, None)
    # IPv6 with a hop-by-hop header before TCP
    v6 = bytes([0x60, 0, 0, 0, 0, 28, 0, 64]) + bytes(15) + b"\x01" + bytes(15) + b"\x02"
    hbh = bytes([6, 0]) + bytes(6)
    tcp = (1234).to_bytes(2, "big") + (80).to_bytes(2, "big") + bytes(16)
    assert decode_payload(v6 + hbh + tcp) == (6, "::1", "::2", 6, 1234, 80)
