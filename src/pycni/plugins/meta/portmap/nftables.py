"""portmap's nftables backend (``"backend": "nftables"``): pycni's table ``inet pycni_hostport``.

Laid out so ADD and DEL cost does not grow with the number of containers already mapped:

* data maps ``hostports4`` / ``hostports6`` (proto . port -> container IP . port) and
  ``hostip4_hostports`` / ``hostip6_hostports`` (host IP . proto . port -> ...), looked up by
  ``dnat ... map`` in a ``hostports`` chain that the nat ``prerouting`` / ``output`` chains enter
  for local destinations only;
* sets ``masq4`` / ``masq6`` (source range . container IP . proto . port): connections we
  DNAT'd that come from the container's subnet (hairpin, neighbours), from 127/8 (localhost)
  or, with masqAll, from anywhere are masqueraded in ``postrouting``. Every element belongs
  to one container, so nothing of a network outlives its last container.

Data maps and sets rather than jumps: the kernel re-validates every jump target reachable
from the base chains when a transaction adds a jump, so per-container chains make each ADD
cost grow with the number of containers. Plain elements do not, and need no userspace cache
of the other containers' objects either.

Each element carries the comment ``id: <containerID> net: <network>``. ADD is one
transaction. DEL is one transaction when the runtime passes portMappings and prevResult, and
otherwise finds the elements by their comment, so rules never leak. A host port claimed by two
containers goes to the later one; the earlier one's DEL leaves it alone (the delete
transaction re-adds each element first, which fails when it maps elsewhere now). Configured
for nftables, DEL also removes the container's rules from the Go plugin's own nftables layout
(tables ``ip``/``ip6 cni_hostport``, rules commented with the container ID).
"""

from __future__ import annotations

from pycni.net import nft
from pycni.plugins.meta.portmap.backend import Backend, Unusable
from pycni.record import record
from pycni.spec.errors import INVALID_CONFIG, PLUGIN_SPECIFIC, CNIError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pycni.plugins.meta.portmap.plugin import PortmapConf

NFT_TABLE = "pycni_hostport"
T = f"inet {NFT_TABLE}"
MAP_ANY = {4: "hostports4", 6: "hostports6"}
MAP_HOSTIP = {4: "hostip4_hostports", 6: "hostip6_hostports"}
MASQ = {4: "masq4", 6: "masq6"}  # source range . container IP . proto . port: masquerade after DNAT
LOCALHOST4 = "127.0.0.0/8"
ANY = {4: "0.0.0.0/0", 6: "::/0"}
# Sets of earlier pycni versions (subnets shared by a network's containers, never removed):
# GC drops them.
LEGACY_SETS = ("targets4", "targets6", "masqall4", "masqall6", "container_nets4", "container_nets6")


def _ipx(family: int) -> str:
    return "ip" if family == 4 else "ip6"


def _addr_type(family: int) -> str:
    return "ipv4_addr" if family == 4 else "ipv6_addr"


def skeleton(conf: PortmapConf) -> list[str]:
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
            # No auto-merge (nor overlaps to merge: an element names its container's address);
            # with it every ADD made nft fetch every element of the table.
            f"add set {T} {MASQ[fam]} {{ type {a} . {a} . inet_proto . inet_service; flags interval; }}",
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
        # A DNAT'd connection from the container's own subnet or from the host itself would see
        # its replies bypass the NAT: masquerade it. One exact lookup, so deleting an element
        # needs no look at the others.
        cmds.append(f"add rule {T} postrouting ct status dnat {ipx} saddr . {ipx} daddr . meta l4proto . th dport "
                    f"@{MASQ[fam]} masquerade")
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


def element_comment(conf: PortmapConf) -> str:
    """Marks every element of this attachment, so a DEL without portMappings finds them."""
    return f"id: {conf.container_id} net: {conf.name}"[:nft.COMMENT_MAX]


def elements(conf: PortmapConf) -> list[Element]:
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
                sources = [ANY[fam]] if conf.masq_all else [str(net.network), *([LOCALHOST4] if fam == 4 else [])]
                target = f"{net.ip} . {m.protocol} . {m.container_port}"
                out += [Element(MASQ[fam], f"{src} . {target}") for src in sources]
    return list(dict.fromkeys(out))


def _render(v: Any) -> str:
    """An element key or value from nft's JSON back to nft syntax."""
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


def _listed(listing: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(map or set, key, data, comment) of every element of a table listing."""
    out = []
    for kind in ("map", "set"):
        for obj in nft.objects(listing, kind):
            for elem in obj.get("elem", []) or []:
                key, data = (elem[0], elem[1]) if kind == "map" and isinstance(elem, list) else (elem, "")
                comment = ""
                if isinstance(key, dict) and isinstance(key.get("elem"), dict):
                    comment = str(key["elem"].get("comment", ""))
                    key = key["elem"]["val"]
                out.append((obj["name"], _render(key), _render(data) if data != "" else "", comment))
    return out


def _missing_tool(e: nft.NftError) -> bool:
    return "command not found" in e.msg


def _list_table() -> dict[str, Any]:
    return nft.list_json("table", "inet", NFT_TABLE, missing_ok=True)


def _delete_by_comment(match: Any, what: str, listing: dict[str, Any] | None = None) -> None:
    """Delete the elements whose comment ``match`` accepts (one listing, one transaction)."""
    listing = _list_table() if listing is None else listing
    cmds = [f"delete element {T} {name} {{ {key} }}" for name, key, _data, comment in _listed(listing)
            if comment and match(comment)]
    if cmds:
        nft.run("\n".join(cmds) + "\n", what=what)


# The reference's own nftables layout (Go plugins from 1.5 with "backend": "nftables"): tables
# ip/ip6 cni_hostport whose rules are commented with the bare container ID.
REFERENCE_TABLE = "cni_hostport"
REFERENCE_CHAINS = ("hostports", "hostip_hostports", "masquerading")


def _unforward_reference(container_id: str) -> None:
    """Delete the rules the reference's nftables backend made for ``container_id``."""
    cmds = []
    for family in ("ip", "ip6"):
        listing = nft.list_json("table", family, REFERENCE_TABLE, missing_ok=True)
        cmds += [f"delete rule {family} {REFERENCE_TABLE} {r['chain']} handle {r['handle']}"
                 for r in nft.rules(listing)
                 if r.get("chain") in REFERENCE_CHAINS and r.get("comment") == container_id and "handle" in r]
    if cmds:
        nft.run("\n".join(cmds) + "\n", what="port mapping teardown (reference layout)")


class NftablesBackend(Backend):
    name = "nftables"

    def forward(self, conf: PortmapConf) -> None:
        """One transaction; a host port held by another container is taken over (newest wins)."""
        comment = nft.quote(element_comment(conf))
        mine = elements(conf)
        code = INVALID_CONFIG if conf.conditions_v4 or conf.conditions_v6 else PLUGIN_SPECIFIC
        try:
            nft.run("\n".join(skeleton(conf) + [el.add(comment) for el in mine]) + "\n", code=code,
                    what="port mapping setup")
            return
        except nft.NftError as e:
            if _missing_tool(e):
                raise Unusable(e.msg, e.details) from None
            if not e.exists:
                raise CNIError(e.code, "unable to set up nftables rules for port mappings", e.details) from None
        # Rare: a host port is mapped to another container. Take ports over element by element,
        # and undo everything if that fails.
        try:
            nft.run("\n".join(skeleton(conf)) + "\n", what="port mapping setup")
            for element in mine:
                try:
                    nft.run(element.add(comment) + "\n", what="port mapping setup")
                except nft.NftError as err:
                    if not err.exists:
                        raise
                    nft.run(f"{element.delete()}\n{element.add(comment)}\n", what="port mapping takeover")
        except CNIError as err:
            try:
                self.unforward(conf)
            except CNIError:
                pass
            raise CNIError(err.code, "unable to set up nftables rules for port mappings", err.details) from None

    def unforward(self, conf: PortmapConf) -> None:
        """Idempotent, and complete without portMappings. Where the config says nftables, the
        Go plugin (from 1.5) wrote its own nftables layout: that goes too."""
        try:
            self._unforward_ours(conf)
            if conf.backend == "nftables":
                _unforward_reference(conf.container_id)
        except nft.NftError as e:
            if not _missing_tool(e):
                raise

    @staticmethod
    def _unforward_ours(conf: PortmapConf) -> None:
        """Where this layout is the configured one, the elements ADD made are deleted straight
        away (one transaction when they are all there). Otherwise (the iptables backend, the
        default) the table is usually absent: one listing says so, rather than a transaction
        that fails and then the listing anyway."""
        if conf.backend != "nftables":
            listing = _list_table()
            if nft.objects(listing, "table"):
                mine = element_comment(conf)
                _delete_by_comment(lambda c: c == mine, "port mapping teardown", listing)
            return
        if conf.mappings and conf.nets:
            script = "".join(f"{e.probe()}\n{e.delete()}\n" for e in elements(conf))
            try:
                nft.run(script, what="port mapping teardown")
                return
            except nft.NftError as e:
                if _missing_tool(e):
                    raise
                # gone already, taken over by a newer container, or not what the runtime says
        mine = element_comment(conf)
        _delete_by_comment(lambda c: c == mine, "port mapping teardown")

    def check(self, conf: PortmapConf) -> None:
        """One listing of the table, compared as a set: linear in the elements."""
        have = {(name, key, data) for name, key, data, _comment in _listed(_list_table())}
        for e in elements(conf):
            if (e.name, e.key, e.data) not in have:
                raise CNIError(PLUGIN_SPECIFIC, "missing hostport rule",
                               f"{T} {e.name} has no element {e.key}{' : ' + e.data if e.data else ''} "
                               f"for container {conf.container_id}")

    def gc(self, conf: PortmapConf, valid: set[str]) -> None:
        """Drop elements of this network whose container is not among the valid attachments,
        and the shared sets earlier versions left behind."""
        import re  # here: only GC needs it

        pattern = re.compile(r"^id: (\S+) net: (.*)$")

        def stale(comment: str) -> bool:
            m = pattern.match(comment)
            return m is not None and m.group(2) == conf.name and m.group(1) not in valid

        try:
            listing = _list_table()
        except nft.NftError as e:
            if _missing_tool(e):
                return
            raise
        cmds = [f"delete element {T} {name} {{ {key} }}" for name, key, _data, comment in _listed(listing)
                if comment and stale(comment)]
        # Legacy shared sets are unreferenced once an ADD rewrote postrouting.
        legacy = {str(s.get("name")) for s in nft.objects(listing, "set")} & set(LEGACY_SETS)
        referenced = any(name in str(r) for r in nft.rules(listing) for name in legacy)
        if not referenced:
            cmds += [f"delete set {T} {name}" for name in sorted(legacy)]
        if cmds:
            nft.run("\n".join(cmds) + "\n", what="port mapping garbage collection")


BACKEND = NftablesBackend()
