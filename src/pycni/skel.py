"""The plugin entry point: environment + stdin -> handler -> stdout, or the spec's error JSON.

A plugin module defines handlers and calls :func:`run_plugin` from ``main()``::

    def cmd_add(args: CmdArgs) -> Result: ...
    def cmd_del(args: CmdArgs) -> None: ...
    PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=..., about="my plugin")
    def main() -> None: run_plugin(PLUGIN)

:func:`dispatch` is the re-entrant core (no ``os.environ``, no ``sys.exit``): the daemon calls
it with a request's environment and stdin. Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pycni.spec import errors as E
from pycni.spec.errors import CNIError
from pycni.spec.types import Result
from pycni.spec.validate import validate_container_id, validate_interface_name
from pycni.spec.version import ALL_VERSIONS, check_supported, greater_than_or_equal, version_info

INTERNAL_ERROR = 999  # what the Go reference reports for errors that are not CNI errors

# Which environment variables each command requires (spec: "Parameters").
REQUIRED_ENV: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": ("CNI_PATH",),
    "VERSION": (),
}
# The lowest config version at which each command exists.
MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


@dataclass
class CmdArgs:
    """One invocation: what the runtime passed in the environment and on stdin."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: str = ""
    path: str = ""
    stdin_data: bytes = b""
    netns_override: bool = False
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def cni_path(self) -> list[str]:
        return [p for p in self.path.split(os.pathsep) if p]

    def conf(self) -> dict[str, Any]:
        """The network configuration from stdin, as a dict (decoded by dispatch already)."""
        return load_conf(self.stdin_data)


Handler = Callable[[CmdArgs], "Result | None"]


@dataclass
class Plugin:
    """A plugin's handlers and the spec versions it speaks."""

    add: Handler | None = None
    delete: Handler | None = None
    check: Handler | None = None
    gc: Handler | None = None
    status: Handler | None = None
    versions: Sequence[str] = ALL_VERSIONS
    about: str = ""


@dataclass
class Outcome:
    """What a plugin process would write and exit with."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""


def load_conf(data: bytes | str) -> dict[str, Any]:
    """Decode a network configuration (spec error 6 when it is not a JSON object)."""
    try:
        conf = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CNIError(E.DECODE_FAILURE, "error unmarshalling network config", str(e)) from None
    if not isinstance(conf, dict):
        raise CNIError(E.DECODE_FAILURE, "error unmarshalling network config",
                       f"expected a JSON object, got {type(conf).__name__}")
    return conf


def config_version(conf: Mapping[str, Any]) -> str:
    v = conf.get("cniVersion", "")
    if not isinstance(v, str):
        raise CNIError(E.DECODE_FAILURE, "invalid cniVersion", f"cniVersion must be a string, got {v!r}")
    return v or "0.1.0"


def prev_result(conf: Mapping[str, Any]) -> Result | None:
    """The ``prevResult`` of a chained invocation, parsed at the config's version."""
    raw = conf.get("prevResult")
    if raw is None:
        return None
    return Result.from_dict(raw, config_version(conf))


def _cmd_args(command: str, env: Mapping[str, str], stdin: bytes) -> CmdArgs:
    missing = [k for k in REQUIRED_ENV[command] if not env.get(k)]
    if missing:
        raise CNIError(E.INVALID_ENV, f"required env variables [{','.join(missing)}] missing",
                       f"the runtime must set {', '.join(missing)} for {command}")
    args = CmdArgs(command=command, container_id=env.get("CNI_CONTAINERID", ""), netns=env.get("CNI_NETNS", ""),
                   ifname=env.get("CNI_IFNAME", ""), args=env.get("CNI_ARGS", ""), path=env.get("CNI_PATH", ""),
                   stdin_data=stdin, netns_override=env.get("CNI_NETNS_OVERRIDE", "") in ("1", "true"),
                   env=dict(env))
    if command in ("ADD", "CHECK", "DEL"):
        validate_container_id(args.container_id)
        validate_interface_name(args.ifname)
    return args


def _handler_for(plugin: Plugin, command: str) -> Handler | None:
    return {"ADD": plugin.add, "DEL": plugin.delete, "CHECK": plugin.check, "GC": plugin.gc,
            "STATUS": plugin.status}.get(command)


def dispatch(plugin: Plugin, env: Mapping[str, str], stdin: bytes) -> Outcome:
    """Run one invocation; never raises, never exits: errors become the spec's error JSON."""
    cni_version = ""
    try:
        command = env.get("CNI_COMMAND", "")
        if not command:
            raise CNIError(E.INVALID_ENV, "required env variables [CNI_COMMAND] missing",
                           "set CNI_COMMAND to ADD, DEL, CHECK, GC, STATUS or VERSION")
        if command not in REQUIRED_ENV:
            raise CNIError(E.INVALID_ENV, f"unknown CNI_COMMAND: {command}",
                           "CNI_COMMAND must be ADD, DEL, CHECK, GC, STATUS or VERSION")
        if command == "VERSION":
            return _version(plugin, stdin)
        args = _cmd_args(command, env, stdin)
        conf = load_conf(stdin)
        cni_version = config_version(conf)
        check_supported(cni_version, plugin.versions)
        if command in MIN_VERSION and not greater_than_or_equal(cni_version, MIN_VERSION[command]):
            raise CNIError(E.INCOMPATIBLE_VERSION, f"config version does not allow {command}",
                           f"{command} needs cniVersion {MIN_VERSION[command]} or later; config is {cni_version}")
        handler = _handler_for(plugin, command)
        if handler is None:
            if command in ("GC", "STATUS"):
                return Outcome(0)  # a plugin with nothing to collect or report succeeds
            raise CNIError(E.INVALID_ENV, f"plugin does not implement {command}", plugin.about)
        result = handler(args)
        if command == "ADD":
            if result is None:
                raise CNIError(INTERNAL_ERROR, "plugin returned no result for ADD", plugin.about)
            return Outcome(0, (json.dumps(result.to_dict(cni_version), indent=4) + "\n").encode())
        return Outcome(0)
    except CNIError as e:
        return Outcome(1, (e.to_json(cni_version or None) + "\n").encode())
    except Exception as e:  # noqa: BLE001 - no traceback ever reaches the runtime
        err = CNIError(INTERNAL_ERROR, str(e) or type(e).__name__, type(e).__name__)
        debug = b""
        if env.get("PYCNI_DEBUG"):
            import traceback

            debug = traceback.format_exc().encode()
        return Outcome(1, (err.to_json(cni_version or None) + "\n").encode(), debug)


def _version(plugin: Plugin, stdin: bytes) -> Outcome:
    """VERSION answers with the config's version when we speak it, else our newest."""
    asked = ""
    if stdin.strip():
        try:
            asked = config_version(load_conf(stdin))
        except CNIError:
            asked = ""
    reply_version = asked if asked in plugin.versions else plugin.versions[-1]
    return Outcome(0, (json.dumps(version_info(plugin.versions, reply_version)) + "\n").encode())


def run_plugin(plugin: Plugin) -> None:
    """Process entry point: read os.environ and stdin, write stdout/stderr, exit."""
    env = os.environ
    command = env.get("CNI_COMMAND", "")
    if sys.stdin is None or sys.stdin.isatty():
        if not command:  # run by hand: say what this is, as the Go plugins do
            sys.stderr.write(f"{plugin.about or 'CNI plugin'}\nCNI protocol versions supported: "
                             f"{', '.join(plugin.versions)}\n")
            sys.exit(0)
        stdin = b""
    else:
        stdin = sys.stdin.buffer.read()
    outcome = dispatch(plugin, env, stdin)
    if outcome.stdout:
        sys.stdout.buffer.write(outcome.stdout)
    if outcome.stderr:
        sys.stderr.buffer.write(outcome.stderr)
    sys.stdout.flush()
    sys.exit(outcome.exit_code)
