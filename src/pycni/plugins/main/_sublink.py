"""The shared shape of macvlan, ipvlan, vlan, dummy and tap: one link in the container, from a parent.

Not a plugin itself (hence the underscore): each of those plugins declares a :class:`SublinkSpec`
(netlink kind, how config keys become link attributes, what CHECK compares) and gets
``parse_conf`` / ADD / DEL / CHECK / GC / STATUS with the Go reference's behaviour: the parent
(``master``) defaults to the interface of the default route, ``mtu`` may not exceed the
parent's, IPAM is delegated when configured (layer 3) or the link is just brought up (layer 2),
and any failure rolls back both the link and the IPAM reservation. Everything in the config is
checked before the link is made. DEL is idempotent: a missing netns or interface is success.
GC and STATUS are the IPAM plugin's answer.
"""

from __future__ import annotations

from pycni import invoke, ipam, netconf
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version
from pycni.spec.errors import INTERNAL, CNIError, invalid_config
from pycni.spec.types import DNS, Interface, Result

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
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
    # (config, the container link) -> raise CNIError when CHECK must fail
    check_link: Callable[[Mapping[str, Any], Link], None] = field(default=lambda conf, link: None)
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
        raise invalid_config("no default route interface found",
                             "set \"master\" in the config to the interface to attach to")

    if in_netns:
        with netns.enter(in_netns):
            return find()
    return find()


@record
class SublinkConf:
    """One sublink plugin's config, checked; ``raw`` is the decoded JSON for the kind's own hooks."""

    name: str
    cni_version: str
    ipam_type: str = ""
    master: str = ""
    link_in_container: bool = False
    mtu: int = 0
    mac: str = ""
    dns: DNS = field(default_factory=DNS)
    attrs: dict[str, Any] = field(default_factory=dict)  # extra netlink attributes of the kind
    prev: Result | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


class SublinkPlugin:
    """parse_conf and the handlers for one :class:`SublinkSpec`."""

    def __init__(self, spec: SublinkSpec) -> None:
        self.spec = spec

    def plugin(self) -> Plugin:
        """The :class:`Plugin` to hand to ``run_plugin``."""
        return Plugin(add=self.add, delete=self.delete, check=self.check, gc=self.gc, status=self.status,
                      about=self.spec.about)

    # ---- config -----------------------------------------------------------------------------
    def parse_conf(self, args: CmdArgs) -> SublinkConf:
        """The config as a :class:`SublinkConf`: IPAM, the kind's own keys, MAC, runtimeConfig, args, dns,
        prevResult — all checked before anything is made."""
        raw = args.conf()
        spec = self.spec
        netconf.args_cni(raw)
        netconf.runtime_config(raw)
        n = SublinkConf(name=netconf.network_name(raw), cni_version=config_version(raw),
                        ipam_type=ipam.require_ipam(raw, spec.name) if spec.ipam_required else netconf.ipam_type(raw),
                        master=netconf.get_str(raw, "master"),
                        link_in_container=netconf.get_bool(raw, "linkInContainer"),
                        mtu=netconf.get_int(raw, "mtu", minimum=0, maximum=netconf.MAX_MTU),
                        dns=DNS.from_dict(netconf.get_dict(raw, "dns")), attrs=spec.link_attrs(raw),
                        prev=netconf.prev_result(raw), raw=raw)
        if spec.mac_configurable:
            n.mac = netconf.container_mac(raw, args.args, config_key=True)
        return n

    def _check_for_add(self, n: SublinkConf, args: CmdArgs) -> None:
        """What ADD must find before making anything: the IPAM plugin, the netns, a free CNI_IFNAME,
        and a result the config's version can carry (0.1.0/0.2.0 results are addresses only)."""
        from pycni.net.link import check_container_ifname

        has_ips = bool(n.ipam_type) or (self.spec.uses_prev_result_ips and n.prev is not None and bool(n.prev.ips))
        netconf.require_ip_result(n.cni_version, has_ips, self.spec.name)
        if n.ipam_type:
            invoke.find_in_path(n.ipam_type, args.cni_path)
        check_container_ifname(args.netns, args.ifname)

    def _parent(self, n: SublinkConf, args: CmdArgs) -> Link | None:
        """The ``master`` link (defaulted to the default-route link), with ``mtu`` checked against it."""
        from pycni.net import sublink

        if not self.spec.needs_master:
            return None
        if not n.master:
            n.master = default_route_interface(args.netns if n.link_in_container else None)
        parent = sublink.parent_link(n.master, args.netns, n.link_in_container)
        if n.mtu > parent.mtu:
            raise invalid_config(f"invalid MTU {n.mtu}, must be [0, master MTU({parent.mtu})]",
                                 f"lower \"mtu\" to at most the MTU of {n.master!r}")
        return parent

    # ---- handlers ---------------------------------------------------------------------------
    def add(self, args: CmdArgs) -> Result:
        """ADD: the link in the container, then IPAM (or the prevResult's IPs); all undone on failure."""
        from pycni.net import sublink

        n = self.parse_conf(args)
        self._check_for_add(n, args)
        parent = self._parent(n, args)
        with Rollback() as undo:
            if self.spec.create is not None:
                link = self.spec.create(n.raw, args, n.mac)
            else:
                link = sublink.create_in_container(
                    self.spec.kind, args.netns, args.ifname, parent=parent.index if parent else None,
                    link_in_container=n.link_in_container, mtu=n.mtu, mac=n.mac, **n.attrs)
            undo.push(self._delete_link, args.netns, args.ifname)
            result = Result(cni_version=n.cni_version,
                            interfaces=[Interface(name=args.ifname, mac=link.mac, sandbox=args.netns)])
            if n.ipam_type:
                ipam_result = ipam.add(n.raw, args)
                undo.push(ipam.delete, n.raw, args)
                result.ips, result.routes = ipam_result.ips, ipam_result.routes
            elif self.spec.uses_prev_result_ips and n.prev is not None and n.prev.ips:
                result.ips, result.routes = n.prev.ips, n.prev.routes  # chained after an IPAM-only plugin
            for ipc in result.ips:
                ipc.interface = 0
            self._configure(args, result)
            result.dns = n.dns
        return result

    def _configure(self, args: CmdArgs, result: Result) -> None:
        """Put the result's addresses and routes on the container link, or just bring it up (layer 2);
        then report its MAC as it is now (in the same visit to the namespace)."""
        from pycni.net import iface, link, netns
        from pycni.net.sysctl import try_write_sysctl

        with netns.enter(args.netns):
            if result.ips:
                for key in (f"net/ipv4/conf/{args.ifname}/arp_notify", f"net/ipv6/conf/{args.ifname}/ndisc_notify"):
                    try_write_sysctl(key, "1")
                iface.configure_iface(args.ifname, result)
            else:
                link.set_link(args.ifname, up=True)
            configured = link.get_link(args.ifname)
            if configured is not None:
                result.interfaces[0].mac = configured.mac

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
        n = self.parse_conf(args)
        ipam.delete(n.raw, args)
        if args.netns:
            self._delete_link(args.netns, args.ifname)

    def check(self, args: CmdArgs) -> None:
        """CHECK: IPAM, the parent, the container link against prevResult, then the kind's own attributes."""
        from pycni.net import netns, verify
        from pycni.net.link import require_link

        n = self.parse_conf(args)
        netns.check_netns(args.netns)
        ipam.check(n.raw, args)
        prev = netconf.require_prev_result(n.raw, self.spec.name)
        self._parent(n, args)
        verify.container_link(prev, args.ifname, args.netns, kind=self.spec.kind)
        with netns.enter(args.netns):
            self.spec.check_link(n.raw, require_link(args.ifname))

    def gc(self, args: CmdArgs) -> None:
        """GC: the IPAM plugin releases what ``cni.dev/valid-attachments`` does not list."""
        ipam.gc(self.parse_conf(args).raw, args)

    def status(self, args: CmdArgs) -> None:
        """STATUS: the IPAM plugin's answer."""
        ipam.status(self.parse_conf(args).raw, args)


@record(frozen=True)
class LinkMode:
    """The ``mode`` key of macvlan and ipvlan: validated from the config, compared on CHECK."""

    kind: str                 # netlink kind; the mode is the link's data["<kind>_mode"]
    modes: Mapping[str, int]  # config name -> the kernel's mode number
    default: str

    def of(self, conf: Mapping[str, Any]) -> str:
        """The configured mode's name (the default when unset); CNIError 7 for an unknown one."""
        mode = netconf.lookup(conf, "mode")

        mode = self.default if mode is None or mode == "" else mode
        if not isinstance(mode, str) or mode not in self.modes:
            raise invalid_config(f"unknown {self.kind} mode: {mode!r}",
                                 f"use one of {', '.join(self.modes)}")
        return str(mode)

    def check(self, conf: Mapping[str, Any], link: Link) -> None:
        """CHECK: the container link's mode must still be the configured one."""
        have = link.data.get(f"{self.kind}_mode")
        have_name = {v: k for k, v in self.modes.items()}.get(have, have) if isinstance(have, int) else have
        if have_name != self.of(conf):
            raise CNIError(INTERNAL, f"container {self.kind} mode {have_name} does not match expected value: "
                                     f"{self.of(conf)}")
