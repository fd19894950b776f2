"""tap: a persistent tap device in the container (for VMs in pods), optionally on a bridge there.

Keys as the reference: ``mac`` (also CNI_ARGS MAC and runtimeConfig mac), ``mtu``,
``multiQueue``, ``owner``, ``group``, ``selinuxContext``, ``bridge`` (a bridge inside the
container to enslave the tap to); IPAM optional. ``selinuxContext`` labels the device's
creation where SELinux is enabled and is ignored where it is not.
"""

from __future__ import annotations

import os

from pycni import netconf
from pycni.net import netns
from pycni.net.link import Link
from pycni.net.names import random_ifname
from pycni.net.tools import run_tool
from pycni.plugins.main._sublink import SublinkPlugin, SublinkSpec
from pycni.skel import CmdArgs, run_plugin
from pycni.spec.errors import INTERNAL, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _uint(conf: Mapping[str, Any], key: str) -> int | None:
    """A uid/gid key of the config, None when absent; CNIError 7 unless it fits 32 bits."""
    return netconf.get_int(conf, key, minimum=0, maximum=2**32 - 1) if netconf.lookup(conf, key) is not None else None


def validate(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Check the tap keys before anything is made (the link_attrs hook: a tap takes no netlink attributes)."""
    _uint(conf, "owner")
    _uint(conf, "group")
    netconf.get_bool(conf, "multiQueue")
    netconf.get_str(conf, "bridge")
    netconf.get_str(conf, "selinuxContext")
    return {}


def _selinux_enabled() -> bool:
    """Whether SELinux is active here, so ``selinuxContext`` must be applied."""
    return os.path.exists("/sys/fs/selinux/enforce")


def create(conf: Mapping[str, Any], args: CmdArgs, mac: str) -> Link:
    """Make the tap in the container under a temporary name, then configure and rename it (the create hook)."""
    from pycni.net import link, tuntap

    tmp = random_ifname("tap")
    with netns.enter(args.netns):
        link.require_free_ifname(args.ifname, args.netns)
        bridge = netconf.get_str(conf, "bridge")
        if bridge and link.get_link(bridge) is None:
            raise invalid_config(f"bridge {bridge!r} not found in the container namespace",
                                 "\"bridge\" names a bridge that must already exist inside the container")
        owner, group = _uint(conf, "owner"), _uint(conf, "group")
        context = netconf.get_str(conf, "selinuxContext")
        multi_queue = netconf.get_bool(conf, "multiQueue")
        if context and _selinux_enabled():
            _create_labelled(tmp, context, multi_queue, owner, group)
        else:
            tuntap.create_tap(tmp, multi_queue=multi_queue, owner=owner, group=group)
        try:
            mtu = netconf.get_int(conf, "mtu") or None

            link.set_link(tmp, mtu=mtu, mac=mac or None, new_name=args.ifname)
            if bridge:
                link.set_link(args.ifname, master=bridge)
            return link.set_link(args.ifname, up=True)
        except Exception:
            link.delete_link(tmp)
            link.delete_link(args.ifname)
            raise


def _create_labelled(name: str, context: str, multi_queue: bool, owner: int | None, group: int | None) -> None:
    """With SELinux, the reference labels `ip tuntap add` through the exec context; so do we."""
    cmd = ["ip", "tuntap", "add", "mode", "tap", "name", name] + (["multi_queue"] if multi_queue else [])
    cmd += ["user", str(owner)] if owner is not None else []
    cmd += ["group", str(group)] if group is not None else []
    try:
        with open("/proc/thread-self/attr/exec", "w") as f:
            f.write(context)
        status, _, stderr = run_tool(cmd)
    finally:
        with open("/proc/thread-self/attr/exec", "w") as f:
            f.write("")
    if status != 0:
        raise CNIError(INTERNAL, f"failed to create tap {name!r}", stderr.strip())


SPEC = SublinkSpec(name="tap", kind="tun", needs_master=False, mac_configurable=True, link_attrs=validate,
                   create=create, about="pycni tap: a tap device in the container")
IMPL = SublinkPlugin(SPEC)
parse_conf, cmd_add, cmd_del, cmd_check, cmd_gc, cmd_status = (IMPL.parse_conf, IMPL.add, IMPL.delete, IMPL.check,
                                                                IMPL.gc, IMPL.status)
PLUGIN = IMPL.plugin()


def main() -> None:
    run_plugin(PLUGIN)
