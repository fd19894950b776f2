"""Refused input changes nothing (issue: reliability): the main plugins validate everything —
config, args, runtimeConfig, CNI_ARGS, ifname, the IPAM section — before their first change,
and roll back every change, host-wide ones included (bridge, ip_forward, nat chains), when a
later step fails. Each case snapshots the host and the container namespace before and after."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import err, ok, run

from pycni.plugins.main import bridge, host_device, ptp, tap
from pycni.skel import Plugin

SUBNET = "10.77.0.0/24"


def snapshot(ns: Namespace) -> dict[str, Any]:
    """Links (name, admin state, alias, addresses), routes, forwarding sysctls and nat rules of ``ns``."""
    links = json.loads(ns.run(["ip", "-j", "addr", "show"]).stdout)
    state = {
        "links": sorted((x["ifname"], "UP" in x.get("flags", []), x.get("ifalias", ""),
                         tuple(sorted(f"{a['local']}/{a['prefixlen']}" for a in x.get("addr_info", []))))
                        for x in links),
        # Not what the kernel does on its own when a bridge first gets a port: "linkdown" (a port-less
        # bridge's carrier) and the local route of its IPv6 link-local address (once DAD is over).
        "routes": "\n".join(line.replace(" linkdown", "") for line in ns.run(
            ["ip", "route", "show", "table", "all"]).stdout.splitlines() if not line.startswith("local fe80:")),
        "forward": ns.run(["sysctl", "-n", "net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"]).stdout,
        "nft": ns.run(["nft", "list", "ruleset"], check=False).stdout,
    }
    ipt = ns.run(["iptables-save", "-t", "nat"], check=False)
    state["iptables"] = "\n".join(line for line in ipt.stdout.splitlines() if not line.startswith(("#", ":")))
    return state


def files(d: Path, ipam_ran: bool = False) -> list[str]:
    """The state files under ``d``; with ``ipam_ran``, not host-local's (its lock and last-reserved
    marker stay after a release, as the reference's do)."""
    found = sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []
    return [f for f in found if not (ipam_ran and f.startswith("ipam"))]


def refused(plugin: Plugin, host: Namespace, ctr: Namespace, conf: dict[str, Any], cni_path: str,
            data: Path, ipam_ran: bool = False, **kw: Any) -> dict[str, Any]:
    """Run ADD; assert it fails and leaves host, container and ``data`` as they were."""
    before = {"host": snapshot(host), "container": snapshot(ctr), "files": files(data, ipam_ran)}
    e = err(run(plugin, "ADD", conf, host=host, netns=ctr, cni_path=cni_path, **kw))
    after = {"host": snapshot(host), "container": snapshot(ctr), "files": files(data, ipam_ran)}
    changed: dict[str, Any] = {}
    for where, was in before.items():
        now = after[where]
        if was != now:
            changed[where] = {k: (was[k], now[k]) for k in was if was[k] != now[k]} if isinstance(was, dict) \
                else (was, now)
    assert not changed, (e, changed)
    if ipam_ran:
        assert [f for f in files(data) if f.split("/")[-1][0].isdigit()] == [], "a reservation is left"
    return e


def ipam(data: Path, **extra: Any) -> dict[str, Any]:
    return {"type": "host-local", "subnet": SUBNET, "dataDir": str(data / "ipam"), **extra}


def with_ipam(data: Path, conf: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with ``extra`` on top; an ``ipam`` in ``extra`` amends :func:`ipam` (its dataDir
    stays in ``data``: without one, host-local writes the machine's /var/lib/cni/networks); any
    other ``ipam`` value replaces it (the wrong-type cases)."""
    amend = extra.get("ipam")
    return {**conf, **extra, **({"ipam": ipam(data, **amend)} if isinstance(amend, dict) else {})}


# ---- bridge --------------------------------------------------------------------------------------
def _bridge(data: Path, **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "refnet", "type": "bridge", "bridge": "refbr0", "isGateway": True,
            "ipMasq": True, "ipam": ipam(data)} | with_ipam(data, {}, extra)


@pytest.mark.parametrize(("extra", "env", "code"), [
    ({"runtimeConfig": "x"}, {}, 7),
    ({"args": "x"}, {}, 7),
    ({"args": {"cni": "x"}}, {}, 7),
    ({"dns": []}, {}, None),
    ({"mtu": 65536}, {}, 7),
    ({"ipam": {"type": "no-such-ipam"}}, {}, 7),
    ({}, {"args": "FOO=1"}, 4),
    ({}, {"container_id": "c" * 100_000}, 4),
    ({}, {"ifname": "lo"}, None),
])
def test_bridge_refusal_changes_nothing(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                        tmp_path: Path, extra: dict[str, Any], env: dict[str, str],
                                        code: int | None) -> None:
    conf = _bridge(tmp_path, **extra)
    e = refused(bridge.PLUGIN, host_ns, container_ns, conf, plugin_dir, tmp_path, ipam_ran="ipam" in extra, **env)
    if code is not None:
        assert e["code"] == code, e


def test_bridge_gateway_outside_the_subnet_is_accepted_as_the_reference_does(
        netns_factory: Any, plugin_dir: str, tmp_path: Path) -> None:
    """Not a refusal: Go's bridge takes a host-local gateway outside the subnet too (the bridge gets
    it with the subnet's mask). Run with its dataDir in ``tmp_path``: without one this case once
    wrote the machine's /var/lib/cni and its outcome depended on what an earlier run left there."""
    results = {}
    for who in ("go", "ours"):
        host, ctr = netns_factory(), netns_factory()
        conf = _bridge(tmp_path / who, ipMasq=False, ipam={"gateway": "10.99.0.1"})
        if who == "ours":
            got = ok(run("bridge", "ADD", conf, host=host, netns=ctr, cni_path=plugin_dir))
        else:
            got = ok(run("bridge", "ADD", conf, via="exec", host=host, netns=ctr))
        bridge_addrs = host.run(["ip", "-br", "-4", "addr", "show", "refbr0"]).stdout.split()[2:]
        results[who] = ([(x["address"], x.get("gateway")) for x in got["ips"]], bridge_addrs)
    assert results["ours"] == results["go"] == ([("10.77.0.1/24", "10.99.0.1")], ["10.99.0.1/24"]), results


def test_bridge_failure_after_the_bridge_exists_keeps_the_existing_bridge(host_ns: Namespace,
                                                                          container_ns: Namespace, plugin_dir: str,
                                                                          tmp_path: Path) -> None:
    """A bridge that was there before the failed ADD is not ours to delete."""
    host_ns.run(["ip", "link", "add", "refbr0", "type", "bridge"])
    refused(bridge.PLUGIN, host_ns, container_ns, _bridge(tmp_path), plugin_dir, tmp_path, ifname="lo")


@pytest.mark.parametrize("backend", ["iptables", "nftables"])
def test_bridge_late_failure_rolls_back_everything(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                                   tmp_path: Path, backend: str) -> None:
    """The bridge already holds another IPv4 address (no forceAddress): ADD fails at the gateway step,
    after the veth, the reservation and the masquerade rules were made — all of them go."""
    host_ns.run(["ip", "link", "add", "refbr0", "type", "bridge"])
    host_ns.run(["ip", "addr", "add", "10.99.9.1/24", "dev", "refbr0"])
    host_ns.run(["ip", "link", "set", "refbr0", "up"])
    host_ns.run(["sysctl", "-qw", "net.ipv6.conf.refbr0.accept_ra=0"])  # as ADD leaves it on a bridge it uses
    for _ in range(100):  # the kernel adds the link's IPv6 multicast route a moment after "up": settle first
        if "ff00::/8" in host_ns.run(["ip", "-6", "route", "show", "table", "local", "dev", "refbr0"]).stdout:
            break
        time.sleep(0.02)
    e = refused(bridge.PLUGIN, host_ns, container_ns, _bridge(tmp_path, ipMasqBackend=backend), plugin_dir, tmp_path,
                ipam_ran=True)
    assert "already has an IP address" in e["msg"], e


# ---- ptp -----------------------------------------------------------------------------------------
def _ptp(data: Path, **extra: Any) -> dict[str, Any]:
    return with_ipam(data, {"cniVersion": "1.0.0", "name": "refnet", "type": "ptp", "ipMasq": True, "ipam": ipam(data)},
                     extra)


@pytest.mark.parametrize(("extra", "env"), [
    ({"dns": []}, {}),
    ({"mtu": 65536}, {}),
    ({"runtimeConfig": "x"}, {}),
    ({}, {"ifname": "lo"}),
    ({}, {"container_id": "c" * 100_000}),
])
def test_ptp_refusal_changes_nothing(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                     tmp_path: Path, extra: dict[str, Any], env: dict[str, str]) -> None:
    refused(ptp.PLUGIN, host_ns, container_ns, _ptp(tmp_path, **extra), plugin_dir, tmp_path, **env)


# ---- host-device ---------------------------------------------------------------------------------
def _hostdev(data: Path, **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "refnet", "type": "host-device", "device": "hd0",
            "dataDir": str(data / "hd"), "ipam": ipam(data)} | with_ipam(data, {}, extra)


@pytest.mark.parametrize(("extra", "env"), [
    ({"args": "x"}, {}),
    ({"runtimeConfig": "x"}, {}),
    ({"dns": []}, {}),
    ({}, {"args": "FOO=1"}),
    ({}, {"ifname": "lo"}),
])
def test_host_device_refusal_changes_nothing(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                             tmp_path: Path, extra: dict[str, Any], env: dict[str, str]) -> None:
    host_ns.run(["ip", "link", "add", "hd0", "type", "veth", "peer", "name", "hd0p"])
    host_ns.run(["ip", "addr", "add", "192.168.5.1/24", "dev", "hd0"])
    host_ns.run(["ip", "link", "set", "hd0", "up"])
    refused(host_device.PLUGIN, host_ns, container_ns, _hostdev(tmp_path, **extra), plugin_dir, tmp_path,
            ipam_ran="ipam" in extra, **env)


def test_host_device_refuses_loopback_before_touching_it(host_ns: Namespace, container_ns: Namespace,
                                                         plugin_dir: str, tmp_path: Path) -> None:
    host_ns.run(["ip", "link", "set", "lo", "up"])
    e = refused(host_device.PLUGIN, host_ns, container_ns, _hostdev(tmp_path, device="lo"), plugin_dir, tmp_path)
    assert e["code"] == 7 and "lo" in e["msg"], e


def test_host_device_that_cannot_move_is_left_as_it_was(host_ns: Namespace, container_ns: Namespace,
                                                          plugin_dir: str, tmp_path: Path) -> None:
    """A bridge is local to its namespace: the kernel refuses the move, and the device stays up with its address."""
    host_ns.run(["ip", "link", "add", "hdbr0", "type", "bridge"])
    host_ns.run(["ip", "addr", "add", "192.168.6.1/24", "dev", "hdbr0"])
    host_ns.run(["ip", "link", "set", "hdbr0", "up"])
    e = refused(host_device.PLUGIN, host_ns, container_ns, _hostdev(tmp_path, device="hdbr0"), plugin_dir, tmp_path)
    assert "failed to move" in e["msg"], e


# ---- tap -----------------------------------------------------------------------------------------
def test_tap_at_010_leaves_no_tap(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                  tmp_path: Path) -> None:
    """A 0.1.0 config cannot hold tap's result (no interfaces): refused before the tap is made."""
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("no /dev/net/tun here")
    conf = {"cniVersion": "0.1.0", "name": "refnet", "type": "tap"}
    e = refused(tap.PLUGIN, host_ns, container_ns, conf, plugin_dir, tmp_path)
    assert e["code"] != 999, e


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
@pytest.mark.parametrize("plugin", ["bridge", "host-device", "macvlan"])
def test_l2_at_010_is_refused_before_anything(host_ns: Namespace, netns_factory: Any, plugin_dir: str,
                                              tmp_path: Path, plugin: str, version: str) -> None:
    """Without IPAM the result has no address, which a 0.1.0/0.2.0 result cannot carry: code 1,
    nothing made, and the reference's msg (`cannot convert: no valid IP addresses`; upstream's
    bridge_test.go expects it). Go's executable fails with that msg after making the bridge,
    veth and container interface, and leaves them; ours refuses first."""
    from pycni.plugins.registry import load

    if plugin == "bridge":
        conf: dict[str, Any] = {"cniVersion": version, "name": "refnet", "type": "bridge", "bridge": "refbr0"}
    elif plugin == "host-device":
        host_ns.run(["ip", "link", "add", "hd0", "type", "veth", "peer", "name", "hd0p"])
        conf = {"cniVersion": version, "name": "refnet", "type": "host-device", "device": "hd0",
                "dataDir": str(tmp_path / "hd")}
    else:
        host_ns.run(["ip", "link", "add", "rfm0", "type", "veth", "peer", "name", "rfm1"])
        host_ns.run(["ip", "link", "set", "rfm0", "up"])
        conf = {"cniVersion": version, "name": "refnet", "type": "macvlan", "master": "rfm0"}
    e = refused(load(plugin), host_ns, netns_factory(), conf, plugin_dir, tmp_path)
    assert e["code"] == 1 and e["msg"] == "cannot convert: no valid IP addresses", e
    assert version in e["details"] and "ipam" in e["details"]
    go = f"/usr/lib/cni/{plugin}"
    if plugin == "host-device" or not os.access(go, os.X_OK):
        return  # Go's host-device moves the device in, then fails: no need to show it twice
    ctr = netns_factory()
    out = run(plugin, "ADD", conf, via="exec", host=host_ns, netns=ctr)
    assert out.exit_code == 1 and json.loads(out.stdout)["msg"] == e["msg"]
    assert "eth0" in ctr.run(["ip", "-br", "link"]).stdout  # what Go leaves behind


# ---- skel ----------------------------------------------------------------------------------------
def _refusal(stdin: bytes, container_id: str = "c1", ifname: str = "eth0") -> dict[str, Any]:
    """bridge's ADD refused before it touches anything (no namespace needed)."""
    out = run("bridge", "ADD", stdin, cni_path="/nonexistent", container_id=container_id,
              netns="/var/run/netns/none", ifname=ifname)
    assert out.exit_code == 1
    return json.loads(out.stdout)


def test_deeply_nested_json_is_a_decode_error() -> None:
    assert _refusal(b"[" * 100_000 + b"]" * 100_000)["code"] == 6
    assert _refusal(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)["code"] == 6


def test_non_utf8_ifname_is_an_env_error() -> None:
    ifname = b"eth\xff".decode("utf-8", "surrogateescape")  # what os.environ holds for that byte
    e = _refusal(ifname=ifname, stdin=b'{"cniVersion":"1.0.0","name":"n","type":"bridge"}')
    assert e["code"] == 4 and "UTF-8" in e["msg"], e


def test_overlong_container_id_is_an_env_error() -> None:
    e = _refusal(container_id="c" * 256, stdin=b'{"cniVersion":"1.0.0","name":"n","type":"bridge"}')
    assert e["code"] == 4 and "too long" in e["msg"], e
    # 255 bytes (the longest a file name can be, which several plugins and the cache name after it) passes on
    e = _refusal(container_id="c" * 255, stdin=b'{"cniVersion":"1.0.0","name":"n","type":"bridge"}')
    assert "too long" not in e["msg"], e




# ---- a wrong JSON type for every key -------------------------------------------------------------
BRIDGE_KEYS = {"bridge": 5, "isGateway": "yes", "isDefaultGateway": 1, "forceAddress": "x", "ipMasq": 1,
               "ipMasqBackend": 3, "mtu": "1500", "hairpinMode": 0, "promiscMode": "no", "vlan": True,
               "vlanTrunk": "x", "preserveDefaultVlan": 2, "macspoofchk": "t", "enabledad": 1,
               "disableContainerInterface": "x", "portIsolation": 1, "ipam": "x", "dns": "x",
               "runtimeConfig": [], "args": 1}
PTP_KEYS = {"ipam": [], "mtu": 1.5, "ipMasq": "true", "ipMasqBackend": [], "dns": 5, "runtimeConfig": "x",
            "args": []}
HOSTDEV_KEYS = {"device": 5, "hwaddr": 1, "kernelpath": [], "pciBusID": {}, "dataDir": 0, "ipam": 1, "dns": [],
                "runtimeConfig": {"deviceID": 7}, "args": "x"}
MACVLAN_KEYS = {"master": 5, "mode": "nope", "mtu": "x", "mac": 5, "linkInContainer": "no", "ipam": 1,
                "dns": 1, "runtimeConfig": {"mac": "zz"}, "args": {"cni": 1}}


@pytest.mark.parametrize(("key", "value"), sorted(BRIDGE_KEYS.items()))
def test_bridge_wrong_type_changes_nothing(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                           tmp_path: Path, key: str, value: Any) -> None:
    e = refused(bridge.PLUGIN, host_ns, container_ns, _bridge(tmp_path, **{key: value}), plugin_dir, tmp_path)
    assert e["code"] in (6, 7), e


@pytest.mark.parametrize(("key", "value"), sorted(PTP_KEYS.items()))
def test_ptp_wrong_type_changes_nothing(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                        tmp_path: Path, key: str, value: Any) -> None:
    e = refused(ptp.PLUGIN, host_ns, container_ns, _ptp(tmp_path, **{key: value}), plugin_dir, tmp_path)
    assert e["code"] in (6, 7), e


@pytest.mark.parametrize(("key", "value"), sorted(HOSTDEV_KEYS.items()))
def test_host_device_wrong_type_changes_nothing(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                                tmp_path: Path, key: str, value: Any) -> None:
    host_ns.run(["ip", "link", "add", "hd0", "type", "veth", "peer", "name", "hd0p"])
    e = refused(host_device.PLUGIN, host_ns, container_ns, _hostdev(tmp_path, **{key: value}), plugin_dir, tmp_path)
    assert e["code"] in (6, 7), e


@pytest.mark.parametrize(("key", "value"), sorted(MACVLAN_KEYS.items()))
def test_macvlan_wrong_type_changes_nothing(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                            tmp_path: Path, key: str, value: Any) -> None:
    from pycni.plugins.main import macvlan

    host_ns.run(["ip", "link", "add", "mv0", "type", "veth", "peer", "name", "mv0p"])
    conf = {"cniVersion": "1.0.0", "name": "refnet", "type": "macvlan", "master": "mv0", "ipam": ipam(tmp_path),
            key: value}
    e = refused(macvlan.PLUGIN, host_ns, container_ns, conf, plugin_dir, tmp_path)
    assert e["code"] in (6, 7), e


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_bridge_two_ranges_of_a_family_below_030(host_ns: Namespace, netns_factory: Any, plugin_dir: str,
                                                 tmp_path: Path, version: str) -> None:
    """Upstream's bridge_test.go, "(3) configures and deconfigures a bridge and veth with default
    route" at 0.1.0/0.2.0: one IPv4 and two IPv6 ranges cannot be carried. ADD fails with Go's
    msg (from host-local) and, ours, leaves nothing. DEL differs on purpose: Go's fails too
    (its host-local refuses the config for every command), ours succeeds — a DEL must be able to
    release what an earlier config reserved, and a DEL that always fails strands the container
    (docs/plugins.md, host-local)."""
    msg = f"CNI version {version} does not support more than 1 address per family"
    conf = {"cniVersion": version, "name": "refnet", "type": "bridge", "bridge": "refbr0", "isGateway": True,
            "isDefaultGateway": True,
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                     "ranges": [[{"subnet": "192.168.0.0/24"}], [{"subnet": "fd00::/64"}],
                                [{"subnet": "2001:db8::/64"}]]}}
    ctr = netns_factory()
    e = refused(bridge.PLUGIN, host_ns, ctr, conf, plugin_dir, tmp_path, ipam_ran=True)
    assert e["msg"] == msg, e
    out = run("bridge", "DEL", conf, host=host_ns, netns=ctr, cni_path=plugin_dir)
    assert out.exit_code == 0, out
    go = "/usr/lib/cni/bridge"
    if not os.access(go, os.X_OK):
        return
    go_conf = dict(conf, ipam=dict(conf["ipam"], dataDir=str(tmp_path / "go-ipam")))
    for cmd in ("ADD", "DEL"):
        out = run("bridge", cmd, go_conf, via="exec", host=host_ns, netns=ctr)
        assert out.exit_code == 1 and json.loads(out.stdout)["msg"] == msg, (cmd, out.stdout)
