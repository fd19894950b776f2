"""Bring the kernel from one :class:`~pycni.cluster.policy.compile.Desired` to the next in one
nftables transaction, touching only what differs.

A set whose members changed gets ``add element`` / ``delete element``; a chain whose rules
changed is flushed and refilled (its name, and every jump to it, stay); a map element is
replaced; objects no longer wanted are deleted last, once nothing refers to them. The whole
script is one transaction: the kernel applies all of it or none, so no packet ever sees half a
change. :func:`full_script` rebuilds the table from nothing — also atomically (delete and
re-add in one transaction), which is how an agent (re)starts without opening a window: the
old rules hold until the new ones replace them.
"""

from __future__ import annotations

from pycni.cluster.policy.compile import TABLE, Desired, base_script


def _elements(items: list[str]) -> str:
    return "{ " + ", ".join(items) + " }"


def _quoted(iface: str) -> str:
    return f'"{iface}"'


def full_script(want: Desired, table: str = TABLE) -> str:
    """The whole table as one transaction that replaces whatever is there."""
    t = f"inet {table}"
    lines = [f"add table {t}", f"delete table {t}", *base_script(table)]
    lines += diff_script(Desired(), want, table).splitlines()
    return "\n".join(lines) + "\n"


def diff_script(have: Desired, want: Desired, table: str = TABLE) -> str:
    """The commands that turn ``have`` into ``want`` ('' when they are the same)."""
    t = f"inet {table}"
    lines: list[str] = []
    hs, hc = have.sets, have.chains
    # (a set or chain kept as it was is the same object: the common case, cheap to pass over)
    for name, (typ, elems) in sorted(kv for kv in want.sets.items() if hs.get(kv[0]) is not kv[1]):
        old = hs.get(name)
        if old is None:
            lines.append(f"add set {t} {name} {{ type {typ}; }}")
            added, removed = sorted(elems), []
        else:
            added, removed = sorted(elems - old[1]), sorted(old[1] - elems)
        if removed:
            lines.append(f"delete element {t} {name} {_elements(removed)}")
        if added:
            lines.append(f"add element {t} {name} {_elements(added)}")
    new_chains = sorted(set(want.chains) - set(have.chains))
    lines += [f"add chain {t} {c}" for c in new_chains]
    for name, rules in sorted(kv for kv in want.chains.items() if hc.get(kv[0]) is not kv[1]):
        if hc.get(name) == rules:
            continue
        if name in have.chains:
            lines.append(f"flush chain {t} {name}")
        lines += [f"add rule {t} {name} {r}" for r in rules]
    for mapname in ("ingress", "egress"):
        old_map, new_map = getattr(have, mapname), getattr(want, mapname)
        gone = sorted(k for k in old_map if new_map.get(k) != old_map[k])
        if gone:
            lines.append(f"delete element {t} {mapname} {_elements([_quoted(k) for k in gone])}")
        fresh = sorted(k for k in new_map if old_map.get(k) != new_map[k])
        if fresh:
            lines.append(f"add element {t} {mapname} "
                         f"{_elements([f'{_quoted(k)} : {new_map[k]}' for k in fresh])}")
    # covered last among the additions: an interface counts as covered once its verdicts are in
    added_cov, removed_cov = sorted(want.covered - have.covered), sorted(have.covered - want.covered)
    if added_cov:
        lines.append(f"add element {t} covered {_elements([_quoted(i) for i in added_cov])}")
    if removed_cov:
        lines.append(f"delete element {t} covered {_elements([_quoted(i) for i in removed_cov])}")
    # what nothing refers to any more: chains (jumps to them are gone above), then sets
    stale_chains = sorted(set(have.chains) - set(want.chains))
    lines += [f"flush chain {t} {c}" for c in stale_chains]
    lines += [f"delete chain {t} {c}" for c in stale_chains]
    lines += [f"delete set {t} {s}" for s in sorted(set(have.sets) - set(want.sets))]
    return "\n".join(lines) + ("\n" if lines else "")


class Programmer:
    """Holds what was last applied; ``apply`` sends only the difference (the first time, and
    after a failure, the whole table)."""

    def __init__(self, table: str = TABLE) -> None:
        self.table = table
        self.applied: Desired | None = None

    def apply(self, want: Desired) -> str:
        """Program ``want``; returns the script sent ('' when nothing changed). A failure raises
        :class:`pycni.net.nft.NftError` and leaves the next call to rebuild everything."""
        from pycni.net import nft

        script = full_script(want, self.table) if self.applied is None else diff_script(self.applied, want,
                                                                                         self.table)
        if not script:
            return ""
        self.applied = None
        nft.run(script, what="policy update")
        self.applied = want
        return script

    def remove(self) -> None:
        """Delete the table (pods of this node are then unprotected and unblocked alike)."""
        from pycni.net import nft

        nft.run(f"add table inet {self.table}\ndelete table inet {self.table}\n", what="policy table removal")
        self.applied = None
