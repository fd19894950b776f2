"""The SDK's config-reading kit (pycni.netconf), rollback and IPAM GC/STATUS delegation."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from pycni import ipam, netconf
from pycni.rollback import Rollback
from pycni.skel import CmdArgs
from pycni.spec.errors import DECODE_FAILURE, INVALID_CONFIG, INVALID_ENV, CNIError


def _code(fn: Any, *a: Any, **kw: Any) -> CNIError:
    with pytest.raises(CNIError) as info:
        fn(*a, **kw)
    return info.value


# ---- typed readers -----------------------------------------------------------------------------
def test_get_int_reads_defaults_and_null() -> None:
    assert netconf.get_int({"mtu": 1400}, "mtu") == 1400
    assert netconf.get_int({}, "mtu", 9) == 9
    assert netconf.get_int({"mtu": None}, "mtu", 9) == 9


@pytest.mark.parametrize("value", [True, False, 1.5, "1400", [1], {}])
def test_get_int_refuses_non_integers_naming_the_key(value: Any) -> None:
    err = _code(netconf.get_int, {"mtu": value}, "mtu")
    assert err.code == INVALID_CONFIG
    assert "'mtu' must be an integer" in err.msg
    assert repr(value) in err.details


def test_get_int_bounds() -> None:
    assert netconf.get_int({"v": 0}, "v", minimum=0, maximum=4094) == 0
    assert netconf.get_int({"v": 4094}, "v", minimum=0, maximum=4094) == 4094
    assert "from 0 to 4094" in _code(netconf.get_int, {"v": 4095}, "v", minimum=0, maximum=4094).msg
    assert "at least 0" in _code(netconf.get_int, {"v": -1}, "v", minimum=0).msg
    assert "at most 10" in _code(netconf.get_int, {"v": 11}, "v", maximum=10).msg


def test_get_bool_refuses_numbers_and_strings() -> None:
    assert netconf.get_bool({"ipMasq": True}, "ipMasq") is True
    assert netconf.get_bool({}, "ipMasq") is False
    for bad in (1, 0, "true", "yes"):
        err = _code(netconf.get_bool, {"ipMasq": bad}, "ipMasq")
        assert err.code == INVALID_CONFIG and "'ipMasq' must be true or false" in err.msg


def test_get_str_choices_and_label() -> None:
    assert netconf.get_str({"b": "x"}, "b") == "x"
    assert netconf.get_str({}, "b", "cni0") == "cni0"
    err = _code(netconf.get_str, {"mac": 5}, "mac", label="runtimeConfig.mac")
    assert "'runtimeConfig.mac' must be a string" in err.msg
    assert netconf.get_str({"m": "l3"}, "m", choices=("l2", "l3")) == "l3"
    assert "one of l2, l3" in _code(netconf.get_str, {"m": "l4"}, "m", choices=("l2", "l3")).msg


def test_get_list_and_get_dict() -> None:
    assert netconf.get_list({}, "x") == []
    assert netconf.get_list({"x": [1]}, "x") == [1]
    assert "'x' must be a list" in _code(netconf.get_list, {"x": "a"}, "x").msg
    assert netconf.get_dict({}, "x") == {}
    assert netconf.get_dict({"x": {"a": 1}}, "x") == {"a": 1}
    assert "'x' must be a JSON object" in _code(netconf.get_dict, {"x": "a"}, "x").msg
    assert netconf.runtime_config({"runtimeConfig": {"mac": "x"}}) == {"mac": "x"}
    assert _code(netconf.runtime_config, {"runtimeConfig": "x"}).code == INVALID_CONFIG
    assert _code(netconf.args_cni, {"args": "x"}).code == INVALID_CONFIG
    assert _code(netconf.args_cni, {"args": {"cni": []}}).msg.startswith("'args.cni'")


# ---- MAC precedence ------------------------------------------------------------------------------
def test_container_mac_precedence() -> None:
    conf = {"mac": "02:00:00:00:00:01", "args": {"cni": {"mac": "02:00:00:00:00:03"}}}
    assert netconf.container_mac(conf, "") == ""
    assert netconf.container_mac(conf, "", config_key=True) == "02:00:00:00:00:01"
    assert netconf.container_mac(conf, "MAC=02:00:00:00:00:02", config_key=True) == "02:00:00:00:00:02"
    assert netconf.container_mac(conf, "MAC=02:00:00:00:00:02", from_args=True) == "02:00:00:00:00:03"
    conf["runtimeConfig"] = {"mac": "02:00:00:00:00:0A"}
    assert netconf.container_mac(conf, "MAC=02:00:00:00:00:02", from_args=True) == "02:00:00:00:00:0a"


def test_container_mac_refusals_name_the_source() -> None:
    err = _code(netconf.container_mac, {"runtimeConfig": {"mac": "zz:zz"}}, "")
    assert err.code == INVALID_CONFIG and "runtimeConfig.mac" in err.msg and "invalid MAC" in err.msg
    assert "CNI_ARGS" in _code(netconf.container_mac, {}, "MAC=1").msg
    assert _code(netconf.container_mac, {}, "FOO=1").code == INVALID_ENV  # Go's LoadArgs: unknown key


# ---- prevResult ----------------------------------------------------------------------------------
def test_require_prev_result() -> None:
    err = _code(netconf.require_prev_result, {"cniVersion": "1.0.0"}, "vrf")
    assert err.code == INVALID_CONFIG and err.msg == "Required prevResult missing" and "vrf" in err.details
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
    got = netconf.require_prev_result({"cniVersion": "1.0.0", "prevResult": prev}, "vrf")
    assert str(got.ips[0].address) == "10.0.0.2/24"
    bad = {"cniVersion": "1.0.0", "prevResult": {"ips": "x"}}
    assert _code(netconf.require_prev_result, bad, "vrf").code == DECODE_FAILURE


# ---- valid-attachments ---------------------------------------------------------------------------
def test_valid_attachments() -> None:
    conf = {netconf.VALID_ATTACHMENTS: [{"containerID": "a", "ifname": "eth0"}]}
    assert netconf.valid_attachments(conf) == [("a", "eth0")]
    assert netconf.valid_attachments({netconf.VALID_ATTACHMENTS: []}) == []
    assert netconf.valid_attachments({"cni.dev/attachments": [{"containerID": "b", "ifname": "e"}]}) == [("b", "e")]


@pytest.mark.parametrize("conf", [
    {},  # missing: GC would release everything
    {netconf.VALID_ATTACHMENTS: None},
    {netconf.VALID_ATTACHMENTS: "x"},
    {netconf.VALID_ATTACHMENTS: [{}]},
    {netconf.VALID_ATTACHMENTS: [None]},
    {netconf.VALID_ATTACHMENTS: [{"containerID": 1}]},
    {netconf.VALID_ATTACHMENTS: [{"containerID": "a", "ifname": 2}]},
])
def test_valid_attachments_refused(conf: dict[str, Any]) -> None:
    assert _code(netconf.valid_attachments, conf).code == INVALID_CONFIG


# ---- Rollback ------------------------------------------------------------------------------------
def test_rollback_runs_newest_first_only_on_failure() -> None:
    done: list[int] = []
    with Rollback() as undo:
        undo.push(done.append, 1)
    assert done == []
    with pytest.raises(RuntimeError, match="boom"), Rollback() as undo:
        undo.push(done.append, 1)
        undo.push(lambda: 1 / 0)  # a failing step does not stop the others
        undo.push(done.append, 2)
        raise RuntimeError("boom")
    assert done == [2, 1]


def test_rollback_is_not_in_ipam_any_more() -> None:
    assert not hasattr(ipam, "Rollback")  # one home: pycni.rollback


# ---- IPAM GC / STATUS delegation -----------------------------------------------------------------
_FAKE_IPAM = """#!/bin/sh
echo "$CNI_COMMAND" >> "{log}"
cat > /dev/null
if [ "$CNI_COMMAND" = STATUS ]; then
  echo '{{"cniVersion":"1.1.0","code":50,"msg":"not ready"}}'; exit 1
fi
exit 0
"""


def _args(tmp_path: Path, command: str, conf: dict[str, Any]) -> CmdArgs:
    return CmdArgs(command=command, path=str(tmp_path), stdin_data=json.dumps(conf).encode(),
                   env={"CNI_COMMAND": command, "CNI_PATH": str(tmp_path), "PATH": os.environ.get("PATH", "")})


def test_ipam_gc_and_status_delegate(tmp_path: Path) -> None:
    log = tmp_path / "log"
    fake = tmp_path / "fake-ipam"
    fake.write_text(_FAKE_IPAM.format(log=log))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "x", "ipam": {"type": "fake-ipam"},
            netconf.VALID_ATTACHMENTS: []}
    ipam.gc(conf, _args(tmp_path, "GC", conf))
    err = _code(ipam.status, conf, _args(tmp_path, "STATUS", conf))
    assert err.code == 50 and err.msg == "not ready"
    assert log.read_text().split() == ["GC", "STATUS"]
    assert ipam.locate(conf, _args(tmp_path, "ADD", conf)) == str(fake)
    no_ipam = {"cniVersion": "1.1.0", "name": "n", "type": "x", netconf.VALID_ATTACHMENTS: []}
    ipam.gc(no_ipam, _args(tmp_path, "GC", no_ipam))  # nothing to ask: success
    ipam.status(no_ipam, _args(tmp_path, "STATUS", no_ipam))
    assert ipam.locate(no_ipam, _args(tmp_path, "ADD", no_ipam)) == ""
    missing = {**conf, "ipam": {"type": "not-there"}}
    assert _code(ipam.locate, missing, _args(tmp_path, "ADD", missing)).code == INVALID_CONFIG


# ---- statefile -----------------------------------------------------------------------------------
def test_statefile_write_read_remove(tmp_path: Path) -> None:
    from pycni import statefile

    path = str(tmp_path / "sub" / ("x" * 255))  # the longest name a directory holds: its temporary fits too
    statefile.write_json(path, {"a": 1}, mode=0o640)
    assert statefile.read_json(path) == {"a": 1}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "sub").st_mode) == 0o700
    assert os.listdir(tmp_path / "sub") == ["x" * 255]  # no temporary left
    assert statefile.remove(path) and not statefile.remove(path)
    assert statefile.read_json(path) is None
    (tmp_path / "bad").write_text("{")
    assert statefile.read_json(str(tmp_path / "bad")) is None
    with pytest.raises(CNIError) as e:
        statefile.write_json(str(tmp_path / "bad" / "x"), {}, failure="cannot save")
    assert e.value.code == 5 and e.value.msg == "cannot save"
