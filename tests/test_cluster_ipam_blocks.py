"""cluster-ipam's block arithmetic (no etcd): cutting range sets into blocks, free addresses."""

from __future__ import annotations

import itertools

from pycni import ipaddr
from pycni.cluster.ipam import block_for, blocks_of, free_ordinal, usable
from pycni.cluster.model import Block, cidr_key, key_cidr
from pycni.ipranges import parse_range_set


def test_blocks_cover_the_range_window_only() -> None:
    rs = parse_range_set([{"subnet": "10.90.0.0/24", "rangeStart": "10.90.0.70", "rangeEnd": "10.90.0.130"}])
    got = [str(c) for c, _r in blocks_of(rs, 26)]
    assert got == ["10.90.0.64/26", "10.90.0.128/26"]
    c, r = next(iter(blocks_of(rs, 26)))
    assert usable(c, r) == (6, 63)  # .70 .. .127


def test_subnet_smaller_than_a_block_is_one_block() -> None:
    rs = parse_range_set([{"subnet": "10.91.0.0/28"}])
    assert [str(c) for c, _r in blocks_of(rs, 26)] == ["10.91.0.0/28"]


def test_ipv6_slash64_is_enumerated_lazily() -> None:
    rs = parse_range_set([{"subnet": "fd00::/64"}])
    first = [str(c) for c, _r in itertools.islice(blocks_of(rs, 122), 3)]
    assert first == ["fd00::/122", "fd00::40/122", "fd00::80/122"]


def test_free_ordinal_skips_reserved_and_taken_round_robin() -> None:
    rs = parse_range_set([{"subnet": "10.92.0.0/29"}])  # .0 network, .1 gateway, .7 broadcast
    cidr, r = next(iter(blocks_of(rs, 29)))
    b = Block(cidr=cidr, node="n1")
    assert free_ordinal(b, r) == 2
    b.allocations = {2: "a/eth0", 3: "b/eth0"}
    b.next = 3
    assert free_ordinal(b, r) == 4
    b.next = 6
    b.allocations = {2: "a", 3: "b", 4: "c", 5: "d", 6: "e"}
    assert free_ordinal(b, r) is None  # .7 is the broadcast
    del b.allocations[3]
    assert free_ordinal(b, r) == 3  # wraps around from next


def test_block_json_roundtrip_and_keys() -> None:
    b = Block(cidr=ipaddr.ip_network("fd00::40/122"), node="n2", allocations={5: "c/eth0"}, next=6)
    again = Block.from_json(b.to_json(), 7)
    assert again.allocations == {5: "c/eth0"} and again.next == 6 and again.mod_revision == 7
    assert str(again.ip(5)) == "fd00::45"
    assert cidr_key(b.cidr) == "fd00::40-122" and key_cidr("fd00::40-122") == b.cidr
    rs = parse_range_set([{"subnet": "fd00::/64"}])
    assert block_for(rs, 122, ipaddr.ip_address("fd00::45")) == (b.cidr, rs[0])
