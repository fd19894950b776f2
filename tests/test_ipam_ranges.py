"""Unit tests for host-local's ranges: parsing, defaults, overlaps, allocation order, requests."""

from __future__ import annotations

import pytest

from pycni import ipaddr
from pycni.ipranges import (
    RangeError,
    address,
    candidates,
    parse_ip,
    parse_ip_with_prefix,
    parse_range,
    parse_range_set,
    parse_routes,
    range_for,
    range_set_str,
    range_sets_overlap,
    requested_ips,
)
from pycni.spec.errors import CNIError

ip = ipaddr.ip_address


def order(rs, last=None, limit=1000):  # type: ignore[no-untyped-def]
    out = []
    for r, value in candidates(rs, ip(last) if last else None):
        out.append(str(address(r.version, value)))
        if len(out) >= limit:
            break
    return out


# ---- defaults --------------------------------------------------------------------------------


def test_ipv4_defaults() -> None:
    r = parse_range({"subnet": "10.1.2.0/24"})
    assert (str(r.range_start), str(r.range_end), str(r.gateway)) == ("10.1.2.1", "10.1.2.254", "10.1.2.1")
    assert str(r) == "10.1.2.1-10.1.2.254"
    assert r.to_dict() == {"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.1", "rangeEnd": "10.1.2.254",
                           "gateway": "10.1.2.1"}


def test_ipv6_defaults_keep_last_address() -> None:
    r = parse_range({"subnet": "2001:db8:1::/64"})
    assert str(r.range_start) == "2001:db8:1::1"
    assert str(r.gateway) == "2001:db8:1::1"
    assert str(r.range_end) == "2001:db8:1:0:ffff:ffff:ffff:ffff"  # IPv6 has no broadcast


def test_explicit_values_and_empty_strings_mean_unset() -> None:
    r = parse_range({"subnet": "10.0.0.0/16", "rangeStart": "10.0.5.10", "rangeEnd": "10.0.5.20",
                     "gateway": "10.0.0.254"})
    assert (str(r.range_start), str(r.range_end), str(r.gateway)) == ("10.0.5.10", "10.0.5.20", "10.0.0.254")
    r = parse_range({"subnet": "10.0.0.0/30", "rangeStart": "", "rangeEnd": None, "gateway": ""})
    assert (str(r.range_start), str(r.range_end), str(r.gateway)) == ("10.0.0.1", "10.0.0.2", "10.0.0.1")


def test_ipv4_mapped_addresses_fold_to_ipv4() -> None:
    assert parse_ip("::ffff:10.0.0.5") == ip("10.0.0.5")
    r = parse_range({"subnet": "10.0.0.0/24", "rangeStart": "::ffff:10.0.0.7"})
    assert r.range_start == ip("10.0.0.7")


@pytest.mark.parametrize("obj,message", [
    ({"subnet": "10.1.2.5/24"}, "Network has host bits set. For a subnet mask of length 24 the network "
                                "address is 10.1.2.0"),
    ({"subnet": "10.1.2.0/31"}, "Network 10.1.2.0/31 too small to allocate from"),
    ({"subnet": "10.1.2.0/32"}, "Network 10.1.2.0/32 too small to allocate from"),
    ({"subnet": "2001:db8::/127"}, "Network 2001:db8::/127 too small to allocate from"),
    ({"subnet": "10.1.2.0/24", "rangeStart": "10.1.3.1"}, "RangeStart 10.1.3.1 not in network 10.1.2.0/24"),
    ({"subnet": "10.1.2.0/24", "rangeEnd": "10.1.3.1"}, "RangeEnd 10.1.3.1 not in network 10.1.2.0/24"),
    ({"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.50", "rangeEnd": "10.1.2.40"},
     "RangeStart 10.1.2.50 not in network 10.1.2.0/24"),
    ({"subnet": "10.1.2.0/24", "rangeStart": "2001:db8::1"}, "RangeStart 2001:db8::1 not in network"),
    ({"subnet": "10.1.2.0"}, "invalid CIDR address: 10.1.2.0"),
    ({"subnet": "10.1.2.0/255.255.255.0"}, "invalid CIDR address"),
    ({"subnet": "banana/24"}, "invalid CIDR address: banana/24"),
    ({"subnet": 24}, "subnet must be a CIDR string"),
    ({}, "subnet must be a CIDR string"),
    ({"subnet": "10.1.2.0/24", "gateway": "10.1.2"}, "gateway '10.1.2' is not a valid IP address"),
    ({"subnet": "10.1.2.0/24", "gateway": 7}, "gateway must be a string"),
    ({"subnet": "10.1.2.0/24", "rangeStart": "fe80::1%eth0"}, "is not a valid IP address"),
    ("10.1.2.0/24", "a range must be an object"),
])
def test_bad_ranges(obj: object, message: str) -> None:
    with pytest.raises(RangeError) as e:
        parse_range(obj)
    assert message in str(e.value)


# ---- sets and overlaps ------------------------------------------------------------------------


def test_range_set_rules() -> None:
    with pytest.raises(RangeError, match="empty range set"):
        parse_range_set([])
    with pytest.raises(RangeError, match="mixed address families"):
        parse_range_set([{"subnet": "10.0.0.0/24"}, {"subnet": "2001:db8::/64"}])
    with pytest.raises(RangeError, match="subnets 10.0.0.1-10.0.255.254 and 10.0.1.1-10.0.1.254 overlap"):
        parse_range_set([{"subnet": "10.0.0.0/16"}, {"subnet": "10.0.1.0/24"}])
    with pytest.raises(RangeError, match="a range set must be a list"):
        parse_range_set({"subnet": "10.0.0.0/24"})
    # Same subnet, disjoint windows: allowed (the reference compares windows, not subnets).
    rs = parse_range_set([{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.99"},
                          {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}])
    assert range_set_str(rs) == "10.0.0.1-10.0.0.99,10.0.0.100-10.0.0.254"


def test_overlap_is_window_intersection() -> None:
    a = parse_range({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20"})
    inner = parse_range({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.12", "rangeEnd": "10.0.0.13"})
    touching = parse_range({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.20", "rangeEnd": "10.0.0.30"})
    apart = parse_range({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.21"})
    v6 = parse_range({"subnet": "::/96"})  # ::a00:c is numerically 10.0.0.12, but another family
    assert a.overlaps(inner) and inner.overlaps(a)
    assert a.overlaps(touching)
    assert not a.overlaps(apart)
    assert not a.overlaps(v6)
    assert range_sets_overlap([apart, a], [inner])
    assert not range_sets_overlap([apart], [inner])


def test_contains_and_range_for() -> None:
    rs = parse_range_set([{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20"},
                          {"subnet": "172.16.0.0/24"}])
    assert range_for(rs, ip("10.0.0.10")) is rs[0]
    assert range_for(rs, ip("10.0.0.21")) is None  # in the subnet, outside the window
    assert range_for(rs, ip("172.16.0.254")) is rs[1]
    assert range_for(rs, ip("172.16.0.255")) is None  # broadcast is beyond the default end
    assert range_for(rs, ip("::ffff:0:0")) is None


# ---- allocation order -------------------------------------------------------------------------


def test_order_starts_at_range_start_and_skips_gateway() -> None:
    rs = parse_range_set([{"subnet": "10.0.0.0/29"}])
    assert order(rs) == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]


def test_order_continues_after_last_reserved_and_wraps() -> None:
    rs = parse_range_set([{"subnet": "10.0.0.0/29"}])
    assert order(rs, "10.0.0.4") == ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    # A cursor outside the set (ranges changed) restarts from the beginning.
    assert order(rs, "192.168.0.1") == order(rs)
    assert order(rs, "2001:db8::1") == order(rs)


def test_order_walks_ranges_round_robin() -> None:
    rs = parse_range_set([{"subnet": "10.0.0.0/29", "rangeStart": "10.0.0.5"},
                          {"subnet": "10.0.1.0/29", "gateway": "10.0.1.3"}])
    assert order(rs) == ["10.0.0.5", "10.0.0.6", "10.0.1.1", "10.0.1.2", "10.0.1.4", "10.0.1.5", "10.0.1.6"]
    assert order(rs, "10.0.1.5") == ["10.0.1.6", "10.0.0.5", "10.0.0.6", "10.0.1.1", "10.0.1.2", "10.0.1.4",
                                     "10.0.1.5"]


def test_order_never_hands_out_network_or_broadcast() -> None:
    rs = parse_range_set([{"subnet": "10.0.0.0/30", "rangeStart": "10.0.0.0", "rangeEnd": "10.0.0.3",
                           "gateway": "10.0.0.1"}])
    assert order(rs) == ["10.0.0.2"]
    v6 = parse_range_set([{"subnet": "2001:db8::/126", "rangeStart": "2001:db8::"}])
    assert order(v6) == ["2001:db8::2", "2001:db8::3"]


def test_order_terminates_when_only_the_gateway_is_left() -> None:
    rs = parse_range_set([{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.1", "rangeEnd": "10.0.0.1"}])
    assert order(rs) == []
    assert order(rs, "10.0.0.1") == []


def test_ipv6_order() -> None:
    rs = parse_range_set([{"subnet": "2001:db8::/120", "rangeStart": "2001:db8::fe"}])
    assert order(rs) == ["2001:db8::fe", "2001:db8::ff"]


def test_order_is_lazy_on_a_big_range() -> None:
    rs = parse_range_set([{"subnet": "10.0.0.0/8"}])
    assert order(rs, "10.200.0.0", limit=2) == ["10.200.0.1", "10.200.0.2"]


# ---- requested addresses and routes ------------------------------------------------------------


def test_parse_ip_with_prefix() -> None:
    assert parse_ip_with_prefix("10.0.0.5") == (ip("10.0.0.5"), None)
    assert parse_ip_with_prefix("10.0.0.5/24") == (ip("10.0.0.5"), 24)
    assert parse_ip_with_prefix("2001:db8::5/64") == (ip("2001:db8::5"), 64)
    for bad in ("", "10.0.0", "10.0.0.5/33", "x/24", "010.0.0.5", "10.0.0.5/255.255.255.0", "10.0.0.5/"):
        with pytest.raises(ValueError):
            parse_ip_with_prefix(bad)


def test_requested_ips_sources_in_order() -> None:
    conf = {"args": {"cni": {"ips": ["10.0.0.7", "2001:db8::7/64"]}}, "runtimeConfig": {"ips": ["10.0.1.7/24"]}}
    got = requested_ips(conf, {"IP": "10.0.0.5, 2001:db8::5"})
    assert got == [(ip("10.0.0.5"), None), (ip("2001:db8::5"), None), (ip("10.0.0.7"), None),
                   (ip("2001:db8::7"), 64), (ip("10.0.1.7"), 24)]
    assert requested_ips({}, {}) == []
    assert requested_ips({}, {"IP": ""}) == []


def test_requested_ips_errors_carry_codes() -> None:
    with pytest.raises(CNIError) as e:
        requested_ips({}, {"IP": "10.0.0.5,nope"})
    assert e.value.code == 4 and "nope" in e.value.details
    with pytest.raises(CNIError) as e:
        requested_ips({"runtimeConfig": {"ips": ["10.0.0.300"]}}, {})
    assert e.value.code == 7 and "runtimeConfig.ips" in e.value.msg
    bad_confs: list[dict[str, object]] = [{"args": {"cni": {"ips": "10.0.0.1"}}}, {"args": "IP=10.0.0.1"},
                                          {"args": {"cni": []}}, {"runtimeConfig": ["10.0.0.1"]}]
    for conf in bad_confs:
        with pytest.raises(CNIError) as e:
            requested_ips(conf, {})
        assert e.value.code == 7
    assert requested_ips({"args": {"other": 1}, "runtimeConfig": {"portMappings": []}}, {}) == []


def test_parse_routes() -> None:
    routes = parse_routes([{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.0.0.254"}])
    assert [r.to_dict() for r in routes] == [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.0.0.254"}]
    assert parse_routes(None) == []
    for bad in ([{"dst": "nope"}], [{"gw": "10.0.0.1"}], {"dst": "0.0.0.0/0"}, ["0.0.0.0/0"]):
        with pytest.raises(CNIError) as e:
            parse_routes(bad)
        assert e.value.code == 7
