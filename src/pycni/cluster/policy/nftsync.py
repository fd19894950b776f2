"""The dataplane writer: bring the kernel's table to a :class:`~pycni.cluster.policy.compile.Desired`
in one nftables transaction, touching only what differs — reconciled against the kernel itself.

What the writer compares with is what the kernel holds, not what this process once sent: on
start, on every resync and after a refused transaction it reads the table back
(:func:`read_table`: the kernel's netlink dumps, :mod:`pycni.net.nftdump`) and diffs the wanted
state against that. It never deletes or empties the
table: a restarted agent takes the kernel's state over as it finds it and moves it towards the
wanted one, so the rules in force hold until the transaction that replaces them commits (the
kernel applies all of it or none). Between reads it keeps a mirror of what it committed and
diffs only the objects the index marked dirty.

Rules carry their text's digest as comment (``compile.rule_tag``), so a chain read back is
compared by those tags, not by parsing nft's rendering of its rules; a chain whose tags differ
is flushed and refilled within the transaction. A set whose members differ gets ``add element``
/ ``delete element``; a map element is replaced; objects no longer wanted (and unknown ones in
our table) are deleted last, once nothing refers to them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pycni.cluster.policy.compile import (
    BASE_CHAINS,
    BASE_OBJECTS,
    BASE_PRIORITY,
    PORT_SET_TYPES,
    SET_TYPES,
    Desired,
    base_chains,
    rule_tag,
)
from pycni.cluster.policy.workload import TABLE

NF_INET_FORWARD, NF_ACCEPT = 2, 1


@dataclass
class Kernel:
    """Our table as the kernel holds it (chains as their rules' tags; None: a rule without one)."""

    sets: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    chains: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    ingress: dict[str, str] = field(default_factory=dict)
    egress: dict[str, str] = field(default_factory=dict)
    covered: set[str] = field(default_factory=set)
    base: set[str] = field(default_factory=set)  # base objects present (covered, maps)
    base_chains: dict[str, tuple[int | None, tuple[str | None, ...]]] = field(default_factory=dict)


@dataclass
class Dirty:
    """What changed in a Desired since the last write (names of sets and chains, map keys)."""

    sets: set[str] = field(default_factory=set)
    chains: set[str] = field(default_factory=set)
    ingress: set[str] = field(default_factory=set)
    egress: set[str] = field(default_factory=set)
    covered: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.sets or self.chains or self.ingress or self.egress or self.covered)


_PROTOS = {6: "tcp", 17: "udp", 132: "sctp"}


def _key_text(set_name: str, key: bytes) -> str | None:
    """A set element's key as the text the index writes it in (by what the set's name says it
    holds); None for a set of ours we do not know (deleted as stale)."""
    import socket

    if set_name in ("covered", "ingress", "egress"):
        return key.split(b"\0", 1)[0].decode(errors="replace")
    fam = socket.AF_INET if set_name.endswith("_4") else socket.AF_INET6 if set_name.endswith("_6") else None
    if fam is None:
        return None
    size = 4 if fam == socket.AF_INET else 16
    if set_name.startswith("s_") and len(key) == size:
        return socket.inet_ntop(fam, key)
    if set_name.startswith("np_") and len(key) == size + 8:  # addr . proto (padded to 4) . port (padded)
        proto = _PROTOS.get(key[size], str(key[size]))
        port = int.from_bytes(key[size + 4:size + 6], "big")
        return f"{socket.inet_ntop(fam, key[:size])} . {proto} . {port}"
    return None


def read_table(table: str = TABLE) -> Kernel | None:
    """Our table as the kernel holds it now (netlink dumps, :mod:`pycni.net.nftdump`); None when
    there is none."""
    from pycni.net import nftdump
    from pycni.net.errors import kernel_errors

    with kernel_errors(f"cannot read the nftables table inet {table} back from the kernel"):
        dumped = nftdump.read_table("inet", table)
    if dumped is None:
        return None
    k = Kernel()
    for s in dumped.sets.values():
        if s.name in BASE_OBJECTS:
            k.base.add(s.name)
        texts = [(_key_text(s.name, key), verdict) for key, verdict in s.elements]
        if s.name == "covered":
            k.covered = {t for t, _ in texts if t is not None}
        elif s.name in ("ingress", "egress"):
            getattr(k, s.name).update({t: v or "" for t, v in texts if t is not None})
        elif s.is_map or any(t is None for t, _ in texts) or not (s.name.startswith(("s_", "np_"))):
            k.sets[s.name] = ("?", frozenset())  # not ours to keep: deleted as stale
        else:
            typ = "" if not s.name.endswith(("_4", "_6")) else (
                SET_TYPES if s.name.startswith("s_") else PORT_SET_TYPES)[int(s.name[-1])]
            k.sets[s.name] = (typ, frozenset(t for t, _ in texts if t is not None))
    for c in dumped.chains.values():
        tags = tuple(c.rules)
        if c.name in BASE_CHAINS:
            good = c.hook == NF_INET_FORWARD and c.policy == NF_ACCEPT
            k.base_chains[c.name] = (c.priority if good else None, tags)
        else:
            k.chains[c.name] = tags
    return k


def _elements(items: Iterable[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def _q(iface: str) -> str:
    return f'"{iface}"'


def _tagged(rule: str) -> str:
    return f'{rule} comment "{rule_tag(rule)}"'


def _tags(rules: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(rule_tag(r) for r in rules)


def diff_script(have: Kernel | None, want: Desired, dirty: Dirty | None = None, table: str = TABLE) -> str:
    """The one transaction that turns ``have`` (None: no table) into ``want`` ('' when nothing
    differs). With ``dirty`` only those objects are compared (the rest is taken to be as wanted);
    without, everything is — the base objects too."""
    t = f"inet {table}"
    k = have if have is not None else Kernel()
    lines: list[str] = []
    if dirty is None:
        if have is None:
            lines.append(f"add table {t}")
        for name, decl in BASE_OBJECTS.items():
            if name not in k.base:
                lines.append("add " + decl.replace("{t}", t))
    set_names = set(want.sets) | set(k.sets) if dirty is None else dirty.sets
    chain_names = set(want.chains) | set(k.chains) if dirty is None else dirty.chains
    stale_sets: list[str] = []
    for name in sorted(set_names):
        new = want.sets.get(name)
        old = k.sets.get(name)
        if new is None:
            if old is not None:
                stale_sets.append(name)
            continue
        typ, elems = new
        if old is None:
            lines.append(f"add set {t} {name} {{ type {typ}; }}")
            added, removed = sorted(elems), []
        elif old[0] != typ:
            raise ValueError(f"set {name} has type {old[0]}, not {typ}")
        else:
            added, removed = sorted(elems - old[1]), sorted(old[1] - elems)
        if removed:
            lines.append(f"delete element {t} {name} {_elements(removed)}")
        if added:
            lines.append(f"add element {t} {name} {_elements(added)}")
    stale_chains: list[str] = []
    fills: list[str] = []
    for name in sorted(chain_names):
        wanted = want.chains.get(name)
        if wanted is None:
            if name in k.chains:
                stale_chains.append(name)
            continue
        rules = wanted
        if name not in k.chains:
            comment = want.comments.get(name)
            lines.append(f"add chain {t} {name}" + (f' {{ comment "{comment}"; }}' if comment else ""))
        elif k.chains[name] == _tags(rules):
            continue
        else:
            fills.append(f"flush chain {t} {name}")
        fills += [f"add rule {t} {name} {_tagged(r)}" for r in rules]
    lines += fills
    if dirty is None:
        # (after the other chains: the base chains' rules may jump to the fail-closed ones)
        for name, (decl, rules) in base_chains(want.log).items():
            prio, tags = k.base_chains.get(name, (None, ()))
            if name in k.base_chains and prio != BASE_PRIORITY[name]:
                # (made by something else: replace it in this same transaction)
                lines += [f"flush chain {t} {name}", f"delete chain {t} {name}"]
                tags = ()
            if name not in k.base_chains or prio != BASE_PRIORITY[name]:
                lines.append(f"add chain {t} {name} {decl}")
            if tags != _tags(rules):
                if tags:
                    lines.append(f"flush chain {t} {name}")
                lines += [f"add rule {t} {name} {_tagged(r)}" for r in rules]
    for mapname in ("ingress", "egress"):
        old_map, new_map = getattr(k, mapname), getattr(want, mapname)
        keys = set(old_map) | set(new_map) if dirty is None else getattr(dirty, mapname)
        gone = sorted(i for i in keys if i in old_map and new_map.get(i) != old_map[i])
        if gone:
            lines.append(f"delete element {t} {mapname} {_elements(map(_q, gone))}")
        fresh = sorted(i for i in keys if i in new_map and old_map.get(i) != new_map[i])
        if fresh:
            lines.append(f"add element {t} {mapname} {_elements(f'{_q(i)} : {new_map[i]}' for i in fresh)}")
    # covered last among the additions: an interface counts as covered once its verdicts are in
    cov = k.covered | want.covered if dirty is None else dirty.covered
    added_cov = sorted(i for i in cov if i in want.covered and i not in k.covered)
    removed_cov = sorted(i for i in cov if i in k.covered and i not in want.covered)
    if added_cov:
        lines.append(f"add element {t} covered {_elements(map(_q, added_cov))}")
    if removed_cov:
        lines.append(f"delete element {t} covered {_elements(map(_q, removed_cov))}")
    # what nothing refers to any more: chains (jumps to them are gone above), then sets
    lines += [f"flush chain {t} {c}" for c in stale_chains]
    lines += [f"delete chain {t} {c}" for c in stale_chains]
    lines += [f"delete {'map' if k.sets[s][0] == '?' else 'set'} {t} {s}" for s in stale_sets]
    return "\n".join(lines) + ("\n" if lines else "")


def _commit(k: Kernel, want: Desired, dirty: Dirty | None) -> None:
    """Make the mirror ``k`` say what a committed diff towards ``want`` left in the kernel."""
    sets = set(want.sets) | set(k.sets) if dirty is None else dirty.sets
    for name in sets:
        if name in want.sets:
            k.sets[name] = want.sets[name]
        else:
            k.sets.pop(name, None)
    chains = set(want.chains) | set(k.chains) if dirty is None else dirty.chains
    for name in chains:
        if name in want.chains:
            k.chains[name] = _tags(want.chains[name])
        else:
            k.chains.pop(name, None)
    for mapname in ("ingress", "egress"):
        old_map, new_map = getattr(k, mapname), getattr(want, mapname)
        keys = set(old_map) | set(new_map) if dirty is None else getattr(dirty, mapname)
        for i in keys:
            if i in new_map:
                old_map[i] = new_map[i]
            else:
                old_map.pop(i, None)
    cov = k.covered | want.covered if dirty is None else dirty.covered
    for i in cov:
        if i in want.covered:
            k.covered.add(i)
        else:
            k.covered.discard(i)
    if dirty is None:
        k.base = set(BASE_OBJECTS)
        k.base_chains = {name: (BASE_PRIORITY[name], _tags(rules))
                         for name, (_, rules) in base_chains(want.log).items()}


class Writer:
    """Holds a mirror of the kernel's table; :meth:`write` sends only what differs."""

    def __init__(self, table: str = TABLE) -> None:
        self.table = table
        self.mirror: Kernel | None = None  # None: read the kernel before the next write
        self.reads = 0  # how many times the table was read back (start, resyncs, refusals)

    def reconcile_next(self) -> None:
        """Have the next write read the kernel's table and compare everything with it."""
        self.mirror = None

    def write(self, want: Desired, dirty: Dirty | None) -> tuple[str, bool]:
        """Program ``want`` (``dirty``: what changed since the last write; None: anything may
        have). Returns the script sent ('' when nothing differed) and whether the kernel was read
        for it. A refusal raises :class:`pycni.net.nft.NftError`; the next write reconciles."""
        from pycni.net import nft

        read = self.mirror is None
        if read:
            self.reads += 1
            have = read_table(self.table)
            dirty = None
        else:
            have = self.mirror
        script = diff_script(have, want, dirty, self.table)
        if not script:
            self.mirror = have if have is not None else Kernel()
            return "", read
        self.mirror = None
        nft.run(script, what="policy update")
        k = have if have is not None else Kernel()
        _commit(k, want, dirty)
        self.mirror = k
        return script, read
