"""portmap's iptables backend: the Go reference's chains and rules, one restore per ADD and DEL.

The nat table (ip6tables alike for IPv6) holds exactly what the reference writes, so its DEL
removes what our ADD made and ours what its ADD made:

    PREROUTING, OUTPUT    -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
    CNI-HOSTPORT-DNAT     -m comment --comment 'dnat name: "<net>" id: "<cid>"' -m multiport
                          -p <proto> --destination-ports <up to 15> [conditions] -j CNI-DN-<hash>
    CNI-DN-<hash>         per mapping: -p <proto> --dport <host port> [-d <hostIP>] then
                          -s <container subnet> -j CNI-HOSTPORT-SETMARK (snat), for IPv4
                          -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK (snat), -j DNAT --to-destination
    CNI-HOSTPORT-SETMARK  -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark <bit>
    POSTROUTING (first)   -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
    CNI-HOSTPORT-MASQ     -m mark --mark <bit> -j MASQUERADE

``<hash>`` is the reference's: SHA-512 of network name + container ID (pycni.net.masq.chain_name).

Cost. The reference runs one iptables command per rule, and under iptables-nft each one reads
the whole nat table, which grows with every container. Here a container's ADD is one
``iptables-restore`` per address family that looks nothing up: it creates the container's
chain with ``-N`` (so it fails as a whole on a repeated ADD), links it into
CNI-HOSTPORT-DNAT (failing if that chain is missing) and rewrites the two mark chains (failing
if they are missing). Only when that fails — first container, repeated ADD, a skeleton
someone removed — does a locked slow path look the shared pieces up and write everything in
one restore. DEL is one restore of exactly the rules ADD made; when the runtime does not pass
them (or they differ) it finds the jumps to the container's chain in a listing instead.
A later ADD on the same host port wins (its jump goes first), as with our nftables backend.
Every ADD rewrites the two mark chains with its own markMasqBit, so the latest bit serves all
containers (both chains agree on it); the reference adds one rule per bit ever configured.
"""

from __future__ import annotations

from pycni.net import iptables
from pycni.net.masq import chain_name
from pycni.plugins.meta.portmap.backend import Backend, Unusable
from pycni.spec.errors import PLUGIN_SPECIFIC, CNIError, invalid_config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pycni.plugins.meta.portmap.plugin import ContainerNet, PortmapConf

# The reference's chain names; never change them (upgrades and swaps depend on them).
TOP_DNAT_CHAIN = "CNI-HOSTPORT-DNAT"
SETMARK_CHAIN = "CNI-HOSTPORT-SETMARK"
MASQ_CHAIN = "CNI-HOSTPORT-MASQ"
COMMENT_MAX = 255  # the reference trims longer comments to 253 bytes + "..."
MULTIPORT_MAX = 15  # ports one multiport match takes


# ---- the reference's rules -------------------------------------------------------------------
def dnat_chain_name(network: str, container_id: str) -> str:
    return chain_name(network, container_id, "DN-")


def dnat_comment(network: str, container_id: str) -> str:
    """The comment of a container's CNI-HOSTPORT-DNAT rules, as the reference formats it."""
    text = f'dnat name: "{network}" id: "{container_id}"'
    raw = text.encode()
    if len(raw) > COMMENT_MAX:
        text = raw[:COMMENT_MAX - 2].decode(errors="ignore") + "..."
    return text


def _mark(bit: int) -> str:
    v = 1 << bit
    return f"{v:#x}/{v:#x}"


def top_jump() -> list[str]:
    return ["-m", "addrtype", "--dst-type", "LOCAL", "-j", TOP_DNAT_CHAIN]


def masq_jump() -> list[str]:
    return ["-m", "comment", "--comment", "CNI portfwd requiring masquerade", "-j", MASQ_CHAIN]


def setmark_rule(bit: int) -> list[str]:
    return ["-m", "comment", "--comment", "CNI portfwd masquerade mark", "-j", "MARK", "--set-xmark", _mark(bit)]


def masq_rule(bit: int) -> list[str]:
    return ["-m", "mark", "--mark", _mark(bit), "-j", "MASQUERADE"]


def entry_rules(conf: PortmapConf, v6: bool) -> list[list[str]]:
    """The container's rules in CNI-HOSTPORT-DNAT, each ending in the jump to its chain."""
    chain = dnat_chain_name(conf.name, conf.container_id)
    comment = dnat_comment(conf.name, conf.container_id)
    conds = [c for c in (conf.conditions_v6 if v6 else conf.conditions_v4) if c]
    by_proto: dict[str, list[int]] = {}
    for m in conf.mappings:
        by_proto.setdefault(m.protocol, []).append(m.host_port)
    out = []
    for proto in sorted(by_proto):
        ports = by_proto[proto]
        for i in range(0, len(ports), MULTIPORT_MAX):
            spec = ",".join(str(p) for p in ports[i:i + MULTIPORT_MAX])
            out.append(["-m", "comment", "--comment", comment, "-m", "multiport", "-p", proto,
                        "--destination-ports", spec, *conds, "-j", chain])
    return out


def chain_rules(conf: PortmapConf, net: ContainerNet) -> list[list[str]]:
    """The rules of the container's CNI-DN- chain for one of its addresses."""
    v6 = net.version == 6
    setmark = conf.external_set_mark_chain or SETMARK_CHAIN
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
    return rules


def _owns_mark_chains(conf: PortmapConf) -> bool:
    return conf.snat and conf.external_set_mark_chain is None


def _mark_chain_lines(conf: PortmapConf, declare: bool) -> list[str]:
    """The two mark chains, rewritten: ``declare`` creates them if missing (slow path); otherwise
    ``-F`` fails the transaction when they are missing (fast path)."""
    bit = conf.mark_masq_bit
    lines = []
    for chain, rule in ((SETMARK_CHAIN, setmark_rule(bit)), (MASQ_CHAIN, masq_rule(bit))):
        lines.append(f":{chain} - [0:0]" if declare else f"-F {chain}")
        lines.append(iptables.rule_line("-A", chain, rule))
    return lines


def _restore(lines: list[str], v6: bool) -> None:
    iptables.restore("\n".join(["*nat", *lines, "COMMIT"]) + "\n", v6)


def _missing_tool(e: iptables.IptablesError) -> bool:
    return e.exit_status == 127


# ---- ADD -------------------------------------------------------------------------------------
def _forward_fast(conf: PortmapConf, net: ContainerNet) -> bool:
    """A container new to this host whose shared chains exist: one restore, no lookups."""
    v6 = net.version == 6
    chain = dnat_chain_name(conf.name, conf.container_id)
    lines = _mark_chain_lines(conf, declare=False) if _owns_mark_chains(conf) else []
    lines.append(f"-N {chain}")
    lines += [iptables.rule_line("-A", chain, r) for r in chain_rules(conf, net)]
    lines += [iptables.rule_line("-I", TOP_DNAT_CHAIN, e) for e in reversed(entry_rules(conf, v6))]
    try:
        _restore(lines, v6)
    except iptables.IptablesError as e:
        if _missing_tool(e):
            raise Unusable(e.msg, "install the iptables package") from None
        return False
    return True


def _forward_slow(conf: PortmapConf, net: ContainerNet) -> None:
    """Everything, looked up: skeleton where missing, the container's chain rewritten, its
    jumps made exactly the wanted ones. Still one restore, so a failure leaves nothing."""
    v6 = net.version == 6
    if not iptables.usable(v6):
        fam = "ip6tables" if v6 else "iptables"
        raise Unusable(f"{fam} is not usable here", f"`{fam} -t nat -S OUTPUT` fails (no tool or no nat support)")
    chain = dnat_chain_name(conf.name, conf.container_id)
    lines: list[str] = []
    if _owns_mark_chains(conf):
        lines += _mark_chain_lines(conf, declare=True)
        if not iptables.rule_exists("nat", "POSTROUTING", masq_jump(), v6):
            lines.append(iptables.rule_line("-I", "POSTROUTING", masq_jump()))
    top_exists = iptables.chain_exists("nat", TOP_DNAT_CHAIN, v6)
    if not top_exists:
        lines.append(f"-N {TOP_DNAT_CHAIN}")
    for builtin in ("PREROUTING", "OUTPUT"):
        if not top_exists or not iptables.rule_exists("nat", builtin, top_jump(), v6):
            lines.append(iptables.rule_line("-A", builtin, top_jump()))
    lines.append(f":{chain} - [0:0]")  # created, or emptied to be written afresh
    lines += [iptables.rule_line("-A", chain, r) for r in chain_rules(conf, net)]
    wanted = entry_rules(conf, v6)
    have = [] if not top_exists else _jumps_to(chain, v6)
    have_canon = {iptables.canonical(r) for r in have}
    wanted_canon = {iptables.canonical(r) for r in wanted}
    lines += [iptables.rule_line("-D", TOP_DNAT_CHAIN, r) for r in have if iptables.canonical(r) not in wanted_canon]
    lines += [iptables.rule_line("-I", TOP_DNAT_CHAIN, r) for r in reversed(wanted)
              if iptables.canonical(r) not in have_canon]
    try:
        _restore(lines, v6)
    except CNIError as e:
        external = conf.external_set_mark_chain
        if conf.conditions_v6 if v6 else conf.conditions_v4:
            raise invalid_config("unable to set up DNAT: check conditionsV4/conditionsV6",
                                 e.details) from None
        if external is not None and external in e.details:
            raise invalid_config(f"externalSetMarkChain {external} cannot be used",
                                 f"{e.details}; it must be an existing chain of the nat table") from None
        raise CNIError(e.code, "unable to set up DNAT", e.details) from None


def _jumps_to(chain: str, v6: bool) -> list[list[str]]:
    """The CNI-HOSTPORT-DNAT rules that jump to ``chain`` (as -S prints them)."""
    out = []
    for line in iptables.list_rules("nat", TOP_DNAT_CHAIN, v6):
        rule = iptables.split_rule(line)
        if rule[-2:] == ["-j", chain]:
            out.append(rule)
    return out


# ---- DEL -------------------------------------------------------------------------------------
def _unforward_family(conf: PortmapConf, v6: bool) -> None:
    chain = dnat_chain_name(conf.name, conf.container_id)
    if conf.mappings:
        # The usual DEL: exactly the jumps ADD made (ours or the reference's), then the chain.
        # Fails as a whole when anything differs or is gone; the listing below sorts that out.
        lines = [iptables.rule_line("-D", TOP_DNAT_CHAIN, e) for e in entry_rules(conf, v6)]
        try:
            _restore([*lines, f"-F {chain}", f"-X {chain}"], v6)
            return
        except iptables.IptablesError as e:
            if _missing_tool(e):
                return  # no iptables: nothing can be there
    try:
        exists = iptables.chain_exists("nat", chain, v6)
    except iptables.IptablesError as e:
        if _missing_tool(e) or not iptables.usable(v6):
            return
        raise
    if not exists:
        return
    with iptables.locked():
        lines = [iptables.rule_line("-D", TOP_DNAT_CHAIN, r) for r in _jumps_to(chain, v6)]
        _restore([*lines, f"-F {chain}", f"-X {chain}"], v6)


# ---- CHECK -----------------------------------------------------------------------------------
def _listing(chain: str, v6: bool) -> set[tuple[tuple[str, ...], ...]] | None:
    """A chain's rules in canonical form (one ``-S``: linear in the chain); None if it is missing."""
    try:
        out = iptables.run(["-t", "nat", "-S", chain], v6)
    except iptables.IptablesError as e:
        if e.not_found or e.exit_status == 1:
            return None
        raise
    return {iptables.canonical(iptables.split_rule(line)) for line in out.splitlines() if line.startswith("-A ")}


def _require(have: set[tuple[tuple[str, ...], ...]] | None, chain: str, rules: list[list[str]], v6: bool) -> None:
    fam = "ip6tables" if v6 else "iptables"
    if have is None:
        raise CNIError(PLUGIN_SPECIFIC, "port mapping chain missing", f"{fam}: chain {chain} not found in table nat")
    for r in rules:
        if iptables.canonical(r) not in have:
            raise CNIError(PLUGIN_SPECIFIC, "missing hostport rule",
                           f"{fam}: no rule `{' '.join(r)}` in chain {chain} of table nat")


class IptablesBackend(Backend):
    name = "iptables"

    def forward(self, conf: PortmapConf) -> None:
        done: list[bool] = []
        try:
            for net in conf.nets:
                v6 = net.version == 6
                if not _forward_fast(conf, net):
                    with iptables.locked():
                        _forward_slow(conf, net)
                done.append(v6)
        except CNIError:
            for v6 in done:  # the other family's part: all or nothing
                try:
                    _unforward_family(conf, v6)
                except CNIError:
                    pass
            raise

    def unforward(self, conf: PortmapConf) -> None:
        families = {n.version == 6 for n in conf.nets} if conf.prev is not None else {False, True}
        for v6 in sorted(families):
            _unforward_family(conf, v6)

    def check(self, conf: PortmapConf) -> None:
        """One listing per chain involved, compared as sets: linear in the mappings."""
        chain = dnat_chain_name(conf.name, conf.container_id)
        for net in conf.nets:
            v6 = net.version == 6
            _require(_listing(chain, v6), chain, chain_rules(conf, net), v6)
            _require(_listing(TOP_DNAT_CHAIN, v6), TOP_DNAT_CHAIN, entry_rules(conf, v6), v6)
            for builtin in ("PREROUTING", "OUTPUT"):
                _require(_listing(builtin, v6), builtin, [top_jump()], v6)
            if _owns_mark_chains(conf):
                _require(_listing("POSTROUTING", v6), "POSTROUTING", [masq_jump()], v6)
                _require(_listing(SETMARK_CHAIN, v6), SETMARK_CHAIN, [setmark_rule(conf.mark_masq_bit)], v6)
                _require(_listing(MASQ_CHAIN, v6), MASQ_CHAIN, [masq_rule(conf.mark_masq_bit)], v6)

    def gc(self, conf: PortmapConf, valid: set[str]) -> None:
        """Jumps whose comment names this network and a container not in ``valid`` go, with
        their chains (a comment the reference trimmed names no container: left alone)."""
        prefix, suffix = f'dnat name: "{conf.name}" id: "', '"'
        for v6 in (False, True):
            try:
                listing = iptables.list_rules("nat", TOP_DNAT_CHAIN, v6)
            except iptables.IptablesError as e:
                if _missing_tool(e) or not iptables.usable(v6):
                    continue
                raise
            stale: dict[str, list[list[str]]] = {}
            for line in listing:
                rule = iptables.split_rule(line)
                comment = rule[rule.index("--comment") + 1] if "--comment" in rule[:-1] else ""
                if rule[-2:-1] != ["-j"] or not (comment.startswith(prefix) and comment.endswith(suffix)):
                    continue
                if comment[len(prefix):-len(suffix)] not in valid:
                    stale.setdefault(rule[-1], []).append(rule)
            if not stale:
                continue
            lines = [iptables.rule_line("-D", TOP_DNAT_CHAIN, r) for rules in stale.values() for r in rules]
            for chain in stale:
                lines += [f"-F {chain}", f"-X {chain}"]
            with iptables.locked():
                _restore(lines, v6)


BACKEND = IptablesBackend()
