"""Finding and executing plugins: the runtime's exec and a plugin's delegation. Stdlib only.

Every function takes the environment explicitly (never ``os.environ`` below the entry point)
so the same code runs in a one-shot plugin and in the daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pycni.spec import errors as E
from pycni.spec.errors import CNIError
from pycni.spec.types import Result
from pycni.spec.validate import validate_plugin_type

if TYPE_CHECKING:
    from pycni.skel import CmdArgs

# Variables a plugin inherits from its caller's environment besides the CNI_* ones.
CNI_ENV_KEYS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")


def find_in_path(plugin: str, paths: Sequence[str]) -> str:
    """Absolute path of ``plugin`` in the first of ``paths`` that has it (code 7 when none)."""
    validate_plugin_type(plugin)
    dirs = [p for p in paths if p]
    if not dirs:
        raise CNIError(E.INVALID_ENV, "no plugin search path provided",
                       f"cannot find plugin {plugin!r}: CNI_PATH is empty")
    for d in dirs:
        candidate = os.path.join(d, plugin)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CNIError(E.INVALID_CONFIG, f"failed to find plugin {plugin!r} in path {list(dirs)}",
                   f"install the {plugin!r} plugin into one of {list(dirs)} or fix the config's type")


def exec_plugin(plugin_path: str, stdin: bytes, env: Mapping[str, str], timeout: float | None = None) -> bytes:
    """Run a plugin binary; return its stdout, or raise the CNIError it printed."""
    try:
        proc = subprocess.run([plugin_path], input=stdin, env=dict(env), capture_output=True, timeout=timeout)
    except FileNotFoundError:
        raise CNIError(E.INVALID_CONFIG, f"plugin {plugin_path!r} not found", "") from None
    except PermissionError as e:
        raise CNIError(E.IO_FAILURE, f"cannot execute plugin {plugin_path!r}", str(e)) from None
    except subprocess.TimeoutExpired:
        raise CNIError(E.TRY_AGAIN, f"plugin {plugin_path!r} timed out", f"no answer after {timeout}s") from None
    if proc.returncode != 0:
        raise _error_from_output(plugin_path, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def _error_from_output(plugin_path: str, rc: int, stdout: bytes, stderr: bytes) -> CNIError:
    try:
        obj = json.loads(stdout)
        if isinstance(obj, dict) and "code" in obj:
            return CNIError.from_dict(obj)
    except (ValueError, UnicodeDecodeError):
        pass
    text = (stderr or stdout).decode(errors="replace").strip()
    return CNIError(999, f"netplugin failed: {os.path.basename(plugin_path)} exited {rc}",
                    text[-2000:])


def plugin_env(base: Mapping[str, str], command: str, *, container_id: str = "", netns: str = "",
               ifname: str = "", args: str = "", path: str = "") -> dict[str, str]:
    """The environment for one plugin execution: ``base`` with the CNI_* variables replaced."""
    env = {k: v for k, v in base.items() if k not in CNI_ENV_KEYS}
    env.update({"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
                "CNI_IFNAME": ifname, "CNI_ARGS": args, "CNI_PATH": path})
    return {k: v for k, v in env.items() if v != "" or k == "CNI_COMMAND"}


def exec_with_result(plugin_path: str, netconf: bytes, env: Mapping[str, str],
                     timeout: float | None = None) -> Result:
    out = exec_plugin(plugin_path, netconf, env, timeout)
    try:
        obj: Any = json.loads(out)
    except (ValueError, UnicodeDecodeError) as e:
        raise CNIError(E.DECODE_FAILURE, f"failed to decode result of {os.path.basename(plugin_path)}",
                       f"{e}: {out[:500]!r}") from None
    version = obj.get("cniVersion") if isinstance(obj, dict) else None
    if not version:
        try:
            version = json.loads(netconf).get("cniVersion") or "0.1.0"
        except (ValueError, AttributeError):
            version = "0.1.0"
    return Result.from_dict(obj, version)


# ---- delegation (a plugin calling another, e.g. IPAM) ------------------------------------------

def _delegate_env(args: CmdArgs, command: str) -> dict[str, str]:
    env = dict(args.env)
    env["CNI_COMMAND"] = command
    return env


def delegate_add(plugin: str, netconf: bytes, args: CmdArgs) -> Result:
    """ADD through ``plugin`` with the caller's environment; the caller undoes with delegate_del."""
    path = find_in_path(plugin, args.cni_path)
    return exec_with_result(path, netconf, _delegate_env(args, "ADD"))


def delegate_check(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    path = find_in_path(plugin, args.cni_path)
    exec_plugin(path, netconf, _delegate_env(args, "CHECK"))


def delegate_del(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    path = find_in_path(plugin, args.cni_path)
    exec_plugin(path, netconf, _delegate_env(args, "DEL"))


def delegate_gc(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    path = find_in_path(plugin, args.cni_path)
    exec_plugin(path, netconf, _delegate_env(args, "GC"))


def delegate_status(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    path = find_in_path(plugin, args.cni_path)
    exec_plugin(path, netconf, _delegate_env(args, "STATUS"))


def get_version_info(plugin_path: str, env: Mapping[str, str], cni_version: str = "1.1.0") -> dict[str, Any]:
    """Ask a plugin which versions it supports (VERSION)."""
    e = dict(env)
    e["CNI_COMMAND"] = "VERSION"
    out = exec_plugin(plugin_path, json.dumps({"cniVersion": cni_version}).encode(), e)
    try:
        info = json.loads(out)
    except ValueError as err:
        raise CNIError(E.DECODE_FAILURE, "failed to decode VERSION answer", str(err)) from None
    if not isinstance(info, dict):
        raise CNIError(E.DECODE_FAILURE, "failed to decode VERSION answer", repr(out[:200]))
    if "supportedVersions" not in info:  # 0.1.0 plugins answer with only cniVersion
        info["supportedVersions"] = ["0.1.0"]
    return info
