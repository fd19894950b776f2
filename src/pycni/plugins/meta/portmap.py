"""portmap: forward host ports to a container (chained; passes prevResult through).

Config keys as the Go reference: ``runtimeConfig.portMappings`` (hostPort, containerPort,
protocol, hostIP), ``snat`` (default true), ``masqAll``, ``markMasqBit`` / ``externalSetMarkChain``
(iptables), ``conditionsV4`` / ``conditionsV6`` and ``backend``: "nftables" (default here) or
"iptables".

nftables layout (table ``inet pycni_hostport``), built so ADD and DEL cost does not grow with
the number of containers already mapped:

* verdict maps ``hostports`` (proto . port), ``hostip4_hostports`` / ``hostip6_hostports``
  (hostIP . proto . port) and ``masq4`` / ``masq6`` (container IP), consulted from the nat
  ``prerouting`` / ``output`` (local destinations only) and ``postrouting`` (DNAT'd
  connections only) base chains;
* per container two chains named from hash(network name + container ID): ``dn-<hash>`` with
  the DNAT rules and ``mq-<hash>`` with the hairpin / localhost masquerade rules. Map elements
  jump to them.

ADD is one transaction. DEL finds everything from the chain names alone (it reads its own
``dn-`` chain when the runtime omits portMappings), so rules never leak. A host port claimed by
two containers goes to the later one, as in the reference; the earlier one's DEL leaves the
later one's mapping alone (a probe ``add element`` in the delete transaction fails when the
element now points elsewhere).

The iptables backend keeps the reference's CNI-HOSTPORT-DNAT / CNI-DN-<hash> /
CNI-HOSTPORT-SETMARK / CNI-HOSTPORT-MASQ chains, so it interoperates with Go-made rules.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from pycni.net import iptables, nft
from pycni.net.masq import chain_name, go_quote, hash_with_prefix
from pycni.skel import CmdArgs, Plugin, config_version, prev_result, run_plugin
from pycni.spec.errors import INVALID_CONFIG, PLUGIN_SPECIFIC, CNIError
from pycni.spec.types import Result

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
@dataclass(frozen=True)
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


@dataclass
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
def container_hash(conf: PortMapConf) -> str:
    return hash_with_prefix(24, "", conf.name + conf.container_id)


def _ipx(family: int) -> str:
    return "ip" if family == 4 else "ip6"


def _key_map(m: PortMapping) -> tuple[str, str]:
    """(map, element key) of a mapping's verdict-map entry."""
    host = m.specific_host()
    if host is None:
        return "hostports", f"{m.protocol} . {m.host_port}"
    return f"hostip{host.version}_hostports", f"{host} . {m.protocol} . {m.host_port}"


def _nft_skeleton() -> list[str]:
    """Shared objects: created if missing, base chains rewritten (identical every time)."""
    return [
        f"add table {T} {{ comment \"pycni portmap plugin\"; }}",
        f"add map {T} hostports {{ type inet_proto . inet_service : verdict; }}",
        f"add map {T} hostip4_hostports {{ type ipv4_addr . inet_proto . inet_service : verdict; }}",
        f"add map {T} hostip6_hostports {{ type ipv6_addr . inet_proto . inet_service : verdict; }}",
        f"add map {T} masq4 {{ type ipv4_addr : verdict; }}",
        f"add map {T} masq6 {{ type ipv6_addr : verdict; }}",
        f"add chain {T} hostport_lookup",
        f"flush chain {T} hostport_lookup",
        f"add rule {T} hostport_lookup ip daddr . meta l4proto . th dport vmap @hostip4_hostports",
        f"add rule {T} hostport_lookup ip6 daddr . meta l4proto . th dport vmap @hostip6_hostports",
        f"add rule {T} hostport_lookup meta l4proto . th dport vmap @hostports",
        f"add chain {T} prerouting {{ type nat hook prerouting priority dstnat; }}",
        f"flush chain {T} prerouting",
        f"add rule {T} prerouting fib daddr type local jump hostport_lookup",
        f"add chain {T} output {{ type nat hook output priority -100; }}",
        f"flush chain {T} output",
        f"add rule {T} output fib daddr type local jump hostport_lookup",
        f"add chain {T} postrouting {{ type nat hook postrouting priority srcnat; }}",
        f"flush chain {T} postrouting",
        f"add rule {T} postrouting ct status dnat ip daddr vmap @masq4",
        f"add rule {T} postrouting ct status dnat ip6 daddr vmap @masq6",
    ]


def _rule_comment(m: PortMapping, net: ContainerNet, container_id: str) -> str:
    # The key comes first so DEL can read it back even when the comment is cut at 128 bytes.
    return f"{m.protocol}/{m.host_port}/{m.host_ip or '*'}/{net.version} id: {container_id}"


_COMMENT_RE = re.compile(r"^(tcp|udp|sctp)/(\d+)/([^/]+)/([46]) ")


def _nft_container_rules(conf: PortMapConf, dn: str, mq: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Commands filling this container's chains, and the (map, key) elements pointing at them."""
    cmds: list[str] = []
    elements: list[tuple[str, str]] = []
    for net in conf.nets:
        fam = net.version
        ipx = _ipx(fam)
        conds = " ".join(conf.conditions_v4 if fam == 4 else conf.conditions_v6)
        used = False
        for m in conf.mappings:
            if not m.applies_to(fam):
                continue
            used = True
            host = m.specific_host()
            match = " ".join(filter(None, [conds, f"{ipx} daddr {host}" if host else "",
                                           f"meta l4proto {m.protocol} th dport {m.host_port}"]))
            target = f"[{net.ip}]:{m.container_port}" if fam == 6 else f"{net.ip}:{m.container_port}"
            cmds.append(f"add rule {T} {dn} {match} dnat {ipx} to {target} "
                        f"comment {nft.quote(_rule_comment(m, net, conf.container_id))}")
            elements.append(_key_map(m))
        if used and conf.snat:
            # Hairpin (the container, or its neighbours, reaching it through the host port) and,
            # for IPv4, localhost: without masquerading the replies would bypass the host's NAT.
            if conf.masq_all:
                sources = "0.0.0.0/0" if fam == 4 else "::/0"
            elif fam == 4:
                sources = f"{{ {net.network}, 127.0.0.0/8 }}"
            else:
                sources = str(net.network)
            cmds.append(f"add rule {T} {mq} {ipx} saddr {sources} masquerade "
                        f"comment {nft.quote('hairpin id: ' + conf.container_id)}")
            elements.append((f"masq{fam}", str(net.ip)))
    return cmds, list(dict.fromkeys(elements))


def _chains(conf: PortMapConf) -> tuple[str, str]:
    h = container_hash(conf)
    return f"dn-{h}", f"mq-{h}"


def nft_forward(conf: PortMapConf) -> None:
    """ADD: one transaction; falls back to taking over host ports another container holds."""
    dn, mq = _chains(conf)
    label = nft.quote(f"net: {conf.name} id: {conf.container_id}")
    fill, elements = _nft_container_rules(conf, dn, mq)
    base = _nft_skeleton() + [
        f"add chain {T} {dn} {{ comment {label}; }}", f"flush chain {T} {dn}",
        f"add chain {T} {mq} {{ comment {label}; }}", f"flush chain {T} {mq}",
        *fill,
    ]
    adds = [f"add element {T} {mp} {{ {key} : jump {_target(mp, dn, mq)} }}" for mp, key in elements]
    try:
        nft.run("\n".join(base + adds) + "\n", code=INVALID_CONFIG if _has_conditions(conf) else PLUGIN_SPECIFIC,
                what="port mapping setup")
        return
    except nft.NftError as e:
        if not e.exists:
            raise CNIError(e.code, "unable to set up nftables rules for port mappings", e.details) from None
    # Some host port is mapped to another container already: the newest ADD wins, as in the
    # reference. Rare, so a few transactions are fine; undo everything if one fails.
    try:
        nft.run("\n".join(base) + "\n", what="port mapping setup")
        for mp, key in elements:
            add = f"add element {T} {mp} {{ {key} : jump {_target(mp, dn, mq)} }}\n"
            try:
                nft.run(add, what="port mapping setup")
            except nft.NftError as e:
                if not e.exists:
                    raise
                nft.run(f"delete element {T} {mp} {{ {key} }}\n" + add, what="port mapping takeover")
    except CNIError as e:
        try:
            nft_unforward(conf)
        except CNIError:
            pass
        raise CNIError(e.code, "unable to set up nftables rules for port mappings", e.details) from None


def _has_conditions(conf: PortMapConf) -> bool:
    return bool(conf.conditions_v4 or conf.conditions_v6)


def _target(mp: str, dn: str, mq: str) -> str:
    return mq if mp.startswith("masq") else dn


def _delete_script(elements: list[tuple[str, str]], dn: str, mq: str, probe: bool = True) -> str:
    """Delete our elements (each probed: re-adding it fails if it now points elsewhere) and chains."""
    lines = [f"add chain {T} {dn}", f"add chain {T} {mq}"]
    for mp, key in elements:
        if probe:
            lines.append(f"add element {T} {mp} {{ {key} : jump {_target(mp, dn, mq)} }}")
        lines.append(f"delete element {T} {mp} {{ {key} }}")
    lines += [f"flush chain {T} {dn}", f"delete chain {T} {dn}", f"flush chain {T} {mq}", f"delete chain {T} {mq}"]
    return "\n".join(lines) + "\n"


def _elements_from_chain(dn: str) -> list[tuple[str, str]] | None:
    """Read back the elements of a container from its own dn- chain (None: no such chain)."""
    listing = nft.list_json("chain", "inet", NFT_TABLE, dn, missing_ok=True)
    if not nft.objects(listing, "chain"):
        return None
    elements: list[tuple[str, str]] = []
    for rule in nft.rules(listing):
        m = _COMMENT_RE.match(str(rule.get("comment", "")))
        if not m:
            continue
        proto, port, host_ip, fam = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
        pm = PortMapping(port, 1, proto, "" if host_ip == "*" else host_ip)
        elements.append(_key_map(pm))
        ip = _dnat_target(rule)
        if ip:
            elements.append((f"masq{fam}", ip))
    return list(dict.fromkeys(elements))


def _dnat_target(rule: dict[str, Any]) -> str:
    for e in rule.get("expr", []):
        if isinstance(e, dict) and "dnat" in e and isinstance(e["dnat"], dict):
            return str(e["dnat"].get("addr", ""))
    return ""


def nft_unforward(conf: PortMapConf) -> None:
    """DEL: remove this container's chains and map elements; idempotent."""
    dn, mq = _chains(conf)
    if conf.mappings and conf.nets:
        _fill, elements = _nft_container_rules(conf, dn, mq)
        try:
            nft.run(_delete_script(elements, dn, mq), what="port mapping teardown")
            return
        except nft.NftError:
            pass  # the runtime's view differs from what is installed: read our own chain instead
    found = _elements_from_chain(dn)
    if found is None:
        return
    try:
        nft.run(_delete_script(found, dn, mq), what="port mapping teardown")
        return
    except nft.NftError as e:
        if not (e.exists or "Device or resource busy" in e.stderr):
            raise
    # Some element was taken over by a newer container (leave it), or an element we cannot
    # name still points at our chains: fall back to looking at each map.
    _delete_slow(dn, mq)


def _delete_slow(dn: str, mq: str) -> None:
    cmds = []
    for mp in ("hostports", "hostip4_hostports", "hostip6_hostports", "masq4", "masq6"):
        listing = nft.list_json("map", "inet", NFT_TABLE, mp, missing_ok=True)
        for m in nft.objects(listing, "map"):
            for elem in m.get("elem", []) or []:
                if not (isinstance(elem, list) and len(elem) == 2):
                    continue
                verdict = elem[1].get("jump", {}) if isinstance(elem[1], dict) else {}
                if verdict.get("target") in (dn, mq):
                    cmds.append(f"delete element {T} {mp} {{ {_key_text(elem[0])} }}")
    cmds += [f"add chain {T} {dn}", f"add chain {T} {mq}", f"flush chain {T} {dn}", f"delete chain {T} {dn}",
             f"flush chain {T} {mq}", f"delete chain {T} {mq}"]
    nft.run("\n".join(cmds) + "\n", what="port mapping teardown")


def _key_text(key: Any) -> str:
    if isinstance(key, dict) and "concat" in key:
        return " . ".join(str(k) for k in key["concat"])
    return str(key)


def nft_check(conf: PortMapConf) -> None:
    dn, mq = _chains(conf)
    listing = nft.list_json("chain", "inet", NFT_TABLE, dn, missing_ok=True)
    if not nft.objects(listing, "chain"):
        raise CNIError(PLUGIN_SPECIFIC, "port mapping chain missing", f"chain {T} {dn} not found")
    have = {str(r.get("comment", "")) for r in nft.rules(listing)}
    _fill, elements = _nft_container_rules(conf, dn, mq)
    for net in conf.nets:
        for m in conf.mappings:
            if m.applies_to(net.version) and _rule_comment(m, net, conf.container_id)[:nft.COMMENT_MAX] not in have:
                raise CNIError(PLUGIN_SPECIFIC, "missing hostport rule",
                               f"no DNAT rule for {m.protocol} port {m.host_port} to {net.ip} in {T} {dn}")
    for mp, key in elements:
        try:
            out = subprocess.run([nft.find_tool("nft"), "get", "element", "inet", NFT_TABLE, mp,
                                  f"{{ {key} }}"], capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise CNIError(PLUGIN_SPECIFIC, "nft command not found", "install nftables") from None
        if out.returncode != 0 or f"jump {_target(mp, dn, mq)}" not in out.stdout:
            raise CNIError(PLUGIN_SPECIFIC, "missing hostport map element",
                           f"{mp} element {key} does not lead to {_target(mp, dn, mq)}")


# ---- iptables backend (the reference's layout) -----------------------------------------------
def _mark_def(bit: int) -> str:
    v = 1 << bit
    return f"{v:#x}/{v:#x}"


def dnat_chain_name(conf: PortMapConf) -> str:
    return chain_name(conf.name, conf.container_id, "DN-")


def _ipt_dnat(conf: PortMapConf, net: ContainerNet) -> tuple[list[list[str]], list[list[str]]]:
    """(entry rules in CNI-HOSTPORT-DNAT, rules of the container's CNI-DN- chain) for one address."""
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


# ---- host side helpers -----------------------------------------------------------------------
def enable_localnet_routing(ip: ipaddress.IPv4Address) -> None:
    """route_localnet=1 on the interface routing to the container, so 127/8 may be DNAT'd to it."""
    try:
        out = subprocess.run([nft.find_tool("ip"), "-o", "route", "get", str(ip)], capture_output=True, text=True,
                             timeout=30)
    except FileNotFoundError:
        return
    m = re.search(r"\bdev (\S+)", out.stdout)
    if out.returncode != 0 or not m:
        return
    from pycni.net.sysctl import write_sysctl

    write_sysctl(f"net/ipv4/conf/{m.group(1)}/route_localnet", "1")


# ---- handlers --------------------------------------------------------------------------------
def cmd_add(args: CmdArgs) -> Result:
    conf = parse_config(args)
    if conf.prev is None:
        raise _bad("must be called as chained plugin", "portmap needs a prevResult (put it after an interface plugin)")
    if not conf.mappings or not conf.nets:
        return conf.prev
    if conf.backend == "nftables":
        nft_forward(conf)
    else:
        ipt_forward(conf)
    if conf.snat and conf.cont_v4 is not None:
        try:
            enable_localnet_routing(conf.cont_v4.ip)
        except CNIError as e:
            cmd_rollback(conf)
            raise CNIError(e.code, "unable to enable route_localnet", e.details) from None
    return conf.prev


def cmd_rollback(conf: PortMapConf) -> None:
    try:
        nft_unforward(conf) if conf.backend == "nftables" else ipt_unforward(conf)
    except CNIError:
        pass


def cmd_del(args: CmdArgs) -> None:
    conf = parse_config(args)
    # Unlike the reference, clean up even when the runtime omits portMappings on DEL: the
    # chains are named from the network and container ID alone.
    if conf.backend == "nftables":
        nft_unforward(conf)
    else:
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


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, about="pycni portmap plugin")


def main() -> None:
    run_plugin(PLUGIN)
