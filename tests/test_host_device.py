"""host-device: a host interface moves into the container and back, with its state."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plugin_util
import pytest
from netns_util import Namespace
from plugin_util import answer, err, ok, run


@pytest.fixture
def wired(netns_factory: Callable[[], Namespace]) -> tuple[Namespace, Namespace]:
    """A host namespace owning 'dev0' (up, mtu 1450, an address) whose peer sits in another namespace."""
    host, peer = netns_factory(), netns_factory()
    subprocess.run(["ip", "link", "add", "dev0", "netns", host.name, "type", "veth", "peer", "name", "p0",
                    "netns", peer.name], check=True)
    host.run(["ip", "link", "set", "dev0", "mtu", "1450", "up"])
    host.run(["ip", "addr", "add", "198.18.9.1/24", "dev", "dev0"])
    peer.run(["ip", "addr", "add", "192.168.88.1/24", "dev", "p0"])
    peer.run(["ip", "link", "set", "p0", "mtu", "1450", "up"])
    return host, peer


def conf(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"cniVersion": "1.0.0", "name": "hd", "type": "host-device", "device": "dev0",
                         "dataDir": str(tmp_path / "hd"),
                         "ipam": {"type": "host-local", "subnet": "192.168.88.0/24", "dataDir": str(tmp_path / "ipam")}}
    c.update(extra)
    return c


def link(ns: Namespace, name: str) -> dict[str, Any] | None:
    proc = ns.run(["ip", "-j", "addr", "show", name], check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def test_move_in_configure_and_restore(wired: tuple[Namespace, Namespace], container_ns: Namespace,
                                       plugin_dir: str, tmp_path: Path) -> None:
    host, _ = wired
    cfg = conf(tmp_path)
    r = ok(run("host-device", "ADD", cfg, host=host, netns=container_ns, cni_path=plugin_dir))
    assert r["interfaces"][0]["name"] == "eth0" and r["interfaces"][0]["sandbox"] == container_ns.path
    assert link(host, "dev0") is None
    inside = link(container_ns, "eth0")
    assert inside is not None and "UP" in inside["flags"]
    assert json.loads(container_ns.run(["ip", "-j", "link", "show", "eth0"]).stdout)[0]["ifalias"] == "dev0"
    container_ns.run(["ping", "-c", "1", "-W", "2", "192.168.88.1"])
    ok(run("host-device", "CHECK", dict(cfg, prevResult=r), host=host, netns=container_ns, cni_path=plugin_dir))

    ok(run("host-device", "DEL", cfg, host=host, netns=container_ns, cni_path=plugin_dir))
    back = link(host, "dev0")
    assert back is not None and "UP" in back["flags"] and back["mtu"] == 1450
    assert "198.18.9.1" in [a["local"] for a in back["addr_info"]]  # the reference loses this address
    ok(run("host-device", "DEL", cfg, host=host, netns=container_ns, cni_path=plugin_dir))  # the reference fails here
    assert link(host, "dev0") is not None and link(container_ns, "eth0") is None


def test_find_by_hwaddr_without_ipam(wired: tuple[Namespace, Namespace], container_ns: Namespace,
                                     plugin_dir: str, tmp_path: Path) -> None:
    host, _ = wired
    mac = json.loads(host.run(["ip", "-j", "link", "show", "dev0"]).stdout)[0]["address"]
    cfg = conf(tmp_path, hwaddr=mac.upper())
    del cfg["device"], cfg["ipam"]
    r = ok(run("host-device", "ADD", cfg, host=host, netns=container_ns, cni_path=plugin_dir))
    assert r["interfaces"] == [{"name": "eth0", "mac": mac, "sandbox": container_ns.path}] and "ips" not in r
    ok(run("host-device", "DEL", cfg, host=host, netns=container_ns, cni_path=plugin_dir))
    assert link(host, "dev0") is not None


@pytest.mark.parametrize("extra,code,text", [
    ({"device": ""}, 7, 'specify either "device", "hwaddr", "kernelpath" or "pciBusID"'),
    ({"device": "nope9"}, 999, "link 'nope9' not found"),
    ({"device": "", "kernelpath": "relative/path"}, 7, "must be absolute and begin with /sys/devices/"),
    ({"device": "", "kernelpath": "/sys/devices/does-not-exist"}, 999, "failed to find network devices"),
    ({"device": "", "pciBusID": "0000:ff:1f.7"}, 999, "no net directory under pci device 0000:ff:1f.7"),
])
def test_bad_device_selection(wired: tuple[Namespace, Namespace], container_ns: Namespace, plugin_dir: str,
                              tmp_path: Path, extra: dict[str, Any], code: int, text: str) -> None:
    host, _ = wired
    e = err(run("host-device", "ADD", conf(tmp_path, **extra), host=host, netns=container_ns, cni_path=plugin_dir))
    assert e["code"] == code and text in e["msg"], e
    assert link(host, "dev0") is not None


def test_rollback_when_ipam_fails(wired: tuple[Namespace, Namespace], container_ns: Namespace, plugin_dir: str,
                                  tmp_path: Path) -> None:
    host, _ = wired
    cfg = conf(tmp_path)
    cfg["ipam"]["subnet"] = "192.168.88.0/31"  # nothing to allocate: IPAM fails after the move
    err(run("host-device", "ADD", cfg, host=host, netns=container_ns, cni_path=plugin_dir))
    back = link(host, "dev0")
    assert back is not None and "UP" in back["flags"] and "198.18.9.1" in [a["local"] for a in back["addr_info"]]
    assert link(container_ns, "eth0") is None


def test_go_reference_deletes_what_we_added(wired: tuple[Namespace, Namespace], container_ns: Namespace,
                                            plugin_dir: str, tmp_path: Path) -> None:
    """The alias convention is shared: the Go plugin's DEL moves our ADD's device back."""
    host, _ = wired
    cfg = conf(tmp_path)
    del cfg["ipam"]
    ok(run("host-device", "ADD", cfg, host=host, netns=container_ns, cni_path=plugin_dir))
    out = plugin_util.run("host-device", "DEL", cfg, via="exec", host=host, netns=container_ns, cni_path=GO_DIR)
    assert out.exit_code == 0, out.stdout
    assert link(host, "dev0") is not None and link(container_ns, "eth0") is None


def test_del_without_netns_still_releases_ipam(wired: tuple[Namespace, Namespace], container_ns: Namespace,
                                               plugin_dir: str, tmp_path: Path) -> None:
    host, _ = wired
    cfg = conf(tmp_path)
    ok(run("host-device", "ADD", cfg, host=host, netns=container_ns, cni_path=plugin_dir))
    assert [f for f in (tmp_path / "ipam" / "hd").iterdir() if f.name[0].isdigit()]
    ok(run("host-device", "DEL", cfg, host=host, cni_path=plugin_dir))
    assert not [f for f in (tmp_path / "ipam" / "hd").iterdir() if f.name[0].isdigit()]
    ok(run("host-device", "DEL", cfg, host=host, netns=container_ns, cni_path=plugin_dir))


GO_DIR = "/usr/lib/cni"
GO_HOST_DEVICE = GO_DIR + "/host-device"


@pytest.mark.parametrize("who", ["py", "go"])
def test_failed_del_leaves_the_container_interface_up(who: str, wired: tuple[Namespace, Namespace],
                                                      container_ns: Namespace, plugin_dir: str,
                                                      tmp_path: Path) -> None:
    """A DEL that cannot move the device back (a same-named device appeared in the host) fails
    and leaves the container's interface as it was: named CNI_IFNAME and up, so the container
    keeps its network and a later DEL can retry — the reference's test, against Go and ours."""
    if who == "go" and not os.access(GO_HOST_DEVICE, os.X_OK):
        pytest.skip("Go reference host-device not installed")
    host, _ = wired
    cfg = conf(tmp_path)
    del cfg["ipam"]
    way = {"via": "dispatch", "cni_path": plugin_dir} if who == "py" else {"via": "exec", "cni_path": GO_DIR}

    def run(cmd: str) -> tuple[int, dict[str, Any]]:
        return answer(plugin_util.run("host-device", cmd, cfg, host=host, netns=container_ns, **way))

    rc, out = run("ADD")
    assert rc == 0, out
    mac = out["interfaces"][0]["mac"]
    host.run(["ip", "link", "add", "dev0", "type", "veth", "peer", "name", "rfpeer0"])  # the conflict
    rc, out = run("DEL")
    assert rc != 0 and out["msg"], out
    inside = link(container_ns, "eth0")
    assert inside is not None and inside["address"] == mac and "UP" in inside["flags"], inside
    host.run(["ip", "link", "del", "dev0"])
    rc, out = run("DEL")
    assert rc == 0, out
    back = link(host, "dev0")
    assert back is not None and back["address"] == mac and link(container_ns, "eth0") is None
    if who == "py":  # ours also gives the device back its state
        assert "UP" in back["flags"] and back["mtu"] == 1450
