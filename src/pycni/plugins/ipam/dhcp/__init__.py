"""IPAM plugin ``dhcp``: addresses from a DHCP server, held by a long-running daemon.

The plugin itself is a thin client: it forwards each request over a unix socket
(``ipam.daemonSocketPath``, default /run/cni/dhcp.sock) to the daemon, which acquires the
lease from inside the container's namespace, keeps renewing it while the container lives and
releases it on DEL. ``dhcp daemon [flags]`` runs that daemon from this same executable, as the
Go reference does (see :mod:`pycni.plugins.ipam.dhcp.daemon` and docs/dhcp.md).

Differences from the reference: DEL releases the lease at the server even when the container's
interface is already gone (the reference can only release through that interface, which main
plugins delete first); DEL succeeds when no daemon runs (no lease is held); CHECK asks whether
the lease is still held instead of acquiring one. Stdlib only.
"""

from __future__ import annotations

import os
import sys

from pycni import netconf
from pycni.cniargs import parse_cni_args
from pycni.plugins.ipam.dhcp import options, protocol
from pycni.record import record
from pycni.skel import CmdArgs, Plugin, run_plugin
from pycni.spec.errors import PLUGIN_NOT_AVAILABLE, CNIError
from pycni.spec.types import Result

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~3 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any


@record
class DhcpConf:
    """What the client needs: where the daemon listens. The daemon reads the rest of the
    config itself (it gets the whole of it); GC's list is checked here first, so a request
    the daemon would refuse is not sent."""

    socket_path: str


def parse_conf(args: CmdArgs) -> DhcpConf:
    conf = args.conf()
    ipam = netconf.ipam_section(conf)
    if args.command == "GC":
        netconf.valid_attachments(conf)
    # What can be checked without the daemon is checked here, so a malformed config is code 7
    # (4 for CNI_ARGS) whether or not the daemon runs, and never reaches it.
    netconf.runtime_config(conf)
    netconf.args_cni(conf)
    netconf.get_int(ipam, "priority", minimum=0, maximum=2**32 - 1, label="ipam.priority")
    options.check(ipam)
    if args.command in ("ADD", "CHECK"):
        parse_cni_args(args.args)
    path = netconf.get_str(ipam, "daemonSocketPath", label="ipam.daemonSocketPath") or protocol.DEFAULT_SOCKET_PATH
    if len(path.encode()) > 107:  # sun_path holds 108 bytes with the NUL
        raise netconf.invalid("ipam.daemonSocketPath", "a unix socket path of at most 107 bytes", path[:64] + "...")
    return DhcpConf(path)


def _call(args: CmdArgs, method: str) -> dict[str, Any]:
    path = parse_conf(args).socket_path
    request = {"method": method, "containerID": args.container_id, "ifname": args.ifname, "args": args.args,
               # the daemon may run in another working directory
               "netns": os.path.abspath(args.netns) if args.netns else "",
               "stdin": args.stdin_data.decode("utf-8", "replace")}
    return protocol.call(path, request)


def cmd_add(args: CmdArgs) -> Result:
    reply = _call(args, "add")
    return Result.from_dict(reply.get("result"), "1.1.0")


def cmd_del(args: CmdArgs) -> None:
    """Release the lease; with no daemon running there is nothing held, so DEL still succeeds."""
    try:
        _call(args, "del")
    except protocol.DaemonUnavailable:
        return None


def cmd_check(args: CmdArgs) -> None:
    _call(args, "check")


def cmd_gc(args: CmdArgs) -> None:
    try:
        _call(args, "gc")
    except protocol.DaemonUnavailable:
        return None


def cmd_status(args: CmdArgs) -> None:
    try:
        _call(args, "status")
    except protocol.DaemonUnavailable as e:
        raise CNIError(PLUGIN_NOT_AVAILABLE, e.msg, e.details) from None


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="CNI dhcp IPAM plugin (pycni); run `dhcp daemon` to start its lease daemon")


def main() -> None:
    """The plugin, or the daemon when the first argument is ``daemon`` (as the reference)."""
    if len(sys.argv) > 1 and sys.argv[1] == "daemon":
        from pycni.plugins.ipam.dhcp.daemon import run

        sys.exit(run(sys.argv[2:]))
    run_plugin(PLUGIN)
