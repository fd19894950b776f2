"""Result types: parsing, rendering and conversion between every pair of spec versions.

The rules come from the Go reference (pkg/types/{020,040,100}); where Go is installed the
same conversions are also run through the Go code itself (tests/interop/gotypes) and the
outputs compared.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from typing import Any

import pytest

from pycni import ipaddr
from pycni.spec import errors as E
from pycni.spec.errors import CNIError
from pycni.spec.types import DNS, Interface, IPConfig, Result, Route, parse_cidr, parse_ip
from pycni.spec.version import ALL_VERSIONS

LEGACY = ("0.1.0", "0.2.0")
V04 = ("0.3.0", "0.3.1", "0.4.0")
V1 = ("1.0.0", "1.1.0")
PAIRS = list(itertools.product(ALL_VERSIONS, ALL_VERSIONS))

DNS_FULL = {"nameservers": ["10.1.0.1", "fd00::1"], "domain": "example.org", "search": ["a.example.org"],
            "options": ["ndots:2"]}


def legacy_sample(ver: str) -> dict[str, Any]:
    return {"cniVersion": ver,
            "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1",
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.7.9/24", "gw": "10.1.0.254"}]},
            "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "::/0", "gw": "fd00::1"}]},
            "dns": DNS_FULL}


def v04_sample(ver: str) -> dict[str, Any]:
    return {"cniVersion": ver,
            "interfaces": [{"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
                           {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/var/run/netns/x"}],
            "ips": [{"version": "4", "interface": 1, "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                    {"version": "4", "interface": 1, "address": "10.2.0.5/16"},
                    {"version": "6", "interface": 0, "address": "fd00::5/64", "gateway": "fd00::1"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "fd01::/64"},
                       {"dst": "192.168.7.9/24", "gw": "10.1.0.254"}],
            "dns": DNS_FULL}


def v1_sample(ver: str) -> dict[str, Any]:
    d = v04_sample(ver)
    for ip in d["ips"]:
        del ip["version"]
    return d


def v11_sample() -> dict[str, Any]:
    """A 1.1.0 result using every 1.1 attribute."""
    d = v1_sample("1.1.0")
    d["interfaces"][1].update({"mtu": 1450, "socketPath": "/run/vhost.sock", "pciID": "0000:00:1f.6"})
    d["routes"][0].update({"mtu": 1400, "advmss": 1360, "priority": 10, "table": 100, "scope": 0})
    return d


def sample(ver: str) -> dict[str, Any]:
    if ver in LEGACY:
        return legacy_sample(ver)
    if ver in V04:
        return v04_sample(ver)
    return v1_sample(ver)


# ---- round trips and JSON shape ----------------------------------------------------------------

@pytest.mark.parametrize("ver", ALL_VERSIONS)
def test_round_trip_same_version_is_identity(ver: str) -> None:
    d = sample(ver)
    res = Result.from_dict(d)
    assert res.cni_version == ver
    assert res.to_dict() == d
    assert json.loads(res.to_json()) == d


def test_round_trip_1_1_attributes() -> None:
    d = v11_sample()
    assert Result.from_dict(d).to_dict() == d
    # 1.0.0 is the same Go type: a 1.1.0 result rendered as 1.0.0 keeps every attribute.
    assert Result.from_dict(d).to_dict("1.0.0") == {**d, "cniVersion": "1.0.0"}


def test_field_order_follows_go_structs() -> None:
    d = Result.from_dict(v11_sample()).to_dict("0.4.0")
    assert list(d) == ["cniVersion", "interfaces", "ips", "routes", "dns"]
    assert list(d["ips"][0]) == ["version", "interface", "address", "gateway"]
    d1 = Result.from_dict(v11_sample()).to_dict()
    assert list(d1["interfaces"][1]) == ["name", "mac", "mtu", "sandbox", "socketPath", "pciID"]
    assert list(d1["routes"][0]) == ["dst", "gw", "mtu", "advmss", "priority", "table", "scope"]
    legacy = Result.from_dict(legacy_sample("0.2.0")).to_dict()
    assert list(legacy) == ["cniVersion", "ip4", "ip6", "dns"]
    assert list(legacy["ip4"]) == ["ip", "gateway", "routes"]


@pytest.mark.parametrize("ver", ALL_VERSIONS)
def test_empty_dns_printed_for_0x_omitted_for_1x(ver: str) -> None:
    res = Result(cni_version=ver, ips=[IPConfig(address=parse_cidr("10.0.0.2/24"))])
    d = res.to_dict()
    if ver in V1:
        assert "dns" not in d
    else:
        assert d["dns"] == {}


def test_minimal_results_omit_empty_lists() -> None:
    assert Result(cni_version="1.0.0").to_dict() == {"cniVersion": "1.0.0"}
    assert Result(cni_version="0.4.0").to_dict() == {"cniVersion": "0.4.0", "dns": {}}


def test_route_dst_keeps_host_bits_as_go_does() -> None:
    r = Route.from_dict({"dst": "10.9.0.5/16"})
    assert r.dst == ipaddr.ip_network("10.9.0.0/16")
    assert r.to_dict() == {"dst": "10.9.0.5/16"}
    # Changing dst in code drops the stale host part.
    r.dst = ipaddr.ip_network("172.16.0.0/12")
    assert r.to_dict() == {"dst": "172.16.0.0/12"}
    assert Route(dst=ipaddr.ip_network("10.0.0.0/8")).to_dict() == {"dst": "10.0.0.0/8"}


def test_interface_index_zero_is_kept() -> None:
    d = {"cniVersion": "1.0.0", "ips": [{"interface": 0, "address": "10.0.0.2/24"}]}
    assert Result.from_dict(d).to_dict() == d


def test_equality_ignores_parse_hints() -> None:
    parsed = Result.from_dict(v04_sample("0.4.0"))
    assert parsed.ips[0] == IPConfig(address=parse_cidr("10.1.0.5/16"), gateway=parse_ip("10.1.0.1"), interface=1)
    assert Result.from_dict({"cniVersion": "1.0.0", "routes": [{"dst": "10.0.0.7/8"}]}).routes[0] == Route(
        dst=ipaddr.ip_network("10.0.0.0/8"))


def test_missing_cni_version_means_0_1_0() -> None:
    d = legacy_sample("0.1.0")
    del d["cniVersion"]
    res = Result.from_dict(d)
    assert res.cni_version == "0.1.0"
    assert res.to_dict()["cniVersion"] == "0.1.0"


# ---- conversion rules -------------------------------------------------------------------------

@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_every_pair_converts_and_reparses(src: str, dst: str) -> None:
    res = Result.from_dict(sample(src))
    out = res.to_dict(dst)
    assert out["cniVersion"] == dst
    again = Result.from_dict(out)
    assert again.cni_version == dst
    # Converting back to where we came from is stable after the first lossy step.
    assert Result.from_dict(again.to_dict(src)).to_dict(dst) == out
    if dst in LEGACY:
        assert set(out) <= {"cniVersion", "ip4", "ip6", "dns"}
        assert out["ip4"]["ip"] == "10.1.0.5/16"  # first IPv4 wins
        assert out["ip6"]["ip"] == "fd00::5/64"
    else:
        assert "ip4" not in out and "ip6" not in out
        for ip in out["ips"]:
            assert ("version" in ip) == (dst in V04)
    assert out["dns"] == DNS_FULL


def test_1_1_to_0_4_drops_interface_extras_keeps_route_attributes() -> None:
    out = Result.from_dict(v11_sample()).to_dict("0.4.0")
    assert out["interfaces"][1] == {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/var/run/netns/x"}
    assert out["routes"][0] == {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "mtu": 1400, "advmss": 1360,
                                "priority": 10, "table": 100, "scope": 0}
    assert [ip["version"] for ip in out["ips"]] == ["4", "4", "6"]


def test_1_1_to_0_2_keeps_first_of_each_family_and_bare_routes() -> None:
    out = Result.from_dict(v11_sample()).to_dict("0.2.0")
    assert out == {"cniVersion": "0.2.0",
                   "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1",
                           "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
                                      {"dst": "192.168.7.9/24", "gw": "10.1.0.254"}]},
                   "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "fd01::/64"}]},
                   "dns": DNS_FULL}


def test_0_4_parse_ignores_1_1_interface_extras() -> None:
    d = v04_sample("0.4.0")
    d["interfaces"][0]["mtu"] = 9000
    res = Result.from_dict(d)
    assert res.interfaces[0].mtu == 0
    assert "mtu" not in res.to_dict("1.1.0")["interfaces"][0]


def test_0_4_declared_ip_version_is_trusted_going_down() -> None:
    d = {"cniVersion": "0.4.0", "ips": [{"version": "6", "address": "10.0.0.2/24"},
                                        {"version": "", "address": "10.0.0.3/24"}]}
    res = Result.from_dict(d)
    assert res.to_dict() == {**d, "dns": {}}  # kept verbatim within 0.3/0.4
    assert res.to_dict("0.2.0") == {"cniVersion": "0.2.0", "ip6": {"ip": "10.0.0.2/24"}, "dns": {}}
    # ... but 1.x has no version field, and Go recomputes it from the address coming back.
    one = Result.from_dict(res.to_dict("1.0.0"))
    assert [ip["version"] for ip in one.to_dict("0.4.0")["ips"]] == ["4", "4"]


def test_legacy_between_0_1_and_0_2_copies_blocks_with_route_attributes() -> None:
    d = {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24", "routes": [{"dst": "fd00::/64", "mtu": 1400}]}}
    res = Result.from_dict(d)
    assert res.to_dict("0.1.0") == {**d, "cniVersion": "0.1.0", "dns": {}}
    # Through 0.4.0 Go files the route by its destination family: no ip6 block, so it is gone.
    assert res.convert("0.4.0").to_dict("0.2.0") == {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"},
                                                     "dns": {}}
    assert res.to_dict("0.4.0")["routes"] == [{"dst": "fd00::/64", "mtu": 1400}]


@pytest.mark.parametrize("src", V04 + V1)
@pytest.mark.parametrize("dst", LEGACY)
def test_no_address_cannot_go_below_0_3(src: str, dst: str) -> None:
    res = Result.from_dict({"cniVersion": src, "interfaces": [{"name": "eth0"}]})
    with pytest.raises(CNIError) as ei:
        res.to_dict(dst)
    assert ei.value.code == E.INCOMPATIBLE_VERSION
    assert "no valid IP addresses" in str(ei.value)


@pytest.mark.parametrize("bad", ["0.5.0", "2.0.0", "1.0", "banana", "9"])
def test_unknown_versions_are_refused(bad: str) -> None:
    with pytest.raises(CNIError) as ei:
        Result.from_dict({"cniVersion": bad})
    assert ei.value.code == E.INCOMPATIBLE_VERSION
    with pytest.raises(CNIError) as ei:
        Result.from_dict(v1_sample("1.0.0")).to_dict(bad)
    assert ei.value.code == E.INCOMPATIBLE_VERSION


def test_expected_version_of_another_type_is_refused() -> None:
    with pytest.raises(CNIError) as ei:
        Result.from_dict(v1_sample("1.0.0"), "0.4.0")
    assert ei.value.code == E.DECODE_FAILURE
    # Same Go type: the declared version wins, as in Go.
    assert Result.from_dict(v04_sample("0.3.1"), "0.4.0").cni_version == "0.3.1"
    # No declared version: the expected one is used.
    d = v1_sample("1.0.0")
    del d["cniVersion"]
    assert Result.from_dict(d, "1.1.0").cni_version == "1.1.0"


@pytest.mark.parametrize(("doc", "fragment"), [
    ({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.300/24"}]}, "address"),
    ({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.3"}]}, "address"),
    ({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.3/255.255.255.0"}]}, "address"),
    ({"cniVersion": "1.0.0", "ips": [{"address": "fe80::1%eth0/64"}]}, "address"),
    ({"cniVersion": "1.0.0", "ips": [{}]}, "address"),
    ({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.3/24", "gateway": "nope"}]}, "gateway"),
    ({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.3/24", "interface": True}]}, "interface"),
    ({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.3/24", "interface": "0"}]}, "interface"),
    ({"cniVersion": "1.0.0", "ips": {"address": "10.0.0.3/24"}}, "ips"),
    ({"cniVersion": "1.0.0", "ips": [None]}, "IP config"),
    ({"cniVersion": "1.0.0", "interfaces": [{"name": 7}]}, "name"),
    ({"cniVersion": "1.1.0", "interfaces": [{"name": "e", "mtu": "1500"}]}, "mtu"),
    ({"cniVersion": "1.0.0", "routes": [{"dst": "10.0.0.0/8", "mtu": 1500.5}]}, "mtu"),
    ({"cniVersion": "1.0.0", "routes": [{"gw": "10.0.0.1"}]}, "destination"),
    ({"cniVersion": "1.0.0", "dns": {"nameservers": "10.0.0.1"}}, "nameservers"),
    ({"cniVersion": "1.0.0", "dns": []}, "dns"),
    ({"cniVersion": 1}, "cniVersion"),
    ({"cniVersion": "0.2.0", "ip4": {"gateway": "10.0.0.1"}}, "ip4"),
    ({"cniVersion": "0.2.0", "ip4": "10.0.0.2/24"}, "ip4"),
    ([], "result"),
])
def test_bad_results_are_decode_errors_naming_the_field(doc: Any, fragment: str) -> None:
    with pytest.raises(CNIError) as ei:
        Result.from_dict(doc)
    assert ei.value.code == E.DECODE_FAILURE
    assert fragment in str(ei.value)


def test_from_json_refuses_non_json() -> None:
    with pytest.raises(CNIError) as ei:
        Result.from_json(b"\xff not json")
    assert ei.value.code == E.DECODE_FAILURE


def test_null_lists_and_dns_are_empty() -> None:
    res = Result.from_dict({"cniVersion": "1.0.0", "interfaces": None, "ips": None, "routes": None, "dns": None})
    assert res == Result(cni_version="1.0.0")


def test_convert_and_copy_are_independent() -> None:
    res = Result.from_dict(v11_sample())
    cp = res.copy()
    cp.interfaces[0].name = "changed"
    assert res.interfaces[0].name == "cni0"
    down = res.convert("0.3.1")
    assert down.cni_version == "0.3.1" and down.interfaces[1].mtu == 0
    assert res.interfaces[1].mtu == 1450


def test_building_in_code() -> None:
    res = Result(cni_version="1.1.0", interfaces=[Interface(name="eth0", mac="aa:bb:cc:dd:ee:ff", mtu=1500)],
                 ips=[IPConfig(address=parse_cidr("10.0.0.2/24"), gateway=parse_ip("10.0.0.1"), interface=0)],
                 routes=[Route(dst=ipaddr.ip_network("0.0.0.0/0"), gw=parse_ip("10.0.0.1"), table=5)],
                 dns=DNS(nameservers=["10.0.0.1"]))
    assert res.to_dict() == {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1500}],
        "ips": [{"interface": 0, "address": "10.0.0.2/24", "gateway": "10.0.0.1"}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "table": 5}],
        "dns": {"nameservers": ["10.0.0.1"]},
    }


# ---- errors ------------------------------------------------------------------------------------

def test_error_json_shape() -> None:
    err = CNIError(E.INVALID_CONFIG, "Invalid Configuration", "Network 192.168.0.0/31 too small")
    assert err.to_dict("1.1.0") == {"cniVersion": "1.1.0", "code": 7, "msg": "Invalid Configuration",
                                    "details": "Network 192.168.0.0/31 too small"}
    assert CNIError(E.TRY_AGAIN, "busy").to_dict() == {"code": 11, "msg": "busy"}  # details omitted when empty
    assert str(err) == "Invalid Configuration; Network 192.168.0.0/31 too small"
    back = CNIError.from_dict(json.loads(err.to_json("1.1.0")))
    assert (back.code, back.msg, back.details, back.cni_version) == (7, err.msg, err.details, "1.1.0")


def test_error_codes_match_the_spec() -> None:
    assert (E.INCOMPATIBLE_VERSION, E.UNSUPPORTED_FIELD, E.UNKNOWN_CONTAINER, E.INVALID_ENV, E.IO_FAILURE,
            E.DECODE_FAILURE, E.INVALID_CONFIG, E.INVALID_NETNS, E.TRY_AGAIN, E.PLUGIN_NOT_AVAILABLE,
            E.LIMITED_CONNECTIVITY, E.INTERNAL) == (1, 2, 3, 4, 5, 6, 7, 8, 11, 50, 51, 999)


# ---- against the Go reference ------------------------------------------------------------------

class GoConverter:
    """tests/interop/gotypes: Go's create.Create + GetAsVersion, one request per line."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        probe = self.convert([(v1_sample("1.0.0"), "1.1.0")])[0]
        self.has_1_1 = "result" in probe

    def convert(self, requests: list[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
        lines = "".join(json.dumps({"result": r, "to": to}) + "\n" for r, to in requests)
        proc = subprocess.run([self.binary], input=lines, capture_output=True, text=True, timeout=60, check=True)
        return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="session")
def go_types(tmp_path_factory: pytest.TempPathFactory) -> GoConverter:
    from interop.gobuild import GoUnavailable, build

    try:
        return GoConverter(build("gotypes", str(tmp_path_factory.mktemp("gotypes"))))
    except GoUnavailable as e:
        pytest.skip(f"Go comparison skipped: {e}")


def go_inputs() -> list[dict[str, Any]]:
    edge = [
        {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}]},  # no address
        {"cniVersion": "0.4.0", "ips": [{"version": "6", "address": "10.0.0.2/24"},
                                        {"version": "", "address": "10.0.0.3/24"}]},
        {"cniVersion": "0.3.0", "ips": [{"version": "6", "address": "fd00::2/64"}],
         "routes": [{"dst": "10.0.0.0/8"}, {"dst": "fd01::5/64", "gw": "fd00::1"}]},
        {"cniVersion": "0.1.0", "ip6": {"ip": "fd00::2/64", "routes": [{"dst": "10.0.0.0/8"}]}},
        {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}},
        {"ip4": {"ip": "10.0.0.2/24", "gateway": "10.0.0.1"}},
        {"cniVersion": "1.0.0", "ips": [{"interface": 0, "address": "10.0.0.2/24"}], "routes": [
            {"dst": "10.9.8.7/16"}]},
    ]
    return [sample(v) for v in ALL_VERSIONS] + edge


def test_every_pair_matches_go(go_types: GoConverter) -> None:
    inputs = [(d, to) for d in go_inputs() for to in ALL_VERSIONS
              if go_types.has_1_1 or ("1.1.0" not in (d.get("cniVersion"), to))]
    if go_types.has_1_1:
        inputs += [(v11_sample(), to) for to in ALL_VERSIONS]
        inputs += [({**sample(v), "routes": [{"dst": "10.0.0.0/8", "mtu": 1400, "table": 3}]}, to)
                   for v in V04 for to in ALL_VERSIONS]
        legacy_attrs = {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24", "routes": [
            {"dst": "fd00::/64", "mtu": 1400}, {"dst": "10.1.0.0/16", "advmss": 1300, "scope": 0}]}}
        inputs += [(legacy_attrs, to) for to in ALL_VERSIONS]
    answers = go_types.convert(inputs)
    assert len(answers) == len(inputs)
    mismatches = []
    for (doc, to), ans in zip(inputs, answers, strict=True):
        try:
            ours: Any = {"result": Result.from_dict(doc).to_dict(to)}
        except CNIError as e:
            ours = {"error": str(e)}
        theirs = ans
        if "result" in theirs and not go_types.has_1_1 and to in V1 and theirs["result"].get("dns") == {}:
            # libcni 1.1.x printed an empty "dns" for 1.x results; the current reference omits it.
            theirs = {"result": {k: v for k, v in theirs["result"].items() if k != "dns"}}
        if ("error" in ours) != ("error" in theirs) or ours.get("result") != theirs.get("result"):
            mismatches.append((doc, to, ours, theirs))
    assert not mismatches, json.dumps(mismatches[:3], indent=1)


@pytest.mark.parametrize("raw,is_set", [
    (None, False), ({}, False), ({"domain": ""}, False), ({"nameservers": None}, False),
    ({"nameservers": []}, True), ({"search": []}, True), ({"options": ["x"]}, True), ({"domain": "a.test"}, True),
])
def test_dns_is_set_as_gos_dnsconfset(raw: Any, is_set: bool) -> None:
    """A plugin's `dns` overrides IPAM's when any list is given, even empty, or a domain (Go's dnsConfSet)."""
    assert DNS.is_set(raw) is is_set
