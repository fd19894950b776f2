"""host-local IPAM: in-process (dispatch), through the installed shim, and against the Go binary.

host-local touches no namespace, so these tests need none: every dataDir lives in tmp_path.
The Go reference (/usr/lib/cni/host-local, v1.1.1, spec up to 1.0.0) runs on the same configs
and, where it matters, the same dataDir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plugin_util
import pytest
from plugin_util import answer, ok

from pycni.plugins.ipam import host_local
from pycni.spec.version import ALL_VERSIONS

GO_DIR = "/usr/lib/cni"
GO_HOST_LOCAL = GO_DIR + "/host-local"
have_go = pytest.mark.skipif(not os.access(GO_HOST_LOCAL, os.X_OK), reason="Go host-local not installed")
GO_VERSIONS = [v for v in ALL_VERSIONS if v != "1.1.0"]  # the Debian build speaks up to 1.0.0

Reply = tuple[int, dict[str, Any]]


NO_NETNS = "/var/run/netns/unused"  # host-local never enters it


def run_via(conf: dict[str, Any] | bytes, command: str = "ADD", cid: str = "ctr1", ifname: str = "eth0",
            cni_args: str = "", *, via: str = "dispatch", cni_path: str = GO_DIR) -> Reply:
    return answer(plugin_util.run("host-local", command, conf, via=via, cni_path=cni_path, container_id=cid,
                                  netns=NO_NETNS, ifname=ifname, args=cni_args))


def run_py(conf: dict[str, Any] | bytes, command: str = "ADD", cid: str = "ctr1", ifname: str = "eth0",
           cni_args: str = "") -> Reply:
    return run_via(conf, command, cid, ifname, cni_args)


def run_go(conf: dict[str, Any] | bytes, command: str = "ADD", cid: str = "ctr1", ifname: str = "eth0",
           cni_args: str = "") -> Reply:
    return run_via(conf, command, cid, ifname, cni_args, via="exec")


def net_conf(data_dir: Path, ipam: dict[str, Any] | None = None, version: str = "1.0.0",
             name: str = "testnet", **extra: Any) -> dict[str, Any]:
    ipam = {"type": "host-local", "subnet": "10.1.2.0/24", **(ipam or {})}
    ipam = {k: v for k, v in ipam.items() if v is not None}  # None: leave the key out
    ipam["dataDir"] = str(data_dir)
    return {"cniVersion": version, "name": name, "type": "bridge", "ipam": ipam, **extra}


def reservations(data_dir: Path, name: str = "testnet") -> dict[str, bytes]:
    """Every file of the network's store except the lock, with its bytes."""
    d = data_dir / name
    if not d.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "lock"}


def ip_files(data_dir: Path, name: str = "testnet") -> dict[str, bytes]:
    return {k: v for k, v in reservations(data_dir, name).items() if not k.startswith("last_reserved_ip.")}


def addresses(reply: Reply) -> list[str]:
    code, res = reply
    assert code == 0, res
    return [ip["address"] for ip in res.get("ips", [])]


def without_empty_dns(res: dict[str, Any]) -> dict[str, Any]:
    """libcni 1.1 (Go binary) prints "dns": {} in 1.0 results, newer libcni omits it: equal either way."""
    return {k: v for k, v in res.items() if not (k == "dns" and v == {})}


# ---- basics ------------------------------------------------------------------------------------


def test_add_legacy_subnet_result_and_disk_layout(tmp_path: Path) -> None:
    conf = net_conf(tmp_path, {"routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.1.2.254"}]})
    code, res = run_py(conf, cid="ctr1")
    assert code == 0, res
    assert without_empty_dns(res) == {
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.1.2.2/24", "gateway": "10.1.2.1"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.1.2.254"}],
    }
    assert reservations(tmp_path) == {"10.1.2.2": b"ctr1\r\neth0", "last_reserved_ip.0": b"10.1.2.2"}
    assert (tmp_path / "testnet" / "lock").exists()
    assert (tmp_path / "testnet" / "10.1.2.2").stat().st_mode & 0o777 == 0o600


def test_round_robin_continues_after_release(tmp_path: Path) -> None:
    conf = net_conf(tmp_path)
    assert addresses(run_py(conf, cid="a")) == ["10.1.2.2/24"]
    assert addresses(run_py(conf, cid="b")) == ["10.1.2.3/24"]
    assert run_py(conf, "DEL", cid="a") == (0, {})
    # The freed .2 is not handed out again until the range has been walked through.
    assert addresses(run_py(conf, cid="c")) == ["10.1.2.4/24"]
    assert set(ip_files(tmp_path)) == {"10.1.2.3", "10.1.2.4"}


def test_exhaustion_wraps_then_fails_with_reference_message(tmp_path: Path) -> None:
    conf = net_conf(tmp_path, {"rangeStart": "10.1.2.10", "rangeEnd": "10.1.2.12"})
    assert [addresses(run_py(conf, cid=c))[0] for c in "abc"] == ["10.1.2.10/24", "10.1.2.11/24", "10.1.2.12/24"]
    code, err = run_py(conf, cid="d")
    assert code == 1
    assert err["code"] == 999
    assert err["msg"] == "failed to allocate for range 0: no IP addresses available in range set: " \
                         "10.1.2.10-10.1.2.12"
    assert run_py(conf, "DEL", cid="b")[0] == 0
    assert addresses(run_py(conf, cid="d")) == ["10.1.2.11/24"]


def test_duplicate_add_is_refused_and_keeps_the_first(tmp_path: Path) -> None:
    conf = net_conf(tmp_path)
    assert addresses(run_py(conf)) == ["10.1.2.2/24"]
    code, err = run_py(conf)
    assert code == 1 and err["code"] == 999
    assert err["msg"] == "failed to allocate for range 0: 10.1.2.2 has been allocated to ctr1, duplicate " \
                         "allocation is not allowed"
    assert ip_files(tmp_path) == {"10.1.2.2": b"ctr1\r\neth0"}
    # Another interface of the same container is another attachment.
    assert addresses(run_py(conf, ifname="net1")) == ["10.1.2.3/24"]


def test_dual_stack_ranges(tmp_path: Path) -> None:
    conf = net_conf(tmp_path, {"subnet": None, "ranges": [
        [{"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.100"}, {"subnet": "10.1.3.0/24"}],
        [{"subnet": "2001:db8:1::/64", "gateway": "2001:db8:1::fffe"}],
    ]})
    code, res = run_py(conf)
    assert code == 0, res
    assert res["ips"] == [{"address": "10.1.2.100/24", "gateway": "10.1.2.1"},
                          {"address": "2001:db8:1::1/64", "gateway": "2001:db8:1::fffe"}]
    assert reservations(tmp_path) == {"10.1.2.100": b"ctr1\r\neth0", "2001:db8:1::1": b"ctr1\r\neth0",
                                      "last_reserved_ip.0": b"10.1.2.100", "last_reserved_ip.1": b"2001:db8:1::1"}
    assert run_py(conf, "CHECK") == (0, {})
    assert run_py(conf, "DEL") == (0, {})
    assert ip_files(tmp_path) == {}


def test_legacy_subnet_comes_before_ranges(tmp_path: Path) -> None:
    conf = net_conf(tmp_path, {"subnet": "10.1.2.0/24", "ranges": [[{"subnet": "2001:db8::/64"}]]})
    assert addresses(run_py(conf)) == ["10.1.2.2/24", "2001:db8::2/64"]


def test_resolv_conf(tmp_path: Path) -> None:
    rc = tmp_path / "resolv.conf"
    rc.write_text("# comment\n; another\nnameserver 10.0.0.53\nnameserver  2001:db8::53 \n"
                  "domain example.com\nsearch a.example b.example\nsearch c.example\n"
                  "options ndots:5 edns0\nnameserver\nbogus line here\n")
    conf = net_conf(tmp_path, {"resolvConf": str(rc)})
    code, res = run_py(conf)
    assert code == 0, res
    assert res["dns"] == {"nameservers": ["10.0.0.53", "2001:db8::53"], "domain": "example.com",
                          "search": ["a.example", "b.example", "c.example"], "options": ["ndots:5", "edns0"]}


def test_del_is_idempotent(tmp_path: Path) -> None:
    conf = net_conf(tmp_path)
    assert addresses(run_py(conf))
    for _ in range(2):
        assert run_py(conf, "DEL") == (0, {})
    assert ip_files(tmp_path) == {}
    assert run_py(net_conf(tmp_path, name="never-used"), "DEL") == (0, {})
    # DEL does not need the ranges (they may have changed, or come from ipRanges at ADD time).
    conf_without_ranges = net_conf(tmp_path, {"subnet": None})
    assert run_py(conf_without_ranges, "DEL") == (0, {})


def test_del_only_releases_its_own_attachment(tmp_path: Path) -> None:
    conf = net_conf(tmp_path)
    run_py(conf, cid="a")
    run_py(conf, cid="a", ifname="net1")
    run_py(conf, cid="b")
    assert run_py(conf, "DEL", cid="a", ifname="eth0") == (0, {})
    assert ip_files(tmp_path) == {"10.1.2.3": b"a\r\nnet1", "10.1.2.4": b"b\r\neth0"}


def test_check(tmp_path: Path) -> None:
    conf = net_conf(tmp_path)
    code, res = run_py(conf)
    assert code == 0
    assert run_py(conf, "CHECK") == (0, {})
    assert run_py({**conf, "prevResult": res}, "CHECK") == (0, {})
    forged = {**res, "ips": [{"address": "10.1.2.77/24", "gateway": "10.1.2.1"}]}
    code, err = run_py({**conf, "prevResult": forged}, "CHECK")
    assert code == 1 and err["code"] == 3 and "10.1.2.77" in err["msg"]
    # A second range set added to the config after ADD: the container holds nothing there.
    grown = net_conf(tmp_path, {"ranges": [[{"subnet": "2001:db8::/64"}]]})
    code, err = run_py(grown, "CHECK")
    assert code == 1 and err["code"] == 3 and "range set 1" in err["msg"]
    run_py(conf, "DEL")
    code, err = run_py(conf, "CHECK")
    assert code == 1 and err["code"] == 3
    assert err["msg"] == "host-local: Failed to find address added by container ctr1"


def test_check_needs_040(tmp_path: Path) -> None:
    code, err = run_py(net_conf(tmp_path, version="0.3.1"), "CHECK")
    assert code == 1 and err["code"] == 1


# ---- requested addresses ------------------------------------------------------------------------


def dual(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return net_conf(tmp_path, {"subnet": None, "ranges": [[{"subnet": "10.1.2.0/24"}],
                                                          [{"subnet": "2001:db8::/64"}]]}, **extra)


def test_requested_ip_from_cni_args(tmp_path: Path) -> None:
    assert addresses(run_py(net_conf(tmp_path), cni_args="IP=10.1.2.50")) == ["10.1.2.50/24"]
    assert reservations(tmp_path)["last_reserved_ip.0"] == b"10.1.2.50"
    # The next automatic allocation continues after the requested one, as in Go.
    assert addresses(run_py(net_conf(tmp_path), cid="b")) == ["10.1.2.51/24"]


def test_requested_ips_comma_separated_and_ignore_unknown(tmp_path: Path) -> None:
    got = addresses(run_py(dual(tmp_path), cni_args="IgnoreUnknown=1;K8S_POD_NAME=p;IP=2001:db8::9,10.1.2.9/24"))
    assert got == ["10.1.2.9/24", "2001:db8::9/64"]


def test_requested_ips_from_args_and_runtime_config(tmp_path: Path) -> None:
    conf = dual(tmp_path, args={"cni": {"ips": ["10.1.2.20"]}}, runtimeConfig={"ips": ["2001:db8::20/64"]})
    assert addresses(run_py(conf)) == ["10.1.2.20/24", "2001:db8::20/64"]


def test_requested_ip_for_one_family_other_allocated(tmp_path: Path) -> None:
    assert addresses(run_py(dual(tmp_path), cni_args="IP=2001:db8::30")) == ["10.1.2.2/24", "2001:db8::30/64"]


def test_requested_ip_outside_ranges_leaves_nothing(tmp_path: Path) -> None:
    code, err = run_py(dual(tmp_path), cni_args="IP=10.9.9.9")
    assert code == 1 and err["code"] == 7
    assert err["msg"] == "failed to allocate all requested IPs: 10.9.9.9"
    assert ip_files(tmp_path) == {}  # both families were reserved, then rolled back


def test_two_requests_for_one_range_set(tmp_path: Path) -> None:
    code, err = run_py(net_conf(tmp_path), cni_args="IP=10.1.2.5,10.1.2.6")
    assert code == 1 and err["msg"] == "failed to allocate all requested IPs: 10.1.2.6"
    assert ip_files(tmp_path) == {}


def test_requested_gateway_and_taken(tmp_path: Path) -> None:
    code, err = run_py(net_conf(tmp_path), cni_args="IP=10.1.2.1")
    assert code == 1 and err["code"] == 7
    assert err["msg"] == "failed to allocate for range 0: requested ip 10.1.2.1 is subnet's gateway"
    assert addresses(run_py(net_conf(tmp_path), cid="a", cni_args="IP=10.1.2.40")) == ["10.1.2.40/24"]
    code, err = run_py(dual(tmp_path), cid="b", cni_args="IP=10.1.2.40")
    assert code == 1 and err["code"] == 999
    assert err["msg"] == "failed to allocate for range 0: requested IP address 10.1.2.40 is not available " \
                         "in range set 10.1.2.1-10.1.2.254"
    assert "held by a eth0" in err["details"]
    assert ip_files(tmp_path) == {"10.1.2.40": b"a\r\neth0"}


def test_bad_cni_args(tmp_path: Path) -> None:
    code, err = run_py(net_conf(tmp_path), cni_args="K8S_POD_NAME=p")
    assert code == 1 and err["code"] == 4
    code, err = run_py(net_conf(tmp_path), cni_args="IP=10.1.2.300")
    assert code == 1 and err["code"] == 4 and "10.1.2.300" in err["msg"] + err["details"]
    code, err = run_py(net_conf(tmp_path), cni_args="IP")
    assert code == 1 and err["code"] == 4
    assert ip_files(tmp_path) == {}


# ---- ipRanges capability --------------------------------------------------------------------


@have_go
def test_ip_ranges_runtime_config(tmp_path: Path) -> None:
    conf = net_conf(tmp_path, {"subnet": None}, runtimeConfig={"ipRanges": [
        [{"subnet": "192.168.7.0/24", "rangeStart": "192.168.7.100", "gateway": "192.168.7.254"}]]})
    assert run_py(conf)[1]["ips"] == [{"address": "192.168.7.100/24", "gateway": "192.168.7.254"}]
    # Prepended to configured ranges, as Go does: configured ranges still apply after them.
    both = net_conf(tmp_path, {"ranges": [[{"subnet": "2001:db8::/64"}]]}, runtimeConfig={"ipRanges": [
        [{"subnet": "10.5.0.0/24"}]]})
    assert addresses(run_py(both, cid="b")) == ["10.5.0.2/24", "10.1.2.2/24", "2001:db8::2/64"]
    assert run_py(both, cid="b")[0] == 1  # a second ADD is refused, as always
    # The Go binary agrees on the order.
    assert addresses(run_go(net_conf(tmp_path / "go", {"ranges": [[{"subnet": "2001:db8::/64"}]]},
                                     runtimeConfig={"ipRanges": [[{"subnet": "10.5.0.0/24"}]]}))) == \
        ["10.5.0.2/24", "10.1.2.2/24", "2001:db8::2/64"]
    overlapping = net_conf(tmp_path, runtimeConfig={"ipRanges": [[{"subnet": "10.1.2.0/25"}]]})
    code, err = run_py(overlapping, cid="c")
    assert code == 1 and err["code"] == 7 and err["msg"] == "range set 0 overlaps with 1"


# ---- GC and STATUS (spec 1.1) -----------------------------------------------------------------


def test_gc_releases_what_is_not_valid(tmp_path: Path) -> None:
    conf = dual(tmp_path, version="1.1.0")
    for cid in ("keep", "drop"):
        assert run_py(conf, cid=cid)[0] == 0
    run_py(conf, cid="keep", ifname="net1")
    store = tmp_path / "testnet"
    (store / "10.1.2.200").write_bytes(b"oldstyle")  # Go's old format: container ID only
    (store / "10.1.2.201").write_bytes(b"gone")
    (store / "10.1.2.202").write_bytes(b"")  # a crash mid-write
    (store / "notes.txt").write_bytes(b"drop\r\neth0")  # not a reservation: left alone
    gc_conf = {**conf, "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"},
                                                     {"containerID": "oldstyle", "ifname": "eth0"}]}
    assert run_py(gc_conf, "GC", cid="", ifname="") == (0, {})
    left = ip_files(tmp_path)
    assert left == {"10.1.2.2": b"keep\r\neth0", "2001:db8::2": b"keep\r\neth0", "10.1.2.200": b"oldstyle",
                    "notes.txt": b"drop\r\neth0"}
    assert (store / "last_reserved_ip.0").exists()
    # Nothing valid: everything goes.
    assert run_py({**conf, "cni.dev/valid-attachments": []}, "GC", cid="", ifname="") == (0, {})
    assert set(ip_files(tmp_path)) == {"notes.txt"}


def test_gc_errors_and_versions(tmp_path: Path) -> None:
    code, err = run_py({**dual(tmp_path, version="1.0.0"), "cni.dev/valid-attachments": []}, "GC")
    assert code == 1 and err["code"] == 1  # GC exists from spec 1.1
    code, err = run_py({**dual(tmp_path, version="1.1.0"), "cni.dev/valid-attachments": [{"containerID": 1}]},
                       "GC")
    assert code == 1 and err["code"] == 7
    # GC of a network never used creates nothing.
    assert run_py({**net_conf(tmp_path / "absent", version="1.1.0"), "cni.dev/valid-attachments": []},
                  "GC") == (0, {})
    assert not (tmp_path / "absent").exists()
    assert run_py({**net_conf(tmp_path, version="1.1.0", name="unused"), "cni.dev/valid-attachments": []},
                  "GC") == (0, {})
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("missing", [{}, {"cni.dev/valid-attachments": None}], ids=["absent", "null"])
def test_gc_without_valid_attachments_is_refused_and_frees_nothing(tmp_path: Path, missing: dict[str, Any]) -> None:
    conf = dual(tmp_path, version="1.1.0")
    assert run_py(conf, cid="a")[0] == 0
    before = reservations(tmp_path)
    code, err = run_py({**conf, **missing}, "GC", cid="", ifname="")
    assert code == 1 and err["code"] == 7 and "GC needs 'cni.dev/valid-attachments'" in err["msg"], err
    assert reservations(tmp_path) == before


def test_gc_through_bridge_without_valid_attachments_frees_nothing(netns_factory: Callable[[], Any],
                                                                   plugin_dir: str, tmp_path: Path) -> None:
    """bridge delegates GC to host-local: a GC that reaches it without the list (a runtime that
    sends none, as cnitool's libcni may) is refused and frees nothing; with the list it frees
    exactly the attachments not on it."""
    from runtimes import write_conflist

    from pycni import invoke
    from pycni.runtime import CNI
    from pycni.spec.errors import CNIError

    host, c1, c2 = netns_factory(), netns_factory(), netns_factory()
    data_dir = tmp_path / "ipam"
    bridge = {"type": "bridge", "bridge": "gcbr0",
              "ipam": {"type": "host-local", "subnet": "10.84.0.0/24", "dataDir": str(data_dir)}}
    write_conflist(tmp_path / "net.d", "gcnet", [bridge], version="1.1.0")
    base = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin"), "PYCNI_SOCKET": "off"}
    rt = CNI(conf_dir=str(tmp_path / "net.d"), plugin_path=[plugin_dir], cache_dir=str(tmp_path / "cache"), env=base)
    net = rt.load_network("gcnet")
    gc_env = invoke.plugin_env(base, "GC", path=plugin_dir)
    conf = {"cniVersion": "1.1.0", "name": "gcnet", **bridge}
    with host.enter():
        rt.add(net, "a", c1.path)
        rt.add(net, "b", c2.path)
        before = ip_files(data_dir, "gcnet")
        assert sorted(before.values()) == [b"a\r\neth0", b"b\r\neth0"]
        for missing in ({}, {"cni.dev/valid-attachments": None}):
            with pytest.raises(CNIError) as e:
                invoke.exec_plugin(os.path.join(plugin_dir, "bridge"), json.dumps({**conf, **missing}).encode(),
                                   gc_env)
            assert e.value.code == 7 and "valid-attachments" in e.value.msg
            assert ip_files(data_dir, "gcnet") == before
        listed = {**conf, "cni.dev/valid-attachments": [{"containerID": "b", "ifname": "eth0"}]}
        invoke.exec_plugin(os.path.join(plugin_dir, "bridge"), json.dumps(listed).encode(), gc_env)
        assert sorted(ip_files(data_dir, "gcnet").values()) == [b"b\r\neth0"]
        rt.delete(net, "a", c1.path)
        rt.delete(net, "b", c2.path)
    assert ip_files(data_dir, "gcnet") == {}


def test_whole_address_space_subnets_create_nothing(tmp_path: Path) -> None:
    for subnet in ("0.0.0.0/0", "::/0"):
        code, err = run_py(net_conf(tmp_path, {"subnet": subnet}))
        assert code == 1 and err["code"] == 7 and f"subnet {subnet} is the whole address space" in err["msg"]
    assert not (tmp_path / "testnet").exists()


@pytest.mark.parametrize("length", [4094, 4095, 4096, 5000, 100_000])
def test_long_container_ids_are_released(tmp_path: Path, length: int) -> None:
    """ADD refuses an ID over 255 characters before anything is made (skel); a reservation another
    implementation made for one, longer than a page, is read whole: DEL, CHECK, GC see it."""
    conf = dual(tmp_path, version="1.1.0")
    cid = "c" * length
    code, err = run_py(conf, cid=cid)
    assert code == 1 and err["code"] == 4 and "too long" in err["msg"]
    assert ip_files(tmp_path) == {}
    # What Go's host-local writes for such an ID (its store has no limit): one file per address.
    store = tmp_path / "testnet"
    store.mkdir()
    for ip in ("10.1.2.2", "2001:db8::2"):
        (store / ip).write_bytes(cid.encode() + b"\r\neth0")
    assert run_py(conf, "CHECK", cid=cid) == (0, {})
    assert run_py(conf, "DEL", cid=cid + "x") == (0, {})  # a longer ID is another owner
    assert sorted(ip_files(tmp_path)) == ["10.1.2.2", "2001:db8::2"]
    assert run_py(conf, "DEL", cid=cid) == (0, {})
    assert ip_files(tmp_path) == {}
    for ip in ("10.1.2.2", "2001:db8::2"):
        (store / ip).write_bytes(cid.encode() + b"\r\neth0")
    gc = {**conf, "cni.dev/valid-attachments": [{"containerID": cid, "ifname": "eth0"}]}
    assert run_py(gc, "GC", cid="", ifname="") == (0, {})
    assert sorted(ip_files(tmp_path)) == ["10.1.2.2", "2001:db8::2"]
    assert run_py({**gc, "cni.dev/valid-attachments": []}, "GC", cid="", ifname="") == (0, {})
    assert ip_files(tmp_path) == {}


@pytest.mark.parametrize("length", [4094, 4095, 4096, 5000, 100_000])
def test_store_reads_long_reservations_whole(tmp_path: Path, length: int) -> None:
    """A reservation longer than a page (Go's host-local writes any ID) is read whole: lookups by
    owner, release and GC see it, in a one-shot read and through the index a daemon keeps."""
    from pycni import ipaddr
    from pycni.plugins.ipam.store import Store

    cid = "c" * length
    ip, other = ipaddr.ip_address("10.1.2.2"), ipaddr.ip_address("10.1.2.3")
    with Store("testnet", str(tmp_path)) as store, store.locked():
        assert store.reserve(cid, "eth0", ip, "0") and store.reserve(cid + "x", "eth0", other, "0")
        assert (tmp_path / "testnet" / "10.1.2.2").read_bytes() == cid.encode() + b"\r\neth0"
        for _ in range(3):  # the third lookup in a process is answered by the index
            assert store.get_by_id(cid, "eth0") == [ip]
            assert store.owner_of(ip) == (cid, "eth0")
        assert store.gc([(cid, "eth0"), (cid + "x", "eth0")]) == []
        assert store.release_by_id(cid, "eth0") == ["10.1.2.2"]
        assert store.get_by_id(cid + "x", "eth0") == [other]
        assert store.release_ip(other, cid + "x", "eth0")
    assert ip_files(tmp_path) == {}


@have_go
def test_go_and_python_agree_on_long_container_ids(tmp_path: Path) -> None:
    conf = net_conf(tmp_path)
    long_go = "g" * 20_000
    assert addresses(run_go(conf, cid=long_go)) == ["10.1.2.2/24"]
    assert run_py(conf, cid="p" * 20_000)[1]["code"] == 4  # ours refuses such an ADD up front
    assert run_py(conf, "CHECK", cid=long_go) == (0, {})
    assert run_py(conf, "DEL", cid=long_go) == (0, {})  # and cleans up what Go made with one
    assert ip_files(tmp_path) == {}


@have_go
def test_long_container_ids_of_go_reservations(tmp_path: Path) -> None:
    """Go's host-local takes a 20 KB container ID: our GC keeps that reservation while it is valid
    and releases it once it is not (before, only its first 4 KiB were read, so it never matched)."""
    conf = net_conf(tmp_path, version="1.0.0")
    long_go = "g" * 20_000
    assert addresses(run_go(conf, cid=long_go)) == ["10.1.2.2/24"]
    gc = {**conf, "cniVersion": "1.1.0", "cni.dev/valid-attachments": [{"containerID": long_go, "ifname": "eth0"}]}
    assert run_py(gc, "GC", cid="", ifname="") == (0, {})
    assert list(ip_files(tmp_path)) == ["10.1.2.2"]
    assert run_py({**gc, "cni.dev/valid-attachments": []}, "GC", cid="", ifname="") == (0, {})
    assert ip_files(tmp_path) == {}


def test_status(tmp_path: Path) -> None:
    assert run_py(net_conf(tmp_path, version="1.1.0"), "STATUS") == (0, {})
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, err = run_py(net_conf(blocker, version="1.1.0"), "STATUS")
    assert code == 1 and err["code"] == 50


# ---- versions ----------------------------------------------------------------------------------


def expected_result(version: str) -> dict[str, Any]:
    if version in ("0.1.0", "0.2.0"):
        return {"cniVersion": version, "ip4": {"ip": "10.1.2.2/24", "gateway": "10.1.2.1",
                                               "routes": [{"dst": "0.0.0.0/0"}]},
                "ip6": {"ip": "2001:db8::2/64", "gateway": "2001:db8::1"}, "dns": {}}
    ips = [{"address": "10.1.2.2/24", "gateway": "10.1.2.1"}, {"address": "2001:db8::2/64", "gateway": "2001:db8::1"}]
    if version in ("0.3.0", "0.3.1", "0.4.0"):
        ips = [{"version": v, **ip} for v, ip in zip(("4", "6"), ips, strict=True)]
    return {"cniVersion": version, "ips": ips, "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_every_version_output(tmp_path: Path, version: str) -> None:
    conf = dual(tmp_path, version=version)
    conf["ipam"]["routes"] = [{"dst": "0.0.0.0/0"}]
    code, res = run_py(conf)
    assert code == 0, res
    assert without_empty_dns(res) == without_empty_dns(expected_result(version))


def test_legacy_versions_refuse_two_sets_of_one_family(tmp_path: Path) -> None:
    conf = net_conf(tmp_path, {"ranges": [[{"subnet": "10.1.3.0/24"}]]}, version="0.2.0")
    code, err = run_py(conf)
    assert code == 1 and err["code"] == 1
    assert err["msg"] == "CNI version 0.2.0 does not support more than 1 address per family"
    assert ip_files(tmp_path) == {}


# ---- malformed input -----------------------------------------------------------------------------


def only_ranges(conf: dict[str, Any], ranges: Any) -> None:
    conf["ipam"].pop("subnet", None)
    conf["ipam"]["ranges"] = ranges


BAD_CONFIGS: list[tuple[str, Callable[[dict[str, Any]], None], int, str]] = [
    ("no ipam", lambda c: c.pop("ipam"), 7, "IPAM config missing 'ipam' key"),
    ("ipam not an object", lambda c: c.update(ipam="host-local"), 7, "IPAM config missing 'ipam' key"),
    ("no name", lambda c: c.pop("name"), 7, "missing network name"),
    ("name escapes dataDir", lambda c: c.update(name="../etc"), 7, "invalid characters found in network name"),
    ("subnet not a string", lambda c: c["ipam"].update(subnet=5), 7, "invalid range set 0: subnet must be"),
    ("host bits", lambda c: c["ipam"].update(subnet="10.1.2.3/24"), 7, "invalid range set 0: Network has host"),
    ("too small", lambda c: c["ipam"].update(subnet="10.1.2.0/31"), 7, "too small to allocate from"),
    ("whole IPv4 space", lambda c: c["ipam"].update(subnet="0.0.0.0/0"), 7, "is the whole address space"),
    ("whole IPv6 space", lambda c: only_ranges(c, [[{"subnet": "::/0"}]]), 7, "is the whole address space"),
    ("rangeStart outside", lambda c: c["ipam"].update(rangeStart="10.1.3.1"), 7, "RangeStart 10.1.3.1 not in"),
    ("no ranges", lambda c: c["ipam"].pop("subnet"), 7, "no IP ranges specified"),
    ("ranges not a list", lambda c: only_ranges(c, {"subnet": "10.0.0.0/8"}), 7,
     "'ipam.ranges' must be a list"),
    ("empty range set", lambda c: c["ipam"].update(ranges=[[]]), 7, "invalid range set 1: empty range set"),
    ("mixed families", lambda c: only_ranges(c, [[{"subnet": "10.1.0.0/24"}, {"subnet": "2001:db8::/64"}]]),
     7, "invalid range set 0: mixed address families"),
    ("overlap in set", lambda c: only_ranges(c, [[{"subnet": "10.1.0.0/16"}, {"subnet": "10.1.2.0/24"}]]),
     7, "invalid range set 0: subnets 10.1.0.1-10.1.255.254 and 10.1.2.1-10.1.2.254 overlap"),
    ("overlapping sets", lambda c: c["ipam"].update(ranges=[[{"subnet": "10.1.0.0/16"}]]), 7,
     "range set 0 overlaps with 1"),
    ("bad route", lambda c: c["ipam"].update(routes=[{"dst": "nowhere"}]), 7, "invalid route in ipam.routes"),
    ("dataDir not a string", lambda c: c["ipam"].update(dataDir=["x"]), 7, "'ipam.dataDir' must be a string"),
    ("bad runtime ips", lambda c: c.update(runtimeConfig={"ips": ["10.1.2"]}), 7, "invalid runtimeConfig.ips"),
    ("missing resolvConf", lambda c: c["ipam"].update(resolvConf="/nonexistent/resolv.conf"), 5,
     "cannot read resolvConf"),
]


@pytest.mark.parametrize("label,mutate,code,msg", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_malformed_config(tmp_path: Path, label: str, mutate: Callable[[dict[str, Any]], None], code: int,
                          msg: str) -> None:
    conf = net_conf(tmp_path)
    mutate(conf)
    got, err = run_py(conf)
    assert got == 1
    assert err["code"] == code, err
    assert msg in err["msg"], err
    assert not any(p.is_file() and p.name[0].isdigit() for p in tmp_path.rglob("*")), "reservation left behind"


def test_undecodable_config(tmp_path: Path) -> None:
    code, err = run_py(b'{"cniVersion": "1.0.0", "name": ')
    assert code == 1 and err["code"] == 6
    code, err = run_py(b"[1, 2]")
    assert code == 1 and err["code"] == 6


def test_unwritable_data_dir_is_an_io_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, err = run_py(net_conf(blocker))
    assert code == 1 and err["code"] == 5 and "cannot open data directory" in err["msg"]


def test_imports_stdlib_only(tmp_path: Path) -> None:
    """An ADD, DEL and GC in a fresh interpreter load no third-party module, nor typing or dataclasses."""
    conf = json.dumps(net_conf(tmp_path, version="1.1.0", **{"cni.dev/valid-attachments": []}))
    code = ("import json, os, sys; from pycni.skel import dispatch; from pycni.plugins.ipam import host_local\n"
            "for cmd in ('ADD', 'DEL', 'GC'):\n"
            "    env = {'CNI_COMMAND': cmd, 'CNI_CONTAINERID': 'c', 'CNI_IFNAME': 'eth0', 'CNI_PATH': '/x',\n"
            "           'CNI_NETNS': '/var/run/netns/unused'}\n"
            f"    assert dispatch(host_local.PLUGIN, env, {conf!r}.encode()).exit_code == 0, cmd\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('pyroute2', 'pydantic', 'typing', 'dataclasses')]\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- through the installed shim, in parallel ---------------------------------------------------------


def test_shim_process(tmp_path: Path, plugin_dir: str) -> None:
    conf = net_conf(tmp_path)
    code, res = run_via(conf, via="exec", cni_path=plugin_dir)
    assert code == 0, res
    assert addresses((code, res)) == ["10.1.2.2/24"]
    assert run_via(conf, "CHECK", via="exec", cni_path=plugin_dir) == (0, {})
    assert run_via(conf, "DEL", via="exec", cni_path=plugin_dir) == (0, {})
    code, err = run_via({**conf, "ipam": {"type": "host-local"}}, via="exec", cni_path=plugin_dir)
    assert code == 1 and err["code"] == 7
    version = ok(plugin_util.run("host-local", "VERSION", b"", via="exec", cni_path=plugin_dir))
    assert "1.1.0" in version["supportedVersions"]


def test_parallel_processes_get_distinct_addresses(tmp_path: Path, plugin_dir: str) -> None:
    exe = os.path.join(plugin_dir, "host-local")
    conf = json.dumps(net_conf(tmp_path)).encode()
    procs = [subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=plugin_util.env("ADD", f"ctr{i}", NO_NETNS)) for i in range(32)]
    outs = [p.communicate(conf, timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[0] for o in outs]
    got = [json.loads(o[0])["ips"][0]["address"] for o in outs]
    assert len(set(got)) == 32
    assert sorted(ip_files(tmp_path)) == sorted(a.split("/")[0] for a in got)
    owners = {v for v in ip_files(tmp_path).values()}
    assert owners == {f"ctr{i}\r\neth0".encode() for i in range(32)}


def test_parallel_threads_get_distinct_addresses(tmp_path: Path) -> None:
    conf = net_conf(tmp_path, {"rangeStart": "10.1.2.10", "rangeEnd": "10.1.2.41"})  # exactly 32 addresses
    results: dict[int, Reply] = {}

    def worker(i: int) -> None:
        results[i] = run_py(conf, cid=f"t{i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [addresses(results[i])[0] for i in range(32)]
    assert len(set(got)) == 32
    code, err = run_py(conf, cid="one-too-many")
    assert code == 1 and "no IP addresses available" in err["msg"]


# ---- against the Go reference -----------------------------------------------------------------------


@have_go
@pytest.mark.parametrize("version", GO_VERSIONS)
def test_go_same_results_every_version(tmp_path: Path, version: str) -> None:
    rc = tmp_path / "resolv.conf"
    rc.write_text("nameserver 10.0.0.53\nsearch example.com\noptions ndots:2\n")
    results = {}
    for impl, run in (("go", run_go), ("py", run_py)):
        conf = dual(tmp_path / impl, version=version)
        conf["ipam"].update(routes=[{"dst": "0.0.0.0/0"}, {"dst": "::/0"}], resolvConf=str(rc))
        results[impl] = [run(conf, cid=f"c{i}") for i in range(3)]
        assert run(conf, "DEL", cid="c1")[0] == 0
        results[impl].append(run(conf, cid="c3"))
    assert [(c, without_empty_dns(r)) for c, r in results["py"]] == \
        [(c, without_empty_dns(r)) for c, r in results["go"]]
    assert reservations(tmp_path / "py") == reservations(tmp_path / "go")


@have_go
def test_go_same_allocation_order_across_ranges(tmp_path: Path) -> None:
    ipam = {"subnet": None, "ranges": [[{"subnet": "10.7.0.0/29", "rangeStart": "10.7.0.4"},
                                        {"subnet": "10.7.1.0/29", "gateway": "10.7.1.3"}],
                                       [{"subnet": "2001:db8:7::/125", "rangeStart": "2001:db8:7::2"}]]}
    seq: dict[str, list[Reply]] = {}
    for impl, run in (("go", run_go), ("py", run_py)):
        conf = net_conf(tmp_path / impl, ipam)
        seq[impl] = []
        for i in range(7):  # the v6 set runs out first: errors must match too
            seq[impl].append(run(conf, cid=f"c{i}"))
            if i == 2:
                run(conf, "DEL", cid="c0")
    for (gc, go), (pc, py) in zip(seq["go"], seq["py"], strict=True):
        assert pc == gc
        if gc == 0:
            assert without_empty_dns(py) == without_empty_dns(go)
        else:
            assert py["msg"] == go["msg"]
    assert reservations(tmp_path / "py") == reservations(tmp_path / "go")


@have_go
def test_go_and_python_share_one_data_dir(tmp_path: Path) -> None:
    conf = dual(tmp_path)
    assert addresses(run_go(conf, cid="go1")) == ["10.1.2.2/24", "2001:db8::2/64"]
    # We continue Go's round robin and refuse Go's duplicate.
    assert addresses(run_py(conf, cid="py1")) == ["10.1.2.3/24", "2001:db8::3/64"]
    assert run_py(conf, cid="go1")[1]["msg"].endswith("duplicate allocation is not allowed")
    assert addresses(run_go(conf, cid="go2")) == ["10.1.2.4/24", "2001:db8::4/64"]
    # Each reads the other's reservations: CHECK, DEL.
    assert run_py(conf, "CHECK", cid="go1") == (0, {})
    assert run_go(conf, "CHECK", cid="py1") == (0, {})
    assert run_py(conf, "DEL", cid="go1") == (0, {})
    assert run_go(conf, "DEL", cid="py1") == (0, {})
    assert sorted(ip_files(tmp_path)) == ["10.1.2.4", "2001:db8::4"]
    # Requested addresses taken by the other implementation are refused by both.
    assert run_go(conf, cid="x", cni_args="IP=10.1.2.4")[0] == 1
    assert run_py(conf, cid="x", cni_args="IP=10.1.2.4")[0] == 1
    assert sorted(ip_files(tmp_path)) == ["10.1.2.4", "2001:db8::4"]


@have_go
def test_old_format_reservations(tmp_path: Path) -> None:
    conf = net_conf(tmp_path)
    store = tmp_path / "testnet"
    store.mkdir()
    (store / "10.1.2.9").write_bytes(b"legacy")
    assert run_py(conf, "CHECK", cid="legacy") == (0, {})
    code, err = run_py(conf, cid="legacy")
    assert code == 1 and "10.1.2.9 has been allocated to legacy" in err["msg"]
    assert run_go(conf, cid="legacy")[1]["msg"] == err["msg"]
    assert run_py(conf, "DEL", cid="legacy") == (0, {})
    assert ip_files(tmp_path) == {}


@have_go
@pytest.mark.parametrize("label,mutate,code,msg", [b for b in BAD_CONFIGS if b[2] != 5 and b[0] not in (
    "no name", "name escapes dataDir", "dataDir not a string", "bad route", "whole IPv4 space",
    "whole IPv6 space")], ids=lambda x: x
    if isinstance(x, str) else "")
def test_go_refuses_what_we_refuse(tmp_path: Path, label: str, mutate: Callable[[dict[str, Any]], None],
                                   code: int, msg: str) -> None:
    conf = net_conf(tmp_path)
    mutate(conf)
    go_code, go_err = run_go(conf)
    assert go_code == 1, go_err
    py_code, py_err = run_py(conf)
    assert py_code == 1
    # Same words where Go's are about ranges; Go's JSON decoder errors are phrased by Go.
    if "json:" not in go_err["msg"]:
        assert go_err["msg"] in f"{py_err['msg']}: {py_err.get('details', '')}", (go_err, py_err)


EDGE_RANGES = [
    {"subnet": "10.0.0.0/30"},
    {"subnet": "10.0.0.0/29", "gateway": "10.0.0.6"},
    {"subnet": "10.0.0.0/29", "gateway": "192.168.0.1"},
    {"subnet": "10.0.0.0/29", "gateway": "2001:db8::1"},
    {"subnet": "10.0.0.0/29", "rangeStart": "10.0.0.3", "rangeEnd": "10.0.0.3"},
    {"subnet": "10.0.0.0/29", "rangeStart": "::ffff:10.0.0.4"},
    {"subnet": "2001:db8::/126"},
    {"subnet": "2001:DB8::/125", "rangeStart": "2001:db8::5", "gateway": "2001:db8::6"},
]


@have_go
@pytest.mark.parametrize("ipam", EDGE_RANGES, ids=[json.dumps(r) for r in EDGE_RANGES])
def test_go_same_sequence_on_edge_ranges(tmp_path: Path, ipam: dict[str, Any]) -> None:
    """Allocate until the range runs out: every address, gateway and final error as Go's."""
    seqs = {}
    for impl, run in (("go", run_go), ("py", run_py)):
        conf = net_conf(tmp_path / impl, ipam)
        seq = []
        for i in range(10):
            code, res = run(conf, cid=f"c{i}")
            seq.append((code, res["msg"] if code else res["ips"]))
            if code:
                break
        seqs[impl] = seq
    assert seqs["py"] == seqs["go"]
    assert seqs["py"][-1][0] == 1  # ran out


@have_go
def test_go_same_requested_ip_with_prefix(tmp_path: Path) -> None:
    for impl, run in (("go", run_go), ("py", run_py)):
        code, res = run(net_conf(tmp_path / impl), cni_args="IgnoreUnknown=true;IP=10.1.2.77/24")
        assert code == 0 and res["ips"] == [{"address": "10.1.2.77/24", "gateway": "10.1.2.1"}], impl
    assert reservations(tmp_path / "py") == reservations(tmp_path / "go")


def test_network_and_broadcast_never_handed_out(tmp_path: Path) -> None:
    """Go would hand out 10.0.0.0 and 10.0.0.7 when rangeStart/rangeEnd name them; we skip them."""
    conf = net_conf(tmp_path, {"subnet": "10.0.0.0/29", "rangeStart": "10.0.0.0", "rangeEnd": "10.0.0.7"})
    got = [addresses(run_py(conf, cid=f"c{i}"))[0] for i in range(5)]
    assert got == ["10.0.0.2/29", "10.0.0.3/29", "10.0.0.4/29", "10.0.0.5/29", "10.0.0.6/29"]
    assert "no IP addresses available" in run_py(conf, cid="c5")[1]["msg"]
    code, err = run_py(conf, cid="c6", cni_args="IP=10.0.0.7")
    assert code == 1 and err["code"] == 7 and "broadcast" in err["msg"]


@have_go
def test_parallel_go_and_python_share_the_lock(tmp_path: Path, plugin_dir: str) -> None:
    """16 Go and 16 Python ADDs at once on one network: flock on the same lock file keeps them apart."""
    ours = os.path.join(plugin_dir, "host-local")
    conf = json.dumps(net_conf(tmp_path, {"rangeStart": "10.1.2.100", "rangeEnd": "10.1.2.131"})).encode()
    procs = [subprocess.Popen([GO_HOST_LOCAL if i % 2 else ours], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=plugin_util.env("ADD", f"ctr{i}", NO_NETNS))
             for i in range(32)]
    outs = [p.communicate(conf, timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[0] for o in outs]
    got = {json.loads(o[0])["ips"][0]["address"] for o in outs}
    assert got == {f"10.1.2.{i}/24" for i in range(100, 132)}  # all 32 addresses, each once
    assert len(ip_files(tmp_path)) == 32


def test_many_reservations_continue_after_the_cursor(tmp_path: Path) -> None:
    """A big, mostly full network: ADD goes straight past the cursor, wraps, and finds the holes."""
    store = tmp_path / "testnet"
    store.mkdir()
    conf = net_conf(tmp_path, {"subnet": "10.20.0.0/16"})
    for i in range(2, 3002):
        (store / f"10.20.{i >> 8}.{i & 255}").write_bytes(f"old{i}\r\neth0".encode())
    (store / "last_reserved_ip.0").write_bytes(b"10.20.11.185")  # the last one written (i = 3001)
    assert addresses(run_py(conf, cid="new1")) == ["10.20.11.186/16"]
    # At the end of the range the cursor wraps to the start, skips the gateway, walks past
    # the 3000 reservations and takes the first hole.
    (store / "10.20.5.5").unlink()
    (store / "last_reserved_ip.0").write_bytes(b"10.20.255.254")
    assert addresses(run_py(conf, cid="new2")) == ["10.20.5.5/16"]
    assert addresses(run_py(conf, cid="new3")) == ["10.20.11.187/16"]
    assert run_py(conf, "DEL", cid="old77") == (0, {})
    assert not (store / "10.20.0.77").exists()


def test_daemon_mode_gives_the_same_answers(tmp_path: Path, host_ns: Any) -> None:
    """Shims forwarding to a pycni daemon (run from a throwaway namespace): same results, no double IPs."""
    from pycni.daemon.server import Daemon
    from pycni.install_plugins import install

    bin_dir = tmp_path / "bin"
    exe = install(str(bin_dir), ["host-local"], daemon=True)[0]
    sock = str(tmp_path / "pycni.sock")
    daemon = Daemon(sock, preload=False)
    daemon.bind()
    server = threading.Thread(target=daemon.serve_forever)
    server.start()
    try:
        conf = json.dumps(net_conf(tmp_path / "data")).encode()
        procs = []
        for i in range(16):
            env = plugin_util.env("ADD", f"d{i}", NO_NETNS, PYCNI_SOCKET=sock)
            procs.append(subprocess.Popen(["ip", "netns", "exec", host_ns.name, exe], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env))
        outs = [p.communicate(conf, timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        got = sorted(json.loads(o[0])["ips"][0]["address"] for o in outs)
        assert len(set(got)) == 16
        assert "host-local" in daemon.plugins  # served by the daemon, not in the shim process
        # The reply and the store are what the in-process plugin would have produced.
        env = plugin_util.env("ADD", "x", NO_NETNS, PYCNI_SOCKET=sock)
        via_daemon = subprocess.run(["ip", "netns", "exec", host_ns.name, exe], input=conf, env=env,
                                    capture_output=True, timeout=60)
        assert via_daemon.returncode == 0
        assert without_empty_dns(json.loads(via_daemon.stdout)) == {
            "cniVersion": "1.0.0", "ips": [{"address": "10.1.2.18/24", "gateway": "10.1.2.1"}]}
        assert ip_files(tmp_path / "data")["10.1.2.18"] == b"x\r\neth0"
        env = plugin_util.env("DEL", "x", NO_NETNS, PYCNI_SOCKET=sock)
        subprocess.run(["ip", "netns", "exec", host_ns.name, exe], input=conf, env=env, check=True, timeout=60)
        assert "10.1.2.18" not in ip_files(tmp_path / "data")
    finally:
        daemon.stop()
        server.join(timeout=10)


# ---- the store on its own ------------------------------------------------------------------------------


def test_store_lock_times_out_with_try_again(tmp_path: Path) -> None:
    import fcntl

    from pycni.plugins.ipam.store import Store
    from pycni.spec.errors import CNIError

    with Store("n", str(tmp_path)) as holder, holder.locked():
        with Store("n", str(tmp_path), lock_timeout=0.2) as waiter:
            with pytest.raises(CNIError) as e, waiter.locked():
                pass
            assert e.value.code == 11 and "busy" in e.value.msg
        # A lock taken the way Go's filemutex takes it blocks us the same way.
    with open(tmp_path / "n" / "lock") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        with Store("n", str(tmp_path), lock_timeout=0.1) as waiter, pytest.raises(CNIError), waiter.locked():
            pass
    with Store("n", str(tmp_path), lock_timeout=0.1) as s, s.locked():
        pass  # free again


def test_store_primitives(tmp_path: Path) -> None:
    from pycni import ipaddr
    from pycni.plugins.ipam.store import Store

    a = ipaddr.ip_address("10.0.0.5")
    with Store("n", str(tmp_path)) as s:
        assert s.last_reserved_ip("0") is None
        assert s.reserve("c1", "eth0", a, "0") is True
        assert s.reserve("c2", "eth0", a, "0") is False
        assert s.owner_of(a) == ("c1", "eth0")
        assert s.release_ip(a, "c2", "eth0") is False  # not the owner: untouched
        assert s.get_by_id("c1", "eth0") == [a]
        assert s.release_ip(a, "c1", "eth0") is True
        assert s.get_by_id("c1", "eth0") == []
        (tmp_path / "n" / "last_reserved_ip.3").write_text("::ffff:10.0.0.9\n")  # tolerant of odd writers
        assert s.last_reserved_ip("3") == ipaddr.ip_address("10.0.0.9")
        (tmp_path / "n" / "last_reserved_ip.4").write_text("garbage")
        assert s.last_reserved_ip("4") is None
        (tmp_path / "n" / "subdir").mkdir()  # never created by host-local; ignored, not fatal
        assert s.release_by_id("nobody", "eth0") == []


# ---- a wrong JSON type for every key ------------------------------------------------------------
SAMPLES: dict[type, Any] = {int: 5, bool: False, str: "x", list: ["x"], dict: {"x": 1}, float: 1.5}
IPAM_KEYS = {"subnet": str, "rangeStart": str, "rangeEnd": str, "gateway": str, "ranges": list, "routes": list,
             "dataDir": str, "resolvConf": str}
TOP_KEYS = {"runtimeConfig": dict, "args": dict}
WRONG = [(where, key, value) for where, keys in (("ipam", IPAM_KEYS), ("top", TOP_KEYS))
         for key, want in keys.items() for have, value in SAMPLES.items() if have is not want]


@pytest.mark.parametrize(("where", "key", "value"), WRONG, ids=[f"{w}-{k}-{type(v).__name__}" for w, k, v in WRONG])
def test_wrong_type_reserves_nothing(tmp_path: Path, where: str, key: str, value: Any) -> None:
    conf = net_conf(tmp_path)
    (conf["ipam"] if where == "ipam" else conf)[key] = value
    for command in ("ADD", "CHECK"):
        code, err = run_py(conf, command)
        assert code == 1 and err["code"] in (6, 7), (command, err)
    assert reservations(tmp_path) == {} and not any(tmp_path.iterdir())


def test_taken_values_read_only_address_names() -> None:
    """The walk past a full range skips by integer: both families apart, the store's own files out."""
    names = {"10.20.0.2", "10.20.0.3", "2001:db8::5", "lock", "last_reserved_ip.0", "10.20", "bogus"}
    taken = host_local._taken_values(names)
    assert taken[4] == {0x0A140002, 0x0A140003}
    assert taken[6] == {0x20010DB8 << 96 | 5}
