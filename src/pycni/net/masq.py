"""IP masquerading for a container's addresses (the ``ipMasq`` of bridge and ptp).

Two backends, each laid out as the Go reference lays it out so rules made by either
implementation can be found and removed by the other:

* ``iptables``: a nat chain ``CNI-<hash(network+containerID)>`` holding ``-d <subnet> -j ACCEPT``
  and ``! -d 224.0.0.0/4 -j MASQUERADE`` (``ff00::/8`` for IPv6), jumped to from POSTROUTING with
  ``-s <ip>``; every rule carries the comment ``name: "<network>" id: "<containerID>"``.
* ``nftables``: table ``inet cni_plugins_masquerade`` whose ``postrouting`` nat chain skips
  multicast and goes to ``masq_checks``, which holds one ``saddr == ip daddr != subnet
  masquerade`` rule per address, commented with a hash of (network, ifname, containerID).
  Each call is one nft transaction.

Everything acts in the calling thread's network namespace. Stdlib only.
"""

from __future__ import annotations

from pycni import jsonlite as json
from pycni.ipaddr import IPv4Interface, IPv6Interface
from pycni.net import iptables, nft
from pycni.net.names import hash_with_prefix
from pycni.spec.errors import PLUGIN_SPECIFIC, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's: this module is on plugins' one-shot start path
if TYPE_CHECKING:
    from collections.abc import Sequence

Address = IPv4Interface | IPv6Interface

BACKENDS = ("iptables", "nftables")
NFT_TABLE = "cni_plugins_masquerade"
NFT_CHAIN = "masq_checks"
_TABLE_COMMENT = "Masquerading for plugins from github.com/containernetworking/plugins"
_CHAIN_COMMENT = "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet"
MULTICAST = {4: "224.0.0.0/4", 6: "ff00::/8"}


# ---- names shared with the Go reference -----------------------------------------------------
def chain_name(network: str, container_id: str, prefix: str = "") -> str:
    """The 28-character iptables chain name Go's utils.FormatChainName(WithPrefix) gives."""
    return hash_with_prefix(28, "CNI-" + prefix, network + container_id)


def go_quote(s: str) -> str:
    """A string as Go's ``%q`` renders it (close enough for names and IDs: JSON escaping)."""
    return json.dumps(s, ensure_ascii=False)


def iptables_comment(network: str, container_id: str) -> str:
    return f"name: {go_quote(network)} id: {go_quote(container_id)}"


def nft_instance_hash(network: str, ifname: str, container_id: str) -> str:
    return hash_with_prefix(16, "", network) + "-" + hash_with_prefix(16, "", f"{ifname}:{container_id}")


def nft_comment(network: str, ifname: str, container_id: str) -> str:
    strip = lambda s: s.replace('"', "")  # noqa: E731
    text = (f"{nft_instance_hash(network, ifname, container_id)}, net: {strip(network)}, "
            f"if: {strip(ifname)}, id: {strip(container_id)}")
    return text[:nft.COMMENT_MAX]


def default_backend() -> str:
    """iptables unless only nftables works here, as the reference chooses."""
    return "iptables" if iptables.usable(quick=True) else "nftables"


def check_backend(backend: str) -> None:
    """Refuse an unknown ``ipMasqBackend`` (code 7): validate before anything is made."""
    _check_backend(backend)


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise invalid_config(f"unknown ipMasq backend {backend!r}",
                             f"ipMasqBackend must be one of {', '.join(BACKENDS)}")


# ---- public API ------------------------------------------------------------------------------
def setup_ip_masq(backend: str, network: str, container_id: str, ifname: str,
                  addresses: Sequence[Address]) -> None:
    """Masquerade traffic from ``addresses`` to anywhere outside their subnets (idempotent)."""
    _check_backend(backend)
    if not addresses:
        return
    if backend == "iptables":
        for family in (4, 6):
            addrs = [a for a in addresses if a.version == family]
            if addrs:
                _ipt_setup(network, container_id, addrs, family == 6)
    else:
        _nft_setup(network, ifname, container_id, addresses)


def undo_ip_masq(backend: str, network: str, container_id: str, ifname: str,
                 addresses: Sequence[Address]) -> None:
    """Rollback of :func:`setup_ip_masq` in an ADD that failed: remove this container's rules, then
    a masquerade table left empty (nft: ours; iptables-nft: the ``nat`` table iptables created on
    first use), so a failed ADD leaves no empty chain behind. A table holding anything stays: the
    removal is one nft transaction that the kernel refuses as a whole while a chain is non-empty,
    so a rule another ADD adds meanwhile is never lost. DEL does not do this (nor does Go's)."""
    teardown_ip_masq(backend, network, container_id, ifname, addresses)
    tables = [("inet", NFT_TABLE)] if backend == "nftables" else \
        [(fam, "nat") for fam, v in (("ip", 4), ("ip6", 6)) if any(a.version == v for a in addresses)]
    for family, table in tables:
        _drop_empty_nft_table(family, table)


def _drop_empty_nft_table(family: str, table: str) -> None:
    """Delete nft table ``family table`` unless a chain in it holds a rule (best effort, quiet).

    One transaction: our own table's jump to its check chain is flushed first; deleting a chain
    that still holds a rule fails (EBUSY) and with it the whole transaction.
    """
    try:
        listing = nft.list_json("table", family, table, missing_ok=True)
        chains = [c["name"] for c in nft.objects(listing, "chain")]
        if not nft.objects(listing, "table"):
            return
        script = [f"flush chain {family} {table} postrouting"] if table == NFT_TABLE and "postrouting" in chains else []
        script += [f"delete chain {family} {table} {c}" for c in chains]
        script.append(f"delete table {family} {table}")
        nft.run("\n".join(script) + "\n", what="ipMasq rollback")
    except CNIError:
        pass


def teardown_ip_masq(backend: str | None, network: str, container_id: str, ifname: str,
                     addresses: Sequence[Address] | None) -> None:
    """Remove this container's masquerade rules; idempotent, works without ``addresses``.

    ``backend`` None (or "") cleans both backends, as the Go reference's teardown does, since
    the container may have been set up under a different configuration.
    """
    if backend:
        _check_backend(backend)
    errors: list[str] = []
    # nftables first: mostly it only asks whether its table is there, and a netfilter socket
    # closed after a commit (iptables' below) waits for the kernel to release what it replaced.
    if backend in (None, "", "nftables"):
        try:
            _nft_teardown(network, ifname, container_id)
        except CNIError as e:
            errors.append(str(e))
    if backend in (None, "", "iptables"):
        for v6 in (False, True):
            addrs = None if addresses is None else [a for a in addresses if (a.version == 6) == v6]
            if addrs == []:
                continue
            try:
                _ipt_teardown(network, container_id, addrs, v6)
            except CNIError as e:
                if backend == "iptables" or iptables.usable(v6):
                    errors.append(str(e))
    if errors:
        raise CNIError(PLUGIN_SPECIFIC, "failed to tear down IP masquerade rules", "; ".join(errors))


def gc_ip_masq(network: str, valid: Sequence[tuple[str, str]]) -> None:
    """GC: remove the masquerade rules of ``network`` whose attachment (containerID, ifname) is
    not in ``valid``, from both layouts whatever the configured backend (a layout whose tool is
    missing has nothing to remove). Rules are matched by the names and hashes ADD derives from
    the attachment, so comments the 128-byte nft limit cut short are still recognised."""
    errors: list[str] = []
    chains = {chain_name(network, cid) for cid, _ifname in valid}
    for v6 in (False, True):
        try:
            with iptables.locked():
                _ipt_gc(network, chains, v6)
        except CNIError as e:
            if iptables.usable(v6):
                errors.append(str(e))
    try:
        _nft_gc(network, {nft_instance_hash(network, ifname, cid) for cid, ifname in valid})
    except nft.NftError as e:
        if "command not found" not in e.msg:
            errors.append(str(e))
    if errors:
        raise CNIError(PLUGIN_SPECIFIC, "failed to garbage-collect IP masquerade rules", "; ".join(errors))


def check_ip_masq(backend: str, network: str, container_id: str, ifname: str,
                  addresses: Sequence[Address]) -> None:
    """Raise a CNIError unless the masquerade rules for every address are in place."""
    _check_backend(backend)
    if backend == "iptables":
        for family in (4, 6):
            addrs = [a for a in addresses if a.version == family]
            if addrs:
                _ipt_check(network, container_id, addrs, family == 6)
    else:
        _nft_check(network, ifname, container_id, addresses)


# ---- iptables --------------------------------------------------------------------------------
def _ipt_chain_rules(addrs: Sequence[Address], chain: str, comment: str) -> list[list[str]]:
    rules: list[list[str]] = []
    for a in addrs:
        rules.append(["-d", str(a.network), "-j", "ACCEPT", "-m", "comment", "--comment", comment])
    rules.append(["!", "-d", MULTICAST[addrs[0].version], "-j", "MASQUERADE", "-m", "comment", "--comment", comment])
    return rules


def _ipt_jump(addr: Address, chain: str, comment: str) -> list[str]:
    return ["-s", str(addr.ip), "-j", chain, "-m", "comment", "--comment", comment]


def _ipt_setup(network: str, container_id: str, addrs: Sequence[Address], v6: bool) -> None:
    chain = chain_name(network, container_id)
    comment = iptables_comment(network, container_id)
    body = [iptables.rule_line("-A", chain, r) for r in _ipt_chain_rules(addrs, chain, comment)]
    jumps = [_ipt_jump(a, chain, comment) for a in addrs]
    # The usual ADD, a container new to this network: one restore that creates the chain with
    # -N, so it fails as a whole if the chain exists, and nothing has to be looked up first
    # (any lookup makes iptables-nft read the whole nat table, which grows with every container).
    # Atomic on its own, so it needs no lock: concurrent ADDs do not queue behind each other.
    fresh = ["*nat", f"-N {chain}", *body, *(iptables.rule_line("-A", "POSTROUTING", j) for j in jumps), "COMMIT"]
    try:
        iptables.restore("\n".join(fresh) + "\n", v6)
        return
    except CNIError:
        pass  # the chain exists (a repeated ADD), or another failure, which the path below reports
    # A chain that existed may already have jumps to it: look for each with `iptables -C`, never
    # by listing POSTROUTING. One atomic restore rewrites the chain (declaring it flushes it);
    # the lock keeps the look and the rewrite together.
    with iptables.locked():
        existed = iptables.chain_exists("nat", chain, v6)
        lines = ["*nat", f":{chain} - [0:0]", *body]
        for j in jumps:
            if not existed or not iptables.rule_exists("nat", "POSTROUTING", j, v6):
                lines.append(iptables.rule_line("-A", "POSTROUTING", j))
        lines.append("COMMIT")
        iptables.restore("\n".join(lines) + "\n", v6)


def _ipt_teardown(network: str, container_id: str, addrs: Sequence[Address] | None, v6: bool) -> None:
    chain = chain_name(network, container_id)
    if addrs:
        # The usual case, one atomic restore: exactly the jumps ADD made, then the chain. It fails
        # as a whole if anything differs (other addresses, set up by another config, already gone).
        comment = iptables_comment(network, container_id)
        lines = ["*nat"] + [iptables.rule_line("-D", "POSTROUTING", _ipt_jump(a, chain, comment)) for a in addrs]
        lines += [f"-F {chain}", f"-X {chain}", "COMMIT"]
        try:
            iptables.restore("\n".join(lines) + "\n", v6)  # atomic on its own: no lock
            return
        except CNIError:
            pass
    with iptables.locked():
        if not iptables.chain_exists("nat", chain, v6):
            return  # no chain, so no jump to it either: nothing of this container's is left
        # Find the POSTROUTING jumps to our chain by their target, so a DEL without addresses
        # (or with different ones) still removes them.
        for line in iptables.list_rules("nat", "POSTROUTING", v6):
            rule = iptables.split_rule(line)
            if "-j" in rule and rule[rule.index("-j") + 1] == chain:
                iptables.delete_rule("nat", "POSTROUTING", rule, v6)
        iptables.delete_chain("nat", chain, v6)


def _ipt_gc(network: str, valid_chains: set[str], v6: bool) -> None:
    """POSTROUTING jumps commented with ``network`` to a chain no valid attachment owns go,
    with their chains: one listing, one restore."""
    prefix = f"name: {go_quote(network)} id: "
    stale: dict[str, list[list[str]]] = {}
    for line in iptables.list_rules("nat", "POSTROUTING", v6):
        rule = iptables.split_rule(line)
        if "--comment" not in rule[:-1] or "-j" not in rule[:-1]:
            continue
        comment, target = rule[rule.index("--comment") + 1], rule[rule.index("-j") + 1]
        if comment.startswith(prefix) and target.startswith("CNI-") and target not in valid_chains:
            stale.setdefault(target, []).append(rule)
    if stale:
        lines = ["*nat"] + [iptables.rule_line("-D", "POSTROUTING", r) for rules in stale.values() for r in rules]
        for chain in stale:
            lines += [f"-F {chain}", f"-X {chain}"]
        iptables.restore("\n".join([*lines, "COMMIT"]) + "\n", v6)


def _ipt_check(network: str, container_id: str, addrs: Sequence[Address], v6: bool) -> None:
    chain = chain_name(network, container_id)
    comment = iptables_comment(network, container_id)
    if not iptables.chain_exists("nat", chain, v6):
        raise CNIError(PLUGIN_SPECIFIC, "IP masquerade chain missing", f"nat chain {chain} not found")
    for rule in _ipt_chain_rules(addrs, chain, comment):
        if not iptables.rule_exists("nat", chain, rule, v6):
            raise CNIError(PLUGIN_SPECIFIC, "IP masquerade rule missing", f"{' '.join(rule)} not in {chain}")
    for a in addrs:
        if not iptables.rule_exists("nat", "POSTROUTING", _ipt_jump(a, chain, comment), v6):
            raise CNIError(PLUGIN_SPECIFIC, "IP masquerade jump missing",
                           f"no POSTROUTING rule sends {a.ip} to {chain}")


# ---- nftables --------------------------------------------------------------------------------
def _nft_our_rules(prefix: str) -> list[dict]:  # type: ignore[type-arg]
    listing = nft.list_json("chain", "inet", NFT_TABLE, NFT_CHAIN, missing_ok=True)
    return [r for r in nft.rules(listing) if str(r.get("comment", "")).startswith(prefix)]


def _nft_setup(network: str, ifname: str, container_id: str, addrs: Sequence[Address]) -> None:
    t = f"inet {NFT_TABLE}"
    stale = _nft_our_rules(nft_instance_hash(network, ifname, container_id))
    comment = nft.quote(nft_comment(network, ifname, container_id))
    script = [
        f"add table {t} {{ comment {nft.quote(_TABLE_COMMENT)}; }}",
        f"add chain {t} {NFT_CHAIN} {{ comment {nft.quote(_CHAIN_COMMENT)}; }}",
        f"add chain {t} postrouting {{ type nat hook postrouting priority srcnat; }}",
        f"flush chain {t} postrouting",
        f"add rule {t} postrouting ip daddr == {MULTICAST[4]} return",
        f"add rule {t} postrouting ip6 daddr == {MULTICAST[6]} return",
        f"add rule {t} postrouting goto {NFT_CHAIN}",
    ]
    script += [f"delete rule {t} {NFT_CHAIN} handle {r['handle']}" for r in stale]
    for a in addrs:
        ipx = "ip" if a.version == 4 else "ip6"
        script.append(f"add rule {t} {NFT_CHAIN} {ipx} saddr == {a.ip} {ipx} daddr != {a.network} "
                      f"masquerade comment {comment}")
    nft.run("\n".join(script) + "\n", what="ipMasq setup")


def _nft_teardown(network: str, ifname: str, container_id: str) -> None:
    # List our chain straight away: with its table absent (the iptables backend) that costs the
    # same however many containers there are, whereas even `nft list tables` fetches the whole
    # ruleset (nft 1.0.6: ~50 ms once iptables-nft holds 1,000 containers' chains).
    ours = _nft_our_rules(nft_instance_hash(network, ifname, container_id))
    if ours:
        nft.run("".join(f"delete rule inet {NFT_TABLE} {NFT_CHAIN} handle {r['handle']}\n" for r in ours),
                what="ipMasq teardown")


def _nft_gc(network: str, valid_hashes: set[str]) -> None:
    net_hash = hash_with_prefix(16, "", network) + "-"
    stale = [r for r in _nft_our_rules(net_hash) if str(r.get("comment", ""))[:33] not in valid_hashes]
    if stale:
        nft.run("".join(f"delete rule inet {NFT_TABLE} {NFT_CHAIN} handle {r['handle']}\n" for r in stale),
                what="ipMasq garbage collection")


def _nft_check(network: str, ifname: str, container_id: str, addrs: Sequence[Address]) -> None:
    ours = _nft_our_rules(nft_instance_hash(network, ifname, container_id))
    if not nft.chain_exists("inet", NFT_TABLE, "postrouting"):
        raise CNIError(PLUGIN_SPECIFIC, "IP masquerade chain missing", f"inet {NFT_TABLE} postrouting not found")
    for a in addrs:
        if not any(_rule_has_saddr(r, str(a.ip)) for r in ours):
            raise CNIError(PLUGIN_SPECIFIC, "IP masquerade rule missing",
                           f"no rule in inet {NFT_TABLE} {NFT_CHAIN} masquerades {a.ip} for {container_id}")


def _rule_has_saddr(rule: dict, ip: str) -> bool:  # type: ignore[type-arg]
    for e in rule.get("expr", []):
        m = e.get("match") if isinstance(e, dict) else None
        if m and m.get("op") == "==" and m.get("right") == ip:
            left = m.get("left", {}).get("payload", {})
            if left.get("field") == "saddr":
                return True
    return False
