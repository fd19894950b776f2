"""firewall: let a container's traffic through the host's forwarding filter.

Chained after an interface plugin, as the Go reference. Backends:

* ``iptables`` (the default, as the reference when firewalld is not running): chain
  ``CNI-FORWARD`` jumped to first from ``FORWARD``, which first jumps to the admin chain
  (``CNI-ADMIN`` or ``iptablesAdminChainName``, left to the administrator), then holds per-IP
  rules: replies to the container (conntrack RELATED,ESTABLISHED) and everything it sends.
* ``nftables`` (pycni's own): table ``inet cni_firewall`` with a forward base chain that
  jumps to the admin chain and accepts replies to / traffic from the addresses in the sets
  ``allowed4``/``allowed6``; a container is its set elements, so DEL removes exactly them.
  An accept there is final only for this table (nftables semantics): a drop in another table
  still drops — use the iptables backend to punch through an iptables FORWARD DROP policy.
* ``firewalld`` is refused (code 7): there is no firewalld to talk to here.

``ingressPolicy`` ``same-bridge`` / ``isolated`` add the reference's CNI-ISOLATION-STAGE-1/2
iptables chains for the bridge (first interface of prevResult), whatever the backend.
"""

from __future__ import annotations

from pycni import netconf
from pycni.record import record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import PLUGIN_SPECIFIC, CNIError, invalid_config
from pycni.spec.types import IPConfig, Result
from pycni.spec.validate import ALNUM, charset_match
from pycni.spec.version import ALL_VERSIONS, greater_than_or_equal

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~3 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

PRIV_CHAIN = "CNI-FORWARD"
DEFAULT_ADMIN_CHAIN = "CNI-ADMIN"
FILTER_COMMENT = "CNI firewall plugin rules"
ADMIN_COMMENT = "CNI firewall plugin admin overrides"
NFT_TABLE = "cni_firewall"
STAGE1, STAGE2 = "CNI-ISOLATION-STAGE-1", "CNI-ISOLATION-STAGE-2"
POLICIES = ("", "open", "same-bridge", "isolated")
# Names the admin chain cannot take: the filter table's built-in chains and the standard
# verdicts (iptables cannot jump to or create them), and the chains this plugin owns (a jump
# to itself loops). iptables refuses other target names (LOG, REJECT, ...) itself: see
# _create_chain. nftables names a chain with an identifier (no leading digit) and its own
# base chain is "forward".
_RESERVED_ADMIN = frozenset({"INPUT", "FORWARD", "OUTPUT", "ACCEPT", "DROP", "RETURN", "QUEUE", PRIV_CHAIN,
                             STAGE1, STAGE2})


@record
class FirewallConf:
    """The checked network config; ``prev`` is always there for ADD and CHECK."""

    cni_version: str
    backend: str
    admin_chain: str
    ingress_policy: str
    prev: Result | None

    @property
    def result(self) -> Result:
        """The prevResult ADD and CHECK act on (parse_conf has required it)."""
        assert self.prev is not None
        return self.prev


def parse_conf(args: CmdArgs) -> FirewallConf:
    """Every key checked, and for ADD/CHECK the prevResult required, before anything changes."""
    raw = args.conf()
    version = config_version(raw)
    netconf.runtime_config(raw)
    netconf.args_cni(raw)
    backend = netconf.get_str(raw, "backend") or "iptables"
    netconf.get_str(raw, "firewalldZone")  # type-checked only: there is no firewalld backend
    if backend == "firewalld":
        raise invalid_config("firewalld backend is not supported",
                       "pycni has no firewalld integration and no firewalld runs here: "
                       "set \"backend\" to \"iptables\" or \"nftables\"")
    if backend not in ("iptables", "nftables"):
        raise invalid_config(f"unknown firewall backend {backend!r}",
                             "backend must be \"iptables\" or \"nftables\"")
    admin = netconf.get_str(raw, "iptablesAdminChainName") or DEFAULT_ADMIN_CHAIN
    if not charset_match(admin, ALNUM + "_", ALNUM + "_.-", 28, eol=True):
        raise invalid_config(f"invalid iptablesAdminChainName {admin!r}",
                             "use up to 28 letters, digits, '_', '-' or '.'")
    if admin in (_RESERVED_ADMIN if backend == "iptables" else ("forward",)):
        raise invalid_config(f"invalid iptablesAdminChainName {admin!r}",
                       f"{admin} is a built-in chain, a verdict or a chain of the firewall plugin itself; "
                       f"name a chain of your own (default {DEFAULT_ADMIN_CHAIN})")
    if backend == "nftables" and not charset_match(admin, ALNUM[:52] + "_", ALNUM + "_.-", eol=True):
        raise invalid_config(f"invalid iptablesAdminChainName {admin!r}",
                             "an nftables chain name starts with a letter or '_'")
    policy = netconf.get_str(raw, "ingressPolicy")
    if policy not in POLICIES:
        raise invalid_config(f"unknown ingress policy: {policy!r}",
                             "ingressPolicy must be \"open\", \"same-bridge\" or \"isolated\"")
    if args.command in ("ADD", "CHECK"):
        prev: Result | None = netconf.require_prev_result(raw, "firewall")
    else:
        prev = netconf.prev_result(raw)  # DEL without one has nothing to remove
    conf = FirewallConf(version, backend, admin, policy, prev)
    if conf.prev is not None and policy not in ("", "open"):
        _isolation_rules(conf, conf.prev)  # refuses a prevResult without the bridge, before any change
    return conf


def host_ip(ip: IPConfig) -> str:
    """The address as a single-host prefix (/32 or /128), as the rules match it."""
    return f"{ip.address.ip}/{32 if ip.address.version == 4 else 128}"


# ---- iptables backend ------------------------------------------------------------------------
def _ipt_jump(chain: str, comment: str) -> list[str]:
    return ["-m", "comment", "--comment", comment, "-j", chain]


def _ipt_ip_rules(ip: str) -> list[list[str]]:
    return [["-d", ip, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
            ["-s", ip, "-j", "ACCEPT"]]


def _ipt_rules_by_family(result: Result) -> dict[bool, list[list[str]]]:
    """This container's PRIV_CHAIN rules, keyed by "is IPv6" (ip6tables vs iptables)."""
    out: dict[bool, list[list[str]]] = {}
    for ip in result.ips:
        out.setdefault(ip.address.version == 6, []).extend(_ipt_ip_rules(host_ip(ip)))
    return out


def _create_chain(chain: str, v6: bool, undo: Rollback) -> None:
    """Create ``chain`` in the filter table unless it exists; a chain made here is undone."""
    from pycni.net import iptables as ipt

    try:
        ipt.run(["-t", "filter", "-N", chain], v6)
    except ipt.IptablesError as e:
        if e.chain_exists:
            return
        if "clash with target name" in e.stderr:
            raise invalid_config(f"invalid iptablesAdminChainName {chain!r}",
                                 f"{chain} is the name of an iptables target; name a chain of your own") from None
        raise
    undo.push(ipt.delete_chain, "filter", chain, v6)


def _add_rule(chain: str, rule: list[str], v6: bool, undo: Rollback, *, prepend: bool = False) -> None:
    """Add ``rule`` unless an identical one is there; a rule added here is undone."""
    from pycni.net import iptables as ipt

    if ipt.rule_exists("filter", chain, rule, v6):
        return
    ipt.run(["-t", "filter", "-I" if prepend else "-A", chain, *(["1"] if prepend else []), *rule], v6)
    undo.push(ipt.delete_rule, "filter", chain, rule, v6)


class _FilterTable:
    """One ``iptables -S`` snapshot of the filter table: its chains and their rules.

    One process to read and one ``iptables-restore`` to write replace the ``-N``/``-C``/``-A``
    processes (six to eight a family) that ADD and CHECK would otherwise run.
    """

    def __init__(self, v6: bool) -> None:
        from pycni.net import iptables as ipt

        self.chains: set[str] = set()
        self.user_chains: set[str] = set()
        self.lines: dict[str, list[str]] = {}
        for line in ipt.run(["-t", "filter", "-S"], v6).splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2 and parts[0] in ("-P", "-N"):
                self.chains.add(parts[1])
                if parts[0] == "-N":
                    self.user_chains.add(parts[1])
            elif len(parts) == 3 and parts[0] == "-A":
                self.lines.setdefault(parts[1], []).append(line)

    def has_rule(self, chain: str, rule: list[str]) -> bool:
        """Whether ``chain`` holds ``rule`` (as ``-C`` would say, compared in canonical form)."""
        from pycni.net import iptables as ipt

        words = [a for a in rule if not a.startswith("-") and a != "!" and " " not in a]
        want = ipt.canonical(rule)
        return any(all(w in line for w in words) and ipt.canonical(ipt.split_rule(line)) == want
                   for line in self.lines.get(chain, ()))


def _iptables_add_at_once(conf: FirewallConf, rules: list[list[str]], v6: bool, undo: Rollback) -> bool:
    """:func:`iptables_add` for one family in one ``iptables-restore``, once both chains exist;
    False (nothing changed) otherwise, and the command-by-command path runs: it creates them with
    ``-N``, which refuses a name iptables-restore would take (a target's, such as ``LOG``)."""
    from pycni.net import iptables as ipt

    try:
        table = _FilterTable(v6)
        if not {conf.admin_chain, PRIV_CHAIN} <= table.user_chains:
            return False
        wanted = [("FORWARD", _ipt_jump(PRIV_CHAIN, FILTER_COMMENT), True),
                  (PRIV_CHAIN, _ipt_jump(conf.admin_chain, ADMIN_COMMENT), True),
                  *((PRIV_CHAIN, rule, False) for rule in rules)]
        missing = [(chain, rule, prepend) for chain, rule, prepend in wanted if not table.has_rule(chain, rule)]
        if missing:
            ipt.restore("*filter\n" + "".join(ipt.rule_line("-I" if prepend else "-A", chain, rule) + "\n"
                                  for chain, rule, prepend in missing) + "COMMIT\n", v6)
    except ipt.IptablesError:
        return False
    for chain, rule, _ in missing:
        undo.push(ipt.delete_rule, "filter", chain, rule, v6)
    return True


def iptables_add(conf: FirewallConf, result: Result, undo: Rollback) -> None:
    for v6, rules in _ipt_rules_by_family(result).items():
        if _iptables_add_at_once(conf, rules, v6, undo):
            continue
        _create_chain(conf.admin_chain, v6, undo)
        _create_chain(PRIV_CHAIN, v6, undo)
        _add_rule("FORWARD", _ipt_jump(PRIV_CHAIN, FILTER_COMMENT), v6, undo, prepend=True)
        _add_rule(PRIV_CHAIN, _ipt_jump(conf.admin_chain, ADMIN_COMMENT), v6, undo, prepend=True)
        for rule in rules:
            _add_rule(PRIV_CHAIN, rule, v6, undo)


def iptables_del(conf: FirewallConf, result: Result) -> None:
    from pycni.net import iptables as ipt

    for v6, rules in _ipt_rules_by_family(result).items():
        for rule in rules:
            ipt.delete_rule("filter", PRIV_CHAIN, rule, v6)


def iptables_check(conf: FirewallConf, result: Result) -> None:
    for v6, rules in _ipt_rules_by_family(result).items():
        fam = "ip6tables" if v6 else "iptables"
        table = _FilterTable(v6)
        for chain in (PRIV_CHAIN, conf.admin_chain):
            if chain not in table.chains:
                raise CNIError(PLUGIN_SPECIFIC, f"{fam} chain {chain} not found")
        for chain, rule in [("FORWARD", _ipt_jump(PRIV_CHAIN, FILTER_COMMENT)),
                            (PRIV_CHAIN, _ipt_jump(conf.admin_chain, ADMIN_COMMENT)),
                            *((PRIV_CHAIN, r) for r in rules)]:
            if not table.has_rule(chain, rule):
                raise CNIError(PLUGIN_SPECIFIC, f"expected {chain} rule not found",
                               f"{fam} -t filter -C {chain} {' '.join(rule)}")


# ---- nftables backend ------------------------------------------------------------------------
def _nft_elements(result: Result) -> dict[str, list[str]]:
    """This container's addresses by the nftables set that allows them (allowed4 / allowed6)."""
    out: dict[str, list[str]] = {"allowed4": [], "allowed6": []}
    for ip in result.ips:
        out["allowed4" if ip.address.version == 4 else "allowed6"].append(str(ip.address.ip))
    return out


def _nft_base(admin: str) -> str:
    """Table, sets and chains, with the forward chain's fixed rules rewritten (idempotent)."""
    t = f"inet {NFT_TABLE}"
    return "\n".join([
        f"add table {t}",
        f"add set {t} allowed4 {{ type ipv4_addr; }}",
        f"add set {t} allowed6 {{ type ipv6_addr; }}",
        f"add chain {t} {admin}",
        f"add chain {t} forward {{ type filter hook forward priority filter; policy accept; }}",
        f"flush chain {t} forward",
        f"add rule {t} forward jump {admin} comment \"{ADMIN_COMMENT}\"",
        f"add rule {t} forward ip daddr @allowed4 ct state related,established counter accept",
        f"add rule {t} forward ip saddr @allowed4 counter accept",
        f"add rule {t} forward ip6 daddr @allowed6 ct state related,established counter accept",
        f"add rule {t} forward ip6 saddr @allowed6 counter accept",
    ]) + "\n"


def _nft_set_members(listing: dict[str, Any], name: str) -> set[str]:
    from pycni.net import nft

    members: set[str] = set()
    for s in nft.objects(listing, "set"):
        if s.get("name") == name:
            for e in s.get("elem", []):
                members.add(e if isinstance(e, str) else str(e.get("elem", {}).get("val", e)))
    return members


def nft_add(conf: FirewallConf, result: Result, undo: Rollback) -> None:
    """One transaction: all of it or nothing. A later failure takes this container's elements out."""
    from pycni.net import nft

    script = _nft_base(conf.admin_chain)
    for set_name, addrs in _nft_elements(result).items():
        if addrs:
            script += f"add element inet {NFT_TABLE} {set_name} {{ {', '.join(addrs)} }}\n"
    try:
        nft.run(script, what="firewall ADD")
    except nft.NftError as e:
        if "syntax error" in e.stderr:  # the admin chain's name is an nftables keyword
            raise invalid_config(f"invalid iptablesAdminChainName {conf.admin_chain!r} for nftables",
                                 f"nft cannot name a chain {conf.admin_chain}: {e.details}") from None
        raise
    undo.push(nft_del, conf, result)


def nft_del(conf: FirewallConf, result: Result) -> None:
    from pycni.net import nft

    listing = nft.list_json("table", "inet", NFT_TABLE, missing_ok=True)
    if not nft.objects(listing, "table"):
        return
    script = ""
    for set_name, addrs in _nft_elements(result).items():
        present = [a for a in addrs if a in _nft_set_members(listing, set_name)]
        if present:
            script += f"delete element inet {NFT_TABLE} {set_name} {{ {', '.join(present)} }}\n"
    if script:
        nft.run(script, what="firewall DEL")


def nft_check(conf: FirewallConf, result: Result) -> None:
    from pycni.net import nft

    listing = nft.list_json("table", "inet", NFT_TABLE, missing_ok=True)
    if not nft.objects(listing, "table"):
        raise CNIError(PLUGIN_SPECIFIC, f"nftables table inet {NFT_TABLE} not found")
    chains = {c.get("name") for c in nft.objects(listing, "chain")}
    for chain in ("forward", conf.admin_chain):
        if chain not in chains:
            raise CNIError(PLUGIN_SPECIFIC, f"nftables chain {chain} not found in inet {NFT_TABLE}")
    fwd = [r for r in nft.rules(listing) if r.get("chain") == "forward"]
    jumps = [r for r in fwd if any(e.get("jump", {}).get("target") == conf.admin_chain for e in r.get("expr", []))]
    if not jumps or len(fwd) < 5:
        raise CNIError(PLUGIN_SPECIFIC, "nftables forward chain rules missing",
                       f"expected the jump to {conf.admin_chain} and four set rules in inet {NFT_TABLE} forward")
    for set_name, addrs in _nft_elements(result).items():
        missing = [a for a in addrs if a not in _nft_set_members(listing, set_name)]
        if missing:
            raise CNIError(PLUGIN_SPECIFIC, f"addresses {missing} not allowed in set {set_name}",
                           f"inet {NFT_TABLE} {set_name} lacks this container's addresses")


# ---- ingress policy (iptables, whatever the backend, as the reference) -----------------------
def _policy_comment(policy: str) -> list[str]:
    return ["-m", "comment", "--comment", f"CNI firewall plugin rules (ingressPolicy: {policy})"]


DEFAULT_POLICY_COMMENT = _policy_comment("same-bridge|isolated")
LEGACY_POLICY_COMMENT = _policy_comment("same-bridge")


def _isolation_rules(conf: FirewallConf, result: Result) -> list[tuple[str, list[str], bool]]:
    """(chain, rule, prepend) in the order the reference installs them, for the bridge."""
    if not result.interfaces or not result.interfaces[0].name:
        raise invalid_config(f"interface needs to be set for ingress policy {conf.ingress_policy!r}",
                             "make sure to chain \"firewall\" after \"bridge\"")
    br = result.interfaces[0].name
    pc = _policy_comment(conf.ingress_policy)
    rules = [("FORWARD", ["-j", STAGE1, *DEFAULT_POLICY_COMMENT], True),
             (STAGE1, ["-i", br, "!", "-o", br, "-j", STAGE2, *pc], True)]
    if conf.ingress_policy == "isolated":
        rules.append((STAGE1, ["-i", br, "-o", br, "-j", "DROP", *pc], True))
    rules += [(STAGE1, ["-j", "RETURN", *DEFAULT_POLICY_COMMENT], False),
              (STAGE2, ["-o", br, "-j", "DROP", *DEFAULT_POLICY_COMMENT], True),
              (STAGE2, ["-j", "RETURN", *DEFAULT_POLICY_COMMENT], False)]
    return rules


def _families(result: Result) -> list[bool]:
    return sorted({ip.address.version == 6 for ip in result.ips})


def setup_ingress_policy(conf: FirewallConf, result: Result, undo: Rollback) -> None:
    if conf.ingress_policy in ("", "open"):
        return
    rules = _isolation_rules(conf, result)
    for v6 in _families(result):
        for chain in (STAGE1, STAGE2):
            _create_chain(chain, v6, undo)
        for chain, rule, prepend in rules:
            _add_rule(chain, rule, v6, undo, prepend=prepend)


def check_ingress_policy(conf: FirewallConf, result: Result) -> None:
    """Beyond the reference's CHECK: the bridge's isolation rules are in place."""
    from pycni.net import iptables as ipt

    if conf.ingress_policy in ("", "open"):
        return
    rules = _isolation_rules(conf, result)
    n = len(DEFAULT_POLICY_COMMENT)
    for v6 in _families(result):
        for chain, rule, _ in rules:
            # Older references (v1.1) commented the shared rules "(ingressPolicy: same-bridge)".
            alt = rule[:-n] + LEGACY_POLICY_COMMENT if rule[-n:] == DEFAULT_POLICY_COMMENT else rule
            if not (ipt.rule_exists("filter", chain, rule, v6) or ipt.rule_exists("filter", chain, alt, v6)):
                raise CNIError(PLUGIN_SPECIFIC, f"expected {chain} rule not found",
                               f"{'ip6tables' if v6 else 'iptables'} -t filter -C {chain} {' '.join(rule)}")


# ---- handlers --------------------------------------------------------------------------------
@record(frozen=True)
class Backend:
    """How one ``backend`` value adds, deletes and checks a container's forwarding rules."""

    add: Callable[[FirewallConf, Result, Rollback], None]
    delete: Callable[[FirewallConf, Result], None]
    check: Callable[[FirewallConf, Result], None]


BACKENDS = {"iptables": Backend(iptables_add, iptables_del, iptables_check),
            "nftables": Backend(nft_add, nft_del, nft_check)}


def cmd_add(args: CmdArgs) -> Result:
    from pycni.net import netns

    conf = parse_conf(args)
    # No half-made ADD: whatever this ADD created (chains, jumps, rules) goes if a later step fails.
    with netns.locked(), Rollback() as undo:
        BACKENDS[conf.backend].add(conf, conf.result, undo)
        setup_ingress_policy(conf, conf.result, undo)
    return conf.result


def cmd_del(args: CmdArgs) -> None:
    """Remove this container's rules (found from prevResult); shared chains stay. Idempotent."""
    from pycni.net import netns

    conf = parse_conf(args)
    if conf.prev is None:
        return
    # The configured backend first, then every other: rules made under another config, or by the
    # other implementation after a swap, go too. Only the configured backend's failure is an error
    # (another's tool may simply not be installed here).
    others = [name for name in BACKENDS if name != conf.backend]
    with netns.locked():
        BACKENDS[conf.backend].delete(conf, conf.prev)
        for name in others:
            try:
                BACKENDS[name].delete(conf, conf.prev)
            except (CNIError, OSError):
                pass
    # Per-bridge isolation chains stay: other containers on the bridge may still need them.


def cmd_check(args: CmdArgs) -> None:
    conf = parse_conf(args)
    BACKENDS[conf.backend].check(conf, conf.result)
    check_ingress_policy(conf, conf.result)


def cmd_gc(args: CmdArgs) -> None:
    """Nothing to collect: the rules are per address and leave with DEL; the list is still checked."""
    parse_conf(args)
    netconf.valid_attachments(args.conf())


def cmd_status(args: CmdArgs) -> None:
    """Ready: the backend's tools are looked up when used."""
    parse_conf(args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                versions=tuple(v for v in ALL_VERSIONS if greater_than_or_equal(v, "0.4.0")),
                about="pycni firewall: allow container traffic through iptables or nftables forwarding")


def main() -> None:
    run_plugin(PLUGIN)
