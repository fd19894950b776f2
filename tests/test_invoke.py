"""invoke: finding plugins, running them, reading their results and errors, delegation."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pycni import invoke
from pycni.skel import CmdArgs
from pycni.spec import errors as E
from pycni.spec.errors import CNIError


def script(directory: Path, name: str, body: str, mode: int = 0o755) -> str:
    """A fake plugin: a Python script with ``body`` (it sees stdin as ``data``, env as ``env``)."""
    path = directory / name
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\ndata = sys.stdin.read()\nenv = os.environ\n{body}\n")
    path.chmod(mode)
    return str(path)


# ---- find_in_path --------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["../bridge", "/usr/lib/cni/bridge", "sub/bridge", "a\\b", "", ".", ".."])
def test_find_in_path_refuses_paths(bad: str, tmp_path: Path) -> None:
    with pytest.raises(CNIError) as ei:
        invoke.find_in_path(bad, [str(tmp_path)])
    assert ei.value.code == E.INVALID_CONFIG


def test_find_in_path_first_directory_wins(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    script(b, "p", "pass")
    assert invoke.find_in_path("p", ["", str(a), str(b)]) == str(b / "p")
    script(a, "p", "pass", mode=0o644)  # found first even if not executable, as in Go ...
    assert invoke.find_in_path("p", [str(a), str(b)]) == str(a / "p")
    with pytest.raises(CNIError) as ei:  # ... and running it says why
        invoke.exec_plugin(str(a / "p"), b"{}", {})
    assert ei.value.code == E.IO_FAILURE and "chmod +x" in ei.value.details


def test_find_in_path_ignores_directories_and_reports_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    with pytest.raises(CNIError) as ei:
        invoke.find_in_path("p", [str(tmp_path)])
    assert ei.value.code == E.INVALID_CONFIG and str(tmp_path) in ei.value.msg


def test_find_in_path_without_paths() -> None:
    with pytest.raises(CNIError) as ei:
        invoke.find_in_path("bridge", [])
    assert ei.value.code == E.INVALID_ENV and "CNI_PATH" in ei.value.details


# ---- exec_plugin and error output -----------------------------------------------------------

def test_exec_returns_stdout_and_passes_env_and_stdin(tmp_path: Path) -> None:
    p = script(tmp_path, "echo", "print(json.dumps({'in': data, 'cmd': env['CNI_COMMAND']}))")
    out = invoke.exec_plugin(p, b"hello", {"CNI_COMMAND": "ADD"})
    assert json.loads(out) == {"in": "hello", "cmd": "ADD"}


def test_error_json_is_parsed(tmp_path: Path) -> None:
    p = script(tmp_path, "fail", "print(json.dumps({'cniVersion': '1.0.0', 'code': 7, 'msg': 'bad', "
                                 "'details': 'very'})); sys.exit(1)")
    with pytest.raises(CNIError) as ei:
        invoke.exec_plugin(p, b"{}", {})
    assert (ei.value.code, ei.value.msg, ei.value.details, ei.value.cni_version) == (7, "bad", "very", "1.0.0")


@pytest.mark.parametrize(("body", "msg_start", "detail_part"), [
    ("sys.exit(3)", "netplugin failed with no error message", "exited with status 3"),
    ("sys.stderr.write('it broke'); sys.exit(1)", "netplugin failed: 'it broke'", "exited with status 1"),
    ("print('not json at all'); sys.exit(2)", "netplugin failed but error parsing its diagnostic message",
     "not json at all"),
    ("print(json.dumps({'code': 'seven'})); sys.exit(1)",
     "netplugin failed but error parsing its diagnostic message", "not a CNI error object"),
    ("print('[1]'); sys.exit(1)", "netplugin failed but error parsing its diagnostic message", "[1]"),
    ("import signal; os.kill(os.getpid(), signal.SIGKILL)", "netplugin failed with no error message",
     "killed by signal 9"),
])
def test_non_json_failures_are_code_0_as_in_go(tmp_path: Path, body: str, msg_start: str,
                                               detail_part: str) -> None:
    p = script(tmp_path, "fail", body)
    with pytest.raises(CNIError) as ei:
        invoke.exec_plugin(p, b"{}", {})
    assert ei.value.code == E.UNKNOWN == 0
    assert ei.value.msg.startswith(msg_start), ei.value
    assert detail_part in str(ei.value)


def test_error_json_without_code_is_code_0(tmp_path: Path) -> None:
    p = script(tmp_path, "fail", "print(json.dumps({'msg': 'vague'})); sys.exit(1)")
    with pytest.raises(CNIError) as ei:
        invoke.exec_plugin(p, b"{}", {})
    assert (ei.value.code, ei.value.msg) == (0, "vague")


def test_missing_plugin_and_missing_interpreter(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as ei:
        invoke.exec_plugin(str(tmp_path / "nope"), b"{}", {})
    assert ei.value.code == E.INVALID_CONFIG
    p = tmp_path / "orphan"
    p.write_text("#!/nonexistent/python\n")
    p.chmod(0o755)
    with pytest.raises(CNIError) as ei:
        invoke.exec_plugin(str(p), b"{}", {})
    assert "interpreter" in ei.value.details


def test_timeout_is_try_again(tmp_path: Path) -> None:
    p = script(tmp_path, "slow", "import time; time.sleep(5)")
    with pytest.raises(CNIError) as ei:
        invoke.exec_plugin(p, b"{}", {}, timeout=0.5)
    assert ei.value.code == E.TRY_AGAIN


# ---- results -------------------------------------------------------------------------------

def test_result_without_version_takes_the_config_version(tmp_path: Path) -> None:
    p = script(tmp_path, "old", "print(json.dumps({'ip4': {'ip': '10.0.0.2/24'}}))")
    res = invoke.exec_with_result(p, b'{"cniVersion": "0.2.0", "name": "n"}', {})
    assert res.cni_version == "0.2.0" and str(res.ips[0].address) == "10.0.0.2/24"
    p = script(tmp_path, "new", "print(json.dumps({'cniVersion': '0.4.0', 'ips': []}))")
    assert invoke.exec_with_result(p, b'{"cniVersion": "1.0.0", "name": "n"}', {}).cni_version == "0.4.0"


@pytest.mark.parametrize("output", ["not json", "[1,2]", '{"cniVersion": "1.0.0", "ips": [{"address": "x"}]}'])
def test_undecodable_results(tmp_path: Path, output: str) -> None:
    p = script(tmp_path, "bad", f"print({output!r})")
    with pytest.raises(CNIError) as ei:
        invoke.exec_with_result(p, b'{"cniVersion": "1.0.0"}', {})
    assert ei.value.code == E.DECODE_FAILURE


# ---- environment and delegation -----------------------------------------------------------

def test_plugin_env_replaces_cni_vars_and_keeps_the_rest() -> None:
    base = {"PATH": "/bin", "CNI_COMMAND": "DEL", "CNI_NETNS": "/old", "CNI_ARGS": "A=1", "OTHER": "x"}
    env = invoke.plugin_env(base, "ADD", container_id="c", netns="/new", ifname="eth0", path="/opt/cni/bin")
    assert env == {"PATH": "/bin", "OTHER": "x", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c",
                   "CNI_NETNS": "/new", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}


@pytest.mark.parametrize("command", ["ADD", "CHECK", "DEL", "GC", "STATUS"])
def test_delegation_passes_the_callers_env_with_the_new_command(tmp_path: Path, command: str) -> None:
    record = tmp_path / "record.json"
    script(tmp_path, "ipam", f"open({str(record)!r}, 'w').write(json.dumps({{'env': dict(env), 'in': data}}))\n"
                             "print(json.dumps({'cniVersion': '1.0.0', 'ips': [{'address': '10.0.0.9/24'}]}))")
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
           "CNI_ARGS": "IgnoreUnknown=1", "CNI_PATH": f"/nonexistent:{tmp_path}", "PATH": "/usr/bin:/bin"}
    args = CmdArgs(command="ADD", container_id="c1", netns="/var/run/netns/x", ifname="eth0",
                   args="IgnoreUnknown=1", path=env["CNI_PATH"], env=env)
    conf = b'{"cniVersion": "1.0.0", "name": "n", "type": "ipam"}'
    fn = {"ADD": invoke.delegate_add, "CHECK": invoke.delegate_check, "DEL": invoke.delegate_del,
          "GC": invoke.delegate_gc, "STATUS": invoke.delegate_status}[command]
    result = fn("ipam", conf, args)
    seen = json.loads(record.read_text())
    assert seen["in"] == conf.decode()
    assert seen["env"]["CNI_COMMAND"] == command
    for key in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"):
        assert seen["env"][key] == env[key]
    if command == "ADD":
        assert result is not None and str(result.ips[0].address) == "10.0.0.9/24"
    else:
        assert result is None


def test_delegation_uses_the_injected_runner(tmp_path: Path) -> None:
    """dispatch(..., runner=) puts the runner on CmdArgs; every delegation goes through it, nested ones too."""
    from pycni.shim import run_delegate
    from pycni.skel import Plugin, dispatch
    from pycni.spec.types import Result

    script(tmp_path, "ipam", "print(json.dumps({'cniVersion': '1.0.0', 'ips': [{'address': '10.0.0.9/24'}]}))")
    calls: list[tuple[str, str]] = []

    def runner(path: str, stdin: bytes, env: dict[str, str]) -> bytes:
        calls.append((os.path.basename(path), env["CNI_COMMAND"]))
        return invoke.exec_plugin(path, stdin, env)

    seen: list[object] = []

    def add(args: CmdArgs) -> Result:
        seen.append(args.runner)
        return invoke.delegate_add("ipam", args.stdin_data, args)

    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0",
           "CNI_PATH": str(tmp_path)}
    conf = b'{"cniVersion": "1.0.0", "name": "n", "type": "x"}'
    outcome = dispatch(Plugin(add=add), env, conf, runner=runner)
    assert outcome.exit_code == 0, outcome.stdout
    assert calls == [("ipam", "ADD")] and seen == [runner]
    assert dispatch(Plugin(add=add), env, conf).exit_code == 0 and seen[-1] is None  # no runner: exec
    # the in-process runner execs what is not one of our executables
    assert json.loads(run_delegate(str(tmp_path / "ipam"), conf, env))["ips"][0]["address"] == "10.0.0.9/24"


def test_delegating_to_a_missing_plugin(tmp_path: Path) -> None:
    args = CmdArgs(command="ADD", path=str(tmp_path), env={"CNI_PATH": str(tmp_path)})
    with pytest.raises(CNIError) as ei:
        invoke.delegate_add("host-local", b"{}", args)
    assert ei.value.code == E.INVALID_CONFIG and "host-local" in ei.value.msg


# ---- VERSION ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "expect"), [
    ("print(json.dumps({'cniVersion': '1.1.0', 'supportedVersions': ['0.4.0', '1.0.0']}))", ["0.4.0", "1.0.0"]),
    ("print(json.dumps({'cniVersion': '0.2.0'}))", ["0.1.0", "0.2.0"]),
    ("print(json.dumps({'code': 4, 'msg': 'unknown CNI_COMMAND: VERSION'})); sys.exit(1)", ["0.1.0"]),
])
def test_version_info(tmp_path: Path, body: str, expect: list[str]) -> None:
    p = script(tmp_path, "v", body)
    assert invoke.get_version_info(p, {})["supportedVersions"] == expect


@pytest.mark.parametrize("body", ["print(json.dumps({'cniVersion': '1.0.0'}))", "print('{}')", "print('zz')",
                                  "print(json.dumps({'cniVersion': '1.0.0', 'supportedVersions': '1.0.0'}))"])
def test_version_info_refuses_incomplete_answers(tmp_path: Path, body: str) -> None:
    p = script(tmp_path, "v", body)
    with pytest.raises(CNIError) as ei:
        invoke.get_version_info(p, {})
    assert ei.value.code == E.DECODE_FAILURE


def test_version_info_of_the_go_reference() -> None:
    go = "/usr/lib/cni/host-local"
    if not os.access(go, os.X_OK):
        pytest.skip("Go reference plugins are not installed")
    info = invoke.get_version_info(go, {"PATH": "/usr/bin:/bin"})
    assert "1.0.0" in info["supportedVersions"] and "0.1.0" in info["supportedVersions"]

