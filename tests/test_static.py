"""static IPAM: results compared with the Go reference binary, errors, CHECK/DEL, lean imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from plugin_util import answer, run

from pycni.skel import Outcome

GO_DIR = "/usr/lib/cni"
GO_STATIC = GO_DIR + "/static"


NO_NETNS = "/var/run/netns/none"  # an IPAM plugin never enters it


def _exec(cni_path: str, conf: dict[str, Any], cni_args: str = "") -> tuple[int, Any]:
    """ADD by the static executable in ``cni_path`` (the Go reference's dir or our plugin_dir)."""
    return answer(run("static", "ADD", conf, via="exec", cni_path=cni_path, container_id="ctr1", netns=NO_NETNS,
                      args=cni_args))


def _dispatch(command: str, conf: dict[str, Any] | bytes, cni_args: str = "") -> Outcome:
    return run("static", command, conf, container_id="ctr1", netns=NO_NETNS, args=cni_args)


def _conf(version: str = "1.0.0", **ipam: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": "statnet", "type": "static", "ipam": {"type": "static", **ipam}}


FULL_IPAM: dict[str, Any] = {
    "addresses": [{"address": "10.10.0.5/24", "gateway": "10.10.0.1"}, {"address": "2001:db8::5/64"}],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.0.254"}, {"dst": "::/0"}],
    "dns": {"nameservers": ["10.10.0.1", "2001:db8::53"], "domain": "example.org",
            "search": ["a.example.org"], "options": ["ndots:2"]},
}

# (conf, CNI_ARGS) pairs run through both implementations.
DIFF_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("full-1.0.0", _conf("1.0.0", **FULL_IPAM), ""),
    ("full-0.4.0", _conf("0.4.0", **FULL_IPAM), ""),
    ("full-0.3.1", _conf("0.3.1", **FULL_IPAM), ""),
    ("full-0.2.0", _conf("0.2.0", **FULL_IPAM), ""),
    ("v6-only", _conf("1.0.0", addresses=[{"address": "fd00:1::10/64", "gateway": "fd00:1::1"}]), ""),
    ("host-bits-kept", _conf("1.0.0", addresses=[{"address": "10.1.2.3/8"}]), ""),
    ("host-address-onlink-gw", _conf("1.0.0", addresses=[{"address": "10.1.2.3/32", "gateway": "169.254.1.1"},
                                                         {"address": "fd00::3/128", "gateway": "fe80::1"}]), ""),
    ("no-addresses", _conf("1.0.0", routes=[{"dst": "10.0.0.0/8"}]), ""),
    ("cni-args-ip-gw", _conf("1.0.0", addresses=[{"address": "10.10.0.5/24"}]),
     "IP=10.20.0.3/16,fd00::3/64;GATEWAY=10.20.0.1,fd00::1"),
    ("cni-args-ignore-unknown", _conf("1.0.0"), "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.30.0.9/24"),
    ("args-cni-ips-replace", {**_conf("1.0.0", addresses=[{"address": "10.10.0.5/24",
                                                           "gateway": "10.10.0.1"}]),
                              "args": {"cni": {"ips": ["10.99.0.7/24", "fd99::7/64"]}}}, ""),
    ("runtime-ips-replace", {**_conf("1.0.0", addresses=[{"address": "10.10.0.5/24"}]),
                             "runtimeConfig": {"ips": ["10.88.0.8/16"]}}, "IP=10.77.0.7/24"),
]


@pytest.mark.skipif(not os.access(GO_STATIC, os.X_OK), reason="Go reference static plugin not installed")
@pytest.mark.parametrize(("name", "conf", "cni_args"), DIFF_CASES, ids=[c[0] for c in DIFF_CASES])
def test_same_result_as_go_reference(plugin_dir: str, name: str, conf: dict[str, Any], cni_args: str) -> None:
    go_rc, go_out = _exec(GO_DIR, conf, cni_args=cni_args)
    py_rc, py_out = _exec(plugin_dir, conf, cni_args=cni_args)
    assert go_rc == 0, go_out
    assert py_rc == 0, py_out
    # Go 1.1.1's libcni prints an empty "dns": {} in 1.x results; current libcni (and our spec layer) omit it.
    if go_out.get("dns") == {} and go_out["cniVersion"].startswith("1."):
        go_out.pop("dns")
    assert py_out == go_out


# The inputs of the reference's own static_test.go (plugins v1.1.1), at every version it runs.
GO_VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]
UPSTREAM_ROUTES = [{"dst": "0.0.0.0/0", "gw": "10.10.0.254"}, {"dst": "3ffe:ffff:0:01ff::1/64", "gw": "3ffe:ffff:0::1"}]
UPSTREAM_DNS = {"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["example.com"]}
UPSTREAM_CASES: dict[str, tuple[dict[str, Any], str]] = {
    # an IPv6 gateway outside its address's /64 is taken as it is
    "add-del": ({"addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
                               {"address": "3ffe:ffff:0:01ff::1/64", "gateway": "3ffe:ffff:0::1"}],
                 "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.5.1"},
                            {"dst": "3ffe:ffff:0:01ff::1/64"}], "dns": UPSTREAM_DNS}, ""),
    "env-multi": ({}, "IP=10.10.0.1/24,11.11.0.1/24;GATEWAY=10.10.0.254"),
    # runtimeConfig wins over args.cni.ips, which wins over CNI_ARGS (the reference's test
    # spells it "RuntimeConfig": Go's case-blind decoding, another item of issue 26)
    "runtime-args-cni-args": ({"routes": UPSTREAM_ROUTES, "dns": UPSTREAM_DNS},
                              "IP=10.10.0.3/24,11.11.0.3/24;GATEWAY=10.10.0.254"),
}
UPSTREAM_TOP: dict[str, dict[str, Any]] = {
    "runtime-args-cni-args": {"capabilities": {"ips": True},
                              "runtimeConfig": {"ips": ["10.10.0.1/24", "3ffe:ffff:0:01ff::1/64"]},
                              "args": {"cni": {"ips": ["10.10.0.2/24", "3ffe:ffff:0:01ff::2/64"]}}},
}


@pytest.mark.skipif(not os.access(GO_STATIC, os.X_OK), reason="Go reference static plugin not installed")
@pytest.mark.parametrize("version", GO_VERSIONS)
@pytest.mark.parametrize("case", sorted(UPSTREAM_CASES))
def test_upstream_specs_same_as_go(plugin_dir: str, case: str, version: str) -> None:
    """The reference's static_test.go inputs: the same result, or the same refusal (msg), as Go."""
    ipam, cni_args = UPSTREAM_CASES[case]
    conf = {**_conf(version, **ipam), "type": "ipvlan", "master": "foo0", **UPSTREAM_TOP.get(case, {})}
    go_rc, go_out = _exec(GO_DIR, conf, cni_args=cni_args)
    py_rc, py_out = _exec(plugin_dir, conf, cni_args=cni_args)
    if go_rc:
        assert py_rc == 1 and py_out["msg"] == go_out["msg"], (go_out, py_out)
        return
    assert py_rc == 0, py_out
    if go_out.get("dns") == {} and go_out["cniVersion"].startswith("1."):
        go_out.pop("dns")
    assert py_out == go_out
    if case == "runtime-args-cni-args":
        first = py_out["ips"][0]["address"] if "ips" in py_out else py_out["ip4"]["ip"]
        assert first == "10.10.0.1/24"


@pytest.mark.skipif(not os.access(GO_STATIC, os.X_OK), reason="Go reference static plugin not installed")
@pytest.mark.parametrize(("where", "msg"), [
    ("address", "the 'address' field is expected to be in CIDR notation, got: '10.10.0.1'"),
    ("CNI_ARGS", "the 'ip' field is expected to be in CIDR notation, got: '10.10.0.1'"),
    ("args", "an entry in the 'ips' field is NOT in CIDR notation, got: '10.10.0.1'"),
    ("runtimeConfig", "an entry in the 'ips' field is NOT in CIDR notation, got: '10.10.0.1'"),
])
def test_invalid_cidr_has_gos_message(plugin_dir: str, where: str, msg: str) -> None:
    """An address without a prefix: Go's msg (upstream's MatchError), ours code 7 with a hint in details."""
    conf: dict[str, Any] = _conf("1.0.0", routes=[{"dst": "0.0.0.0/0"}])
    cni_args = ""
    if where == "address":
        conf["ipam"]["addresses"] = [{"address": "10.10.0.1"}]
    elif where == "CNI_ARGS":
        cni_args = "IP=10.10.0.1"
    elif where == "args":
        conf["args"] = {"cni": {"ips": ["10.10.0.1"]}}
    else:
        conf["runtimeConfig"] = {"ips": ["10.10.0.1"]}
    go_rc, go_out = _exec(GO_DIR, conf, cni_args=cni_args)
    py_rc, py_out = _exec(plugin_dir, conf, cni_args=cni_args)
    assert go_rc == 1 and go_out["msg"] == msg
    assert py_rc == 1 and py_out["code"] == 7 and py_out["msg"] == msg and "ADDRESS/PREFIX" in py_out["details"]


@pytest.mark.skipif(not os.access(GO_STATIC, os.X_OK), reason="Go reference static plugin not installed")
@pytest.mark.parametrize("conf", [
    _conf("1.0.0", addresses=[{"address": "10.10.0.5"}]),                     # no prefix
    _conf("1.0.0", addresses=[{"address": "10.10.0.500/24"}]),                 # bad octet
    _conf("1.0.0", addresses=[{"address": "10.0.0.1/24", "gateway": "nope"}]),  # bad gateway
    _conf("0.2.0", addresses=[{"address": "10.0.0.1/24"}, {"address": "10.0.1.1/24"}]),  # 2 per family
    {"cniVersion": "1.0.0", "name": "n", "type": "static"},                    # no ipam
])
def test_both_refuse_bad_config(plugin_dir: str, conf: dict[str, Any]) -> None:
    go_rc, _ = _exec(GO_DIR, conf)
    py_rc, py_out = _exec(plugin_dir, conf)
    assert go_rc != 0
    assert py_rc == 1
    assert py_out["code"] == 7, py_out
    assert py_out["msg"]


def _add(conf: dict[str, Any], cni_args: str = "") -> tuple[int, dict[str, Any]]:
    return answer(_dispatch("ADD", conf, cni_args))


@pytest.mark.parametrize(("conf", "cni_args", "code", "fragment"), [
    (_conf(addresses=[{"address": "10.0.0.5/24", "gateway": "10.0.1.1"}]), "", 7, "outside"),
    (_conf(addresses=[{"address": "10.0.0.5/25", "gateway": "10.0.0.129"}]), "", 7, "outside"),
    (_conf(addresses=[{"address": "10.0.0.5/24", "gateway": "fd00::1"}]), "", 7, "family"),
    (_conf(addresses=[{"address": "10.0.0.5/24"}]), "GATEWAY=192.168.9.1", 7, "not inside any address"),
    (_conf(addresses=[{"address": "10.0.0.5/24"}]), "IP=10.0.0.9", 7, "CIDR"),
    (_conf(addresses=[{"address": "10.0.0.5/24"}]), "IP=10.0.0.9/24;FOO=1", 4, "unknown args"),
    (_conf(addresses="10.0.0.5/24"), "", 7, "addresses"),
    (_conf(addresses=[{"address": "10.0.0.5/24"}], routes=[{"dst": "banana"}]), "", 7, "route"),
    ({**_conf(), "runtimeConfig": {"ips": ["10.0.0.1"]}}, "", 7, "CIDR"),
    ({**_conf(addresses=[{"address": "10.0.0.5/24"}]), "args": "x"}, "", 7, "'args' must be a JSON object"),
    ({**_conf(addresses=[{"address": "10.0.0.5/24"}]), "runtimeConfig": []}, "", 7, "'runtimeConfig' must be"),
    ({**_conf(), "runtimeConfig": {"ips": "10.0.0.1/24"}}, "", 7, "'runtimeConfig.ips' must be a list"),
])
def test_errors_are_clear_cni_errors(conf: dict[str, Any], cni_args: str, code: int, fragment: str) -> None:
    rc, out = _add(conf, cni_args)
    assert rc == 1
    assert out["code"] == code, out
    assert fragment in out["msg"] + out.get("details", ""), out


def test_undecodable_stdin_is_code_6() -> None:
    out = _dispatch("ADD", b"{not json")
    assert out.exit_code == 1 and json.loads(out.stdout)["code"] == 6


def test_del_and_gc_always_succeed() -> None:
    no_ipam = {"cniVersion": "1.1.0", "name": "n", "type": "static"}
    for conf in (_conf(addresses=[{"address": "10.0.0.5/24"}]), no_ipam):
        assert _dispatch("DEL", conf).exit_code == 0
    gc_conf = {**_conf("1.1.0"), "cni.dev/valid-attachments": []}
    assert _dispatch("GC", gc_conf).exit_code == 0


def test_check_against_prev_result() -> None:
    conf = _conf("1.0.0", addresses=[{"address": "10.0.0.5/24", "gateway": "10.0.0.1"}])
    rc, result = _add(conf)
    assert rc == 0
    ok = _dispatch("CHECK", {**conf, "prevResult": result})
    assert ok.exit_code == 0, ok.stdout
    wrong_gw = json.loads(json.dumps(result))
    wrong_gw["ips"][0]["gateway"] = "10.0.0.254"
    bad = _dispatch("CHECK", {**conf, "prevResult": wrong_gw})
    assert bad.exit_code == 1 and "Failed to match addr" in json.loads(bad.stdout)["msg"]
    missing = _dispatch("CHECK", {**conf, "prevResult": {
        "cniVersion": "1.0.0", "ips": [{"address": "10.0.0.6/24"}]}})
    assert missing.exit_code == 1 and "missing" in json.loads(missing.stdout)["msg"]
    no_prev = _dispatch("CHECK", conf)
    assert no_prev.exit_code == 1 and "prevResult" in json.loads(no_prev.stdout)["msg"]


def test_imports_stdlib_only() -> None:
    code = ("import sys; import pycni.plugins.ipam.static; "
            "bad=[m for m in sys.modules if m.split('.')[0] in ('pyroute2','pydantic','yaml')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("attachments,code", [("absent", 7), (None, 7), ([{}], 7), ([{"containerID": 1}], 7),
                                              ([], 0), ([{"containerID": "c1", "ifname": "eth0"}], 0)])
def test_gc_checks_the_valid_list_and_status_is_ready(attachments: Any, code: int) -> None:
    """Nothing to collect, but GC refuses a missing or malformed list as every plugin does; STATUS answers."""
    conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": "gcnet", "type": "static", "ipam": {"type": "static"}}
    if attachments != "absent":
        conf["cni.dev/valid-attachments"] = attachments
    out = run("static", "GC", conf, cni_path="/nonexistent")
    assert out.exit_code == (1 if code else 0), out.stdout
    if code:
        assert json.loads(out.stdout)["code"] == code
    out = run("static", "STATUS", conf, cni_path="/nonexistent")
    assert out.exit_code == 0, out.stdout


SAMPLES: dict[type, Any] = {int: 5, bool: False, str: "x", list: ["x"], dict: {"x": 1}, float: 1.5}
WRONG = [(where, key, value) for where, keys in (("ipam", {"addresses": list, "routes": list, "dns": dict}),
                                                 ("top", {"runtimeConfig": dict, "args": dict}))
         for key, want in keys.items() for have, value in SAMPLES.items() if have is not want]


@pytest.mark.parametrize(("where", "key", "value"), WRONG, ids=[f"{w}-{k}-{type(v).__name__}" for w, k, v in WRONG])
def test_wrong_type_is_refused(where: str, key: str, value: Any) -> None:
    conf = _conf(addresses=[{"address": "10.0.0.5/24"}])
    (conf["ipam"] if where == "ipam" else conf)[key] = value
    rc, out = _add(conf)
    assert rc == 1 and out["code"] in (6, 7), out
