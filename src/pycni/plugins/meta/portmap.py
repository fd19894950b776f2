"""portmap: forward host ports to a container (chained; passes prevResult through).

Config keys as the Go reference: ``runtimeConfig.portMappings`` (hostPort, containerPort,
protocol, hostIP), ``snat`` (default true), ``masqAll``, ``markMasqBit`` / ``externalSetMarkChain``
(iptables), ``conditionsV4`` / ``conditionsV6`` and ``backend``: "nftables" (default here) or
"iptables".

nftables layout (table ``inet pycni_hostport``), built so ADD and DEL cost does not grow with
the number of containers already mapped:

* data maps ``hostports4`` / ``hostports6`` (proto . port -> container IP . port) and
  ``hostip4_hostports`` / ``hostip6_hostports`` (host IP . proto . port -> ...), looked up by
  ``dnat ... map`` in a ``hostports`` chain that the nat ``prerouting`` / ``output`` chains enter
  for local destinations only;
* sets ``targets4`` / ``targets6`` (container IP . proto . port): DNAT'd connections to them
  coming from a container subnet (hairpin, neighbours; subnets kept in ``container_nets4/6``)
  or from 127/8 (localhost) are masqueraded in ``postrouting``; ``masqall4/6`` for masqAll.

Each element carries the comment ``id: <containerID> net: <network>``. ADD is one
transaction. DEL is one transaction when the runtime passes portMappings and prevResult, and
otherwise finds the elements by their comment, so rules never leak. A host port claimed by two
containers goes to the later one, as in the reference; the earlier one's DEL leaves it alone
(the delete transaction re-adds each element first, which fails when it maps elsewhere now).

The iptables backend (imported only when a config asks for it) keeps the reference's
CNI-HOSTPORT-DNAT / CNI-DN-<hash> / CNI-HOSTPORT-SETMARK / CNI-HOSTPORT-MASQ chains, so it
interoperates with rules the Go plugin made.
"""

from __future__ import annotations

import ipaddress
import re

from pycni.record import field, record
from pycni.skel import CmdArgs, Plugin, config_version, prev_result, run_plugin
from pycni.spec.errors import INVALID_CONFIG, PLUGIN_SPECIFIC, CNIError
from pycni.spec.types import Result

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any

# pycni.net (nft, iptables, masq) and subprocess are imported by the functions that use them:
# VERSION needs none of them.

IPv4Interface = ipaddress.IPv4Interface
IPv6Interface = ipaddress.IPv6Interface
ContainerNet = IPv4Interface | IPv6Interface

DEFAULT_MARK_BIT = 13
PROTOCOLS = ("tcp", "udp", "sctp")
BACKENDS = ("nftables", "iptables")

NFT_TABLE = "pycni_hostport"
T = f"inet {NFT_TABLE}"

# The reference's iptables chain names; never change them (upgrades depend on them).
TOP_DNAT_CHAIN = "CNI-HOSTPORT-DNAT"
SETMARK_CHAIN = "CNI-HOSTPORT-SETMARK"
MASQ_CHAIN = "CNI-HOSTPORT-MASQ"
OLD_SNAT_CHAIN = "CNI-HOSTPORT-SNAT"


# ---- configuration ---------------------------------------------------------------------------
@record(frozen=True)
class PortMapping:
    host_port: int
    container_port: int
    protocol: str
    host_ip: str = ""  # "" = every local address

    def host_addr(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        return ipaddress.ip_address(self.host_ip) if self.host_ip else None

    def applies_to(self, family: int) -> bool:
        """A mapping with a hostIP only applies to the container address of the same family."""
        addr = self.host_addr()
        return addr is None or addr.version == family

    def specific_host(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The hostIP to match on; unspecified (0.0.0.0, ::) means any, as in the reference."""
        addr = self.host_addr()
        return None if addr is None or addr.is_unspecified else addr


@record
class PortMapConf:
    name: str
    cni_version: str
    backend: str
    snat: bool
    masq_all: bool
    mark_masq_bit: int
    external_set_mark_chain: str | None
    conditions_v4: list[str]
    conditions_v6: list[str]
    mappings: list[PortMapping]
    prev: Result | None
    container_id: str = ""
    cont_v4: IPv4Interface | None = None
    cont_v6: IPv6Interface | None = None
    nets: list[ContainerNet] = field(default_factory=list)


def _bad(msg: str, details: str = "") -> CNIError:
    return CNIError(INVALID_CONFIG, msg, details)


def _int_field(entry: dict[str, Any], key: str, i: int) -> int:
    v = entry.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"invalid portMappings[{i}].{key}", f"expected an integer, got {v!r}")
    return v


def _parse_mappings(raw: Any) -> list[PortMapping]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("invalid runtimeConfig.portMappings", f"expected a list, got {type(raw).__name__}")
    out = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise _bad(f"invalid portMappings[{i}]", f"expected an object, got {e!r}")
        hp, cp = _int_field(e, "hostPort", i), _int_field(e, "containerPort", i)
        if cp <= 0 or cp > 65535:
            raise _bad(f"Invalid container port number: {cp}", f"portMappings[{i}].containerPort must be 1-65535")
        if hp <= 0 or hp > 65535:
            raise _bad(f"Invalid host port number: {hp}", f"portMappings[{i}].hostPort must be 1-65535")
        proto = e.get("protocol") or "tcp"
        if not isinstance(proto, str) or proto.lower() not in PROTOCOLS:
            raise _bad(f"invalid portMappings[{i}].protocol {proto!r}", f"protocol must be one of {PROTOCOLS}")
        host_ip = e.get("hostIP") or ""
        if not isinstance(host_ip, str):
            raise _bad(f"invalid portMappings[{i}].hostIP", f"expected a string, got {host_ip!r}")
        if host_ip:
            try:
                host_ip = str(ipaddress.ip_address(host_ip))
            except ValueError:
                raise _bad(f"invalid portMappings[{i}].hostIP {host_ip!r}", "hostIP must be an IP address") from None
        out.append(PortMapping(hp, cp, proto.lower(), host_ip))
    return out


def _conditions(conf: dict[str, Any], key: str) -> list[str] | None:
    v = conf.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(c, str) for c in v):
        raise _bad(f"invalid {key}", f"{key} must be a list of strings, got {v!r}")
    return v


def _conditions_backend(conds: list[str] | None) -> str:
    """iptables conditions start with a dash (-d, -m, --sport); nftables ones never do."""
    if not conds or not conds[0]:
        return ""
    return "iptables" if conds[0].startswith("-") else "nftables"


def parse_config(args: CmdArgs) -> PortMapConf:
    """Decode and validate the config, and pick the container's addresses from prevResult."""
    raw = args.conf()
    version = config_version(raw)
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise _bad("invalid network name", f"name must be a string, got {name!r}")
    snat = raw.get("snat", True)
    if snat is None:
        snat = True
    if not isinstance(snat, bool):
        raise _bad("invalid snat", f"snat must be true or false, got {snat!r}")
    masq_all = raw.get("masqAll", False) or False
    if not isinstance(masq_all, bool):
        raise _bad("invalid masqAll", f"masqAll must be true or false, got {masq_all!r}")
    mark_bit, ext_chain = raw.get("markMasqBit"), raw.get("externalSetMarkChain")
    if mark_bit is not None and ext_chain is not None:
        raise _bad("Cannot specify externalSetMarkChain and markMasqBit",
                   "externalSetMarkChain replaces the mark chain markMasqBit configures; set one of them")
    if mark_bit is None:
        mark_bit = DEFAULT_MARK_BIT
    if isinstance(mark_bit, bool) or not isinstance(mark_bit, int) or not 0 <= mark_bit <= 31:
        raise _bad("MasqMarkBit must be between 0 and 31", f"markMasqBit is {mark_bit!r}")
    if ext_chain is not None and (not isinstance(ext_chain, str) or not ext_chain):
        raise _bad("invalid externalSetMarkChain", f"expected a chain name, got {ext_chain!r}")
    cond4, cond6 = _conditions(raw, "conditionsV4"), _conditions(raw, "conditionsV6")

    backend = raw.get("backend")
    # Options only one backend understands; they also choose the backend when none is named.
    wants: dict[str, list[str]] = {"iptables": [], "nftables": []}
    if ext_chain is not None:
        wants["iptables"].append("externalSetMarkChain")
    for key, conds in (("conditionsV4", cond4), ("conditionsV6", cond6)):
        if b := _conditions_backend(conds):
            wants[b].append(key)
    if backend is None:
        backend = "iptables" if wants["iptables"] and not wants["nftables"] else "nftables"
    if backend not in BACKENDS:
        raise _bad(f"unrecognized backend {backend!r}", f"backend must be one of {', '.join(BACKENDS)}")
    wrong = "nftables" if backend == "iptables" else "iptables"
    if wants[wrong]:
        raise _bad(f"{backend} backend was requested but configuration contains {wrong}-specific options "
                   f"{wants[wrong]}", f"remove them or set \"backend\": \"{wrong}\"")

    rc = raw.get("runtimeConfig") or {}
    if not isinstance(rc, dict):
        raise _bad("invalid runtimeConfig", f"expected an object, got {rc!r}")
    conf = PortMapConf(name=name, cni_version=version, backend=backend, snat=snat, masq_all=masq_all,
                       mark_masq_bit=mark_bit, external_set_mark_chain=ext_chain,
                       conditions_v4=cond4 or [], conditions_v6=cond6 or [],
                       mappings=_parse_mappings(rc.get("portMappings")), prev=prev_result(raw),
                       container_id=args.container_id)
    if conf.prev is not None:
        _pick_addresses(conf, args.ifname)
    return conf


def _pick_addresses(conf: PortMapConf, ifname: str) -> None:
    """The first IPv4 and IPv6 address on the container's own interface (as the reference)."""
    assert conf.prev is not None
    ifaces = conf.prev.interfaces
    for ip in conf.prev.ips:
        if ip.interface is not None and 0 <= ip.interface < len(ifaces):
            iface = ifaces[ip.interface]
            if iface.name != ifname or not iface.sandbox:
                continue
        if isinstance(ip.address, IPv4Interface) and conf.cont_v4 is None:
            conf.cont_v4 = ip.address
        elif isinstance(ip.address, IPv6Interface) and conf.cont_v6 is None:
            conf.cont_v6 = ip.address
    conf.nets = [n for n in (conf.cont_v4, conf.cont_v6) if n is not None]


# ---- nftables backend ------------------------------------------------------------------------
# Data maps rather than jumps: the kernel re-validates every jump target reachable from the
# base chains when a transaction adds a jump, so verdict maps pointing at per-container chains
# make each ADD cost grow with the number of containers. Plain data-map and set elements
# do not, and need no userspace cache of the other containers' objects either.
MAP_ANY = {4: "hostports4", 6: "hostports6"}
MAP_HOSTIP = {4: "hostip4_hostports", 6: "hostip6_hostports"}
TARGETS = {4: "targets4", 6: "targets6"}        # container IP . proto . port, masquerade when hairpin
MASQ_ALL = {4: "masqall4", 6: "masqall6"}       # ... masquerade whatever the source (masqAll)
NETS = {4: "container_nets4", 6: "container_nets6"}  # container subnets (shared, never removed)


def _ipx(family: int) -> str:
    return "ip" if family == 4 else "ip6"


def _addr_type(family: int) -> str:
    return "ipv4_addr" if family == 4 else "ipv6_addr"


def _nft_skeleton(conf: PortMapConf) -> list[str]:
    """Shared objects, created when missing; the base chains are rewritten identically each time.

    As in the reference, conditionsV4/V6 guard the entry to the port lookup for every
    container, so the configuration of the latest ADD applies to all.
    """
    cmds = [f"add table {T} {{ comment \"pycni portmap plugin\"; }}"]
    for fam in (4, 6):
        a = _addr_type(fam)
        cmds += [
            f"add map {T} {MAP_ANY[fam]} {{ type inet_proto . inet_service : {a} . inet_service; }}",
            f"add map {T} {MAP_HOSTIP[fam]} {{ type {a} . inet_proto . inet_service : {a} . inet_service; }}",
            f"add set {T} {TARGETS[fam]} {{ type {a} . inet_proto . inet_service; }}",
            f"add set {T} {MASQ_ALL[fam]} {{ type {a} . inet_proto . inet_service; }}",
            # No auto-merge: with it every ADD made nft fetch the elements of every set and map
            # in the table (~9 ms at 1,000 mappings). Overlaps are merged by _widen_nets instead.
            f"add set {T} {NETS[fam]} {{ type {a}; flags interval; }}",
        ]
    cmds += [f"add chain {T} hostports", f"flush chain {T} hostports"]
    for fam in (4, 6):
        ipx = _ipx(fam)
        # A failed map lookup ends the rule, so a host-IP mapping wins over a wildcard one.
        cmds += [f"add rule {T} hostports dnat {ipx} to {ipx} daddr . meta l4proto . th dport map @{MAP_HOSTIP[fam]}",
                 f"add rule {T} hostports dnat {ipx} to meta l4proto . th dport map @{MAP_ANY[fam]}"]
    for chain, hook, prio in (("prerouting", "prerouting", "dstnat"), ("output", "output", "-100")):
        cmds += [f"add chain {T} {chain} {{ type nat hook {hook} priority {prio}; }}", f"flush chain {T} {chain}"]
        for fam, conds in ((4, conf.conditions_v4), (6, conf.conditions_v6)):
            match = " ".join(filter(None, [f"meta nfproto ipv{fam}", "fib daddr type local", *conds]))
            cmds.append(f"add rule {T} {chain} {match} jump hostports")
    cmds += [f"add chain {T} postrouting {{ type nat hook postrouting priority srcnat; }}",
             f"flush chain {T} postrouting"]
    for fam in (4, 6):
        ipx = _ipx(fam)
        # Connections we DNAT'd from a container subnet (hairpin, neighbours) or from localhost
        # would see replies bypass the NAT: masquerade them. Exact-match sets, so deleting an
        # element needs no look at the others.
        dnat_to_us = f"ct status dnat {ipx} daddr . meta l4proto . th dport"
        cmds.append(f"add rule {T} postrouting {dnat_to_us} @{TARGETS[fam]} {ipx} saddr @{NETS[fam]} masquerade")
        if fam == 4:
            cmds.append(f"add rule {T} postrouting {dnat_to_us} @{TARGETS[fam]} ip saddr 127.0.0.0/8 masquerade")
        cmds.append(f"add rule {T} postrouting {dnat_to_us} @{MASQ_ALL[fam]} masquerade")
    return cmds


@record(frozen=True)
class Element:
    """One element this container owns: ``data`` is set for map elements."""

    name: str  # map or set
    key: str
    data: str = ""

    def add(self, comment: str) -> str:
        tail = f" : {self.data}" if self.data else ""
        return f"add element {T} {self.name} {{ {self.key} comment {comment}{tail} }}"

    def probe(self) -> str:
        """Re-adding the element: a no-op if it is ours, 'File exists' if it maps elsewhere now."""
        tail = f" : {self.data}" if self.data else ""
        return f"add element {T} {self.name} {{ {self.key}{tail} }}"

    def delete(self) -> str:
        return f"delete element {T} {self.name} {{ {self.key} }}"


def element_comment(conf: PortMapConf) -> str:
    """Marks every element of this attachment, so a DEL without portMappings finds them."""
    from pycni.net import nft

    return f"id: {conf.container_id} net: {conf.name}"[:nft.COMMENT_MAX]


def nft_elements(conf: PortMapConf) -> list[Element]:
    out: list[Element] = []
    for net in conf.nets:
        fam = net.version
        for m in conf.mappings:
            if not m.applies_to(fam):
                continue
            host = m.specific_host()
            data = f"{net.ip} . {m.container_port}"
            if host is None:
                out.append(Element(MAP_ANY[fam], f"{m.protocol} . {m.host_port}", data))
            else:
                out.append(Element(MAP_HOSTIP[fam], f"{host} . {m.protocol} . {m.host_port}", data))
            if conf.snat:
                target = f"{net.ip} . {m.protocol} . {m.container_port}"
                out.append(Element(MASQ_ALL[fam] if conf.masq_all else TARGETS[fam], target))
    return list(dict.fromkeys(out))


def nft_nets(conf: PortMapConf) -> list[str]:
    """Add this container's subnet to the shared set (re-adding the same subnet is a no-op)."""
    if not conf.snat or conf.masq_all:
        return []
    return [f"add element {T} {NETS[n.version]} {{ {n.network} }}" for n in conf.nets]


def _set_intervals(listing: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(element as nft prints it, first, last address) of each element of a listed interval set."""
    from pycni.net import nft

    out: list[tuple[str, int, int]] = []
    for st in nft.objects(listing, "set"):
        for e in st.get("elem", []):
            e = e.get("elem", {}).get("val", e) if isinstance(e, dict) and "elem" in e else e
            if isinstance(e, str):
                ip = ipaddress.ip_address(e)
                out.append((e, int(ip), int(ip)))
            elif isinstance(e, dict) and "prefix" in e:
                net = ipaddress.ip_network(f"{e['prefix']['addr']}/{e['prefix']['len']}", strict=False)
                out.append((str(net), int(net.network_address), int(net.broadcast_address)))
            elif isinstance(e, dict) and "range" in e:
                lo, hi = (ipaddress.ip_address(x) for x in e["range"])
                out.append((f"{lo}-{hi}", int(lo), int(hi)))
    return out


def _widen_nets(conf: PortMapConf) -> None:
    """Overlap fallback, what auto-merge did: a subnet inside an element already there needs
    nothing; a subnet containing elements replaces them (CIDR blocks never partly overlap)."""
    from pycni.net import nft

    cmds: list[str] = []
    for n in conf.nets if conf.snat and not conf.masq_all else []:
        net = n.network
        first, last = int(net.network_address), int(net.broadcast_address)
        have = _set_intervals(nft.list_json("set", "inet", NFT_TABLE, NETS[n.version]))
        if any(lo <= first and last <= hi for _, lo, hi in have):
            continue
        cmds += [f"delete element {T} {NETS[n.version]} {{ {text} }}" for text, lo, hi in have
                 if first <= lo and hi <= last]
        cmds.append(f"add element {T} {NETS[n.version]} {{ {net} }}")
    if cmds:
        nft.run("\n".join(cmds) + "\n", what="port mapping subnet merge")


def _add_nets(conf: PortMapConf) -> None:
    """The subnet elements on their own (the slow path of :func:`nft_forward`)."""
    from pycni.net import nft

    nets = nft_nets(conf)
    if not nets:
        return
    try:
        nft.run("\n".join(nets) + "\n", what="port mapping setup")
    except nft.NftError as e:
        if not e.overlaps:
            raise
        _widen_nets(conf)


def nft_forward(conf: PortMapConf) -> None:
    """ADD: one transaction; a host port held by another container is taken over (newest wins)."""
    from pycni.net import nft

    comment = nft.quote(element_comment(conf))
    skeleton = _nft_skeleton(conf)
    elements = nft_elements(conf)
    code = INVALID_CONFIG if conf.conditions_v4 or conf.conditions_v6 else PLUGIN_SPECIFIC
    try:
        nft.run("\n".join(skeleton + nft_nets(conf) + [el.add(comment) for el in elements]) + "\n", code=code,
                what="port mapping setup")
        return
    except nft.NftError as e:
        if not (e.exists or e.overlaps):
            raise CNIError(e.code, "unable to set up nftables rules for port mappings", e.details) from None
    # Rare: a host port is mapped to another container, or this subnet overlaps another network's.
    # Take ports over element by element, merge subnets, and undo everything if that fails.
    try:
        nft.run("\n".join(skeleton) + "\n", what="port mapping setup")
        _add_nets(conf)
        for element in elements:
            try:
                nft.run(element.add(comment) + "\n", what="port mapping setup")
            except nft.NftError as err:
                if not err.exists:
                    raise
                nft.run(f"{element.delete()}\n{element.add(comment)}\n", what="port mapping takeover")
    except CNIError as err:
        try:
            nft_unforward(conf)
        except CNIError:
            pass
        raise CNIError(err.code, "unable to set up nftables rules for port mappings", err.details) from None


def nft_unforward(conf: PortMapConf) -> None:
    """DEL: remove this attachment's elements; idempotent, and complete without portMappings."""
    from pycni.net import nft

    if conf.mappings and conf.nets:
        elements = nft_elements(conf)
        script = "".join(f"{e.probe()}\n{e.delete()}\n" for e in elements)
        try:
            nft.run(script, what="port mapping teardown")
            return
        except nft.NftError:
            pass  # gone already, taken over by a newer container, or not what the runtime says
    _unforward_by_comment(conf)


def _unforward_by_comment(conf: PortMapConf) -> None:
    """Find our elements by their comment (one listing of the table) and delete them."""
    from pycni.net import nft

    listing = nft.list_json("table", "inet", NFT_TABLE, missing_ok=True)
    mine = element_comment(conf)
    cmds = []
    for kind in ("map", "set"):
        for obj in nft.objects(listing, kind):
            for elem in obj.get("elem", []) or []:
                key = elem[0] if kind == "map" and isinstance(elem, list) else elem
                if isinstance(key, dict) and isinstance(key.get("elem"), dict):
                    if key["elem"].get("comment") == mine:
                        cmds.append(f"delete element {T} {obj['name']} {{ {_render(key['elem']['val'])} }}")
    if cmds:
        nft.run("\n".join(cmds) + "\n", what="port mapping teardown")


def _render(v: Any) -> str:
    """An element key from nft's JSON back to nft syntax."""
    if isinstance(v, dict):
        if "concat" in v:
            return " . ".join(_render(x) for x in v["concat"])
        if "prefix" in v:
            return f"{v['prefix']['addr']}/{v['prefix']['len']}"
        if "range" in v:
            lo, hi = v["range"]
            return f"{_render(lo)}-{_render(hi)}"
        if "elem" in v:
            return _render(v["elem"]["val"])
    return str(v)


def _get_elements(name: str, elems: list[Element]) -> tuple[bool, str]:
    import subprocess

    from pycni.net import nft

    keys = ", ".join(e.key for e in elems)
    try:
        out = subprocess.run([nft.find_tool("nft"), "get", "element", "inet", NFT_TABLE, name, f"{{ {keys} }}"],
                             capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise CNIError(PLUGIN_SPECIFIC, "nft command not found", "install nftables") from None
    return out.returncode == 0, " ".join(out.stdout.split())


def nft_check(conf: PortMapConf) -> None:
    by_name: dict[str, list[Element]] = {}
    for e in nft_elements(conf):
        by_name.setdefault(e.name, []).append(e)
    for name, elems in by_name.items():
        found, text = _get_elements(name, elems)  # one query per map when all is well
        for e in elems:
            ok, seen = found, text
            if not found:  # some key is missing: ask one by one to name it
                ok, seen = _get_elements(name, [e])
            want = re.escape(e.key) + r'(?: comment "[^"]*")?' + (r" : " + re.escape(e.data) if e.data else "")
            if not ok or not re.search(want + r"(?:[ ,}]|$)", seen):
                raise CNIError(PLUGIN_SPECIFIC, "missing hostport rule",
                               f"{T} {name} has no element {e.key}{' : ' + e.data if e.data else ''} "
                               f"for container {conf.container_id}")


def nft_gc(conf: PortMapConf, valid: set[str]) -> None:
    """GC: drop elements of this network whose container is not among the valid attachments."""
    from pycni.net import nft

    listing = nft.list_json("table", "inet", NFT_TABLE, missing_ok=True)
    suffix = f" net: {conf.name}"
    cmds = []
    for kind in ("map", "set"):
        for obj in nft.objects(listing, kind):
            for elem in obj.get("elem", []) or []:
                key = elem[0] if kind == "map" and isinstance(elem, list) else elem
                if not (isinstance(key, dict) and isinstance(key.get("elem"), dict)):
                    continue
                comment = str(key["elem"].get("comment", ""))
                m = re.match(r"^id: (\S+) net: (.*)$", comment)
                if m and " net: " + m.group(2) == suffix and m.group(1) not in valid:
                    cmds.append(f"delete element {T} {obj['name']} {{ {_render(key['elem']['val'])} }}")
    if cmds:
        nft.run("\n".join(cmds) + "\n", what="port mapping garbage collection")


# ---- iptables backend (the reference's layout) -----------------------------------------------
def _mark_def(bit: int) -> str:
    v = 1 << bit
    return f"{v:#x}/{v:#x}"


def dnat_chain_name(conf: PortMapConf) -> str:
    from pycni.net.masq import chain_name

    return chain_name(conf.name, conf.container_id, "DN-")


def _ipt_dnat(conf: PortMapConf, net: ContainerNet) -> tuple[list[list[str]], list[list[str]]]:
    """(entry rules in CNI-HOSTPORT-DNAT, rules of the container's CNI-DN- chain) for one address."""
    from pycni.net.masq import go_quote

    v6 = net.version == 6
    comment = f'dnat name: {go_quote(conf.name)} id: {go_quote(conf.container_id)}'
    if len(comment) > 255:
        comment = comment[:253] + "..."
    setmark = conf.external_set_mark_chain or SETMARK_CHAIN
    conds = conf.conditions_v6 if v6 else conf.conditions_v4
    by_proto: dict[str, list[int]] = {}
    for m in conf.mappings:
        by_proto.setdefault(m.protocol, []).append(m.host_port)
    entries = []
    for proto in sorted(by_proto):
        ports = by_proto[proto]
        for i in range(0, len(ports), 15):  # multiport takes 15 ports at most
            spec = ",".join(str(p) for p in ports[i:i + 15])
            entries.append(["-m", "comment", "--comment", comment, "-m", "multiport", "-p", proto,
                            "--destination-ports", spec, *_split_conditions(conds)])
    rules = []
    for m in conf.mappings:
        if not m.applies_to(net.version):
            continue
        base = ["-p", m.protocol, "--dport", str(m.host_port)]
        host = m.specific_host()
        if host is not None:
            base += ["-d", str(host)]
        if conf.snat:
            src = ("::/0" if v6 else "0.0.0.0/0") if conf.masq_all else str(net.network)
            rules.append([*base, "-s", src, "-j", setmark])
            if not v6 and not conf.masq_all:
                rules.append([*base, "-s", "127.0.0.1", "-j", setmark])
        dest = f"[{net.ip}]:{m.container_port}" if v6 else f"{net.ip}:{m.container_port}"
        rules.append([*base, "-j", "DNAT", "--to-destination", dest])
    return entries, rules


def _split_conditions(conds: list[str]) -> list[str]:
    """iptables conditions are argv words already, as in the reference."""
    return [c for c in conds if c]


def ipt_forward(conf: PortMapConf) -> None:
    from pycni.net import iptables

    for net in conf.nets:
        v6 = net.version == 6
        if conf.snat and conf.external_set_mark_chain is None:
            mark = _mark_def(conf.mark_masq_bit)
            iptables.ensure_chain("nat", SETMARK_CHAIN, v6)
            iptables.append_unique("nat", SETMARK_CHAIN, ["-m", "comment", "--comment", "CNI portfwd masquerade mark",
                                                          "-j", "MARK", "--set-xmark", mark], v6)
            iptables.ensure_chain("nat", MASQ_CHAIN, v6)
            iptables.append_unique("nat", MASQ_CHAIN, ["-m", "mark", "--mark", mark, "-j", "MASQUERADE"], v6)
            iptables.append_unique("nat", "POSTROUTING", ["-m", "comment", "--comment",
                                                          "CNI portfwd requiring masquerade", "-j", MASQ_CHAIN],
                                   v6, prepend=True)
        iptables.ensure_chain("nat", TOP_DNAT_CHAIN, v6)
        for entry in ("PREROUTING", "OUTPUT"):
            iptables.append_unique("nat", entry, ["-m", "addrtype", "--dst-type", "LOCAL", "-j", TOP_DNAT_CHAIN], v6)
        chain = dnat_chain_name(conf)
        entries, rules = _ipt_dnat(conf, net)
        # One restore writes the container chain afresh and links it in (newest first).
        lines = ["*nat", f":{chain} - [0:0]"]
        lines += [iptables.rule_line("-A", chain, r) for r in rules]
        for e in entries:
            if not iptables.rule_exists("nat", TOP_DNAT_CHAIN, [*e, "-j", chain], v6):
                lines.append(iptables.rule_line("-I", TOP_DNAT_CHAIN, [*e, "-j", chain]))
        lines.append("COMMIT")
        try:
            iptables.restore("\n".join(lines) + "\n", v6)
        except CNIError as e:
            code = INVALID_CONFIG if (conf.conditions_v6 if v6 else conf.conditions_v4) else e.code
            raise CNIError(code, "unable to set up DNAT", e.details) from None


def ipt_unforward(conf: PortMapConf) -> None:
    from pycni.net import iptables
    from pycni.net.masq import chain_name

    chain = dnat_chain_name(conf)
    old_snat = chain_name(conf.name, conf.container_id, "SN-")
    usable = [v6 for v6 in (False, True) if iptables.usable(v6)]
    if not usable:
        raise CNIError(PLUGIN_SPECIFIC, "neither iptables nor ip6tables usable",
                       "install iptables or use the nftables backend")
    for v6 in usable:
        for top, ch in ((TOP_DNAT_CHAIN, chain), (OLD_SNAT_CHAIN, old_snat)):
            for line in iptables.list_rules("nat", top, v6):
                rule = iptables.split_rule(line)
                if rule[-2:] == ["-j", ch]:
                    iptables.delete_rule("nat", top, rule, v6)
            iptables.delete_chain("nat", ch, v6)


def ipt_check(conf: PortMapConf) -> None:
    from pycni.net import iptables

    chain = dnat_chain_name(conf)
    for net in conf.nets:
        v6 = net.version == 6
        if not iptables.chain_exists("nat", chain, v6):
            raise CNIError(PLUGIN_SPECIFIC, "port mapping chain missing", f"chain {chain} not found in table nat")
        entries, rules = _ipt_dnat(conf, net)
        for r in rules:
            if not iptables.rule_exists("nat", chain, r, v6):
                raise CNIError(PLUGIN_SPECIFIC, "missing hostport rule", f"rule {' '.join(r)} not in {chain}")
        for e in entries:
            if not iptables.rule_exists("nat", TOP_DNAT_CHAIN, [*e, "-j", chain], v6):
                raise CNIError(PLUGIN_SPECIFIC, "missing hostport rule", f"no {TOP_DNAT_CHAIN} rule jumps to {chain}")


def _ipt_locked() -> AbstractContextManager[None]:
    from pycni.net import iptables

    return iptables.locked()


# ---- host side helpers -----------------------------------------------------------------------
def enable_localnet_routing(ip: ipaddress.IPv4Address) -> None:
    """route_localnet=1 on the interface routing to the container, so 127/8 may be DNAT'd to it."""
    from pycni.net import route
    from pycni.net.sysctl import write_sysctl

    dev = route.output_link(ip)
    if dev is not None:
        write_sysctl(f"net/ipv4/conf/{dev}/route_localnet", "1")


def forget_stale_udp_flows(conf: PortMapConf) -> None:
    """Delete conntrack entries of UDP flows to the mapped host ports that began before the
    mapping: they would bypass the DNAT until they time out. Best effort, as in the reference."""
    udp_ports = sorted({m.host_port for m in conf.mappings if m.protocol == "udp"})
    if not udp_ports:
        return
    import socket

    from pycni.net.conntrack import delete_by_dst_port

    for net in conf.nets:
        family = socket.AF_INET if net.version == 4 else socket.AF_INET6
        for port in udp_ports:
            try:
                delete_by_dst_port(socket.IPPROTO_UDP, port, family)
            except OSError:
                pass


# ---- handlers --------------------------------------------------------------------------------
def cmd_add(args: CmdArgs) -> Result:
    conf = parse_config(args)
    if conf.prev is None:
        raise _bad("must be called as chained plugin", "portmap needs a prevResult (put it after an interface plugin)")
    if not conf.mappings or not conf.nets:
        return conf.prev
    try:
        if conf.backend == "nftables":
            nft_forward(conf)
        else:
            with _ipt_locked():
                ipt_forward(conf)
        if conf.snat and conf.cont_v4 is not None:
            try:
                enable_localnet_routing(conf.cont_v4.ip)
            except CNIError as e:
                raise CNIError(e.code, "unable to enable route_localnet", e.details) from None
    except CNIError:
        cmd_rollback(conf)  # leave nothing half-made
        raise
    forget_stale_udp_flows(conf)
    return conf.prev


def cmd_rollback(conf: PortMapConf) -> None:
    try:
        if conf.backend == "nftables":
            nft_unforward(conf)
        else:
            with _ipt_locked():
                ipt_unforward(conf)
    except CNIError:
        pass


def cmd_del(args: CmdArgs) -> None:
    conf = parse_config(args)
    # Unlike the reference, clean up even when the runtime omits portMappings on DEL: the
    # chains are named from the network and container ID alone.
    if conf.backend == "nftables":
        nft_unforward(conf)
    else:
        with _ipt_locked():
            ipt_unforward(conf)
    return None


def cmd_check(args: CmdArgs) -> None:
    conf = parse_config(args)
    if conf.prev is None:
        raise _bad("Required prevResult missing", "CHECK needs the prevResult of the ADD")
    if not conf.mappings or not conf.nets:
        return None
    if conf.backend == "nftables":
        nft_check(conf)
    else:
        ipt_check(conf)
    return None


def cmd_gc(args: CmdArgs) -> None:
    """Spec 1.1 GC: forget mappings of containers the runtime no longer knows (nftables)."""
    conf = parse_config(args)
    raw = args.conf().get("cni.dev/valid-attachments") or []
    if not isinstance(raw, list):
        raise _bad("invalid cni.dev/valid-attachments", "expected a list of {containerID, ifname}")
    valid = {str(a.get("containerID", "")) for a in raw if isinstance(a, dict)}
    if conf.backend == "nftables":
        nft_gc(conf, valid)
    return None


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, about="pycni portmap plugin")


def main() -> None:
    run_plugin(PLUGIN)
