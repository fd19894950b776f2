"""MAC spoof checking on a bridge port with nftables (the bridge plugin's ``macspoofchk``).

Same ruleset as the Go reference's ``link.SpoofChecker``, so either implementation can tear
down what the other set up: table ``bridge nat``, base chain ``PREROUTING`` (filter hook
prerouting, priority -300, policy accept) with a rule ``iifname <host veth> jump
cni-br-iface-<id>``; that chain jumps to ``cni-br-iface-<id>-mac``, which returns for the
container's source MAC and drops everything else. Every rule is commented
``macspoofchk-<id>`` where ``<id>`` is ``<containerID>-<ifname>``.

We apply it as a single nft transaction (the reference needs two). Acts in the calling
thread's netns.
"""

from __future__ import annotations

from pycni.net import nft

FAMILY = "bridge"
TABLE = "nat"
BASE_CHAIN = "PREROUTING"


def ref_id(container_id: str, ifname: str) -> str:
    """The id naming one port's chains and comments, as the reference builds it."""
    return f"{container_id}-{ifname}"


def iface_chain(refid: str) -> str:
    return f"cni-br-iface-{refid}"


def mac_chain(refid: str) -> str:
    return iface_chain(refid) + "-mac"


def comment(refid: str) -> str:
    return "macspoofchk-" + refid


def _prerouting_rules(refid: str) -> list[dict]:  # type: ignore[type-arg]
    """This port's jump rules in the shared base chain (found by their comment)."""
    listing = nft.list_json("chain", FAMILY, TABLE, BASE_CHAIN, missing_ok=True)
    return [r for r in nft.rules(listing) if r.get("comment") == comment(refid)]


def _delete_prerouting_rules(refid: str) -> str:
    """nft commands deleting this port's rules in the base chain (by handle)."""
    return "".join(f"delete rule {FAMILY} {TABLE} {BASE_CHAIN} handle {r['handle']}\n"
                   for r in _prerouting_rules(refid))


def setup(host_iface: str, mac: str, refid: str) -> None:
    """Only frames from ``mac`` may enter the bridge through ``host_iface`` (idempotent)."""
    ic, mc, cm = iface_chain(refid), mac_chain(refid), nft.quote(comment(refid))
    stale = _delete_prerouting_rules(refid)
    nft.run(f"add table {FAMILY} {TABLE}\n"
            f"add chain {FAMILY} {TABLE} {BASE_CHAIN} "
            "{ type filter hook prerouting priority -300; policy accept; }\n"
            f"add chain {FAMILY} {TABLE} {ic}\n"
            f"add chain {FAMILY} {TABLE} {mc}\n"
            f"flush chain {FAMILY} {TABLE} {ic}\n"
            f"flush chain {FAMILY} {TABLE} {mc}\n"
            + stale +
            f"add rule {FAMILY} {TABLE} {BASE_CHAIN} iifname {nft.quote(host_iface)} jump {ic} comment {cm}\n"
            f"add rule {FAMILY} {TABLE} {ic} jump {mc} comment {cm}\n"
            f"add rule {FAMILY} {TABLE} {mc} ether saddr {mac} return comment {cm}\n"
            f"add rule {FAMILY} {TABLE} {mc} drop comment {cm}\n",
            what="macspoofchk setup")


def teardown(refid: str) -> None:
    """Remove the port's rules and chains; idempotent (nothing there: nothing to do)."""
    if not nft.table_exists(FAMILY, TABLE):
        return
    script = _delete_prerouting_rules(refid)
    chains = [c for c in (iface_chain(refid), mac_chain(refid)) if nft.chain_exists(FAMILY, TABLE, c)]
    script += "".join(f"flush chain {FAMILY} {TABLE} {chain}\n" for chain in chains)  # first: a jump into mc pins it
    script += "".join(f"delete chain {FAMILY} {TABLE} {chain}\n" for chain in chains)
    if script:
        nft.run(script, what="macspoofchk teardown")


def is_set_up(host_iface: str, mac: str, refid: str) -> bool:
    """Whether the spoof-check rules for this port are in place (for CHECK)."""
    rules = _prerouting_rules(refid)
    if not any(_iifname(r) == host_iface for r in rules):
        return False
    listing = nft.list_json("chain", FAMILY, TABLE, mac_chain(refid), missing_ok=True)
    text = str(nft.rules(listing)).lower()
    return mac.lower() in text


def _iifname(rule: dict) -> str | None:  # type: ignore[type-arg]
    """The interface name a rule matches with ``iifname``, from nft JSON; None when it matches none."""
    for expr in rule.get("expr", []):
        match = expr.get("match") if isinstance(expr, dict) else None
        if match and match.get("left", {}).get("meta", {}).get("key") == "iifname":
            right = match.get("right")
            return right if isinstance(right, str) else None
    return None
