"""vrf: config validation, the request it sends, and the kernel step where the kernel has VRF."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import err, ok, run

from pycni.plugins.meta import vrf
from pycni.skel import CmdArgs
from pycni.spec.errors import CNIError


def conf(container: Namespace, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"cniVersion": "1.0.0", "name": "vrfnet", "type": "vrf", "vrfname": "blue",
                         "prevResult": {"cniVersion": "1.0.0",
                                        "interfaces": [{"name": "eth0", "sandbox": container.path}],
                                        "ips": [{"interface": 0, "address": "10.55.0.2/24", "gateway": "10.55.0.1"}],
                                        "routes": [{"dst": "0.0.0.0/0"}]}}
    c.update(extra)
    return c


@pytest.mark.parametrize("raw,text", [({"vrfname": ""}, "valid vrf name"), ({"vrfname": "x" * 16}, "invalid vrf name"),
                                      ({"vrfname": "b", "table": 254}, "invalid vrf table"),
                                      ({"vrfname": "b", "table": "7"}, "invalid vrf table")])
def test_config_errors(raw: dict[str, Any], text: str) -> None:
    with pytest.raises(CNIError) as e:
        vrf.parse_conf(CmdArgs("ADD", stdin_data=json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "vrf",
                                                              **raw}).encode()))
    assert e.value.code == 7 and text in e.value.msg


def test_table_choice() -> None:
    assert vrf.first_free_table(set()) == 1
    assert vrf.first_free_table({1, 2, 4}) == 3


def test_prev_result_required(host_ns: Namespace, container_ns: Namespace, tmp_path: Path) -> None:
    cfg = conf(container_ns)
    del cfg["prevResult"]
    assert "missing prevResult" in err(run("vrf", "ADD", cfg, host=host_ns, netns=container_ns,
                                           cni_path=str(tmp_path)))["msg"]


def test_del_without_anything_is_fine(host_ns: Namespace, container_ns: Namespace, tmp_path: Path) -> None:
    ok(run("vrf", "DEL", conf(container_ns), host=host_ns, netns=container_ns, cni_path=str(tmp_path)))


def test_kernel_lifecycle(host_ns: Namespace, container_ns: Namespace, tmp_path: Path) -> None:
    container_ns.run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0"])
    container_ns.run(["ip", "addr", "add", "10.55.0.2/24", "dev", "eth0"])
    container_ns.run(["ip", "link", "set", "eth0", "up"])
    cfg = conf(container_ns, table=42)
    outcome = run("vrf", "ADD", cfg, host=host_ns, netns=container_ns, cni_path=str(tmp_path))
    if outcome.exit_code != 0:
        e = json.loads(outcome.stdout)
        assert "does not support vrf links" in e["msg"], e
        link = json.loads(container_ns.run(["ip", "-j", "link", "show", "eth0"]).stdout)[0]
        assert "master" not in link and "10.55.0.2/24" in container_ns.run(["ip", "addr", "show", "eth0"]).stdout
        pytest.skip("kernel step skipped: this kernel has no vrf link type (the error path was verified)")
    assert json.loads(outcome.stdout)["ips"][0]["address"] == "10.55.0.2/24"
    link = json.loads(container_ns.run(["ip", "-j", "link", "show", "eth0"]).stdout)[0]
    assert link["master"] == "blue"
    ok(run("vrf", "CHECK", cfg, host=host_ns, netns=container_ns, cni_path=str(tmp_path)))
    ok(run("vrf", "DEL", cfg, host=host_ns, netns=container_ns, cni_path=str(tmp_path)))
    assert container_ns.run(["ip", "link", "show", "blue"], check=False).returncode != 0
