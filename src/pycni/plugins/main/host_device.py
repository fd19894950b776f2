"""host-device: move an existing host interface into the container, and back on DEL.

The device is found by ``device`` (name), ``hwaddr``, ``kernelpath`` (/sys/devices/...) or
``pciBusID`` (runtimeConfig ``deviceID`` overrides it), renamed to CNI_IFNAME in the container,
brought up, and configured by IPAM when there is one. Like the reference, the original name is
kept in the link's alias, so either implementation can move it back. Unlike the reference, we
also save its original state (up/down, MTU, addresses — the kernel drops addresses on a netns
move) under ``dataDir`` and restore it on DEL, and a second DEL succeeds.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pycni import ipam
from pycni.net import netns
from pycni.net.link import Link
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, load_conf, prev_result, run_plugin
from pycni.spec import errors as E
from pycni.spec.errors import INTERNAL, CNIError
from pycni.spec.types import DNS, Interface, Result
from pycni.spec.validate import validate_container_id

DEFAULT_DATA_DIR = "/var/lib/cni/host-device"
SYS_BUS_PCI = "/sys/bus/pci/devices"


def _conf(data: bytes) -> dict[str, Any]:
    """The config, with runtimeConfig.deviceID as pciBusID and one way of finding the device required."""
    conf = load_conf(data)
    rc = conf.get("runtimeConfig") or {}
    if isinstance(rc, dict) and rc.get("deviceID"):
        conf["pciBusID"] = rc["deviceID"]
    for key in ("device", "hwaddr", "kernelpath", "pciBusID", "dataDir"):
        if key in conf and not isinstance(conf[key], str):
            raise CNIError(E.INVALID_CONFIG, f"\"{key}\" must be a string", f"got {conf[key]!r}")
    if not any(conf.get(k) for k in ("device", "hwaddr", "kernelpath", "pciBusID")):
        raise CNIError(E.INVALID_CONFIG, 'specify either "device", "hwaddr", "kernelpath" or "pciBusID"',
                       "host-device needs to know which host interface to move into the container")
    ipam.ipam_type(conf)
    return conf


def find_host_device(conf: dict[str, Any]) -> str:
    """The host interface the config names (in the calling thread's netns)."""
    from pycni.net.link import get_link, list_links

    if conf.get("device"):
        if get_link(conf["device"]) is None:
            raise CNIError(INTERNAL, f"failed to find host device: link {conf['device']!r} not found",
                           "check \"device\" against `ip link` on the host")
        return str(conf["device"])
    if conf.get("hwaddr"):
        want = conf["hwaddr"].lower()
        for link in list_links():
            if link.mac == want:
                return link.name
        raise CNIError(INTERNAL, f"failed to find host device: no interface has MAC {conf['hwaddr']}")
    names = {link.name for link in list_links()}
    if conf.get("kernelpath"):
        path = conf["kernelpath"]
        if not os.path.isabs(path) or not path.startswith("/sys/devices/"):
            raise CNIError(E.INVALID_CONFIG,
                           f"kernel device path {path!r} must be absolute and begin with /sys/devices/")
        net_dir = os.path.join(path, "net")
        try:
            entries = sorted(os.listdir(net_dir))
        except OSError:
            raise CNIError(INTERNAL, f"failed to find network devices at {net_dir!r}") from None
        for entry in entries:
            if entry in names:
                return entry
        raise CNIError(INTERNAL, f"failed to find host device: no interface under {net_dir}")
    pci = conf["pciBusID"]
    net_dir = os.path.join(SYS_BUS_PCI, pci, "net")
    if not os.path.isdir(net_dir):
        import glob

        matches = sorted(glob.glob(os.path.join(SYS_BUS_PCI, glob.escape(pci), "virtio*", "net")))
        if not matches:
            raise CNIError(INTERNAL, f"failed to find host device: no net directory under pci device {pci}")
        net_dir = matches[0]
    entries = sorted(os.listdir(net_dir))
    if not entries:
        raise CNIError(INTERNAL, f"failed to find device name for pci address {pci}")
    return entries[0]


def _state_path(conf: dict[str, Any], args: CmdArgs) -> str:
    """Where the device's original state is saved (the container ID is checked: it names a file)."""
    validate_container_id(args.container_id)
    return os.path.join(conf.get("dataDir") or DEFAULT_DATA_DIR, f"{args.container_id}-{args.ifname}.json")


def _save_state(path: str, state: dict[str, Any]) -> None:
    """Write what DEL restores, atomically (a crash leaves the old file or the new, never half)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def _load_state(path: str) -> dict[str, Any] | None:
    """What :func:`_save_state` wrote; None when missing or unreadable (DEL then restores nothing)."""
    try:
        with open(path) as f:
            state = json.load(f)
        return state if isinstance(state, dict) else None
    except (OSError, ValueError):
        return None


def _move_in(name: str, args: CmdArgs) -> Link:
    """Move host link ``name`` into the container as CNI_IFNAME (alias = original name), up."""
    from pycni.net import link

    with netns.enter(args.netns):
        link.require_free_ifname(args.ifname, args.netns)
    fd = netns.open_netns(args.netns)
    try:
        link.set_link(name, up=False)
        link.move_link_to_netns(name, fd)
    finally:
        os.close(fd)
    with netns.enter(args.netns):
        try:
            link.set_alias(name, name)
            link.set_link(name, new_name=args.ifname)
            return link.set_link(args.ifname, up=True)
        except CNIError:
            _move_out(args, name)
            raise


def _move_out(args: CmdArgs, current_name: str) -> str | None:
    """Move the container link back to the calling thread's netns under its alias; its old name."""
    from pycni.net import link

    host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with netns.enter(args.netns):
            found = link.get_link(current_name)
            if found is None:
                return None
            original = link.get_alias(found.index) or current_name
            link.set_link(found.index, up=False)
            link.set_link(found.index, new_name=original)
            try:
                link.move_link_to_netns(original, host_fd)
            except CNIError:
                link.set_link(original, new_name=current_name)  # leave it retryable, as the reference
                raise
            return original
    finally:
        os.close(host_fd)


def _restore(name: str, state: dict[str, Any] | None) -> None:
    """Give the host link back its saved MTU, addresses and up state (the netns move dropped them)."""
    from pycni.net import addr, link

    if not state:
        return
    if state.get("mtu"):
        link.set_link(name, mtu=int(state["mtu"]))
    for a in state.get("addresses", []):
        addr.add_addr(name, a, exist_ok=True)
    if state.get("up"):
        link.set_link(name, up=True)


def cmd_add(args: CmdArgs) -> Result:
    from pycni.net import addr, iface
    from pycni.net.link import require_link

    conf = _conf(args.stdin_data)
    netns.check_netns(args.netns)
    name = find_host_device(conf)
    before = require_link(name)
    state = {"name": name, "up": before.up, "mtu": before.mtu, "mac": before.mac,
             "addresses": [str(a.address) for a in addr.list_addrs(before.index) if a.scope == 0]}
    path = _state_path(conf, args)
    with Rollback() as undo:
        _save_state(path, state)
        undo.push(_forget, path)
        moved = _move_in(name, args)
        undo.push(_undo_move, args, state)
        result = Result(cni_version=config_version(conf),
                        interfaces=[Interface(name=args.ifname, mac=moved.mac, sandbox=args.netns)])
        if ipam.ipam_type(conf):
            ipam_result = ipam.add(conf, args)
            undo.push(ipam.delete, conf, args)
            result.ips, result.routes = ipam_result.ips, ipam_result.routes
            for ipc in result.ips:
                ipc.interface = 0
            with netns.enter(args.netns):
                iface.configure_iface(args.ifname, result)
            result.dns = DNS.from_dict(conf.get("dns"))
    return result


def _forget(path: str) -> None:
    """Delete the saved state if it is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _undo_move(args: CmdArgs, state: dict[str, Any]) -> None:
    """Roll back a move into the container: move the device out and restore its state."""
    name = _move_out(args, args.ifname)
    if name:
        _restore(name, state)


def cmd_del(args: CmdArgs) -> None:
    conf = _conf(args.stdin_data)
    ipam.delete(conf, args)  # first, and even without CNI_NETNS: never leak the reservation
    if not args.netns:
        return
    path = _state_path(conf, args)
    state = _load_state(path)
    if netns.netns_exists(args.netns):
        name = _move_out(args, args.ifname)
        if name is not None:
            _restore(name, state)
    _forget(path)  # moved back now, or already back (a second DEL), or gone with its namespace


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import verify

    conf = _conf(args.stdin_data)
    netns.check_netns(args.netns)
    ipam.check(conf, args)
    prev = prev_result(conf)
    if prev is None:
        raise CNIError(E.INVALID_CONFIG, "Required prevResult missing", "CHECK needs the result of ADD")
    verify.container_link(prev, args.ifname, args.netns)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check,
                about="pycni host-device: moves a host interface into the container")


def main() -> None:
    run_plugin(PLUGIN)
