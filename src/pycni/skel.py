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

import os
import sys

from pycni import callscope
from pycni import jsonlite as json
from pycni.record import field, record
from pycni.spec.errors import (
    DECODE_FAILURE,
    INCOMPATIBLE_VERSION,
    INTERNAL,
    INVALID_ENV,
    INVALID_NETNS,
    CNIError,
    invalid_config,
)
from pycni.spec.gokeys import lookup
from pycni.spec.types import Result
from pycni.spec.validate import validate_container_id, validate_interface_name, validate_network_name
from pycni.spec.version import ALL_VERSIONS, check_supported, greater_than_or_equal, highest, version_info

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from pycni.invoke import Runner

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


@record
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
    # How delegates run (pycni.invoke): injected by dispatch's caller; None execs them.
    runner: Runner | None = field(default=None, compare=False, repr=False)
    # stdin as dispatch decoded it, handed to the first conf() call (see there); None: not decoded.
    decoded: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def cni_path(self) -> list[str]:
        return [p for p in self.path.split(os.pathsep) if p]

    def conf(self) -> dict[str, Any]:
        """The network configuration from stdin, as a dict of the caller's own.

        The first call takes the dict dispatch decoded to check the config (stdin is decoded
        once per plugin call); a later call decodes stdin again, so a caller that changes its
        dict (say, to delegate) never changes what another part of the handler reads.
        """
        conf, self.decoded = self.decoded, None
        return conf if conf is not None else load_conf(self.stdin_data)


if TYPE_CHECKING:  # (a type-only alias: collections.abc stays off the start path)
    Handler = Callable[[CmdArgs], "Result | None"]


@record
class Plugin:
    """A plugin's handlers and the spec versions it speaks."""

    add: Handler | None = None
    delete: Handler | None = None
    check: Handler | None = None
    gc: Handler | None = None
    status: Handler | None = None
    versions: Sequence[str] = ALL_VERSIONS
    about: str = ""


@record
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
        raise CNIError(DECODE_FAILURE, "error unmarshalling network config", str(e)) from None
    except RecursionError:
        raise CNIError(DECODE_FAILURE, "error unmarshalling network config",
                       "JSON nested too deeply to decode") from None
    if not isinstance(conf, dict):
        raise CNIError(DECODE_FAILURE, "error unmarshalling network config",
                       f"expected a JSON object, got {type(conf).__name__}")
    return conf


def config_version(conf: Mapping[str, Any]) -> str:
    v = lookup(conf, "cniVersion", "")  # Go's decoder: "CNIVersion" too (pycni.spec.gokeys)
    if not isinstance(v, str):
        raise CNIError(DECODE_FAILURE, "invalid cniVersion", f"cniVersion must be a string, got {v!r}")
    return v or "0.1.0"


def prev_result(conf: Mapping[str, Any]) -> Result | None:
    """The ``prevResult`` of a chained invocation, parsed at the config's version."""
    raw = lookup(conf, "prevResult")
    if raw is None:
        return None
    return Result.from_dict(raw, config_version(conf))


# Longest CNI_CONTAINERID a plugin accepts: the longest file name, since several plugins (and the
# runtime's cache) name files after it. Go sets no limit but then fails, or leaks, part-way.
MAX_CONTAINER_ID = 255


def _check_new_container_id(value: str) -> None:
    """ADD refuses an over-long ID before anything is made; DEL, CHECK and GC still accept one, so
    an attachment another implementation made with it can be cleaned up."""
    if len(value) > MAX_CONTAINER_ID:
        raise CNIError(INVALID_ENV, "containerID too long",
                       f"CNI_CONTAINERID is {len(value)} characters; at most {MAX_CONTAINER_ID} are accepted")


# The variables skel reads, in the Go reference's order (error messages list them in it).
_ENV_ORDER = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
_VALIDATORS: dict[str, Callable[[str], None]] = {
    "CNI_CONTAINERID": validate_container_id,
    "CNI_IFNAME": validate_interface_name,
}


def _cmd_args(command: str, env: Mapping[str, str], stdin: bytes, runner: Runner | None = None) -> CmdArgs:
    """Check the environment as Go's skel does: a present-but-invalid value first, then all missing ones."""
    required = REQUIRED_ENV.get(command, ())
    missing = []
    for name in _ENV_ORDER:
        value = env.get(name, "")
        if not value:
            if name in required or name == "CNI_COMMAND":
                missing.append(name)
        elif name in required and name in _VALIDATORS:
            _VALIDATORS[name](value)
            if name == "CNI_CONTAINERID" and command == "ADD":
                _check_new_container_id(value)
    if missing:
        raise CNIError(INVALID_ENV, f"required env variables [{','.join(missing)}] missing",
                       f"the runtime must set {', '.join(missing)} for CNI_COMMAND={command or '(unset)'}")
    return CmdArgs(command=command, container_id=env.get("CNI_CONTAINERID", ""), netns=env.get("CNI_NETNS", ""),
                   ifname=env.get("CNI_IFNAME", ""), args=env.get("CNI_ARGS", ""), path=env.get("CNI_PATH", ""),
                   stdin_data=stdin, netns_override=_netns_override(env), env=dict(env), runner=runner)


def _netns_override(env: Mapping[str, str]) -> bool:
    return env.get("CNI_NETNS_OVERRIDE", "").upper() in ("1", "TRUE")


def _validate_config(stdin: bytes) -> dict[str, Any]:
    """Every command but VERSION needs a JSON config with a valid name (Go: validateConfig)."""
    conf = load_conf(stdin)
    name = lookup(conf, "name")
    if name is None or name == "":
        raise invalid_config("missing network name", "the network configuration needs a \"name\"")
    if not isinstance(name, str):
        raise CNIError(DECODE_FAILURE, "error unmarshalling network config",
                       f"\"name\" must be a string, got {name!r}")
    validate_network_name(name)
    return conf


def _handler_for(plugin: Plugin, command: str) -> Handler | None:
    return {"ADD": plugin.add, "DEL": plugin.delete, "CHECK": plugin.check, "GC": plugin.gc,
            "STATUS": plugin.status}.get(command)


def _check_min_version(plugin: Plugin, command: str, cni_version: str) -> None:
    """CHECK needs 0.4.0, GC and STATUS 1.1.0, in the config and among the plugin's versions."""
    need = MIN_VERSION[command]
    if not greater_than_or_equal(cni_version, need):
        raise CNIError(INCOMPATIBLE_VERSION, f"config version does not allow {command}",
                       f"{command} needs cniVersion {need} or later; the config says {cni_version}")
    if not any(greater_than_or_equal(v, cni_version) for v in plugin.versions):
        raise CNIError(INCOMPATIBLE_VERSION, f"plugin version does not allow {command}",
                       f"the plugin supports {list(plugin.versions)}; the config says {cni_version}")


def _same_netns_as_plugin(netns: str) -> bool:
    """Is CNI_NETNS the namespace this thread runs in? (Unopenable paths are not: Go's CheckNetNS.)"""
    try:
        a, b = os.stat(netns), os.stat("/proc/thread-self/ns/net")
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def dispatch(plugin: Plugin, env: Mapping[str, str], stdin: bytes, runner: Runner | None = None) -> Outcome:
    """Run one invocation; never raises, never exits: errors become the spec's error JSON.

    ``runner`` runs the handler's delegates (see :data:`pycni.invoke.Runner`); None execs them.

    The order of checks follows Go's skel, so the same bad input gets the same code:
    invalid CNI_CONTAINERID/CNI_IFNAME, missing variables (4), VERSION, undecodable config
    (6), missing/invalid name (7), unknown command (4), minimum version for CHECK/GC/STATUS
    (1), unsupported cniVersion (1), for ADD/DEL a CNI_NETNS that is the plugin's own
    namespace (8, unless CNI_NETNS_OVERRIDE) — checked before the handler, unlike Go — then
    the handler.
    """
    cni_version = ""
    try:
        command = env.get("CNI_COMMAND", "")
        try:
            args = _cmd_args(command, env, stdin, runner)
        except CNIError as e:
            if e.code == INVALID_ENV and not command and plugin.about:
                # Run by hand with no CNI_COMMAND: say what this is, as the Go plugins do.
                return Outcome(0, b"", (f"{plugin.about}\nCNI protocol versions supported: "
                                        f"{', '.join(plugin.versions)}\n").encode())
            raise
        if command == "VERSION":
            return _version(plugin, stdin)
        conf = _validate_config(stdin)
        args.decoded = conf
        if command not in REQUIRED_ENV:
            raise CNIError(INVALID_ENV, f"unknown CNI_COMMAND: {command}",
                           "CNI_COMMAND must be ADD, DEL, CHECK, GC, STATUS or VERSION")
        cni_version = config_version(conf)
        if command in MIN_VERSION:
            _check_min_version(plugin, command, cni_version)
        check_supported(cni_version, plugin.versions)
        # Refuse before the handler runs (Go's skel checks after, so a misdirected ADD has
        # already configured the plugin's own namespace when it reports the error).
        if command in ("ADD", "DEL") and not args.netns_override and args.netns \
                and _same_netns_as_plugin(args.netns):
            raise CNIError(INVALID_NETNS, "plugin's netns and netns from CNI_NETNS should not be the same",
                           f"CNI_NETNS={args.netns} is the namespace the plugin runs in; pass the container's "
                           "namespace, or set CNI_NETNS_OVERRIDE=1 if this is really meant")
        handler = _handler_for(plugin, command)
        if handler is None and command == "ADD":
            raise CNIError(INTERNAL, "plugin does not implement ADD", plugin.about)
        with callscope.call():  # the namespace fds and netlink sockets of this call, closed at its end
            result = handler(args) if handler is not None else None
        out = b""
        if command == "ADD":
            if result is None:
                raise CNIError(INTERNAL, "plugin returned no result for ADD", plugin.about)
            out = (json.dumps(result.to_dict(cni_version), indent=4) + "\n").encode()
        return Outcome(0, out)
    except CNIError as e:
        if _lacks_privilege(e) and PRIVILEGE_HINT not in e.details:
            e = CNIError(e.code, e.msg, f"{e.details}; {PRIVILEGE_HINT}" if e.details else PRIVILEGE_HINT,
                         e.cni_version)
        return Outcome(1, (e.to_json(cni_version or None) + "\n").encode())
    except (Exception, SystemExit) as e:  # noqa: BLE001 - no traceback ever reaches the runtime
        err = CNIError(INTERNAL, str(e) or type(e).__name__, type(e).__name__)
        if _lacks_privilege(e):
            err.details = f"{err.details}; {PRIVILEGE_HINT}"
        debug = b""
        if env.get("PYCNI_DEBUG"):
            import traceback

            debug = traceback.format_exc().encode()
        return Outcome(1, (err.to_json(cni_version or None) + "\n").encode(), debug)


PRIVILEGE_HINT = "the plugin needs root or CAP_NET_ADMIN (and CAP_SYS_ADMIN to enter network namespaces)"


def _lacks_privilege(e: BaseException) -> bool:
    """Was ``e`` caused by EPERM or EACCES from the kernel (also behind a ``raise ... from None``)?"""
    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (1, 13):  # EPERM, EACCES
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _version(plugin: Plugin, stdin: bytes) -> Outcome:
    """VERSION answers with the config's version when we speak it (spec), else our newest.

    Go's skel ignores stdin and always answers with its own newest version; both satisfy
    Go's decoder, which needs only a non-empty cniVersion and supportedVersions.
    """
    asked = ""
    if stdin.strip():
        try:
            asked = config_version(load_conf(stdin))
        except CNIError:
            asked = ""
    reply_version = asked if asked in plugin.versions else highest(plugin.versions)
    return Outcome(0, (json.dumps(version_info(plugin.versions, reply_version)) + "\n").encode())


def run_plugin(plugin: Plugin) -> None:
    """Process entry point: read os.environ and stdin, write stdout/stderr, exit."""
    env = os.environ
    # Go reads no stdin when CNI_COMMAND is unset (someone ran the binary by hand).
    if not env.get("CNI_COMMAND") or sys.stdin is None or sys.stdin.isatty():
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
