"""ptp, macvlan, host-device and tap driven by a runtime — ours and the Go libcni — end to end."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from runtimes import GoRuntime, PycniRuntime, Runtime, write_conflist

RUNTIMES = ["pycni", "go-libcni"]


def make_runtime(kind: str, request: pytest.FixtureRequest, host: Namespace, conf_dir: Path, network: str,
                 plugin_dir: str, tmp_path: Path) -> Runtime:
    if kind == "pycni":
        return PycniRuntime(host, conf_dir, network, [plugin_dir], tmp_path / "cache")
    tool = request.getfixturevalue("go_libcni_tool")
    return GoRuntime(tool, host, conf_dir, network, [plugin_dir], tmp_path / "cache")


def ipam(tmp_path: Path, subnet: str) -> dict[str, Any]:
    return {"type": "host-local", "subnet": subnet, "dataDir": str(tmp_path / "ipam"),
            "routes": [{"dst": "0.0.0.0/0"}]}


def addr(result: dict[str, Any]) -> str:
    return str(result["ips"][0]["address"].split("/")[0])


@pytest.mark.parametrize("kind", RUNTIMES)
def test_ptp_under_runtime(kind: str, request: pytest.FixtureRequest, netns_factory: Callable[[], Namespace],
                           plugin_dir: str, tmp_path: Path) -> None:
    host, c1, c2 = netns_factory(), netns_factory(), netns_factory()
    write_conflist(tmp_path / "net.d", "ptpnet",
                   [{"type": "ptp", "ipMasq": True, "ipam": ipam(tmp_path, "10.81.0.0/24")}])
    rt = make_runtime(kind, request, host, tmp_path / "net.d", "ptpnet", plugin_dir, tmp_path)
    rt.add("p1", c1)
    r2 = rt.add("p2", c2)
    c1.run(["ping", "-c", "2", "-W", "2", addr(r2)])
    rt.check("p1", c1)
    rt.delete("p1", c1)
    rt.delete("p2", c2)
    rt.delete("p2", c2)
    assert "CNI-" not in host.run(["iptables-save", "-t", "nat"]).stdout
    assert not [ln for ln in host.run(["ip", "-o", "link"]).stdout.splitlines() if "veth" in ln]


@pytest.mark.parametrize("kind", RUNTIMES)
def test_macvlan_under_runtime(kind: str, request: pytest.FixtureRequest, netns_factory: Callable[[], Namespace],
                               plugin_dir: str, tmp_path: Path) -> None:
    host, lan, c1, c2 = (netns_factory() for _ in range(4))
    subprocess.run(["ip", "link", "add", "uplink", "netns", host.name, "type", "veth", "peer", "name", "lan0",
                    "netns", lan.name], check=True)
    host.run(["ip", "link", "set", "uplink", "up"])
    lan.run(["ip", "link", "set", "lan0", "up"])
    write_conflist(tmp_path / "net.d", "mvnet", [{"type": "macvlan", "master": "uplink", "mode": "bridge",
                                                  "ipam": ipam(tmp_path, "10.82.0.0/24")}])
    rt = make_runtime(kind, request, host, tmp_path / "net.d", "mvnet", plugin_dir, tmp_path)
    r1 = rt.add("m1", c1)
    rt.add("m2", c2)
    c2.run(["ping", "-c", "2", "-W", "2", addr(r1)])
    rt.check("m2", c2)
    rt.delete("m1", c1)
    rt.delete("m2", c2)
    assert c1.run(["ip", "link", "show", "eth0"], check=False).returncode != 0


@pytest.mark.parametrize("kind", RUNTIMES)
def test_host_device_under_runtime(kind: str, request: pytest.FixtureRequest,
                                   netns_factory: Callable[[], Namespace], plugin_dir: str, tmp_path: Path) -> None:
    host, peer, ctr = netns_factory(), netns_factory(), netns_factory()
    subprocess.run(["ip", "link", "add", "hd0", "netns", host.name, "type", "veth", "peer", "name", "p0",
                    "netns", peer.name], check=True)
    peer.run(["ip", "addr", "add", "10.83.0.1/24", "dev", "p0"])
    peer.run(["ip", "link", "set", "p0", "up"])
    write_conflist(tmp_path / "net.d", "hdnet", [{"type": "host-device", "device": "hd0",
                                                  "dataDir": str(tmp_path / "hd"),
                                                  "ipam": {"type": "host-local", "subnet": "10.83.0.0/24",
                                                           "rangeStart": "10.83.0.10",
                                                           "dataDir": str(tmp_path / "ipam")}}])
    rt = make_runtime(kind, request, host, tmp_path / "net.d", "hdnet", plugin_dir, tmp_path)
    rt.add("h1", ctr)
    ctr.run(["ping", "-c", "1", "-W", "2", "10.83.0.1"])
    rt.check("h1", ctr)
    rt.delete("h1", ctr)
    rt.delete("h1", ctr)
    assert host.run(["ip", "link", "show", "hd0"], check=False).returncode == 0


@pytest.mark.parametrize("kind", RUNTIMES)
def test_tap_under_runtime(kind: str, request: pytest.FixtureRequest, netns_factory: Callable[[], Namespace],
                           plugin_dir: str, tmp_path: Path) -> None:
    host, ctr = netns_factory(), netns_factory()
    write_conflist(tmp_path / "net.d", "tapnet", [{"type": "tap", "multiQueue": True,
                                                   "ipam": ipam(tmp_path, "10.84.0.0/24")}])
    rt = make_runtime(kind, request, host, tmp_path / "net.d", "tapnet", plugin_dir, tmp_path)
    r = rt.add("t1", ctr)
    assert r["interfaces"][0]["sandbox"] == ctr.path
    info = json.loads(ctr.run(["ip", "-d", "-j", "link", "show", "eth0"]).stdout)[0]["linkinfo"]
    assert info["info_kind"] == "tun" and info["info_data"]["type"] == "tap"
    rt.check("t1", ctr)
    rt.delete("t1", ctr)
    assert ctr.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
