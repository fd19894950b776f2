"""Finding and executing plugins: the runtime's exec and a plugin's delegation. Stdlib only.

Every function takes the environment explicitly (never ``os.environ`` below the entry point)
so the same code runs in a one-shot plugin and in the daemon. Delegation runs a plugin with the
:data:`Runner` its caller put on :class:`pycni.skel.CmdArgs` (``skel.dispatch(..., runner=)``),
else with :func:`exec_plugin`; this module knows nothing of our own plugins.
"""

from __future__ import annotations

import errno
import os
import time

from pycni import jsonlite as json
from pycni.spec.errors import DECODE_FAILURE, INVALID_ENV, IO_FAILURE, TRY_AGAIN, UNKNOWN, CNIError, invalid_config
from pycni.spec.gokeys import lookup
from pycni.spec.types import Result
from pycni.spec.validate import validate_plugin_type
from pycni.spec.version import CURRENT_VERSION

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from pycni.skel import CmdArgs

# How a plugin is run: (path, stdin, env) -> stdout, or the CNIError it reported. exec_plugin is
# the default; an in-process runner (pycni.shim.run_delegate: the one-shot shim and the daemon
# inject it through skel.dispatch) runs our own plugins without a new interpreter, as libcni's
# invoke.Exec lets a caller replace exec.
if TYPE_CHECKING:  # (a type-only alias: collections.abc stays off the start path)
    Runner = Callable[[str, bytes, Mapping[str, str]], bytes]

# Variables a plugin inherits from its caller's environment besides the CNI_* ones.
CNI_ENV_KEYS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")


def find_in_path(plugin: str, paths: Sequence[str]) -> str:
    """Path of ``plugin`` in the first of ``paths`` holding a regular file of that name.

    As Go's FindInPath: the first match wins even if it is not executable (running it then
    fails with a clear permission error rather than silently picking a later copy).
    """
    validate_plugin_type(plugin)
    dirs = [p for p in paths if p]
    if not dirs:
        raise CNIError(INVALID_ENV, "no plugin search path provided",
                       f"cannot find plugin {plugin!r}: CNI_PATH is empty")
    for d in dirs:
        candidate = os.path.join(d, plugin)
        if os.path.isfile(candidate):
            return candidate
    raise invalid_config(f"failed to find plugin {plugin!r} in path {list(dirs)}",
                         f"install the {plugin!r} plugin into one of {list(dirs)} or fix the config's type")


_ETXTBSY_RETRIES = 5


def exec_plugin(plugin_path: str, stdin: bytes, env: Mapping[str, str], timeout: float | None = None) -> bytes:
    """Run a plugin binary; return its stdout, or raise the CNIError it printed.

    A plugin binary being replaced while we start it ("text file busy") is retried, as Go does.
    """
    import subprocess  # here, not at the top: ~5 ms that a plugin delegating in-process never needs

    name = os.path.basename(plugin_path)
    for attempt in range(_ETXTBSY_RETRIES + 1):
        try:
            proc = subprocess.run([plugin_path], input=stdin, env=dict(env), capture_output=True,
                                  timeout=timeout)
            break
        except FileNotFoundError:
            raise invalid_config(f"plugin {plugin_path!r} not found",
                                 "the file is missing, or it is a script whose interpreter does not exist") from None
        except PermissionError as e:
            raise CNIError(IO_FAILURE, f"cannot execute plugin {plugin_path!r}",
                           f"{e.strerror}: make it executable (chmod +x) or fix CNI_PATH") from None
        except subprocess.TimeoutExpired:
            raise CNIError(TRY_AGAIN, f"plugin {name} timed out", f"no answer after {timeout}s") from None
        except OSError as e:
            if e.errno == errno.ETXTBSY and attempt < _ETXTBSY_RETRIES:
                time.sleep(1)
                continue
            raise CNIError(IO_FAILURE, f"cannot execute plugin {plugin_path!r}", str(e)) from None
    if proc.returncode != 0:
        if env.get("PYCNI_DEBUG") and proc.stderr:
            import sys

            sys.stderr.buffer.write(b"--- stderr of %s:\n%s\n" % (name.encode(), proc.stderr.rstrip()))
            sys.stderr.flush()
        raise error_from_output(plugin_path, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def error_from_output(plugin_path: str, rc: int, stdout: bytes, stderr: bytes) -> CNIError:
    """The error a failed plugin reported; Go's wording and code 0 when it printed no error JSON."""
    name = os.path.basename(plugin_path)
    status = f"{name} exited with status {rc}" if rc > 0 else f"{name} was killed by signal {-rc}"
    err_text = stderr.decode(errors="replace").strip()
    if not stdout.strip():
        if not err_text:
            return CNIError(UNKNOWN, f"netplugin failed with no error message: {status}")
        return CNIError(UNKNOWN, f"netplugin failed: {err_text[-2000:]!r}", status)
    out_text = stdout.decode(errors="replace").strip()
    try:
        obj = json.loads(stdout)
    except (ValueError, UnicodeDecodeError) as e:
        return CNIError(UNKNOWN, "netplugin failed but error parsing its diagnostic message",
                        f"{out_text[-2000:]!r}: {e}; {status}")
    code = lookup(obj, "code", 0) if isinstance(obj, dict) else None  # Go's types.Error: keys in any case
    msg, details = lookup(obj, "msg", ""), lookup(obj, "details", "")
    if isinstance(code, bool) or not isinstance(code, int) or code < 0 \
            or not isinstance(msg, str) or not isinstance(details, str):
        return CNIError(UNKNOWN, "netplugin failed but error parsing its diagnostic message",
                        f"{out_text[-2000:]!r}: not a CNI error object; {status}")
    return CNIError(code, msg, details, str(lookup(obj, "cniVersion", "") or ""))


def plugin_env(base: Mapping[str, str], command: str, *, container_id: str = "", netns: str = "",
               ifname: str = "", args: str = "", path: str = "") -> dict[str, str]:
    """The environment for one plugin execution: ``base`` with the CNI_* variables replaced."""
    env = {k: v for k, v in base.items() if k not in CNI_ENV_KEYS}
    env.update({"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
                "CNI_IFNAME": ifname, "CNI_ARGS": args, "CNI_PATH": path})
    return {k: v for k, v in env.items() if v != "" or k == "CNI_COMMAND"}


def exec_with_result(plugin_path: str, netconf: bytes, env: Mapping[str, str],
                     timeout: float | None = None, runner: Runner | None = None) -> Result:
    """Run an ADD and parse its result; a result without cniVersion is read as the config's version."""
    out = exec_plugin(plugin_path, netconf, env, timeout) if runner is None else runner(plugin_path, netconf, env)
    name = os.path.basename(plugin_path)
    try:
        obj: Any = json.loads(out)
    except (ValueError, UnicodeDecodeError) as e:
        raise CNIError(DECODE_FAILURE, f"failed to decode result of {name}",
                       f"{e}: {out[:500]!r}") from None
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise CNIError(DECODE_FAILURE, f"failed to decode result of {name}",
                       f"expected a JSON object, got {out[:500]!r}")
    version = lookup(obj, "cniVersion")
    if not isinstance(version, str) or not version:
        # Only then is the config needed (the plugin that ran has decoded it already).
        try:
            conf: Any = json.loads(netconf)
        except (ValueError, UnicodeDecodeError) as e:
            raise CNIError(DECODE_FAILURE, "decoding version from network config", str(e)) from None
        conf_version = lookup(conf, "cniVersion")
        version = (conf_version if isinstance(conf_version, str) else "") or "0.1.0"
        obj = {**obj, "cniVersion": version}  # appended: it wins over a "CNIVersion": "" before it
    return Result.from_dict(obj, version)


# ---- delegation (a plugin calling another, e.g. IPAM) ------------------------------------------

def _delegate_env(args: CmdArgs, command: str) -> dict[str, str]:
    env = dict(args.env)
    env["CNI_COMMAND"] = command
    return env


def _runner(args: CmdArgs) -> Runner:
    """How this invocation runs its delegates: the runner its caller injected, else exec."""
    return args.runner or exec_plugin


def delegate_add(plugin: str, netconf: bytes, args: CmdArgs) -> Result:
    """ADD through ``plugin`` with the caller's environment; the caller undoes with delegate_del."""
    path = find_in_path(plugin, args.cni_path)
    return exec_with_result(path, netconf, _delegate_env(args, "ADD"), runner=_runner(args))


def _delegate(command: str, plugin: str, netconf: bytes, args: CmdArgs) -> None:
    """A delegated command that returns no result (CHECK, DEL, GC, STATUS)."""
    _runner(args)(find_in_path(plugin, args.cni_path), netconf, _delegate_env(args, command))


def delegate_check(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    _delegate("CHECK", plugin, netconf, args)


def delegate_del(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    _delegate("DEL", plugin, netconf, args)


def delegate_gc(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    _delegate("GC", plugin, netconf, args)


def delegate_status(plugin: str, netconf: bytes, args: CmdArgs) -> None:
    _delegate("STATUS", plugin, netconf, args)


def get_version_info(plugin_path: str, env: Mapping[str, str], cni_version: str = CURRENT_VERSION) -> dict[str, Any]:
    """Ask a plugin which versions it supports (VERSION), reading the answer as Go does.

    A plugin too old to know VERSION speaks 0.1.0; a 0.2.0 answer without
    ``supportedVersions`` means 0.1.0 and 0.2.0; anything else must list them.
    """
    e = dict(env)
    e["CNI_COMMAND"] = "VERSION"
    try:
        out = exec_plugin(plugin_path, json.dumps({"cniVersion": cni_version}).encode(), e)
    except CNIError as err:
        if err.msg == "unknown CNI_COMMAND: VERSION":
            return {"cniVersion": "0.1.0", "supportedVersions": ["0.1.0"]}
        raise
    try:
        info = json.loads(out)
    except (ValueError, UnicodeDecodeError) as err:
        raise CNIError(DECODE_FAILURE, "decoding version info", f"{err}: {out[:200]!r}") from None
    if not isinstance(info, dict):
        raise CNIError(DECODE_FAILURE, "decoding version info", f"expected a JSON object: {out[:200]!r}")
    reported = lookup(info, "cniVersion")  # Go's PluginDecoder reads a struct: keys in any case
    if not isinstance(reported, str) or not reported:
        raise CNIError(DECODE_FAILURE, "decoding version info: missing field cniVersion", repr(out[:200]))
    supported = lookup(info, "supportedVersions")
    if not supported:
        if reported != "0.2.0":
            raise CNIError(DECODE_FAILURE, "decoding version info: missing field supportedVersions",
                           repr(out[:200]))
        supported = ["0.1.0", "0.2.0"]
    elif not isinstance(supported, list) or not all(isinstance(v, str) for v in supported):
        raise CNIError(DECODE_FAILURE, "decoding version info: supportedVersions is not a list of strings",
                       repr(out[:200]))
    return {"cniVersion": reported, "supportedVersions": supported}  # in the spec's spelling
