"""The shared shape of macvlan, ipvlan, vlan and dummy: one link in the container, from a parent.

Each of those plugins declares a :class:`SublinkSpec` (netlink kind, how config keys become
link attributes, what CHECK compares) and gets ADD / DEL / CHECK with the Go reference's
behaviour: the parent (``master``) defaults to the interface of the default route, ``mtu``
may not exceed the parent's, IPAM is delegated when configured (layer 3) or the link is just
brought up (layer 2), and any failure rolls back both the link and the IPAM reservation.
DEL is idempotent: a missing netns or interface is success.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pycni import ipam
from pycni.cniargs import load_cni_args
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, load_conf, prev_result
from pycni.spec import errors as E
from pycni.spec.errors import INTERNAL, CNIError
from pycni.spec.types import DNS, Interface, Result

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

    from pycni.net.link import Link

# pycni.net modules are imported by the handlers that use them: VERSION needs none of them.


@record
class SublinkSpec:
    """What differs between the plugins that share this shape."""

    name: str                    # CNI type, for messages
    kind: str                    # netlink link kind
    about: str
    needs_master: bool = True
    ipam_required: bool = False
    mac_configurable: bool = False
    # config -> extra netlink attributes (e.g. macvlan_mode); raise CNIError(7) on bad values
    link_attrs: Callable[[Mapping[str, Any]], dict[str, Any]] = field(default=lambda conf: {})
    # (config, netlink message of the container link) -> raise CNIError when CHECK must fail
    check_link: Callable[[Mapping[str, Any], Any], None] = field(default=lambda conf, msg: None)
    # Apply a prevResult's addresses when there is no ipam (ipvlan chained after an IPAM-only plugin)
    uses_prev_result_ips: bool = False
    # Make the link another way than netlink RTM_NEWLINK from a parent (tap): (conf, args, mac) -> Link
    create: Callable[[Mapping[str, Any], CmdArgs, str], Link] | None = None


def default_route_interface(in_netns: str | None = None) -> str:
    """Name of the link carrying the first default route (where the reference looks for master)."""
    from pycni.net import netns, route
    from pycni.net.link import get_link

    def find() -> str:
        """The first default route's link in the current namespace."""
        for r in route.list_routes(table=route.RT_TABLE_MAIN):
            if r.dst.prefixlen == 0 and r.oif:
                link = get_link(r.oif)
                if link is not None:
                    return link.name
        raise CNIError(E.INVALID_CONFIG, "no default route interface found",
                       "set \"master\" in the config to the interface to attach to")

    if in_netns:
        with netns.enter(in_netns):
            return find()
    return find()


def _mtu(conf: Mapping[str, Any]) -> int:
    """The configured ``mtu`` (0: the parent's); CNIError 7 unless an integer."""
    mtu = conf.get("mtu", 0) or 0
    if not isinstance(mtu, int) or isinstance(mtu, bool):
        raise CNIError(E.INVALID_CONFIG, "\"mtu\" must be an integer", f"got {mtu!r}")
    return mtu


def _mac(conf: Mapping[str, Any], args: CmdArgs) -> str:
    """The container MAC: config, then CNI_ARGS MAC, then runtimeConfig.mac (last wins); lower case."""
    from pycni.netconf import is_colon_mac

    mac = str(conf.get("mac", "") or "")
    env_mac = load_cni_args(args.args, ["MAC"]).get("MAC", "")
    if env_mac:
        mac = env_mac
    rc = conf.get("runtimeConfig") or {}
    if isinstance(rc, dict) and rc.get("mac"):
        mac = str(rc["mac"])
    if mac and not is_colon_mac(mac):
        raise CNIError(E.INVALID_CONFIG, f"invalid args {mac} for MAC addr", "use the form 0a:58:0a:f4:00:05")
    return mac.lower()


class SublinkPlugin:
    """ADD / DEL / CHECK for one :class:`SublinkSpec`."""

    def __init__(self, spec: SublinkSpec) -> None:
        self.spec = spec

    def plugin(self) -> Plugin:
        """The :class:`Plugin` to hand to ``run_plugin``."""
        return Plugin(add=self.add, delete=self.delete, check=self.check, about=self.spec.about)

    # ---- config -----------------------------------------------------------------------------
    def _conf(self, args: CmdArgs) -> dict[str, Any]:
        """The config, with IPAM and the kind's own keys checked before anything is made."""
        conf = load_conf(args.stdin_data)
        if self.spec.ipam_required:
            ipam.require_ipam(conf, self.spec.name)
        else:
            ipam.ipam_type(conf)
        self.spec.link_attrs(conf)  # validate early: nothing is made for a bad config
        if not isinstance(conf.get("linkInContainer", False), bool):
            raise CNIError(E.INVALID_CONFIG, "\"linkInContainer\" must be true or false",
                           f"got {conf.get('linkInContainer')!r}")
        mtu = conf.get("mtu", 0)
        if mtu is not None and (not isinstance(mtu, int) or isinstance(mtu, bool) or mtu < 0):
            raise CNIError(E.INVALID_CONFIG, "\"mtu\" must be a non-negative integer", f"got {mtu!r}")
        return conf

    def _parent(self, conf: dict[str, Any], args: CmdArgs) -> Link | None:
        """The ``master`` link (defaulted to the default-route link), with ``mtu`` checked against it."""
        from pycni.net import sublink

        if not self.spec.needs_master:
            return None
        in_container = bool(conf.get("linkInContainer", False))
        master = conf.get("master") or ""
        if not isinstance(master, str):
            raise CNIError(E.INVALID_CONFIG, "\"master\" must be a string", f"got {master!r}")
        if not master:
            master = default_route_interface(args.netns if in_container else None)
            conf["master"] = master
        parent = sublink.parent_link(master, args.netns, in_container)
        mtu = _mtu(conf)
        if mtu < 0 or mtu > parent.mtu:
            raise CNIError(E.INVALID_CONFIG, f"invalid MTU {mtu}, must be [0, master MTU({parent.mtu})]",
                           f"lower \"mtu\" to at most the MTU of {master!r}")
        return parent

    # ---- handlers ---------------------------------------------------------------------------
    def add(self, args: CmdArgs) -> Result:
        """ADD: the link in the container, then IPAM (or the prevResult's IPs); all undone on failure."""
        from pycni.net import netns, sublink
        from pycni.net.link import get_link

        conf = self._conf(args)
        netns.check_netns(args.netns)
        parent = self._parent(conf, args)
        mac = _mac(conf, args) if self.spec.mac_configurable else ""
        attrs = self.spec.link_attrs(conf)
        with Rollback() as undo:
            if self.spec.create is not None:
                link = self.spec.create(conf, args, mac)
            else:
                link = sublink.create_in_container(
                    self.spec.kind, args.netns, args.ifname, parent=parent.index if parent else None,
                    link_in_container=bool(conf.get("linkInContainer", False)), mtu=_mtu(conf), mac=mac, **attrs)
            undo.push(self._delete_link, args.netns, args.ifname)
            result = Result(cni_version=config_version(conf),
                            interfaces=[Interface(name=args.ifname, mac=link.mac, sandbox=args.netns)])
            prev = prev_result(conf)
            if ipam.ipam_type(conf):
                ipam_result = ipam.add(conf, args)
                undo.push(ipam.delete, conf, args)
                result.ips, result.routes = ipam_result.ips, ipam_result.routes
            elif self.spec.uses_prev_result_ips and prev is not None and prev.ips:
                result.ips, result.routes = prev.ips, prev.routes  # chained after an IPAM-only plugin
            for ipc in result.ips:
                ipc.interface = 0
            self._configure(args, result)
            result.dns = DNS.from_dict(conf.get("dns"))
        with netns.enter(args.netns):
            created = get_link(args.ifname)
            if created is not None:
                result.interfaces[0].mac = created.mac
        return result

    def _configure(self, args: CmdArgs, result: Result) -> None:
        """Put the result's addresses and routes on the container link, or just bring it up (layer 2)."""
        from pycni.net import iface, link, netns
        from pycni.net.sysctl import try_write_sysctl

        with netns.enter(args.netns):
            if result.ips:
                for key in (f"net/ipv4/conf/{args.ifname}/arp_notify", f"net/ipv6/conf/{args.ifname}/ndisc_notify"):
                    try_write_sysctl(key, "1")
                iface.configure_iface(args.ifname, result)
            else:
                link.set_link(args.ifname, up=True)

    @staticmethod
    def _delete_link(netns_path: str, ifname: str) -> None:
        """Delete the container link; a missing netns or link is success."""
        from pycni.net import link, netns

        if not netns.netns_exists(netns_path):
            return
        with netns.enter(netns_path):
            link.delete_link(ifname)

    def delete(self, args: CmdArgs) -> None:
        """DEL: release IPAM first (the reference's order), then the link."""
        conf = load_conf(args.stdin_data)
        ipam.delete(conf, args)
        if args.netns:
            self._delete_link(args.netns, args.ifname)

    def check(self, args: CmdArgs) -> None:
        """CHECK: IPAM, the parent, the container link against prevResult, then the kind's own attributes."""
        from pycni.net import netns, verify
        from pycni.net.link import ipr, lookup_msg

        conf = self._conf(args)
        netns.check_netns(args.netns)
        ipam.check(conf, args)
        prev = prev_result(conf)
        if prev is None:
            raise CNIError(E.INVALID_CONFIG, "required prevResult missing", "CHECK needs the result of ADD")
        self._parent(conf, args)
        verify.container_link(prev, args.ifname, args.netns, kind=self.spec.kind)
        with netns.enter(args.netns), ipr() as sock:
            self.spec.check_link(conf, lookup_msg(sock, args.ifname))


def link_info_data(msg: Any) -> Any:
    """The IFLA_INFO_DATA of a link message (kind-specific attributes), or None."""
    info = msg.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_DATA") if info is not None else None


@record(frozen=True)
class LinkMode:
    """The ``mode`` key of macvlan and ipvlan: validated from the config, compared on CHECK."""

    kind: str                 # netlink kind; the mode lives in IFLA_<KIND>_MODE
    modes: Mapping[str, int]  # config name -> IFLA_<KIND>_MODE value
    default: str

    def of(self, conf: Mapping[str, Any]) -> str:
        """The configured mode's name (the default when unset); CNIError 7 for an unknown one."""
        mode = conf.get("mode") or self.default
        if mode not in self.modes:
            raise CNIError(E.INVALID_CONFIG, f"unknown {self.kind} mode: {mode!r}",
                           f"use one of {', '.join(self.modes)}")
        return str(mode)

    def check(self, conf: Mapping[str, Any], msg: Any) -> None:
        """CHECK: the container link's mode must still be the configured one."""
        data = link_info_data(msg)
        have = data.get_attr(f"IFLA_{self.kind.upper()}_MODE") if data is not None else None
        names = {v: k for k, v in self.modes.items()}
        have_name = names.get(have, have) if isinstance(have, int) else have  # pyroute2 may decode the name
        if have_name != self.of(conf):
            raise CNIError(INTERNAL, f"container {self.kind} mode {have_name} does not match expected value: "
                                     f"{self.of(conf)}")
