"""Refused input changes nothing, for the chained plugins (tuning, bandwidth, firewall, sbr):
everything is checked before the first change (a wrong JSON type for every key is code 6/7
naming the key), and a failure part-way takes back what the ADD made (sysctls, saved state,
qdiscs, chains, rules). Each case snapshots the host and the
container namespace — links, addresses, routes, rules, qdiscs, filter and nat tables,
nftables, the sysctls the cases touch — and the plugin's state directory, before and after.
(flannel's and host-local's refusals are in their own test files.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import err, run
from test_refusals_main import files, snapshot

from pycni.plugins.meta import bandwidth, firewall, sbr, tuning
from pycni.skel import Plugin

SYSCTLS = ("net.core.somaxconn", "net.ipv4.conf.eth0.rp_filter", "net.ipv4.ip_forward")


def meta_snapshot(ns: Namespace) -> dict[str, Any]:
    """:func:`snapshot` plus what chained plugins change: rules, qdiscs, the filter tables, sysctls."""
    state = snapshot(ns)
    state["rules"] = ns.run(["ip", "rule"]).stdout + ns.run(["ip", "-6", "rule"]).stdout
    state["qdiscs"] = ns.run(["tc", "qdisc", "show"]).stdout
    state["filter"] = "\n".join(
        line for v6 in ("", "6") for line in ns.run([f"ip{v6}tables-save", "-t", "filter"]).stdout.splitlines()
        if not line.startswith(("#", ":")))
    state["sysctls"] = ns.run(["sysctl", *SYSCTLS], check=False).stdout
    return state


@pytest.fixture
def pair(host_ns: Namespace, container_ns: Namespace) -> tuple[Namespace, Namespace, dict[str, Any]]:
    """A veth from the host (vh0) into the container (eth0, 10.77.0.2/24, default route) and the
    prevResult an interface plugin would have passed on."""
    host_ns.run(["ip", "link", "add", "vh0", "type", "veth", "peer", "name", "eth0", "netns", container_ns.name])
    for ns, dev in ((host_ns, "vh0"), (container_ns, "eth0")):
        ns.run(["sysctl", "-qw", f"net.ipv6.conf.{dev}.disable_ipv6=1"])  # no link-local routes appearing later
        ns.run(["ip", "link", "set", dev, "up"])
    container_ns.run(["ip", "addr", "add", "10.77.0.2/24", "dev", "eth0"])
    container_ns.run(["ip", "route", "add", "default", "via", "10.77.0.1"])
    for ns, dev in ((host_ns, "vh0"), (container_ns, "eth0")):  # carrier settles before the first snapshot
        ns.run(["ip", "link", "set", dev, "up"])
        for _ in range(200):
            if json.loads(ns.run(["ip", "-j", "link", "show", dev]).stdout)[0]["operstate"] == "UP":
                break
            time.sleep(0.01)
    prev = {"cniVersion": "1.0.0", "dns": {},
            "interfaces": [{"name": "vh0"}, {"name": "eth0", "sandbox": container_ns.path}],
            "ips": [{"address": "10.77.0.2/24", "gateway": "10.77.0.1", "interface": 1}]}
    return host_ns, container_ns, prev


def refused(plugin: Plugin, host: Namespace, ctr: Namespace, conf: dict[str, Any], data: Path,
            **kw: Any) -> dict[str, Any]:
    """Run ADD; assert it fails with an error JSON and leaves host, container and ``data`` as they were."""
    before = {"host": meta_snapshot(host), "container": meta_snapshot(ctr), "files": files(data)}
    e = err(run(plugin, "ADD", conf, host=host, netns=ctr, cni_path="/nonexistent", **kw))
    after = {"host": meta_snapshot(host), "container": meta_snapshot(ctr), "files": files(data)}
    changed = {where: {k: (was[k], after[where][k]) for k in was if was[k] != after[where][k]}
               if isinstance(was, dict) else (was, after[where])
               for where, was in before.items() if was != after[where]}
    assert not changed, (e, changed)
    assert set(e) >= {"code", "msg"} and "Traceback" not in json.dumps(e), e
    return e


def _conf(kind: str, prev: dict[str, Any] | None, data: Path, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": "refnet", "type": kind, **extra}
    if kind == "tuning":
        conf.setdefault("dataDir", str(data / "tuning"))
    if prev is not None:
        conf["prevResult"] = prev
    return conf


NO_PREV = {"prevResult": None}  # marker: drop the prevResult
GARBAGE_PREV = {"prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "not-an-address"}]}}


def _run(plugin: Plugin, kind: str, pair: Any, tmp_path: Path, extra: dict[str, Any], env: dict[str, str],
         code: int | None) -> None:
    host, ctr, prev = pair
    if extra.get("prevResult", prev) is None:
        prev, extra = None, {k: v for k, v in extra.items() if k != "prevResult"}
    elif "prevResult" in extra:
        prev, extra = extra["prevResult"], {k: v for k, v in extra.items() if k != "prevResult"}
    e = refused(plugin, host, ctr, _conf(kind, prev, tmp_path, **extra), tmp_path, **env)
    if code is not None:
        assert e["code"] == code, e


# ---- tuning --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "env", "code"), [
    ({"mtu": "x"}, {}, 7),
    ({"mtu": -1}, {}, 7),
    ({"txQLen": True}, {}, 7),
    ({"mac": "zz:11:22:33:44:55"}, {}, 7),
    ({"sysctl": {"net.core.somaxconn": 500}}, {}, 7),
    ({"sysctl": {"net.core.rmem_max": "1"}}, {}, 7),  # host-wide
    ({"sysctl": {"kernel.pid_max": "1"}}, {}, 7),  # not a net sysctl
    ({"sysctl": {"net.ipv4.conf.IFNAME/../../../../kernel/pid_max": "1"}}, {}, None),
    ({"args": "x", "mtu": 1400}, {}, 7),
    ({"runtimeConfig": "x", "mtu": 1400}, {}, 7),
    ({"runtimeConfig": {"mac": "zz"}}, {}, 7),
    ({**NO_PREV, "mtu": 1400}, {}, 7),
    ({**GARBAGE_PREV, "mtu": 1400}, {}, None),
    ({"mtu": 1400}, {"args": "FOO=1"}, 4),
    ({"mtu": 1400}, {"ifname": "eth9"}, None),  # no such interface
    # Late failures: a sysctl the kernel refuses after another was set; an MTU the veth refuses
    # after the sysctl was set and the originals were saved.
    ({"sysctl": {"net.core.somaxconn": "600", "net.ipv4.conf.eth0.rp_filter": "x"}}, {}, None),
    ({"sysctl": {"net.core.somaxconn": "600"}, "mtu": 70000, "mac": "0a:11:22:33:44:55"}, {}, None),
])
def test_tuning_refusal_changes_nothing(pair: Any, tmp_path: Path, extra: dict[str, Any], env: dict[str, str],
                                        code: int | None) -> None:
    _run(tuning.PLUGIN, "tuning", pair, tmp_path, extra, env, code)


# ---- bandwidth -----------------------------------------------------------------------------------
LIMITS = {"ingressRate": 800000, "ingressBurst": 80000, "egressRate": 800000, "egressBurst": 80000}


@pytest.mark.parametrize(("extra", "env", "code"), [
    ({"ingressRate": "x", "ingressBurst": 800}, {}, 7),
    ({"ingressRate": -1, "ingressBurst": 800}, {}, 7),
    ({"ingressRate": 8000}, {}, 7),
    ({"ingressRate": 8000, "ingressBurst": 8 * 0xFFFFFFFF}, {}, 7),
    ({**LIMITS, "shapedSubnets": ["10.0.0.300/8"]}, {}, 7),
    ({**LIMITS, "shapedSubnets": ["10.0.0.0/8"], "unshapedSubnets": ["10.1.0.0/16"]}, {}, 7),
    ({"runtimeConfig": "x", **LIMITS}, {}, 7),
    ({"runtimeConfig": {"bandwidth": {"egressRate": "fast"}}}, {}, 7),
    ({**NO_PREV, **LIMITS}, {}, 7),
    ({**GARBAGE_PREV, **LIMITS}, {}, None),
    ({**LIMITS}, {"ifname": "eth9"}, None),  # no such container interface
])
def test_bandwidth_refusal_changes_nothing(pair: Any, tmp_path: Path, extra: dict[str, Any], env: dict[str, str],
                                           code: int | None) -> None:
    _run(bandwidth.PLUGIN, "bandwidth", pair, tmp_path, extra, env, code)


def test_bandwidth_late_failure_takes_the_ingress_shaper_back(pair: Any, tmp_path: Path) -> None:
    """The ifb's name is taken (by a link that is not ours): ADD fails after shaping the veth;
    the shaper goes, the link that was there stays."""
    host, _ctr, _prev = pair
    host.run(["ip", "link", "add", bandwidth.ifb_name("refnet", "ctr"), "type", "veth", "peer", "name", "taken1"])
    _run(bandwidth.PLUGIN, "bandwidth", pair, tmp_path, dict(LIMITS), {}, None)


# ---- firewall ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "code"), [
    ({"backend": 3}, 7),
    ({"backend": "pf"}, 7),
    ({"backend": "firewalld"}, 7),
    ({"iptablesAdminChainName": "INPUT"}, 7),
    ({"iptablesAdminChainName": "LOG"}, 7),
    ({"iptablesAdminChainName": "x y"}, 7),
    ({"backend": "nftables", "iptablesAdminChainName": "drop"}, 7),
    ({"ingressPolicy": "closed"}, 7),
    ({"ingressPolicy": "same-bridge",
      "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.77.0.2/24"}]}}, 7),  # no bridge named
    ({"firewalldZone": 1}, 7),
    (NO_PREV, 7),
    (GARBAGE_PREV, None),
])
def test_firewall_refusal_changes_nothing(pair: Any, tmp_path: Path, extra: dict[str, Any], code: int | None) -> None:
    _run(firewall.PLUGIN, "firewall", pair, tmp_path, extra, {}, code)


# ---- sbr -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "code"), [
    ({"table": "x"}, 7),
    ({"table": 254}, 7),
    ({"table": 0}, 7),
    ({"gateways": ["x"]}, 7),
    ({"gateways": "10.77.0.1"}, 7),
    ({"addSourceHints": 1}, 7),
    ({"vrfname": 5}, 7),
    ({"vrfname": "a-name-far-too-long"}, 7),
    (NO_PREV, 7),
    ({"prevResult": {"cniVersion": "1.0.0", "ips": []}}, 7),
    (GARBAGE_PREV, None),
])
def test_sbr_refusal_changes_nothing(pair: Any, tmp_path: Path, extra: dict[str, Any], code: int | None) -> None:
    _run(sbr.PLUGIN, "sbr", pair, tmp_path, extra, {}, code)


# ---- a wrong JSON type for every key -------------------------------------------------------------
# Each key with the JSON type it takes; every other type is tried (JSON true for an integer too).
SAMPLES: dict[type, Any] = {int: 5, bool: True, str: "x", list: ["x"], dict: {"x": 1}, float: 1.5}
KEY_TYPES: dict[str, tuple[Plugin, dict[str, Any], dict[str, type]]] = {
    "tuning": (tuning.PLUGIN, {"mtu": 1400},
               {"mac": str, "mtu": int, "promisc": bool, "allmulti": bool, "txQLen": int, "sysctl": dict,
                "dataDir": str, "runtimeConfig": dict, "args": dict}),
    "bandwidth": (bandwidth.PLUGIN, dict(LIMITS),
                  {"ingressRate": int, "ingressBurst": int, "egressRate": int, "egressBurst": int,
                   "shapedSubnets": list, "unshapedSubnets": list, "runtimeConfig": dict}),
    "firewall": (firewall.PLUGIN, {}, {"backend": str, "iptablesAdminChainName": str, "firewalldZone": str,
                                       "ingressPolicy": str}),
    "sbr": (sbr.PLUGIN, {}, {"table": int, "gateways": list, "addSourceHints": bool, "vrfname": str}),
}
WRONG_TYPES = [(kind, key, value) for kind, (_plugin, _base, keys) in KEY_TYPES.items()
               for key, want in keys.items()
               for have, value in SAMPLES.items() if have is not want]


@pytest.mark.parametrize(("kind", "key", "value"), WRONG_TYPES,
                         ids=[f"{k}-{key}-{type(v).__name__}" for k, key, v in WRONG_TYPES])
def test_wrong_type_changes_nothing(pair: Any, tmp_path: Path, kind: str, key: str, value: Any) -> None:
    plugin, base, _keys = KEY_TYPES[kind]
    host, ctr, prev = pair
    e = refused(plugin, host, ctr, _conf(kind, prev, tmp_path, **{**base, key: value}), tmp_path)
    assert e["code"] in (6, 7) and key in e["msg"] + e.get("details", ""), e
