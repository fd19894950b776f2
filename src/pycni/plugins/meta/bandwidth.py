"""bandwidth: limit a container's traffic with token buckets on the host side of its veth.

Chained after an interface plugin, as the Go reference: traffic *into* the container
(``ingressRate``/``ingressBurst``) is shaped by a root qdisc on the host-side veth; traffic
*out of* it (``egress*``) is redirected from the veth's ingress to an ifb device
(``bwp`` + hash of network name and container id) and shaped there. Rates are bits/s,
bursts bits. Without subnets the shaper is a tbf (as the reference today); with
``shapedSubnets`` or ``unshapedSubnets`` it is an htb with a shaped and an uncapped class and
u32 filters choosing between them (as the reference's htb mode). Values may come from the
config itself or from ``runtimeConfig.bandwidth`` (the ``bandwidth`` capability).
"""

from __future__ import annotations

from pycni import ipaddr, netconf
from pycni.net import probe
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import PLUGIN_SPECIFIC, CNIError, invalid_config
from pycni.spec.types import Interface, Result
from pycni.spec.version import ALL_VERSIONS, greater_than_or_equal

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~3 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

IFB_PREFIX = "bwp"
IFNAME_MAX = 15
MAX_U32 = 0xFFFFFFFF
MAX_U64 = 0xFFFFFFFFFFFFFFFF
RATE_KEYS = ("ingressRate", "ingressBurst", "egressRate", "egressBurst")
ENTRY_KEYS = (*RATE_KEYS, "shapedSubnets", "unshapedSubnets")


@record
class Limits:
    """One direction's token bucket, in bytes (as the kernel takes them)."""

    rate: int  # bytes/s
    burst: int  # bytes


@record
class BandwidthConf:
    """The checked config: per-direction limits (None: unshaped) and the subnet selection."""

    name: str
    cni_version: str
    ingress: Limits | None = None
    egress: Limits | None = None
    shaped_subnets: list[str] = field(default_factory=list)
    unshaped_subnets: list[str] = field(default_factory=list)
    prev: Result | None = None

    @property
    def is_zero(self) -> bool:
        return self.ingress is None and self.egress is None


def ifb_name(network: str, container_id: str) -> str:
    """The ifb device's name, derived as the reference derives it (so either can clean up)."""
    from pycni.net.names import hash_with_prefix

    return hash_with_prefix(IFNAME_MAX, IFB_PREFIX, network + container_id)


# ---- configuration ---------------------------------------------------------------------------
def _subnets(entry: dict[str, Any], key: str) -> list[str]:
    """``shapedSubnets``/``unshapedSubnets``: a list of CIDRs, each checked."""
    v = netconf.get_list(entry, key)
    for s in v:
        if not isinstance(s, str):
            raise netconf.invalid(key, "a list of CIDR strings", v)
        try:
            if "/" not in s:
                raise ValueError("missing /prefix")
            ipaddr.ip_network(s, strict=False)
        except ValueError as e:
            raise invalid_config(f"bad subnet {s!r} provided",
                                 f"{key} entries must be CIDRs such as 10.0.0.0/8 or fd00::/64 ({e})") from None
    return list(v)


def _limits(direction: str, rate_bits: int, burst_bits: int) -> Limits | None:
    """Validate one direction as the reference does; a burst too large for the kernel's 32-bit
    bucket at this rate (containerd's MaxUint32 "no particular burst") is taken as the largest
    bucket the kernel holds (:func:`pycni.net.tc.largest_burst`), never refused."""
    if rate_bits and not burst_bits:
        raise invalid_config("if rate is set, burst must also be set",
                             f"{direction}Rate is {rate_bits} but {direction}Burst is 0: give a burst in bits")
    if burst_bits and not rate_bits:
        raise invalid_config("if burst is set, rate must also be set",
                             f"{direction}Burst is {burst_bits} but {direction}Rate is 0: give a rate in bits/s")
    if burst_bits // 8 >= MAX_U32:
        raise invalid_config("burst cannot be more than 4GB",
                             f"{direction}Burst is {burst_bits} bits; the kernel keeps bursts in 32 bits of bytes")
    if not rate_bits:
        return None
    rate, burst = rate_bits // 8, burst_bits // 8
    if rate == 0:
        raise invalid_config(f"{direction}Rate too small",
                             f"{direction}Rate is {rate_bits} bits/s; the kernel counts whole bytes: use at least 8")
    if burst == 0:
        raise invalid_config(f"{direction}Burst too small",
                             f"{direction}Burst is {burst_bits} bits; the kernel counts whole bytes: use at least 8")
    from pycni.net import tc

    return Limits(rate, tc.largest_burst(rate, burst))


def parse_conf(args: CmdArgs) -> BandwidthConf:
    """The limits checked whole (and the prevResult an ADD with limits, or a CHECK, needs)."""
    raw = args.conf()
    version = config_version(raw)
    # Top-level limits win whole over runtimeConfig's (the reference embeds one entry or the other).
    rc = netconf.runtime_config(raw)
    netconf.args_cni(raw)
    if any(netconf.has(raw, k) for k in ENTRY_KEYS):  # any spelling Go's decoder gives the entry

        entry, label = raw, ""
    else:
        entry, label = netconf.get_dict(rc, "bandwidth", label="runtimeConfig.bandwidth"), "runtimeConfig.bandwidth."
    conf = BandwidthConf(name=netconf.network_name(raw), cni_version=version, prev=netconf.prev_result(raw))
    vals = {k: netconf.get_int(entry, k, minimum=0, maximum=MAX_U64, label=label + k) for k in RATE_KEYS}
    conf.ingress = _limits("ingress", vals["ingressRate"], vals["ingressBurst"])
    conf.egress = _limits("egress", vals["egressRate"], vals["egressBurst"])
    conf.shaped_subnets = _subnets(entry, "shapedSubnets")
    conf.unshaped_subnets = _subnets(entry, "unshapedSubnets")
    if conf.shaped_subnets and conf.unshaped_subnets:
        raise invalid_config("unshapedSubnets and shapedSubnets cannot be both specified",
                       "give one of them: shapedSubnets shapes only those destinations, "
                       "unshapedSubnets shapes all but those")
    if conf.prev is None and (args.command == "CHECK" or args.command == "ADD" and not conf.is_zero):
        raise invalid_config("must be called as chained plugin",
                             "bandwidth needs a prevResult from the interface plugin before it")
    return conf


# ---- shared steps ----------------------------------------------------------------------------
def host_interface(prev: Result, args: CmdArgs) -> Interface:
    """The host-side veth: the peer of the container's interface, listed without a sandbox."""
    from pycni.net import link, netns

    if not prev.interfaces:
        raise invalid_config("no interfaces provided", "prevResult lists no interfaces")
    with netns.enter(args.netns):
        cont = link.get_link(args.ifname)
    if cont is None or cont.kind != "veth" or not cont.peer_index:
        raise CNIError(PLUGIN_SPECIFIC, f"container interface {args.ifname} has no veth peer",
                       f"{args.ifname!r} in {args.netns} is missing or not a veth")
    peer = link.get_link(cont.peer_index)
    if peer is None:
        raise CNIError(PLUGIN_SPECIFIC, f"veth peer with index {cont.peer_index} is not in host ns",
                       "run the plugin in the namespace that holds the host side of the veth")
    for iface in prev.interfaces:
        if not iface.sandbox and iface.name == peer.name:
            return iface
    raise CNIError(PLUGIN_SPECIFIC, "no veth peer of container interface found in host ns",
                   f"host-side veth {peer.name!r} is not among prevResult's host interfaces")


def _shape(conf: BandwidthConf, dev: str, lim: Limits) -> None:
    """Shape what ``dev`` transmits: htb when subnets pick what is shaped, else a plain tbf."""
    from pycni.net import tc

    if conf.shaped_subnets or conf.unshaped_subnets:
        exclude = bool(conf.unshaped_subnets)
        tc.add_htb(dev, lim.rate, lim.burst, conf.unshaped_subnets or conf.shaped_subnets, exclude)
    else:
        tc.add_tbf(dev, lim.rate, lim.burst)


def _check_shaper(conf: BandwidthConf, dev: str, lim: Limits) -> None:
    """CHECK: the root qdisc of ``dev`` is what :func:`_shape` would install for ``lim``."""
    from pycni.net import tc

    qs = tc.qdiscs(dev)
    if qs is None:
        raise CNIError(PLUGIN_SPECIFIC, f"device {dev} not found")
    root = [q for q in qs if q.parent == tc.TC_H_ROOT]
    if not root:
        raise CNIError(PLUGIN_SPECIFIC, f"failed to find qdisc on {dev}", "no root shaping qdisc")
    q = root[0]
    if conf.shaped_subnets or conf.unshaped_subnets:
        want_def = tc.UNSHAPED_MINOR if conf.shaped_subnets else tc.SHAPED_MINOR
        if q.kind != "htb":
            raise CNIError(PLUGIN_SPECIFIC, f"root qdisc on {dev} is {q.kind}, expected htb")
        if q.params.get("defcls") != want_def:
            raise CNIError(PLUGIN_SPECIFIC, f"default class does not match on {dev}",
                           f"{q.params.get('defcls')} != {want_def}")
        classes = {c.handle & 0xFFFF: c for c in tc.htb_classes(dev)}
        shaped = classes.get(tc.SHAPED_MINOR)
        if len(classes) != 2 or shaped is None or tc.UNSHAPED_MINOR not in classes:
            raise CNIError(PLUGIN_SPECIFIC, f"htb classes do not match on {dev}", f"found {sorted(classes)}")
        # tc 6.1 rounds an htb bucket as xmittime does (whole microseconds first), a tbf's as
        # tc_xmittime; they differ only when the burst is not a whole number of microseconds.
        buckets = (tc.xmittime(lim.rate, lim.burst), tc.tc_xmittime(lim.rate, lim.burst))
        if shaped.rate != lim.rate or shaped.buffer not in buckets:

            raise CNIError(PLUGIN_SPECIFIC, f"rate or burst does not match on {dev}",
                           f"class 1:30 rate {shaped.rate} != {lim.rate} or buffer differs")
        subnets = conf.shaped_subnets or conf.unshaped_subnets
        if len(tc.filters(dev, "1:")) != len(subnets):
            raise CNIError(PLUGIN_SPECIFIC, f"subnet filters do not match on {dev}",
                           f"expected {len(subnets)} u32 filters")
        return
    if q.kind != "tbf":
        raise CNIError(PLUGIN_SPECIFIC, f"root qdisc on {dev} is {q.kind}, expected tbf")
    if q.params.get("rate") != lim.rate:
        raise CNIError(PLUGIN_SPECIFIC, "Rate doesn't match", f"{dev}: {q.params.get('rate')} != {lim.rate}")
    if q.params.get("limit") != tc.tbf_limit(lim.rate, lim.burst):
        raise CNIError(PLUGIN_SPECIFIC, "Limit doesn't match", f"{dev}: {q.params.get('limit')}")
    want, got = tc.tbf_buffer(lim.rate, lim.burst), int(q.params.get("buffer") or 0)
    # Below 2**32 bytes/s the bucket is exact; above, tc's float rounding may move it a tick or two.
    if got != want and (lim.rate <= MAX_U32 or abs(got - want) > max(2, want // 10000)):
        raise CNIError(PLUGIN_SPECIFIC, "Buffer doesn't match", f"{dev}: {q.params.get('buffer')}")


# ---- handlers --------------------------------------------------------------------------------
def cmd_add(args: CmdArgs) -> Result:
    conf = parse_conf(args)
    if conf.prev is None or conf.is_zero:  # most pods: nothing to shape, nothing to import
        return conf.prev or Result(cni_version=conf.cni_version)
    from pycni.net import link, tc

    result = conf.prev.copy()
    host = host_interface(result, args)
    ifb = ifb_name(conf.name, args.container_id)
    with Rollback() as undo:  # leave nothing half-made
        if conf.ingress is not None:
            _shape(conf, host.name, conf.ingress)
            undo.push(tc.delete_qdisc, host.name)
        if conf.egress is not None:
            hl = link.require_link(host.name)
            mac = tc.create_ifb(ifb, hl.mtu)
            undo.push(link.delete_link, ifb)
            result.interfaces.append(Interface(name=ifb, mac=mac))
            tc.add_ingress_redirect(host.name, ifb)
            undo.push(tc.delete_qdisc, host.name, True)
            _shape(conf, ifb, conf.egress)
    return result


def cmd_del(args: CmdArgs) -> None:
    """Remove the ifb (and, when the veth still exists, its shapers). Idempotent.

    Most pods ask for no shaping, and a runtime repeats DELs (containerd: StopPodSandbox, then
    RemovePodSandbox): with no ifb (ADD makes one for any egress limit) and no ingress limit
    configured (or no veth to clear it from), nothing is left to remove, and the DEL returns
    before netlink, tc and the netns."""
    conf = parse_conf(args)
    ifb = ifb_name(conf.name, args.container_id)
    if probe.link_exists(ifb) is False and (conf.ingress is None or conf.prev is None or not args.netns):
        return
    from pycni.net import link, tc

    link.delete_link(ifb)
    if conf.prev is None or not args.netns:
        return
    try:  # beyond the reference: also clear the host veth's qdiscs if it outlives this DEL
        host = host_interface(conf.prev, args)
    except CNIError:
        return
    tc.delete_qdisc(host.name, ingress=True)
    if conf.ingress is not None:
        tc.delete_qdisc(host.name)


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import tc

    conf = parse_conf(args)
    assert conf.prev is not None  # parse_conf requires it for CHECK
    host = host_interface(conf.prev, args)
    if conf.ingress is not None:
        _check_shaper(conf, host.name, conf.ingress)
    if conf.egress is not None:
        ifb = ifb_name(conf.name, args.container_id)
        if tc.qdiscs(ifb) is None:
            raise CNIError(PLUGIN_SPECIFIC, f"get ifb device: {ifb} not found")
        redirects = [f for f in tc.filters(host.name, "ffff:")
                     if any(a.get("to_dev") == ifb for a in f["options"].get("actions", []))]
        if not redirects:
            raise CNIError(PLUGIN_SPECIFIC, f"no redirect from {host.name} to {ifb}",
                           "the ingress mirred filter is missing")
        _check_shaper(conf, ifb, conf.egress)


def cmd_gc(args: CmdArgs) -> None:
    """Nothing to collect: the shapers live on the container's veth and ifb, deleted by DEL;
    the list is still checked."""
    parse_conf(args)
    netconf.valid_attachments(args.conf())


def cmd_status(args: CmdArgs) -> None:
    """Always ready."""
    parse_conf(args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                versions=tuple(v for v in ALL_VERSIONS if greater_than_or_equal(v, "0.3.0")),
                about="pycni bandwidth: tbf/htb traffic shaping on the host side of a container's veth")


def main() -> None:
    run_plugin(PLUGIN)
