"""skel: environment + stdin -> handler -> stdout / error JSON, as Go's skel does it.

Unit tests drive ``dispatch`` with a recording plugin; the comparison tests run the Go
reference plugins (/usr/lib/cni) and ours with the same bad input, inside a throwaway
namespace, and compare exit and error codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from pycni.plugins import registry
from pycni.skel import CmdArgs, Outcome, Plugin, dispatch, prev_result
from pycni.spec import errors as E
from pycni.spec.errors import CNIError
from pycni.spec.types import IPConfig, Result, parse_cidr
from pycni.spec.version import ALL_VERSIONS

GO_PLUGIN_DIR = "/usr/lib/cni"
NS_PATH_UNUSED = "/var/run/netns/pycni-no-such-ns"


class Recorder:
    """A plugin whose handlers record their calls and return a fixed result."""

    def __init__(self, versions: tuple[str, ...] = ALL_VERSIONS, about: str = "recorder plugin",
                 fail: BaseException | None = None) -> None:
        self.calls: list[CmdArgs] = []
        self.fail = fail
        self.plugin = Plugin(add=self.handle, delete=self.handle, check=self.handle, gc=self.handle,
                             status=self.handle, versions=versions, about=about)

    def handle(self, args: CmdArgs) -> Result | None:
        self.calls.append(args)
        if self.fail is not None:
            raise self.fail
        if args.command == "ADD":
            return Result(cni_version="1.1.0", ips=[IPConfig(address=parse_cidr("10.0.0.2/24"))])
        return None


def conf(version: str = "1.0.0", **extra: Any) -> bytes:
    return json.dumps({"cniVersion": version, "name": "testnet", "type": "recorder", **extra}).encode()


def env_for(command: str, **overrides: str) -> dict[str, str]:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "ctr-1", "CNI_NETNS": NS_PATH_UNUSED,
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
    env.update(overrides)
    return {k: v for k, v in env.items() if v != ""}


def error_of(out: Outcome) -> dict[str, Any]:
    assert out.exit_code == 1, out
    assert b"Traceback" not in out.stdout + out.stderr
    err = json.loads(out.stdout)
    assert isinstance(err["code"], int) and err["msg"]
    return err


# ---- environment ---------------------------------------------------------------------------

@pytest.mark.parametrize(("command", "drop", "listed"), [
    ("ADD", ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
     "CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH"),
    ("ADD", ["CNI_NETNS"], "CNI_NETNS"),
    ("ADD", ["CNI_PATH", "CNI_IFNAME"], "CNI_IFNAME,CNI_PATH"),
    ("CHECK", ["CNI_CONTAINERID"], "CNI_CONTAINERID"),
    ("CHECK", ["CNI_NETNS"], "CNI_NETNS"),
    ("DEL", ["CNI_IFNAME"], "CNI_IFNAME"),
    ("DEL", ["CNI_CONTAINERID", "CNI_PATH"], "CNI_CONTAINERID,CNI_PATH"),
    ("GC", ["CNI_PATH"], "CNI_PATH"),
    ("STATUS", ["CNI_PATH"], "CNI_PATH"),
])
def test_missing_env_lists_every_missing_variable(command: str, drop: list[str], listed: str) -> None:
    rec = Recorder()
    env = env_for(command, **{k: "" for k in drop})
    err = error_of(dispatch(rec.plugin, env, conf("1.1.0")))
    assert err["code"] == E.INVALID_ENV
    assert err["msg"] == f"required env variables [{listed}] missing"
    assert not rec.calls


@pytest.mark.parametrize("command", ["DEL", "GC", "STATUS"])
def test_optional_env_may_be_absent(command: str) -> None:
    rec = Recorder()
    env = {"CNI_COMMAND": command, "CNI_PATH": "/opt/cni/bin"}
    if command == "DEL":
        env.update(CNI_CONTAINERID="c1", CNI_IFNAME="eth0")  # no CNI_NETNS: DEL must still work
    out = dispatch(rec.plugin, env, conf("1.1.0"))
    assert out == Outcome(0), out
    assert len(rec.calls) == 1 and rec.calls[0].netns == ""


def test_no_command_with_about_prints_about_and_succeeds() -> None:
    out = dispatch(Recorder(versions=("0.4.0", "1.0.0")).plugin, {}, b"")
    assert out.exit_code == 0 and out.stdout == b""
    assert out.stderr.decode() == "recorder plugin\nCNI protocol versions supported: 0.4.0, 1.0.0\n"


def test_no_command_without_about_is_an_env_error() -> None:
    err = error_of(dispatch(Recorder(about="").plugin, {"CNI_PATH": "/x"}, b""))
    assert err["code"] == E.INVALID_ENV and err["msg"] == "required env variables [CNI_COMMAND] missing"


@pytest.mark.parametrize(("var", "value", "code", "msg"), [
    ("CNI_CONTAINERID", "bad/id", E.INVALID_ENV, "invalid characters in containerID"),
    ("CNI_CONTAINERID", "-leading", E.INVALID_ENV, "invalid characters in containerID"),
    ("CNI_IFNAME", "a" * 16, E.INVALID_ENV, "interface name is too long"),
    ("CNI_IFNAME", "é" * 8, E.INVALID_ENV, "interface name is too long"),  # 16 bytes, as the kernel counts
    ("CNI_IFNAME", "..", E.INVALID_ENV, "interface name is . or .."),
    ("CNI_IFNAME", "eth/0", E.INVALID_ENV, "interface name contains"),
    ("CNI_IFNAME", "eth 0", E.INVALID_ENV, "interface name contains"),
    ("CNI_IFNAME", "eth:0", E.INVALID_ENV, "interface name contains"),
])
@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK"])
def test_invalid_ids_are_refused_before_anything_runs(command: str, var: str, value: str, code: int,
                                                      msg: str) -> None:
    rec = Recorder()
    err = error_of(dispatch(rec.plugin, env_for(command, **{var: value}), conf()))
    assert (err["code"], err["msg"][:len(msg)]) == (code, msg)
    assert not rec.calls


def test_invalid_id_is_reported_before_missing_variables() -> None:
    # As Go's skel: a present-but-invalid value is reported first.
    err = error_of(dispatch(Recorder().plugin, env_for("ADD", CNI_CONTAINERID="a b", CNI_PATH=""), conf()))
    assert err["msg"] == "invalid characters in containerID"


def test_unknown_command() -> None:
    err = error_of(dispatch(Recorder().plugin, {"CNI_COMMAND": "FROB"}, conf()))
    assert err["code"] == E.INVALID_ENV and err["msg"] == "unknown CNI_COMMAND: FROB"


# ---- VERSION ---------------------------------------------------------------------------------

def test_version_needs_no_other_env_and_no_stdin() -> None:
    out = dispatch(Recorder().plugin, {"CNI_COMMAND": "VERSION"}, b"")
    assert out.exit_code == 0
    assert json.loads(out.stdout) == {"cniVersion": "1.1.0", "supportedVersions": list(ALL_VERSIONS)}


def test_version_answers_with_the_asked_version_when_supported() -> None:
    out = dispatch(Recorder().plugin, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "0.3.1"}')
    assert json.loads(out.stdout)["cniVersion"] == "0.3.1"
    out = dispatch(Recorder(versions=("0.3.1", "0.4.0")).plugin, {"CNI_COMMAND": "VERSION"},
                   b'{"cniVersion": "9.9.9"}')
    assert json.loads(out.stdout) == {"cniVersion": "0.4.0", "supportedVersions": ["0.3.1", "0.4.0"]}


def test_version_ignores_garbage_stdin() -> None:
    out = dispatch(Recorder().plugin, {"CNI_COMMAND": "VERSION"}, b"\x00garbage")
    assert out.exit_code == 0 and json.loads(out.stdout)["supportedVersions"]


# ---- configuration and versions --------------------------------------------------------------

@pytest.mark.parametrize(("stdin", "code", "msg"), [
    (b"", E.DECODE_FAILURE, "error unmarshalling network config"),
    (b"{not json", E.DECODE_FAILURE, "error unmarshalling network config"),
    (b"[1, 2]", E.DECODE_FAILURE, "error unmarshalling network config"),
    (b"\xff\xfe", E.DECODE_FAILURE, "error unmarshalling network config"),
    (b'{"cniVersion": "1.0.0"}', E.INVALID_CONFIG, "missing network name"),
    (b'{"cniVersion": "1.0.0", "name": ""}', E.INVALID_CONFIG, "missing network name"),
    (b'{"cniVersion": "1.0.0", "name": "bad name"}', E.INVALID_CONFIG, "invalid characters found in network name"),
    (b'{"cniVersion": "1.0.0", "name": 5}', E.DECODE_FAILURE, "error unmarshalling network config"),
    (b'{"cniVersion": 1, "name": "n"}', E.DECODE_FAILURE, "invalid cniVersion"),
    (b'{"cniVersion": "0.5.0", "name": "n"}', E.INCOMPATIBLE_VERSION, "incompatible CNI versions"),
    (b'{"cniVersion": "2.0.0", "name": "n"}', E.INCOMPATIBLE_VERSION, "incompatible CNI versions"),
])
@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK"])
def test_bad_config(command: str, stdin: bytes, code: int, msg: str) -> None:
    if command == "CHECK" and b"2.0.0" in stdin:
        msg = "plugin version does not allow CHECK"  # Go checks the plugin can go that high first
    rec = Recorder()
    err = error_of(dispatch(rec.plugin, env_for(command), stdin))
    assert (err["code"], err["msg"]) == (code, msg), err
    assert not rec.calls


def test_unsupported_version_details_name_both_sides() -> None:
    err = error_of(dispatch(Recorder(versions=("0.3.1", "0.4.0")).plugin, env_for("ADD"), conf("1.0.0")))
    assert err["details"] == 'config is "1.0.0", plugin supports ["0.3.1" "0.4.0"]'
    assert err["cniVersion"] == "1.0.0"


def test_missing_cni_version_means_0_1_0() -> None:
    rec = Recorder()
    out = dispatch(rec.plugin, env_for("ADD"), b'{"name": "n", "type": "x"}')
    assert out.exit_code == 0, out
    assert json.loads(out.stdout) == {"cniVersion": "0.1.0", "ip4": {"ip": "10.0.0.2/24"}, "dns": {}}


@pytest.mark.parametrize(("command", "too_old", "ok"), [
    ("CHECK", ["0.1.0", "0.2.0", "0.3.0", "0.3.1"], ["0.4.0", "1.0.0", "1.1.0"]),
    ("GC", ["0.4.0", "1.0.0"], ["1.1.0"]),
    ("STATUS", ["0.3.1", "1.0.0"], ["1.1.0"]),
])
def test_commands_need_a_minimum_config_version(command: str, too_old: list[str], ok: list[str]) -> None:
    for ver in too_old:
        rec = Recorder()
        err = error_of(dispatch(rec.plugin, env_for(command), conf(ver)))
        assert (err["code"], err["msg"]) == (E.INCOMPATIBLE_VERSION, f"config version does not allow {command}")
        assert not rec.calls
    for ver in ok:
        rec = Recorder()
        assert dispatch(rec.plugin, env_for(command), conf(ver)) == Outcome(0)
        assert [c.command for c in rec.calls] == [command]


def test_plugin_too_old_for_check() -> None:
    err = error_of(dispatch(Recorder(versions=("0.3.1",)).plugin, env_for("CHECK"), conf("0.4.0")))
    assert (err["code"], err["msg"]) == (E.INCOMPATIBLE_VERSION, "plugin version does not allow CHECK")


# ---- handlers ------------------------------------------------------------------------------

def test_add_passes_env_and_renders_result_in_config_version() -> None:
    rec = Recorder()
    env = env_for("ADD", CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAME=p")
    out = dispatch(rec.plugin, env, conf("0.4.0"))
    assert out.exit_code == 0, out
    assert json.loads(out.stdout) == {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}],
                                      "dns": {}}
    args = rec.calls[0]
    assert (args.container_id, args.netns, args.ifname, args.args, args.path) == (
        "ctr-1", NS_PATH_UNUSED, "eth0", "IgnoreUnknown=1;K8S_POD_NAME=p", "/opt/cni/bin")
    assert args.cni_path == ["/opt/cni/bin"] and args.conf()["name"] == "testnet"
    assert args.stdin_data == conf("0.4.0")


def test_add_result_that_cannot_be_converted_is_an_error() -> None:
    plugin = Plugin(add=lambda a: Result(cni_version="1.0.0"), about="x")
    err = error_of(dispatch(plugin, env_for("ADD"), conf("0.2.0")))
    assert err["code"] == E.INCOMPATIBLE_VERSION and "no valid IP addresses" in err["details"]


@pytest.mark.parametrize("exc", [ValueError("boom"), KeyError("ipam"), OSError(13, "Permission denied"),
                                 ZeroDivisionError(), SystemExit(3), RecursionError("deep")])
@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK"])
def test_handler_exceptions_become_internal_errors(command: str, exc: BaseException) -> None:
    out = dispatch(Recorder(fail=exc).plugin, env_for(command), conf())
    err = error_of(out)
    assert err["code"] == E.INTERNAL == 999
    assert err["cniVersion"] == "1.0.0"
    assert err["details"].split(";")[0] == type(exc).__name__
    if isinstance(exc, PermissionError):  # the usual cause of EPERM, said plainly
        assert "needs root or CAP_NET_ADMIN" in err["details"]
    assert out.stderr == b""


def test_debug_env_puts_the_traceback_on_stderr_only() -> None:
    out = dispatch(Recorder(fail=ValueError("boom")).plugin, env_for("ADD", PYCNI_DEBUG="1"), conf())
    assert json.loads(out.stdout)["msg"] == "boom"
    assert b"Traceback" in out.stderr and b"ValueError: boom" in out.stderr


def test_handler_cni_errors_keep_their_code() -> None:
    err = error_of(dispatch(Recorder(fail=CNIError(E.TRY_AGAIN, "busy", "later")).plugin, env_for("DEL"),
                            conf("0.4.0")))
    assert err == {"cniVersion": "0.4.0", "code": 11, "msg": "busy", "details": "later"}


def test_add_returning_nothing_is_an_internal_error() -> None:
    err = error_of(dispatch(Plugin(add=lambda a: None, about="x"), env_for("ADD"), conf()))
    assert err["code"] == E.INTERNAL


def test_missing_handlers() -> None:
    bare = Plugin(about="bare")
    assert error_of(dispatch(bare, env_for("ADD"), conf()))["code"] == E.INTERNAL
    for command, ver in (("DEL", "1.0.0"), ("CHECK", "1.0.0"), ("GC", "1.1.0"), ("STATUS", "1.1.0")):
        assert dispatch(bare, env_for(command), conf(ver)) == Outcome(0), command


@pytest.mark.parametrize("command", ["ADD", "DEL"])
def test_netns_of_the_plugin_itself_is_refused(command: str) -> None:
    own = "/proc/thread-self/ns/net"
    rec = Recorder()
    err = error_of(dispatch(rec.plugin, env_for(command, CNI_NETNS=own), conf()))
    assert err["code"] == E.INVALID_NETNS
    for override in ("1", "true", "TRUE"):
        out = dispatch(rec.plugin, env_for(command, CNI_NETNS=own, CNI_NETNS_OVERRIDE=override), conf())
        assert out.exit_code == 0, out
    assert rec.calls[-1].netns_override


def test_prev_result_is_parsed_at_the_config_version() -> None:
    prev = {"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.0.0.2/24"}]}
    res = prev_result(json.loads(conf("0.3.1", prevResult=prev)))
    assert res is not None and res.cni_version == "0.3.1" and str(res.ips[0].address) == "10.0.0.2/24"
    assert prev_result(json.loads(conf("1.0.0"))) is None
    with pytest.raises(CNIError) as ei:  # a 0.3.1 body under a 1.0.0 config: Go refuses too
        prev_result(json.loads(conf("1.0.0", prevResult=prev)))
    assert ei.value.code == E.DECODE_FAILURE


# ---- the process entry point ----------------------------------------------------------------

RUN_RECORDER = """
import sys
from pycni.skel import Plugin, run_plugin
from pycni.spec.types import Result
run_plugin(Plugin(add=lambda a: Result(cni_version="1.0.0"), delete=lambda a: 1 / 0, about="tiny"))
"""


def run_entry(env: dict[str, str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(sys.path), **env}
    return subprocess.run([sys.executable, "-c", RUN_RECORDER], env=full, input=stdin, capture_output=True,
                          timeout=60)


def test_run_plugin_process_exit_codes_and_streams() -> None:
    proc = run_entry({}, b"")
    assert proc.returncode == 0 and proc.stdout == b"" and b"tiny" in proc.stderr
    proc = run_entry(env_for("DEL"), conf())
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["code"] == 999
    proc = run_entry(env_for("ADD"), conf())
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"cniVersion": "1.0.0"}


# ---- against the Go reference plugins ---------------------------------------------------------

# (name, env changes, stdin) — bad input every Go version (1.1 to current) answers the same way.
GO_CASES: list[tuple[str, dict[str, str], Callable[[], bytes]]] = [
    ("no-env-at-all", {"CNI_COMMAND": "", "CNI_CONTAINERID": "", "CNI_NETNS": "", "CNI_IFNAME": "",
                       "CNI_PATH": ""}, lambda: b""),
    ("add-only-command", {"CNI_CONTAINERID": "", "CNI_NETNS": "", "CNI_IFNAME": "", "CNI_PATH": ""}, conf),
    ("add-no-netns", {"CNI_NETNS": ""}, conf),
    ("add-no-path-ifname", {"CNI_PATH": "", "CNI_IFNAME": ""}, conf),
    ("check-no-containerid", {"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": ""}, conf),
    ("del-no-ifname", {"CNI_COMMAND": "DEL", "CNI_IFNAME": ""}, conf),
    ("add-bad-containerid", {"CNI_CONTAINERID": "bad/id"}, conf),
    ("add-long-ifname", {"CNI_IFNAME": "x" * 16}, conf),
    ("del-dot-ifname", {"CNI_COMMAND": "DEL", "CNI_IFNAME": "."}, conf),
    ("add-bad-json", {}, lambda: b"{nope"),
    ("del-empty-stdin", {"CNI_COMMAND": "DEL"}, lambda: b""),
    ("add-no-name", {}, lambda: b'{"cniVersion": "0.4.0", "type": "x"}'),
    ("add-bad-name", {}, lambda: conf(name="has space")),
    ("add-unknown-version", {}, lambda: conf("0.5.0")),
    ("del-unknown-version", {"CNI_COMMAND": "DEL"}, lambda: conf("7.0.0")),
    ("check-0.3.1", {"CNI_COMMAND": "CHECK"}, lambda: conf("0.3.1")),
    ("check-0.2.0", {"CNI_COMMAND": "CHECK"}, lambda: conf("0.2.0")),
    ("version-bare", {"CNI_COMMAND": "VERSION", "CNI_CONTAINERID": "", "CNI_NETNS": "", "CNI_IFNAME": "",
                      "CNI_PATH": ""}, lambda: b""),
]


def _run(ns: Any, binary: str, env: dict[str, str], stdin: bytes) -> tuple[int, dict[str, Any] | None]:
    proc = subprocess.run(["ip", "netns", "exec", ns.name, binary], env=env, input=stdin,
                          capture_output=True, timeout=60)
    assert b"Traceback" not in proc.stdout + proc.stderr, proc
    body = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, body


@pytest.mark.parametrize("plugin_type", sorted(t for t in registry.PLUGIN_MODULES
                                                if os.path.exists(os.path.join(GO_PLUGIN_DIR, t))))
def test_bad_input_same_codes_as_go(plugin_type: str, host_ns: Any, container_ns: Any, plugin_dir: str,
                                    tmp_path: Any) -> None:
    go = os.path.join(GO_PLUGIN_DIR, plugin_type)
    if not os.access(go, os.X_OK):
        pytest.skip(f"Go reference plugin {go} is not installed (apt-get install containernetworking-plugins)")
    ours = os.path.join(plugin_dir, plugin_type)
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr-go",
            "CNI_NETNS": container_ns.path, "CNI_IFNAME": "eth0", "CNI_PATH": plugin_dir}
    differences = []
    for name, change, stdin in GO_CASES:
        env = {k: v for k, v in {**base, **change}.items() if v}
        go_rc, go_body = _run(host_ns, go, env, stdin())
        our_rc, our_body = _run(host_ns, ours, env, stdin())
        go_code = go_body.get("code") if go_body else None
        our_code = our_body.get("code") if our_body else None
        if (go_rc, go_code) != (our_rc, our_code):
            differences.append((name, {"go": (go_rc, go_body), "ours": (our_rc, our_body)}))
        if go_body and "required env variables" in go_body.get("msg", ""):
            assert our_body is not None and our_body["msg"] == go_body["msg"], name
        if name == "version-bare":
            assert set(go_body["supportedVersions"]) <= set(our_body["supportedVersions"])
    assert not differences, json.dumps(differences, indent=1)
    # None of those may have created anything in the host namespace.
    assert host_ns.run(["ip", "-o", "link", "show"]).stdout.count("\n") == 1
