"""tap: persistent tap devices in the container, with owner/group, multiqueue, MAC, bridge, IPAM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import err, ok, run


def conf(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"cniVersion": "1.0.0", "name": "tapnet", "type": "tap",
                         "ipam": {"type": "host-local", "subnet": "10.99.0.0/24", "dataDir": str(tmp_path / "ipam")}}
    c.update(extra)
    return c


def details(ns: Namespace, name: str = "eth0") -> dict[str, Any]:
    return json.loads(ns.run(["ip", "-d", "-j", "link", "show", name]).stdout)[0]


def test_tap_with_owner_group_mac_and_ipam(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                           tmp_path: Path) -> None:
    cfg = conf(tmp_path, owner=4242, group=4243, mtu=1400, multiQueue=True,
               runtimeConfig={"mac": "0a:58:0a:63:00:09"})
    r = ok(run("tap", "ADD", cfg, host=host_ns, netns=container_ns, cni_path=plugin_dir))
    assert r["interfaces"] == [{"name": "eth0", "mac": "0a:58:0a:63:00:09", "sandbox": container_ns.path}]
    assert r["ips"][0]["interface"] == 0 and r["ips"][0]["address"].startswith("10.99.0.")
    d = details(container_ns)
    info = d["linkinfo"]["info_data"]
    assert d["linkinfo"]["info_kind"] == "tun" and info["type"] == "tap"
    assert info["user"] == 4242 and info["group"] == 4243 and info["multi_queue"] and info["persist"]
    assert d["mtu"] == 1400 and "UP" in d["flags"]
    addrs = container_ns.run(["ip", "-4", "-o", "addr", "show", "eth0"]).stdout
    assert r["ips"][0]["address"] in addrs
    ok(run("tap", "CHECK", dict(cfg, prevResult=r), host=host_ns, netns=container_ns, cni_path=plugin_dir))
    ok(run("tap", "DEL", cfg, host=host_ns, netns=container_ns, cni_path=plugin_dir))
    ok(run("tap", "DEL", cfg, host=host_ns, netns=container_ns, cni_path=plugin_dir))
    assert container_ns.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
    assert not [f for f in (tmp_path / "ipam" / "tapnet").iterdir() if f.name[0].isdigit()]


def test_tap_layer2_on_a_bridge_in_the_container(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                                  tmp_path: Path) -> None:
    container_ns.run(["ip", "link", "add", "br-vm", "type", "bridge"])
    cfg = conf(tmp_path, bridge="br-vm")
    del cfg["ipam"]
    r = ok(run("tap", "ADD", cfg, host=host_ns, netns=container_ns, cni_path=plugin_dir, ifname="tap0"))
    assert "ips" not in r
    assert details(container_ns, "tap0")["master"] == "br-vm"


@pytest.mark.parametrize("extra,text", [({"owner": -1}, "'owner' must be"), ({"bridge": "missing-br"},
                                                                                  "bridge 'missing-br' not found")])
def test_bad_config(host_ns: Namespace, container_ns: Namespace, plugin_dir: str, tmp_path: Path,
                    extra: dict[str, Any], text: str) -> None:
    e = err(run("tap", "ADD", conf(tmp_path, **extra), host=host_ns, netns=container_ns, cni_path=plugin_dir))
    assert e["code"] == 7 and text in e["msg"], e
    assert container_ns.run(["ip", "link", "show", "eth0"], check=False).returncode != 0


def test_rollback_when_ipam_fails(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                  tmp_path: Path) -> None:
    cfg = conf(tmp_path)
    cfg["ipam"]["subnet"] = "10.99.0.0/31"
    err(run("tap", "ADD", cfg, host=host_ns, netns=container_ns, cni_path=plugin_dir))
    assert container_ns.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
