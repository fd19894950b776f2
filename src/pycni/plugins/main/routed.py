"""routed: a veth per pod and nothing but routes (Calico's per-pod dataplane).

Unlike ptp, no address on the host end and no subnet anywhere: the pod holds its addresses
as /32 (/128) and sends everything to a made-up next hop, 169.254.1.1 (IPv4) or the host
end's link-local address (IPv6), on a link route. The host end carries a fixed MAC
(``ee:ee:ee:ee:ee:ee``, so its link-local address is known in advance), answers ARP for any
address by proxy (NDP likewise), and the host reaches the pod by one route per pod address.
Any IPAM works; with ``cluster-ipam`` and ``pycni node`` the pod is reachable from every node.
With ``cluster-ipam`` each attachment is also recorded as a workload endpoint in etcd, and when
the node enforces network policy ADD returns only once the agent has programmed the pod's
interface (``policySetupTimeout``; ``defaultPolicy``: see pycni.cluster.policy.workload and
docs/policy.md).

Calico's keys are accepted, so a Calico conflist with ``"type": "routed"`` and cluster-ipam works:
``nodename`` (the node's name, as cluster-ipam's ``nodeName``), ``mtu``, ``policy``
(``{"type": "k8s"}``), ``log_level`` and ``log_file_path`` (one line per ADD/DEL, appended), and
``kubernetes`` (``{"kubeconfig": PATH}``). With ``kubernetes`` set, a Kubernetes pod's ADD waits
(within ``policySetupTimeout``) for the pod's labels and named ports, mirrored from the API by
``pycni kube-controllers``, before it records the endpoint, so the endpoint is born labelled and
no agent ever judges the pod unlabelled; past the timeout: code 11 and a full rollback. The
plugin reads etcd only: the kubeconfig is not opened (no API credentials on the node's plugin
path, none to expire). See docs/kubernetes.md.

The host end is named from the container ID and interface (``rtd`` + 12 hex digits of BLAKE2b),
so DEL finds it without any state; its alias records the owner, which tells a stale link of
ours (removed and made again) from an unlikely hash collision (the next name is tried).
"""

from __future__ import annotations

from pycni import invoke, ipaddr, ipam, netconf
from pycni.cluster.names import HOST_PREFIX
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, load_conf, run_plugin
from pycni.spec.errors import INTERNAL, CNIError, invalid_config
from pycni.spec.types import DNS, Interface, IPAddress, IPConfig, Result, Route

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

HOST_MAC = "ee:ee:ee:ee:ee:ee"
GATEWAY_V4 = ipaddr.IPv4Address("169.254.1.1")
GATEWAY_V6 = ipaddr.IPv6Address("fe80::ecee:eeff:feee:eeee")  # EUI-64 link-local of HOST_MAC
NAME_TRIES = 4  # names per (container, ifname): the hash, then salted hashes on a collision
ALIAS_PREFIX = "pycni-routed:"


@record
class RoutedConf:
    """A validated ``routed`` configuration (everything checked before anything is made)."""

    conf: dict[str, Any]  # the whole config, as handed to IPAM
    ipam_type: str
    mtu: int = 0          # 0: the kernel's default
    dns: DNS = field(default_factory=DNS)
    default_deny: bool = False     # "defaultPolicy": "deny"
    setup_timeout: float = 10.0    # "policySetupTimeout": seconds ADD waits for the node agent
    kubernetes: bool = False       # Calico's "kubernetes" section: wait for the pod's API labels
    log_level: int = 0             # Calico's "log_level" (LOG_LEVELS index); "log_file_path" below
    log_file: str = ""


# Calico's log_level values (case-insensitive), quietest last
LOG_LEVELS = ("debug", "info", "warning", "error", "fatal", "panic")


def parse_conf(args: CmdArgs) -> RoutedConf:
    """The config as a :class:`RoutedConf`: IPAM required, ``mtu`` one the kernel takes, ``dns``,
    runtimeConfig and args well-formed."""
    raw = args.conf()
    netconf.runtime_config(raw)
    netconf.args_cni(raw)
    mtu = netconf.get_int(raw, "mtu", minimum=0, maximum=netconf.MAX_MTU)
    if 0 < mtu < 68:
        raise netconf.invalid("mtu", f"0 (the default) or from 68 to {netconf.MAX_MTU}", mtu)
    default = netconf.get_str(raw, "defaultPolicy", "allow", choices=("allow", "deny"))
    timeout = netconf.lookup(raw, "policySetupTimeout", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
        raise netconf.invalid("policySetupTimeout", "a number of seconds (0 < t <= 300)", timeout)
    ipam_type = ipam.require_ipam(raw, "routed")
    if default == "deny" and ipam_type != "cluster-ipam":
        raise invalid_config('routed: "defaultPolicy": "deny" needs cluster-ipam',
                               "the node agent learns of pods from their workload endpoints in etcd, which only "
                               "a cluster-ipam network records")
    kube = netconf.lookup(raw, "kubernetes")
    if kube is not None:
        if not isinstance(kube, dict):
            raise netconf.invalid("kubernetes", 'an object such as {"kubeconfig": "/etc/cni/net.d/kubeconfig"}', kube)
        netconf.get_str(kube, "kubeconfig", label="kubernetes.kubeconfig")  # accepted, never opened (see above)
        if ipam_type != "cluster-ipam":
            raise invalid_config('routed: "kubernetes" needs cluster-ipam',
                                 "the pod's labels reach the node through etcd, which only a cluster-ipam network "
                                 "names")
    nodename = netconf.get_str(raw, "nodename")
    if nodename:
        from pycni.cluster.settings import check_node_name

        check_node_name(nodename, "nodename")
    netconf.get_str(netconf.get_dict(raw, "policy"), "type", "k8s", choices=("k8s",), label="policy.type")
    level = netconf.get_str(raw, "log_level", "info").lower()
    if level not in LOG_LEVELS:
        raise netconf.invalid("log_level", f"one of {', '.join(LOG_LEVELS)}", level)
    return RoutedConf(conf=raw, ipam_type=ipam_type, mtu=mtu, dns=DNS.from_dict(netconf.get_dict(raw, "dns")),
                      default_deny=default == "deny", setup_timeout=float(timeout), kubernetes=kube is not None,
                      log_level=LOG_LEVELS.index(level), log_file=netconf.get_str(raw, "log_file_path"))


def log(rc: RoutedConf, level: str, message: str) -> None:
    """Append one line to ``log_file_path`` when ``level`` is at or above ``log_level`` (Calico's
    keys); a log that cannot be written never fails the call."""
    if not rc.log_file or LOG_LEVELS.index(level) < rc.log_level:
        return
    import os
    import time

    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    line = f"{stamp}Z [{level.upper()}] routed[{os.getpid()}]: {message}\n".encode()
    try:
        fd = os.open(rc.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


def check_for_add(rc: RoutedConf, args: CmdArgs) -> None:
    """What ADD must find before making anything: the IPAM plugin on CNI_PATH, the netns, a free
    CNI_IFNAME."""
    from pycni.net import link

    invoke.find_in_path(rc.ipam_type, args.cni_path)
    link.check_container_ifname(args.netns, args.ifname)


def host_names(container_id: str, ifname: str) -> list[str]:
    """The host-end names this attachment may use, in order (15 characters, IFNAMSIZ - 1)."""
    try:
        from _blake2 import blake2b  # CPython's built-in BLAKE2: hashlib would load OpenSSL (~6 ms)
    except ImportError:  # pragma: no cover - another interpreter
        from hashlib import blake2b

    names = []
    for n in range(NAME_TRIES):
        seed = f"{container_id}\0{ifname}" + (f"\0{n}" if n else "")
        names.append(HOST_PREFIX + blake2b(seed.encode(), digest_size=6).hexdigest())
    return names


def owner_tag(container_id: str, ifname: str) -> str:
    """The host end's alias: which attachment owns it."""
    return f"{ALIAS_PREFIX}{container_id}/{ifname}"


def _link_alias(name: str) -> str | None:
    """The alias of link ``name``, None when there is no such link."""
    from pycni.net import link

    found = link.get_link(name)
    return None if found is None else found.alias


def _claim_host_name(container_id: str, ifname: str) -> str:
    """A free host-end name for this attachment; a stale link of its own (an earlier ADD that
    left it) is removed, a link owned by anyone else is skipped."""
    from pycni.net import link

    tag = owner_tag(container_id, ifname)
    for name in host_names(container_id, ifname):
        alias = _link_alias(name)
        if alias is None:
            return name
        if alias == tag:
            link.delete_link(name)
            return name
    raise CNIError(INTERNAL, f"routed: no free host interface name for {container_id}/{ifname}",
                   f"{', '.join(host_names(container_id, ifname))} all exist and belong to other containers")


def find_host_end(container_id: str, ifname: str) -> str | None:
    """The host end made for this attachment, None when there is none."""
    tag = owner_tag(container_id, ifname)
    for name in host_names(container_id, ifname):
        alias = _link_alias(name)
        if alias is None:
            continue  # a later salted name may still be ours if this one was freed since
        if alias == tag:
            return name
    return None


def _gateway(version: int) -> IPAddress:
    return GATEWAY_V4 if version == 4 else GATEWAY_V6


def _host_addresses(result: Result) -> list[IPConfig]:
    """The pod's addresses as host routes (/32, /128) with the fixed next hop as gateway."""
    out = []
    for ipc in result.ips:
        bits = ipc.address.max_prefixlen
        out.append(IPConfig(address=ipaddr.ip_interface(f"{ipc.address.ip}/{bits}"),
                            gateway=_gateway(ipc.address.version), interface=1))
    return out


def _pod_routes(result: Result, versions: set[int]) -> list[Route]:
    """A default route per family in use, then IPAM's other routes, all via the fixed next hop."""
    routes = [Route(dst=ipaddr.ip_network("0.0.0.0/0" if v == 4 else "::/0"), gw=_gateway(v))
              for v in sorted(versions)]
    for r in result.routes:
        if r.dst.prefixlen == 0 or r.dst.version not in versions:
            continue
        routes.append(Route(dst=r.dst, gw=_gateway(r.dst.version), mtu=r.mtu, advmss=r.advmss,
                            priority=r.priority, table=r.table))
    return routes


def _setup_host_end(name: str, index: int, tag: str, versions: set[int], undo: Rollback) -> None:
    """The owner alias; forwarding on (off again if the ADD fails and it was off); proxy ARP and
    per-link forwarding in the same request as the alias (netlink: no /proc/sys walk, see
    pycni.net.sysctl); proxy NDP on the host end, before the pod end is up, so its link-local
    address is born with DAD off, usable at once."""
    from pycni.net import link, sysctl

    for version in sorted(versions):
        if sysctl.enable_forwarding(version):
            undo.push(sysctl.disable_forwarding, version)
    kw: dict[str, Any] = {"index": index, "ifalias": tag}
    if 4 in versions:
        kw["ipv4_devconf"] = {link.IPV4_DEVCONF_FORWARDING: 1, link.IPV4_DEVCONF_PROXY_ARP: 1}
    with link.rtnl() as sock:
        link.setlink(sock, f"failed to configure host interface {name!r}", **kw)
    if 4 in versions:
        # answer proxy ARP at once (the default delays replies by up to 0.8 s)
        sysctl.try_write_sysctl(f"net/ipv4/neigh/{name}/proxy_delay", "0")
    if 6 in versions:
        sysctl.write_sysctl(f"net/ipv6/conf/{name}/accept_dad", "0")
        sysctl.write_sysctl(f"net/ipv6/conf/{name}/proxy_ndp", "1")
        sysctl.write_sysctl(f"net/ipv6/conf/{name}/forwarding", "1")


def _setup_pod(netns_path: str, ifname: str, ips: list[IPConfig], routes: list[Route]) -> None:
    """Addresses, permanent neighbours for the next hops, link routes and the pod's routes."""
    from pycni.net import addr, iface, link, neigh, netns, route

    versions = {i.address.version for i in ips}
    with netns.enter(netns_path):
        index = link.require_link(ifname).index
        if 6 in versions:
            iface.enable_ipv6(ifname)
        for ipc in ips:
            # No DAD: the only other party on this link is our host end.
            addr.add_addr(index, ipc.address, nodad=True)
        link.set_up(index, ifname)
        for v in sorted(versions):
            gw = _gateway(v)
            # Known in advance, so no ARP/NDP: the pod reaches its next hop even where proxy ARP
            # would stay silent (a host with no route to 169.254.1.1 answers no ARP for it).
            neigh.set_neighbour(index, str(gw), HOST_MAC)
            if v == 4:
                route.add_route(f"{gw}/32", dev=index, scope=route.RT_SCOPE_LINK)
        for r in routes:
            src = next((i.address.ip for i in ips if i.address.version == r.dst.version), None)
            route.add_route(r.dst, gw=r.gw, dev=index, src=src, mtu=r.mtu or None, advmss=r.advmss or None,
                            priority=r.priority or None, table=r.table)


def cmd_add(args: CmdArgs) -> Result:
    rc = parse_conf(args)
    try:
        out = _add(rc, args)
    except CNIError as e:
        log(rc, "error", f"ADD {args.container_id}/{args.ifname} failed: {e.msg} ({e.details}) code {e.code}")
        raise
    log(rc, "info", f"ADD {args.container_id}/{args.ifname}: {', '.join(str(i.address) for i in out.ips)}")
    return out


def _add(rc: RoutedConf, args: CmdArgs) -> Result:
    from pycni.net import link, neigh, route, veth

    check_for_add(rc, args)
    with Rollback() as undo:
        result = ipam.add(rc.conf, args)
        undo.push(ipam.delete, rc.conf, args)
        ips = _host_addresses(result)
        versions: set[int] = {i.address.version for i in ips}
        host = _claim_host_name(args.container_id, args.ifname)
        pair = veth.setup_veth(args.netns, args.ifname, mtu=rc.mtu, host_name=host, host_mac=HOST_MAC)
        undo.push(link.delete_link, host)  # the host routes go with it
        _setup_host_end(host, pair.host.index, owner_tag(args.container_id, args.ifname), versions, undo)
        routes = _pod_routes(result, versions)
        _setup_pod(args.netns, args.ifname, ips, routes)
        for ipc in ips:
            # The pod's MAC is known: no ARP/NDP from the host to the pod. A fresh veth drops what
            # it is asked to send until the kernel has activated its queue (linkwatch work, late on
            # a busy host); a lost first ARP request or NS costs the 1 s retransmission — for a
            # reused address every node already routes here, so the first packet comes at once.
            neigh.set_neighbour(pair.host.index, str(ipc.address.ip), pair.container.mac)
            # replace: a route left to this address by a pod that died uncleanly must not block this one
            route.add_route(ipc.address.network, dev=pair.host.index, scope=route.RT_SCOPE_LINK, replace=True)
        _record_workload(rc, args, host, pair.container.mac, ips, undo)
        out = Result(cni_version=result.cni_version, ips=ips, routes=routes, dns=result.dns,
                     interfaces=[Interface(name=host, mac=HOST_MAC),
                                 Interface(name=args.ifname, mac=pair.container.mac, sandbox=args.netns)])
        if not rc.dns.is_empty():
            out.dns = rc.dns  # the plugin's own DNS settings win over IPAM's, as in the reference
    return out


def _record_workload(rc: RoutedConf, args: CmdArgs, host: str, mac: str, ips: list[IPConfig],
                     undo: Rollback) -> None:
    """With cluster-ipam: the workload endpoint in etcd (undone if a later step fails), then the
    wait for this node's agent to cover ``host`` (see pycni.cluster.policy.workload)."""
    from pycni.cluster.policy import workload

    cluster = workload.cluster_settings(rc.conf)
    if cluster is None:
        return
    from pycni.cluster.model import WorkloadEndpoint
    from pycni.cniargs import parse_cni_args

    cni_args = parse_cni_args(args.args)
    orchestrator, namespace, pod = workload.workload_of(cni_args, args.container_id)
    ep = WorkloadEndpoint(node=cluster.node, network=cluster.network, namespace=namespace, pod=pod,
                          container_id=args.container_id, ifname=args.ifname, interface_name=host, mac=mac,
                          ip_networks=[str(i.address) for i in ips], profiles=[cluster.network],
                          orchestrator=orchestrator, default_policy="deny" if rc.default_deny else "allow",
                          pod_uid=cni_args.get("K8S_POD_UID", "") if orchestrator == "k8s" else "")
    # With "kubernetes": the pod's labels from the API first (a pod outside Kubernetes has none to wait for)
    wait = rc.setup_timeout if rc.kubernetes and orchestrator == "k8s" else 0.0
    workload.record_endpoint(cluster, ep, pod_uid=cni_args.get("K8S_POD_UID", ""), wait_labels=wait)
    log(rc, "debug", f"endpoint {namespace}/{pod} recorded with labels {ep.labels}")
    undo.push(workload.delete_endpoint, cluster, args.container_id, args.ifname)
    workload.wait_covered(host, rc.setup_timeout, rc.default_deny)


def cmd_del(args: CmdArgs) -> None:
    from pycni.net import link, netns

    conf = load_conf(args.stdin_data)
    if netconf.lookup(conf, "log_file_path"):
        try:
            log(parse_conf(args), "info", f"DEL {args.container_id}/{args.ifname}")
        except CNIError:
            pass  # DEL cleans up after any config, even one ADD would refuse
    ipam.delete(conf, args)
    host = find_host_end(args.container_id, args.ifname)
    if host is not None:
        link.delete_link(host)  # the pod end and the host routes go with it
    elif args.netns and netns.netns_exists(args.netns):
        with netns.enter(args.netns):
            found = link.get_link(args.ifname)
            if found is not None and found.kind == "veth":
                link.delete_link(found.index)


def cmd_check(args: CmdArgs) -> None:
    from pycni.net import link, netns, route, sysctl, verify

    rc = parse_conf(args)
    netns.check_netns(args.netns)
    ipam.check(rc.conf, args)
    prev = netconf.require_prev_result(rc.conf, "routed")
    verify.container_link(prev, args.ifname, args.netns, kind="veth", label="routed")
    host = find_host_end(args.container_id, args.ifname)
    if host is None:
        raise CNIError(INTERNAL, f"routed: host interface for {args.container_id}/{args.ifname} not found",
                       f"expected one of {', '.join(host_names(args.container_id, args.ifname))}")
    found = link.require_link(host)
    installed = route.list_routes(dev=found.index)
    for ipc in prev.ips:
        if ipc.address.version == 4 and sysctl.read_sysctl(f"net/ipv4/conf/{host}/proxy_arp") != "1":
            raise CNIError(INTERNAL, f"routed: proxy ARP is off on {host}", "the pod cannot reach its next hop")
        want = ipaddr.ip_network(f"{ipc.address.ip}/{ipc.address.max_prefixlen}")
        if not any(r.dst == want for r in installed):
            raise CNIError(INTERNAL, f"routed: host route to {want} via {host} not found",
                           "the host no longer routes to the pod")


def cmd_gc(args: CmdArgs) -> None:
    """The IPAM plugin's GC releases what ``cni.dev/valid-attachments`` does not list (host ends
    die with their pods' namespaces)."""
    from pycni.cluster.policy import workload

    rc = parse_conf(args)
    ipam.gc(rc.conf, args)
    cluster = workload.cluster_settings(rc.conf)
    if cluster is not None:  # endpoints whose handles went with an earlier GC are gone already; any other
        workload.gc_endpoints(cluster, netconf.valid_attachments(rc.conf))


def cmd_status(args: CmdArgs) -> None:
    """The IPAM plugin's STATUS is ours (cluster-ipam: whether etcd answers)."""
    rc = parse_conf(args)
    ipam.status(rc.conf, args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni routed: a veth per pod, host routes and proxy ARP (Calico's dataplane)")


def main() -> None:
    run_plugin(PLUGIN)
