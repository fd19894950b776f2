"""host-device: move an existing host interface into the container, and back on DEL.

The device is found by ``device`` (name), ``hwaddr``, ``kernelpath`` (/sys/devices/...) or
``pciBusID`` (runtimeConfig ``deviceID`` overrides it), renamed to CNI_IFNAME in the container,
brought up, and configured by IPAM when there is one. Like the reference, the original name is
kept in the link's alias, so either implementation can move it back. Unlike the reference, we
also save its original state (up/down, MTU, addresses — the kernel drops addresses on a netns
move — and alias) under ``dataDir`` and restore it on DEL, and a second DEL succeeds. The host's
loopback is refused before anything is touched, and the device is moved while still up, so a
device the kernel will not move is left exactly as it was.
"""

from __future__ import annotations

import os

from pycni import ipam, netconf, statefile
from pycni.net import netns
from pycni.net.link import Link
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import INTERNAL, CNIError, invalid_config
from pycni.spec.types import DNS, Interface, Result
from pycni.spec.validate import validate_container_id

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_DATA_DIR = "/var/lib/cni/host-device"
SYS_BUS_PCI = "/sys/bus/pci/devices"
IFF_LOOPBACK = 0x8


@record
class HostDeviceConf:
    """Which host device to move (one of device, hwaddr, kernelpath, pciBusID) and where its state is kept."""

    name: str
    cni_version: str
    device: str = ""
    hwaddr: str = ""
    kernelpath: str = ""
    pci_bus_id: str = ""  # runtimeConfig.deviceID when given
    data_dir: str = DEFAULT_DATA_DIR
    ipam_type: str = ""
    dns: DNS = field(default_factory=DNS)


def parse_conf(args: CmdArgs) -> HostDeviceConf:
    """The config as a :class:`HostDeviceConf`; every key (and runtimeConfig, args, dns, ipam) checked."""
    raw = args.conf()
    get = netconf.get_str
    netconf.args_cni(raw)
    n = HostDeviceConf(name=netconf.network_name(raw), cni_version=config_version(raw), device=get(raw, "device"),
                       hwaddr=get(raw, "hwaddr"), kernelpath=get(raw, "kernelpath"),
                       pci_bus_id=get(raw, "pciBusID"), data_dir=get(raw, "dataDir") or DEFAULT_DATA_DIR,
                       ipam_type=netconf.ipam_type(raw), dns=DNS.from_dict(netconf.get_dict(raw, "dns")))
    device_id = netconf.get_str(netconf.runtime_config(raw), "deviceID", label="runtimeConfig.deviceID")
    if device_id:
        n.pci_bus_id = device_id
    if not (n.device or n.hwaddr or n.kernelpath or n.pci_bus_id):
        raise invalid_config('specify either "device", "hwaddr", "kernelpath" or "pciBusID"',
                             "host-device needs to know which host interface to move into the container")
    return n


def find_host_device(n: HostDeviceConf) -> str:
    """The host interface the config names (in the calling thread's netns)."""
    from pycni.net.link import get_link, list_links

    if n.device:
        if get_link(n.device) is None:
            raise CNIError(INTERNAL, f"failed to find host device: link {n.device!r} not found",
                           "check \"device\" against `ip link` on the host")
        return n.device
    if n.hwaddr:
        want = n.hwaddr.lower()
        for link in list_links():
            if link.mac == want:
                return link.name
        raise CNIError(INTERNAL, f"failed to find host device: no interface has MAC {n.hwaddr}")
    names = {link.name for link in list_links()}
    if n.kernelpath:
        path = n.kernelpath
        if not os.path.isabs(path) or not path.startswith("/sys/devices/"):
            raise invalid_config(f"kernel device path {path!r} must be absolute and begin with /sys/devices/")
        net_dir = os.path.join(path, "net")
        try:
            entries = sorted(os.listdir(net_dir))
        except OSError:
            raise CNIError(INTERNAL, f"failed to find network devices at {net_dir!r}") from None
        for entry in entries:
            if entry in names:
                return entry
        raise CNIError(INTERNAL, f"failed to find host device: no interface under {net_dir}")
    pci = n.pci_bus_id
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


def _refuse_unmovable(found: Link) -> None:
    """The host's loopback never leaves (the kernel would refuse anyway, after the reference took it down)."""
    if found.flags & IFF_LOOPBACK or found.name == "lo":
        raise invalid_config(f"cannot move loopback device {found.name!r} into a container",
                             "host-device moves a real host interface; name another \"device\"")


def _state_path(n: HostDeviceConf, args: CmdArgs) -> str:
    """Where the device's original state is saved (the container ID is checked: it names a file)."""
    validate_container_id(args.container_id)
    return os.path.join(n.data_dir, f"{args.container_id}-{args.ifname}.json")


def _load_state(path: str) -> dict[str, Any] | None:
    """What ADD saved; None when missing or unreadable (DEL then restores nothing)."""
    state = statefile.read_json(path)
    return state if isinstance(state, dict) else None


def _new_dirs(path: str) -> list[str]:
    """The directories above ``path`` that do not exist yet, deepest first (a rollback removes them)."""
    out = []
    d = os.path.dirname(path)
    while d and d != os.path.dirname(d) and not os.path.isdir(d):
        out.append(d)
        d = os.path.dirname(d)
    return out


def _forget(path: str, made_dirs: list[str]) -> None:
    """Rollback of the saved state: the file, then the directories made for it (if empty)."""
    statefile.remove(path)
    for d in made_dirs:
        try:
            os.rmdir(d)
        except OSError:
            break


def _move_in(name: str, args: CmdArgs) -> Link:
    """Move host link ``name`` into the container as CNI_IFNAME (alias = original name), up.

    The move comes first, with the link as it is: when the kernel refuses it nothing has changed.
    """
    from pycni.net import link

    fd = netns.open_netns(args.netns)
    try:
        link.move_link_to_netns(name, fd)
    finally:
        os.close(fd)
    with netns.enter(args.netns):
        try:
            link.set_link(name, up=False)
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
                # Leave it as it was, so the container keeps its network and a DEL can retry
                # (a same-named device in the host, say), as the reference does.
                link.set_link(found.index, new_name=current_name, up=True if found.up else None)
                raise
            return original
    finally:
        os.close(host_fd)


def _restore(name: str, state: dict[str, Any] | None) -> None:
    """Give the host link back its saved MTU, addresses, alias and up state (the netns move dropped them)."""
    from pycni.net import addr, link

    if not state:
        return
    if state.get("mtu"):
        link.set_link(name, mtu=int(state["mtu"]))
    if "alias" in state:
        link.set_alias(name, str(state["alias"]))
    for a in state.get("addresses", []):
        addr.add_addr(name, a, exist_ok=True)
    if state.get("up"):
        link.set_link(name, up=True)


def cmd_add(args: CmdArgs) -> Result:
    from pycni.net import addr, iface
    from pycni.net.link import check_container_ifname, get_alias, require_link

    n = parse_conf(args)
    conf = args.conf()
    netconf.require_ip_result(n.cni_version, bool(n.ipam_type), "host-device")
    ipam.locate(conf, args)
    check_container_ifname(args.netns, args.ifname)
    name = find_host_device(n)
    before = require_link(name)
    _refuse_unmovable(before)
    state = {"name": name, "up": before.up, "mtu": before.mtu, "mac": before.mac, "alias": get_alias(before.index),
             "addresses": [str(a.address) for a in addr.list_addrs(before.index) if a.scope == 0]}
    path = _state_path(n, args)
    with Rollback() as undo:
        undo.push(_forget, path, _new_dirs(path))
        statefile.write_json(path, state, failure="failed to save the host device's state")
        moved = _move_in(name, args)
        undo.push(_undo_move, args, state)
        result = Result(cni_version=n.cni_version,
                        interfaces=[Interface(name=args.ifname, mac=moved.mac, sandbox=args.netns)])
        if n.ipam_type:
            ipam_result = ipam.add(conf, args)
            undo.push(ipam.delete, conf, args)
            result.ips, result.routes = ipam_result.ips, ipam_result.routes
            for ipc in result.ips:
                ipc.interface = 0
            with netns.enter(args.netns):
                iface.configure_iface(args.ifname, result)
            result.dns = n.dns
    return result


def _undo_move(args: CmdArgs, state: dict[str, Any]) -> None:
    """Roll back a move into the container: move the device out and restore its state."""
    name = _move_out(args, args.ifname)
    if name:
        _restore(name, state)


def cmd_del(args: CmdArgs) -> None:
    n = parse_conf(args)
    ipam.delete(args.conf(), args)  # first, and even without CNI_NETNS: never leak the reservation
    if not args.netns:
        return
    path = _state_path(n, args)
    state = _load_state(path)
    if netns.netns_exists(args.netns):
        name = _move_out(args, args.ifname)
        if name is not None:
            _restore(name, state)
    statefile.remove(path)  # moved back now, or already back (a second DEL), or gone with its namespace


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import verify

    parse_conf(args)
    conf = args.conf()
    netns.check_netns(args.netns)
    ipam.check(conf, args)
    prev = netconf.require_prev_result(conf, "host-device")
    verify.container_link(prev, args.ifname, args.netns)


def cmd_gc(args: CmdArgs) -> None:
    """The IPAM plugin's GC releases what ``cni.dev/valid-attachments`` does not list."""
    parse_conf(args)
    ipam.gc(args.conf(), args)


def cmd_status(args: CmdArgs) -> None:
    """The IPAM plugin's STATUS is ours."""
    parse_conf(args)
    ipam.status(args.conf(), args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni host-device: moves a host interface into the container")


def main() -> None:
    run_plugin(PLUGIN)
