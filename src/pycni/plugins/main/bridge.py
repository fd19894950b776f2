"""The ``bridge`` plugin: a veth from the container to a Linux bridge on the host.

Same config keys, behaviour and result as the Go reference bridge. Where we differ on
purpose: bad config is rejected with code 7 before anything is made (the reference often
fails half-way with code 999); an ADD that fails undoes everything it did (veth, IPAM
reservation, masquerade and spoof-check rules); DEL with the netns gone still removes the
host-side rules; CHECK looks for the expected routes in every routing table, so it passes
after a chained plugin (sbr, ...) moved them out of the main table.

The plugin runs in the host's netns (the calling thread's); the container side is done
inside ``netns.enter(CNI_NETNS)``.
"""

from __future__ import annotations

import time

from pycni import ipaddr, ipam, netconf, skel
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, run_plugin
from pycni.spec.errors import INTERNAL, CNIError, invalid_config
from pycni.spec.types import DNS, Interface, IPInterface, Result, Route

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

    from pycni.net.link import Link
    from pycni.net.veth import VethPair

DEFAULT_BRIDGE = "cni0"
# The wait for the bridge port to come up: the reference's bound (~2.5 s; it retries after 50,
# 500, 1000, 1000 ms), with its first 50 ms split into re-checks at 1, 2, 4, ... ms, as for
# DAD (net/addr.settle_addresses): a port not up at the first look is up a moment later.
PORT_UP_RETRIES_MS = (0, 1, 2, 4, 8, 16, 19, 500, 1000, 1000)


# ---- config ------------------------------------------------------------------------------------
@record
class BridgeConf:
    name: str
    cni_version: str
    bridge: str = DEFAULT_BRIDGE
    is_gw: bool = False
    is_default_gw: bool = False
    force_address: bool = False
    ip_masq: bool = False
    ip_masq_backend: str | None = None
    mtu: int = 0
    hairpin: bool = False
    promisc: bool = False
    vlan: int = 0
    vlan_trunk: bool = False  # vlanTrunk given at all (turns on vlan_filtering, as in Go)
    vlans: list[int] = field(default_factory=list)
    preserve_default_vlan: bool = False
    macspoofchk: bool = False
    enable_dad: bool = False
    disable_container_interface: bool = False
    port_isolation: bool = False
    mac: str = ""
    ipam_type: str = ""
    dns: DNS = field(default_factory=DNS)
    dns_set: bool = False

    @property
    def vlan_filtering(self) -> bool:
        return self.vlan != 0 or self.vlan_trunk


def _vlan_trunk(items: Any) -> list[int]:
    """Expand ``vlanTrunk`` ([{id} | {minID, maxID}]) into a sorted list, checked as in Go."""
    if not isinstance(items, list):
        raise netconf.invalid("vlanTrunk", "a list of {id} or {minID, maxID}", items)
    vids: set[int] = set()

    def vid(item: dict[str, Any], key: str) -> int:
        v = netconf.lookup(item, key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 4094:
            raise invalid_config(f"incorrect trunk {key} parameter",
                                   f"{key} must be an integer in 1..4094, got {v!r}")
        return v

    for item in items:
        if not isinstance(item, dict):
            raise invalid_config("invalid 'vlanTrunk' entry", f"expected an object, got {item!r}")
        has_min, has_max = netconf.lookup(item, "minID") is not None, netconf.lookup(item, "maxID") is not None
        if has_min and has_max:
            lo, hi = vid(item, "minID"), vid(item, "maxID")
            if hi < lo:
                raise invalid_config("minID is greater than maxID in trunk parameter", f"{item!r}")
            vids.update(range(lo, hi + 1))
        elif has_max:
            raise invalid_config("minID and maxID should be configured simultaneously, minID is missing", f"{item!r}")
        elif has_min:
            raise invalid_config("minID and maxID should be configured simultaneously, maxID is missing", f"{item!r}")
        if netconf.lookup(item, "id") is not None:
            vids.add(vid(item, "id"))
    return sorted(vids)


def parse_conf(args: CmdArgs) -> BridgeConf:
    """The network config as a :class:`BridgeConf`; every value checked before we act."""
    from pycni.spec.validate import validate_interface_name

    raw = args.conf()
    get_bool = netconf.get_bool
    n = BridgeConf(name=netconf.network_name(raw), cni_version=skel.config_version(raw),
                   ipam_type=netconf.ipam_type(raw),
                   bridge=netconf.get_str(raw, "bridge") or DEFAULT_BRIDGE,
                   is_gw=get_bool(raw, "isGateway"), is_default_gw=get_bool(raw, "isDefaultGateway"),
                   force_address=get_bool(raw, "forceAddress"), ip_masq=get_bool(raw, "ipMasq"),
                   ip_masq_backend=netconf.get_str(raw, "ipMasqBackend") or None,
                   mtu=netconf.get_int(raw, "mtu", minimum=0, maximum=netconf.MAX_MTU),
                   hairpin=get_bool(raw, "hairpinMode"), promisc=get_bool(raw, "promiscMode"),
                   preserve_default_vlan=get_bool(raw, "preserveDefaultVlan"),
                   macspoofchk=get_bool(raw, "macspoofchk"), enable_dad=get_bool(raw, "enabledad"),
                   disable_container_interface=get_bool(raw, "disableContainerInterface"),
                   port_isolation=get_bool(raw, "portIsolation"))
    try:
        validate_interface_name(n.bridge)
    except CNIError as e:
        raise invalid_config(f"invalid bridge name {n.bridge!r}", e.details or e.msg) from None
    n.vlan = netconf.get_int(raw, "vlan")
    if not 0 <= n.vlan <= 4094:
        raise invalid_config(f"invalid VLAN ID {n.vlan} (must be between 0 and 4094)",
                               "set vlan to 0 (none) or 1..4094")
    trunk = netconf.lookup(raw, "vlanTrunk")
    if trunk is not None:
        n.vlan_trunk = True
        n.vlans = _vlan_trunk(trunk)

    if n.ip_masq_backend not in (None, "iptables", "nftables"):
        raise invalid_config(f"unknown ipmasq backend {n.ip_masq_backend!r}",
                               "ipMasqBackend must be iptables or nftables")
    if n.is_default_gw:
        n.is_gw = True
    # The container MAC: CNI_ARGS MAC, then args.cni.mac, then runtimeConfig.mac (last wins).
    n.mac = netconf.container_mac(raw, args.args, from_args=True)
    n.dns = DNS.from_dict(netconf.get_dict(raw, "dns"))
    n.dns_set = not n.dns.is_empty()
    return n


def check_for_add(n: BridgeConf, args: CmdArgs) -> None:
    """What only ADD refuses (DEL must still clean up after such a config, as in Go), and what it
    must find before making anything: the IPAM plugin on CNI_PATH, the netns, a free CNI_IFNAME."""
    from pycni.net.link import check_container_ifname

    if n.ipam_type and n.disable_container_interface:
        raise invalid_config("cannot use IPAM when DisableContainerInterface flag is set",
                   "drop ipam for an L2-only attachment, or drop disableContainerInterface")
    if n.hairpin and n.promisc:
        raise invalid_config("cannot set hairpin mode and promiscuous mode at the same time", "choose one of them")
    netconf.require_ip_result(n.cni_version, bool(n.ipam_type), "bridge")
    ipam.locate(args.conf(), args)
    check_container_ifname(args.netns, args.ifname)


# ---- ADD ---------------------------------------------------------------------------------------
def _gateway_for(address: IPInterface) -> Any:
    return address.network.network_address + 1


def _calc_gateways(result: Result, n: BridgeConf) -> dict[int, list[Any]]:
    """Fill in gateways and default routes as Go's calcGateways; return gateway addrs per family."""
    gws: dict[int, list[Any]] = {4: [], 6: []}
    default_found = {4: False, 6: False}
    for ipc in result.ips:
        fam = ipc.address.version
        ipc.interface = 2
        if ipc.gateway is None and n.is_gw:
            ipc.gateway = _gateway_for(ipc.address)
        if n.is_default_gw and not default_found[fam]:
            default = ipaddr.ip_network("0.0.0.0/0" if fam == 4 else "::/0")
            default_found[fam] = any(r.gw is not None and r.dst == default for r in result.routes)
            if not default_found[fam]:
                result.routes.append(Route(dst=default, gw=ipc.gateway))
                default_found[fam] = True
        if n.is_gw:
            gws[fam].append(ipaddr.ip_interface(f"{ipc.gateway}/{ipc.address.network.prefixlen}"))
    return gws


def _ensure_addr(link_name: str, gw: Any, force: bool) -> bool:
    """Put gateway address ``gw`` on the bridge (or its VLAN interface), as Go's ensureAddr;
    True when this call added it. Go pins the bridge's MAC here, after the first port joined;
    ours was pinned before any port joined (pycni.net.bridge.ensure_bridge)."""
    from pycni.net import addr

    for a in addr.list_addrs(link_name, gw.version):
        if a.address == gw:
            return False
        overlap = a.address.network.overlaps(gw.network)
        if gw.version == 4 or overlap:
            if not force:
                raise CNIError(INTERNAL, f"{link_name!r} already has an IP address different from {gw}",
                               f"it has {a.address}; set forceAddress to replace it, or use another bridge")
            addr.del_addr(link_name, a.address)
    addr.add_addr(link_name, gw, exist_ok=True)
    return True


def _ensure_bridge(n: BridgeConf, undo: Rollback) -> Link:
    """The bridge, made when missing; a failed ADD deletes a bridge it made (if no port joined since)."""
    from pycni.net import bridge as br
    from pycni.net import link

    existed = link.get_link(n.bridge) is not None
    bridge = br.ensure_bridge(n.bridge, mtu=n.mtu, promisc=n.promisc, vlan_filtering=n.vlan_filtering)
    if not existed:
        undo.push(_delete_if_unused, bridge.index, "")
    return bridge


def _delete_if_unused(index: int, port: str) -> None:
    """Rollback: delete the bridge we made unless a port other than ``port`` (ours) is on it —
    another ADD may have joined it meanwhile."""
    from pycni.net import link

    if all(li.master != index or li.name == port for li in link.list_links()):
        link.delete_link(index)


def _drop_gateway(name: str, gw: Any, port: str) -> None:
    """Rollback: take the gateway address we added off a bridge no other port uses."""
    from pycni.net import addr, link

    found = link.get_link(name)
    if found is not None and all(li.master != found.index or li.name == port for li in link.list_links()):
        addr.del_addr(name, gw)


def _setup_port(host: str | int, *, hairpin: bool, isolated: bool, vlan: int, vlans: list[int],
                preserve_default_vlan: bool) -> None:
    """Set an enslaved host veth's port flags and VLANs, as Go's setupVeth (one request by index)."""
    from pycni.net import bridge as br

    br.set_port(host, hairpin=hairpin, isolated=isolated)
    if (vlan or vlans) and not preserve_default_vlan:
        br.remove_all_port_vlans(host)
    if vlan:
        br.add_port_vlan(host, vlan, pvid=True, untagged=True)
    for v in vlans:
        br.add_port_vlan(host, v)
    if not vlan and vlans:
        br.add_port_vlan(host, 1, pvid=True, untagged=True)  # the trunk's native VLAN, as in Go


def _ensure_vlan_interface(n: BridgeConf, bridge_mtu: int, undo: Rollback) -> Link:
    """The ``<bridge>.<vlan>`` gateway veth in the host, made like a container port (Go's way)."""
    from pycni.net import link, netns, veth

    name = f"{n.bridge}.{n.vlan}"
    found = link.get_link(name)
    if found is not None:
        return found
    pair = veth.setup_veth(netns.current_netns_path(), name, mtu=bridge_mtu, master=link.require_link(n.bridge).index)
    undo.push(lambda: link.delete_link(pair.host.name))
    _setup_port(pair.host.index, hairpin=False, isolated=False, vlan=n.vlan, vlans=[],
                preserve_default_vlan=n.preserve_default_vlan)
    return link.set_link(name, up=True)


def _wait_port_up(host: str) -> Link:
    """The host veth once it is operationally up (the reference waits the same ~2.5 s)."""
    from pycni.net import link

    for ms in PORT_UP_RETRIES_MS:  # the first try is at once: one lookup when the port is up already
        if ms:
            time.sleep(ms / 1000)
        found = link.require_link(host)
        if found.oper_up:
            return found
    raise CNIError(INTERNAL, f"bridge port in error state: operstate {found.operstate}",
                   f"{host} did not come up within {sum(PORT_UP_RETRIES_MS)} ms")


def default_masq_backend() -> str:
    """Prefer iptables unless only nftables works here, as the reference does."""
    from pycni.net import masq

    return masq.default_backend()


def cmd_add(args: CmdArgs) -> Result:
    from pycni.net import link, netns, veth

    n = parse_conf(args)
    check_for_add(n, args)
    with Rollback() as undo:  # an ADD that fails part-way takes back what it made, host-wide too
        bridge = _ensure_bridge(n, undo)
        pair = veth.setup_veth(args.netns, args.ifname, mtu=n.mtu, mac=n.mac, master=bridge.index)
        undo.push(lambda: link.delete_link(pair.host.name))
        _setup_port(pair.host.index, hairpin=n.hairpin, isolated=n.port_isolation, vlan=n.vlan,
                    vlans=n.vlans, preserve_default_vlan=n.preserve_default_vlan)
        host_if = Interface(name=pair.host.name, mac=pair.host.mac)
        cont_if = Interface(name=pair.container.name, mac=pair.container.mac, sandbox=args.netns)
        br_if = Interface(name=bridge.name, mac=bridge.mac)
        result = Result(cni_version=n.cni_version, interfaces=[br_if, host_if, cont_if])
        if n.macspoofchk:
            from pycni.net import spoofchk  # only here: it loads the nft module (~0.4 ms a call)

            refid = spoofchk.ref_id(args.container_id, args.ifname)
            undo.push(lambda: spoofchk.teardown(refid))
            spoofchk.setup(pair.host.name, pair.container.mac, refid)
        if n.ipam_type:
            _add_l3(args, n, result, bridge.mtu, pair, undo)
        elif not n.disable_container_interface:
            with netns.enter(args.netns):
                link.set_link(args.ifname, up=True)
        if not n.disable_container_interface:
            host_if.mac = _wait_port_up(pair.host.name).mac
        else:
            host_if.mac = link.require_link(pair.host.name).mac
        if n.dns_set:
            result.dns = n.dns
        return result


def _add_l3(args: CmdArgs, n: BridgeConf, result: Result, bridge_mtu: int, pair: VethPair,
            undo: Rollback) -> None:
    from pycni.net import iface, link, masq, netns
    from pycni.net.sysctl import disable_forwarding, enable_forwarding, try_write_sysctl

    container_index = pair.container.index
    conf = args.conf()
    ipam_result = ipam.add(conf, args)
    undo.push(ipam.delete, conf, args)
    result.ips, result.routes, result.dns = ipam_result.ips, ipam_result.routes, ipam_result.dns
    gws = _calc_gateways(result, n)
    masq_job: _Background | None = None
    if n.ip_masq:
        backend = n.ip_masq_backend or default_masq_backend()
        addrs = [ipc.address for ipc in result.ips]
        undo.push(masq.undo_ip_masq, backend, n.name, args.container_id, args.ifname, addrs)
        # Its iptables-restore process runs while the links are configured (the result is the
        # same in any order): each waits on something else, the RTNL lock or the xtables table.
        masq_job = _Background(masq.setup_ip_masq, backend, n.name, args.container_id, args.ifname, addrs)
    try:
        with netns.enter(args.netns):
            for key, value in ((f"net/ipv6/conf/{args.ifname}/enhanced_dad", "1" if n.enable_dad else None),
                               (f"net/ipv6/conf/{args.ifname}/accept_dad", "1" if n.enable_dad else "0")):
                if value is not None:
                    try_write_sysctl(key, value)
            if not link.try_set_ipv4_devconf(container_index, {link.IPV4_DEVCONF_ARP_NOTIFY: 1}):
                try_write_sysctl(f"net/ipv4/conf/{args.ifname}/arp_notify", "1")
            iface.configure_iface(args.ifname, result)
        if n.is_gw:
            vlan_if: Interface | None = None
            for fam in (4, 6):
                for gw in gws[fam]:
                    if n.vlan:
                        vl = _ensure_vlan_interface(n, bridge_mtu, undo)
                        if vlan_if is None:
                            vlan_if = Interface(name=vl.name, mac=vl.mac)
                            result.interfaces.append(vlan_if)
                        _ensure_addr(vl.name, gw, n.force_address)
                    elif _ensure_addr(n.bridge, gw, n.force_address):
                        undo.push(_drop_gateway, n.bridge, gw, pair.host.name)
                if gws[fam] and enable_forwarding(fam):
                    undo.push(disable_forwarding, fam)
    finally:
        if masq_job is not None:
            masq_job.join()  # before any rollback tears its rules down
    if masq_job is not None:
        masq_job.result()


class _Background:
    """``fn(*fn_args)`` on another thread, which starts in this thread's network namespace;
    :meth:`result` re-raises what it raised. On ``_thread`` with a lock as the join: threading
    (with _weakrefset) costs a one-shot ADD ~0.7 ms to import."""

    def __init__(self, fn: Any, *fn_args: Any) -> None:
        import _thread

        self._error: BaseException | None = None
        self._fn, self._args = fn, fn_args
        self._done = _thread.allocate_lock()
        self._done.acquire()
        try:
            _thread.start_new_thread(self._run, ())
        except BaseException:
            self._done.release()
            raise

    def _run(self) -> None:
        try:
            self._fn(*self._args)
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self._error = e
        finally:
            self._done.release()

    def join(self) -> None:
        with self._done:  # released when _run ends; taken and given back, so join() may be repeated
            pass

    def result(self) -> None:
        self.join()
        if self._error is not None:
            raise self._error


# ---- DEL ---------------------------------------------------------------------------------------
def _global_unicast(ip: Any) -> bool:
    """Go's IP.IsGlobalUnicast: anything but link-local, loopback, multicast and unspecified."""
    return not (ip.is_link_local or ip.is_loopback or ip.is_multicast or ip.is_unspecified
                or (ip.version == 4 and ip == ipaddr.IPv4Address("255.255.255.255")))


def cmd_del(args: CmdArgs) -> None:
    """Delete the container's veth, release its addresses, remove its masquerade rules.

    A DEL with no netns (containerd's RemovePodSandbox repeats the DEL with CNI_NETNS empty)
    imports no netlink module: IPAM and the masquerade teardown (found by name, without an
    exec when nothing is left: pycni.net.probe) are all it does."""
    n = parse_conf(args)
    addrs = _delete_veth(args) if args.netns else None
    ipam.delete(args.conf(), args)
    if n.macspoofchk:
        from pycni.net import spoofchk

        spoofchk.teardown(spoofchk.ref_id(args.container_id, args.ifname))
    if n.ipam_type and n.ip_masq:
        from pycni.net import masq

        # Both backends, as the reference: the container may have been set up under another config.
        masq.teardown_ip_masq(None, n.name, args.container_id, args.ifname, addrs or None)


def _delete_veth(args: CmdArgs) -> list[Any] | None:
    """Delete the container's end of the veth (the host end goes with it); its global addresses,
    or None when the netns or the interface is gone."""
    from pycni.net import addr, link, netns

    if not netns.netns_exists(args.netns):
        return None
    with netns.enter(args.netns):
        found = link.get_link(args.ifname)
        if found is None:
            return None
        addrs = [a.address for a in addr.list_addrs(found.index) if _global_unicast(a.address.ip)]
        link.delete_link(found.index)
    return addrs


# ---- CHECK -------------------------------------------------------------------------------------
def _fail(msg: str, details: str = "") -> CNIError:
    return CNIError(INTERNAL, msg, details)


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import link, netns, spoofchk, verify

    n = parse_conf(args)
    netns.check_netns(args.netns)
    ipam.check(args.conf(), args)
    result = netconf.require_prev_result(args.conf(), "bridge")
    br_map = next((i for i in result.interfaces if i.name == n.bridge), None)
    # the bridge, in the host
    if br_map is None:
        raise _fail("Interface name missing ", f"prevResult lists no interface named {n.bridge!r}")
    if br_map.sandbox:
        raise _fail(f"Interface {br_map.name} should not be in sandbox")
    br_link = link.get_link(n.bridge)
    if br_link is None:
        raise _fail(f"Interface name {n.bridge} not found")
    if br_link.kind != "bridge":
        raise _fail(f"Interface {n.bridge} does not have link type of bridge")
    if br_map.mac and br_map.mac.lower() != br_link.mac:
        raise _fail(f"Bridge interface {n.bridge} Mac doesn't match: {br_map.mac}")
    if br_link.promisc != n.promisc:
        raise _fail(f"Bridge interface {n.bridge} configured Promisc Mode {str(n.promisc).lower()} doesn't match "
                    f"current state: {str(br_link.promisc).lower()} ")
    # the container side: the interface, its MAC, addresses, subnet routes and routes
    cont = verify.container_link(result, args.ifname, args.netns, kind="veth", subnet_routes=True)
    # the host veth: peer of the container side, enslaved to the bridge
    host = None
    for intf in result.interfaces:
        if intf.name in (n.bridge, args.ifname) or intf.sandbox:
            continue
        cand = link.get_link(intf.name)
        if cand is None:
            raise _fail(f"Interface name {intf.name} not found")
        if cand.kind != "veth" or cand.index != cont.peer_index or cand.peer_index != cont.index \
                or cand.master != br_link.index:
            continue
        if intf.mac and intf.mac.lower() != cand.mac:
            raise _fail(f"Interface {intf.name} Mac doesn't match: {intf.mac} not found")
        host = cand
        break
    if host is None:
        raise _fail(f"CNI veth created for bridge {n.bridge} was not found")
    if n.macspoofchk and not spoofchk.is_set_up(host.name, cont.mac, spoofchk.ref_id(args.container_id,
                                                                                    args.ifname)):
        raise _fail(f"macspoofchk rules for {host.name} not found", "run ADD again to restore them")


# ---- STATUS / GC -------------------------------------------------------------------------------
def cmd_status(args: CmdArgs) -> None:
    """The IPAM plugin's STATUS is ours."""
    parse_conf(args)
    ipam.status(args.conf(), args)


def cmd_gc(args: CmdArgs) -> None:
    """The IPAM plugin's GC releases what ``cni.dev/valid-attachments`` does not list; masquerade
    rules of attachments not listed go too, in both layouts (as DEL: they may have been set up
    under another config)."""
    n = parse_conf(args)
    conf = args.conf()
    ipam.gc(conf, args)
    if n.ip_masq:
        from pycni import netconf
        from pycni.net import masq

        masq.gc_ip_masq(n.name, netconf.valid_attachments(conf))


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, status=cmd_status, gc=cmd_gc,
                about="CNI bridge plugin (pycni)")


def main() -> None:
    run_plugin(PLUGIN)

