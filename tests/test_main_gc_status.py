"""Every main plugin that delegates to IPAM answers GC and STATUS with its IPAM's answer (as the
reference's pkg/ipam does): a STATUS the IPAM refuses is the plugin's refusal, a GC reaches the
IPAM with the valid-attachments list. A stand-in IPAM plugin on CNI_PATH records the calls."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
from plugin_util import answer, run

from pycni.plugins.main import bridge, dummy, host_device, ipvlan, loopback, macvlan, ptp, routed, tap, vlan
from pycni.plugins.meta import vrf
from pycni.skel import Plugin

IPAM = """#!/bin/sh
cat > "{log}.$CNI_COMMAND"
if [ "$CNI_COMMAND" = STATUS ] && [ -e "{log}.down" ]; then
  echo '{{"cniVersion":"1.1.0","code":50,"msg":"ipam not ready"}}'; exit 1
fi
exit 0
"""

PLUGINS: dict[str, tuple[Plugin, dict[str, Any]]] = {
    "bridge": (bridge.PLUGIN, {}),
    "ptp": (ptp.PLUGIN, {}),
    "host-device": (host_device.PLUGIN, {"device": "eth9"}),
    "macvlan": (macvlan.PLUGIN, {"master": "eth9"}),
    "ipvlan": (ipvlan.PLUGIN, {"master": "eth9"}),
    "vlan": (vlan.PLUGIN, {"master": "eth9", "vlanId": 5}),
    "dummy": (dummy.PLUGIN, {}),
    "tap": (tap.PLUGIN, {}),
    "routed": (routed.PLUGIN, {}),
}


@pytest.fixture
def fake_ipam(tmp_path: Path) -> Path:
    script = tmp_path / "fake-ipam"
    script.write_text(IPAM.format(log=tmp_path / "log"))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def _run(plugin: Plugin, command: str, conf: dict[str, Any], cni_path: Path) -> tuple[int, dict[str, Any]]:
    return answer(run(plugin, command, conf, cni_path=str(cni_path)))


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_status_and_gc_are_the_ipams(fake_ipam: Path, name: str) -> None:
    plugin, extra = PLUGINS[name]
    valid = [{"containerID": "c1", "ifname": "eth0"}]
    conf = {"cniVersion": "1.1.0", "name": "net", "type": name, "ipam": {"type": "fake-ipam"}, **extra}
    assert _run(plugin, "STATUS", conf, fake_ipam) == (0, {})
    (fake_ipam / "log.down").touch()
    rc, e = _run(plugin, "STATUS", conf, fake_ipam)
    assert rc == 1 and e["code"] == 50 and e["msg"] == "ipam not ready", e
    assert _run(plugin, "GC", {**conf, "cni.dev/valid-attachments": valid}, fake_ipam) == (0, {})
    assert json.loads((fake_ipam / "log.GC").read_text())["cni.dev/valid-attachments"] == valid
    (fake_ipam / "log.GC").unlink()
    for bad in ({}, {"cni.dev/valid-attachments": [{}]}, {"cni.dev/valid-attachments": [None]}):
        rc, e = _run(plugin, "GC", {**conf, **bad}, fake_ipam)
        assert rc == 1 and e["code"] == 7, e  # refused: a delegate reading it as "none valid" frees everything
    assert not (fake_ipam / "log.GC").exists()


@pytest.mark.parametrize("plugin", [loopback.PLUGIN, vrf.PLUGIN])
def test_plugins_without_ipam_are_ready(tmp_path: Path, plugin: Plugin) -> None:
    conf = {"cniVersion": "1.1.0", "name": "net", "type": "x", "vrfname": "blue"}
    assert _run(plugin, "STATUS", conf, tmp_path) == (0, {})
    assert _run(plugin, "GC", {**conf, "cni.dev/valid-attachments": []}, tmp_path) == (0, {})
