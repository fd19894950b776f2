"""The dataplane writer: bring the kernel's table to a
:class:`~pycni.cluster.policy.compile.Desired` in one nftables transaction, touching only what
differs — reconciled against the kernel itself.

What the writer compares with is what the kernel holds, not what this process once sent: on
start and after a refused transaction it reads the table back (:func:`read_table`: the kernel's
netlink dumps, :mod:`pycni.net.nftdump`) and diffs the wanted state against that; the agent's
periodic check asks the nf_tables generation id whether anyone else committed since, and only
then has the table read back by a child process (:class:`Readback`, :meth:`Writer.adopt`). It
never deletes or empties the table: a restarted agent takes the kernel's state over as it finds
it and moves it towards the wanted one, so the rules in force hold until the transaction that
replaces them commits (the kernel applies all of it or none). Between reads it keeps a mirror
of what it committed and diffs only the objects the index marked dirty.

The difference is a list of operations (:class:`Op`, :func:`diff`), sent as one nf_tables
netlink batch (:func:`batch`; rules encoded by :mod:`pycni.net.nftrule` as nft encodes them), or
as an nft script through libnftables (:func:`script`) when the batch does not encode one of them
(the table's base objects, made once): libnftables fetches every
chain and set of the namespace before each transaction, milliseconds beside a large table.

Rules carry their text's digest as comment (``compile.rule_tag``), so a chain read back is
compared by those tags, not by parsing nft's rendering of its rules; a chain whose tags differ
is flushed and refilled within the transaction. A set whose members differ gets ``add element``
/ ``delete element``; a map element is replaced; objects no longer wanted (and unknown ones in
our table) are deleted last, once nothing refers to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

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

if TYPE_CHECKING:
    from pycni.net.nftbatch import Batch

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


IFNAME_SETS = ("covered", "ingress", "egress")  # (keyed by interface name; the last two verdict maps)


def _key_text(set_name: str, key: bytes) -> str | None:
    """A set element's key as the text the index writes it in (by what the set's name says it
    holds); None for a set of ours we do not know (deleted as stale)."""
    import socket

    if set_name in IFNAME_SETS:
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


_PROTO_NUMBERS = {name: number for number, name in _PROTOS.items()}


def _key_bytes(set_name: str, text: str) -> bytes | None:
    """The inverse of :func:`_key_text`: an element's key as the kernel holds it; None for what
    this does not know (the transaction then goes through libnftables)."""
    import socket

    if set_name in IFNAME_SETS:  # (the interface's name itself)
        raw = text.encode()
        return raw.ljust(16, b"\0") if 0 < len(raw) < 16 and b'"' not in raw else None
    fam = socket.AF_INET if set_name.endswith("_4") else socket.AF_INET6 if set_name.endswith("_6") else None
    if fam is None:
        return None
    try:
        if set_name.startswith("s_"):
            return socket.inet_pton(fam, text)
        if set_name.startswith("np_"):
            addr, proto, port = text.split(" . ")
            number = _PROTO_NUMBERS.get(proto)
            return socket.inet_pton(fam, addr) + bytes([number, 0, 0, 0]) + int(port).to_bytes(2, "big") + b"\0\0" \
                if number is not None else None
    except (OSError, ValueError):
        return None
    return None


class Op(NamedTuple):
    """One command of a transaction, as :func:`diff` computes it; :func:`script` renders it as
    nft text, :func:`batch` as a netlink message.

    ``verb`` ``kind`` ``name`` ``args``:
    add table · add base NAME (decl) · add basechain NAME (decl) · add set NAME (type) ·
    add|delete element SET (item, ...) · add chain NAME (comment?) · flush chain NAME ·
    add rule CHAIN (text) · delete chain NAME · delete set|map NAME. An element of a selector or
    port set is its text; of ``covered``, an interface name; of a verdict map, an interface name
    to delete and (name, verdict) to add."""

    verb: str
    kind: str
    name: str = ""
    args: tuple[Any, ...] = ()


def script(ops: list[Op], table: str = TABLE) -> str:
    """``ops`` as an nft script ('' for none)."""
    t = f"inet {table}"
    lines: list[str] = []
    for op in ops:
        verb, kind, name, args = op
        if kind == "table":
            lines.append(f"add table {t}")
        elif kind == "base":
            lines.append("add " + args[0].replace("{t}", t))
        elif kind == "basechain":
            lines.append(f"add chain {t} {name} {args[0]}")
        elif kind == "set" and verb == "add":
            lines.append(f"add set {t} {name} {{ type {args[0]}; }}")
        elif kind == "element":
            items = args if name not in IFNAME_SETS else (
                f'"{i}"' if isinstance(i, str) else f'"{i[0]}" : {i[1]}' for i in args)
            lines.append(f"{verb} element {t} {name} {_elements(items)}")
        elif kind == "chain" and verb == "add":
            lines.append(f"add chain {t} {name}" + (f' {{ comment "{args[0]}"; }}' if args else ""))
        elif kind == "rule":
            lines.append(f"add rule {t} {name} {_tagged(args[0])}")
        else:  # flush chain, delete chain, delete set, delete map
            lines.append(f"{verb} {kind} {t} {name}")
    return "\n".join(lines) + ("\n" if lines else "")


def batch(ops: list[Op], table: str = TABLE) -> Batch | None:
    """``ops`` as one netlink batch (:class:`pycni.net.nftbatch.Batch`), or None when one of them
    is not encoded there — the table, its base objects and base chains (made once), a rule
    outside :mod:`pycni.net.nftrule`'s grammar (none the compiler writes), a key of a set this
    does not know, a batch past :data:`~pycni.net.nftbatch.BATCH_AT_MOST` — and libnftables is to run :func:`script`."""
    from pycni.net import nftbatch, nftrule

    b = nftbatch.Batch("inet", table)
    for verb, kind, name, args in ops:
        if kind == "set" and verb == "add":
            if not b.add_set(name, args[0]):
                return None
        elif kind in ("set", "map"):
            b.delete_set(name)
        elif kind == "element":
            verdict_map = name in ("ingress", "egress")
            elements: list[tuple[bytes, tuple[int, str] | None]] = []
            for item in args:
                verdict: tuple[int, str] | None = None
                if verdict_map and verb == "add":
                    if isinstance(item, str):
                        return None  # (a map element needs its verdict)
                    item, word = item
                    verdict = nftrule.parse_verdict(word)
                    if verdict is None:
                        return None
                key = _key_bytes(name, item)
                if key is None:
                    return None
                elements.append((key, verdict))
            b.elements(verb == "add", name, elements)
        elif kind == "chain":
            if verb == "add":
                b.add_chain(name, args[0] if args else None)
            elif verb == "flush":
                b.flush_chain(name)
            else:
                b.delete_chain(name)
        elif kind == "rule":
            expressions = nftrule.encode(args[0], b.add_anonymous_set)
            if expressions is None:
                return None
            b.add_rule(name, expressions, rule_tag(args[0]))
        else:  # the table, base objects and base chains
            return None
        if b.size > nftbatch.BATCH_AT_MOST:
            return None
    return b


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


def _tagged(rule: str) -> str:
    return f'{rule} comment "{rule_tag(rule)}"'


def _tags(rules: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(rule_tag(r) for r in rules)


def diff(have: Kernel | None, want: Desired, dirty: Dirty | None = None) -> list[Op]:
    """The one transaction that turns ``have`` (None: no table) into ``want`` (empty when nothing
    differs). With ``dirty`` only those objects are compared (the rest is taken to be as wanted);
    without, everything is — the base objects too."""
    k = have if have is not None else Kernel()
    ops: list[Op] = []
    if dirty is None:
        if have is None:
            ops.append(Op("add", "table"))
        for name, decl in BASE_OBJECTS.items():
            if name not in k.base:
                ops.append(Op("add", "base", name, (decl,)))
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
            ops.append(Op("add", "set", name, (typ,)))
            added, removed = sorted(elems), []
        elif old[0] != typ:
            raise ValueError(f"set {name} has type {old[0]}, not {typ}")
        else:
            added, removed = sorted(elems - old[1]), sorted(old[1] - elems)
        if removed:
            ops.append(Op("delete", "element", name, tuple(removed)))
        if added:
            ops.append(Op("add", "element", name, tuple(added)))
    stale_chains: list[str] = []
    fills: list[Op] = []
    for name in sorted(chain_names):
        wanted = want.chains.get(name)
        if wanted is None:
            if name in k.chains:
                stale_chains.append(name)
            continue
        rules = wanted
        if name not in k.chains:
            comment = want.comments.get(name)
            ops.append(Op("add", "chain", name, (comment,) if comment else ()))
        elif k.chains[name] == _tags(rules):
            continue
        else:
            fills.append(Op("flush", "chain", name))
        fills += [Op("add", "rule", name, (r,)) for r in rules]
    ops += fills
    if dirty is None:
        # (after the other chains: the base chains' rules may jump to the fail-closed ones)
        for name, (decl, rules) in base_chains(want.log).items():
            prio, tags = k.base_chains.get(name, (None, ()))
            if name in k.base_chains and prio != BASE_PRIORITY[name]:
                # (made by something else: replace it in this same transaction)
                ops += [Op("flush", "chain", name), Op("delete", "chain", name)]
                tags = ()
            if name not in k.base_chains or prio != BASE_PRIORITY[name]:
                ops.append(Op("add", "basechain", name, (decl,)))
            if tags != _tags(rules):
                if tags:
                    ops.append(Op("flush", "chain", name))
                ops += [Op("add", "rule", name, (r,)) for r in rules]
    for mapname in ("ingress", "egress"):
        old_map, new_map = getattr(k, mapname), getattr(want, mapname)
        keys = set(old_map) | set(new_map) if dirty is None else getattr(dirty, mapname)
        gone = sorted(i for i in keys if i in old_map and new_map.get(i) != old_map[i])
        if gone:
            ops.append(Op("delete", "element", mapname, tuple(gone)))
        fresh = sorted(i for i in keys if i in new_map and old_map.get(i) != new_map[i])
        if fresh:
            ops.append(Op("add", "element", mapname, tuple((i, new_map[i]) for i in fresh)))
    # covered last among the additions: an interface counts as covered once its verdicts are in
    cov = k.covered | want.covered if dirty is None else dirty.covered
    added_cov = sorted(i for i in cov if i in want.covered and i not in k.covered)
    removed_cov = sorted(i for i in cov if i in k.covered and i not in want.covered)
    if added_cov:
        ops.append(Op("add", "element", "covered", tuple(added_cov)))
    if removed_cov:
        ops.append(Op("delete", "element", "covered", tuple(removed_cov)))
    # what nothing refers to any more: chains (jumps to them are gone above), then sets
    ops += [Op("flush", "chain", c) for c in stale_chains]
    ops += [Op("delete", "chain", c) for c in stale_chains]
    ops += [Op("delete", "map" if k.sets[s][0] == "?" else "set", s) for s in stale_sets]
    return ops


def diff_script(have: Kernel | None, want: Desired, dirty: Dirty | None = None, table: str = TABLE) -> str:
    """:func:`diff` as an nft script ('' when nothing differs)."""
    return script(diff(have, want, dirty), table)


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


GENERATIONS = 1 << 32  # nf_tables' generation id is a 32-bit counter


def _after(gen: int, other: int) -> bool:
    """Whether generation ``gen`` is ``other`` or later (the counter wraps)."""
    return (gen - other) % GENERATIONS < GENERATIONS // 2


def generation(ask: Callable[[], int] | None = None) -> int | None:
    """The namespace's nf_tables generation id (through ``ask``, else a socket of its own); None
    when the kernel does not say."""
    from pycni.net import nftdump

    try:
        return (ask or nftdump.generation)()
    except OSError:  # (NetlinkError too): unknown, so the kernel is read back
        return None


def read_consistent(table: str = TABLE, ask: Callable[[], int] | None = None) -> tuple[Kernel | None, int | None]:
    """Our table and the generation it was read at; None for the generation when a commit (anyone's)
    came during the dumps, so the snapshot may mix two states."""
    before = generation(ask)
    have = read_table(table)
    return have, before if before is not None and generation(ask) == before else None


class Writer:
    """Holds a mirror of the kernel's table; :meth:`write` sends only what differs.

    It also knows when the mirror is certainly what the kernel holds: ``clean``, the generation
    id at which the table was read back or at which our own commit was the only one since. A
    periodic check (:meth:`unchanged`) then costs one netlink request instead of a read-back."""

    def __init__(self, table: str = TABLE) -> None:
        self.table = table
        self.mirror: Kernel | None = None  # None: read the kernel before the next write
        self.reads = 0  # how many times the table was read back (start, resyncs, refusals)
        self.commits = 0  # transactions the kernel took from this writer
        self.clean: int | None = None  # the generation at which the kernel's table = mirror, if known
        self.committed_at: int | None = None  # the generation right after our last commit (None: unknown)
        self.skips = 0  # periodic checks answered by the generation id alone (nothing committed since ours)
        self.netlink_batches = 0  # transactions sent as netlink batches (no libnftables)
        from pycni.net.nftdump import Generation

        self.generation = Generation()  # (one socket kept: asked after every commit)

    def reconcile_next(self) -> None:
        """Have the next write read the kernel's table and compare everything with it."""
        self.mirror = None

    def unchanged(self) -> bool:
        """Whether nothing was committed in this namespace since the kernel's table was known to be
        the mirror (our last read-back, or our last commit when it was the only one since)."""
        return self.mirror is not None and self.clean is not None and generation(self.generation) == self.clean

    def write(self, want: Desired, dirty: Dirty | None) -> tuple[str, bool]:
        """Program ``want`` (``dirty``: what changed since the last write; None: anything may
        have). Returns the script sent ('' when nothing differed) and whether the kernel was read
        for it. A refusal raises :class:`pycni.net.nft.NftError`; the next write reconciles."""
        read = self.mirror is None
        if read:
            self.reads += 1
            have, self.clean = read_consistent(self.table, self.generation)
            dirty = None
        else:
            have = self.mirror
        return self._send(have, want, dirty), read

    def adopt(self, snapshot: Kernel | None, at: int | None, commits: int, want: Desired) -> str | None:
        """Reconcile with a table read back off the event path (:class:`Readback`): ``snapshot``
        read at generation ``at`` when this writer had made ``commits`` commits. Used only when it
        shows the kernel as it is after our last commit (no commit of ours since it was started,
        or read at a generation after ours); then the whole difference is sent in one
        transaction and the script returned. None: discarded (read again)."""
        if not self.usable(at, commits):
            return None
        self.reads += 1
        self.clean = at
        return self._send(snapshot, want, None)

    def checked(self, at: int) -> None:
        """A usable snapshot read at generation ``at`` was found to be exactly the mirror
        (:class:`Comparison`) — the usual answer when the commits that moved the generation were
        someone else's, in their own tables: the table is known clean at ``at``."""
        self.reads += 1
        self.clean = at

    def _commit_batch(self, b: Batch) -> None:
        """A transaction as one netlink batch (:mod:`pycni.net.nftbatch`: no libnftables cache to
        fetch); a refusal raises NftError like libnftables' would."""
        from pycni.net.nft import NftError
        from pycni.spec.errors import IO_FAILURE

        self.netlink_batches += 1
        try:
            b.commit(self.generation.socket())
        except OSError as e:  # (NetlinkError too; nothing was applied)
            self.generation.close()
            raise NftError(IO_FAILURE, "policy update failed", f"the kernel refused the batch: {e}") from None

    def usable(self, at: int | None, commits: int) -> bool:
        """Whether a table read at generation ``at``, started when this writer had made ``commits``
        commits, shows the kernel as it is after our last commit."""
        if self.mirror is None or at is None:
            return False
        return commits == self.commits or (self.committed_at is not None and _after(at, self.committed_at))

    def _send(self, have: Kernel | None, want: Desired, dirty: Dirty | None) -> str:
        from pycni.net import nft

        ops = diff(have, want, dirty)
        if not ops:
            self.mirror = have if have is not None else Kernel()
            return ""
        self.mirror = None
        clean, self.clean = self.clean, None
        text = script(ops, self.table)
        b = batch(ops, self.table)
        if b is not None:
            self._commit_batch(b)
        else:
            nft.run(text, what="policy update")
        self.commits += 1
        self.committed_at = generation(self.generation)
        if clean is not None and self.committed_at is not None and self.committed_at == (clean + 1) % GENERATIONS:
            self.clean = self.committed_at  # (ours was the only commit since the table was known)
        k = have if have is not None else Kernel()
        _commit(k, want, dirty)
        self.mirror = k
        return text


PART_WEIGHT = 2000  # entries and set elements in one part of a read-back (compared in one step)


def _pack(k: Kernel) -> list[tuple[str, Any]]:
    """``k`` as parts that can be compared one at a time: the head (how many entries each
    collection has, the base objects), then the maps, ``covered``, the chains and the sets in
    slices of about :data:`PART_WEIGHT` entries and elements."""
    parts: list[tuple[str, Any]] = [("head", (len(k.ingress), len(k.egress), len(k.covered), len(k.chains),
                                              len(k.sets), k.base, k.base_chains))]
    collections: list[tuple[str, dict[Any, Any]]] = [
        ("ingress", k.ingress), ("egress", k.egress), ("covered", dict.fromkeys(k.covered)), ("chains", k.chains),
        ("sets", k.sets)]
    for kind, objects in collections:
        part: dict[Any, Any] = {}
        weight = 0
        for name, value in objects.items():
            part[name] = value
            weight += 1 + (len(value[1]) if kind == "sets" else len(value) if kind == "chains" else 0)
            if weight >= PART_WEIGHT:
                parts.append((kind, part))
                part, weight = {}, 0
        if part:
            parts.append((kind, part))
    return parts


class Readback:
    """Our table read back by a child process (``python -m pycni.cluster.policy.nftsync TABLE``),
    waited for by a thread: at 10,000 endpoints decoding the dumps is 0.2-0.9 s of Python that,
    in a thread of the agent, would hold the interpreter lock against the event path. The child
    inherits the namespace; it answers the generation it read at (None when a commit came during
    the dumps) on a line of its own, then the snapshot as ``marshal`` data, in parts
    (:func:`_pack`): the agent compares them with its mirror a part at a time (:class:`Comparison`),
    so taking a snapshot holds no event up for more than one part's work, and unmarshals the
    whole only to repair (:meth:`snapshot`). ``commits``: the writer's count when it was started
    (see :meth:`Writer.usable`)."""

    def __init__(self, table: str, commits: int) -> None:
        import threading

        self.table = table
        self.commits = commits
        self.at: int | None = None
        self.error = ""  # why there is no answer ('' : there is one)
        self._packed = b""  # the snapshot: marshalled parts (each after its length), or one None (no table)
        self.thread = threading.Thread(target=self._run, name="policy-readback", daemon=True)
        self.thread.start()

    def done(self) -> bool:
        return not self.thread.is_alive()

    def parts(self) -> Iterator[tuple[str, Any]]:
        """The snapshot's parts, unmarshalled one at a time; ("none", None) when there was no table.
        (Each is framed by its length: ``marshal.load`` from a file reads every string through a
        method call, ten times slower than ``loads`` of the part's bytes.)"""
        import marshal

        data = memoryview(self._packed)
        offset = 0
        while offset + 4 <= len(data):
            size = int.from_bytes(data[offset:offset + 4], "big")
            part = marshal.loads(data[offset + 4:offset + 4 + size])
            offset += 4 + size
            yield ("none", None) if part is None else part

    def snapshot(self) -> Kernel | None:
        """The table as read (None: there was none)."""
        k = Kernel()
        for kind, payload in self.parts():
            if kind == "none":
                return None
            if kind == "head":
                k.base, k.base_chains = payload[-2:]
            else:
                getattr(k, kind).update(payload)
        return k

    def _run(self) -> None:
        import os
        import subprocess
        import sys

        # (the directory holding the pycni package, for a child of an agent run from a source tree)
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        try:
            proc = subprocess.run([sys.executable, "-m", "pycni.cluster.policy.nftsync", self.table],
                                  capture_output=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.error = f"the reader did not answer: {e}"
            return
        head, newline, self._packed = proc.stdout.partition(b"\n")
        if proc.returncode != 0 or not newline:
            lines = proc.stderr.decode(errors="replace").strip().splitlines()
            self.error = f"the reader failed ({proc.returncode}): {lines[-1] if lines else 'no message'}"
            return
        self.at = int(head) if head != b"-" else None


class Comparison:
    """A finished :class:`Readback` compared with the writer's mirror a part at a time, between
    events: at 10,000 endpoints the whole comparison is ~8 ms of CPU (~20 ms under load) and its
    unmarshalling ~3 ms, which in one piece held up the event that arrived meanwhile. Each
    :meth:`step` works until its time budget is spent and says how far it got. A commit of ours
    before the end makes the snapshot useless (:meth:`Writer.usable`): dropped."""

    def __init__(self, writer: Writer, readback: Readback) -> None:
        self.writer = writer
        self.readback = readback
        self._parts = readback.parts()

    def step(self, budget: float = 0.0005) -> str | None:
        """None: more to compare (call again); else ``"stale"`` (a commit of ours since the read:
        drop it), ``"equal"`` (the table is the mirror) or ``"differs"`` (repair: the whole
        :meth:`Readback.snapshot` to :meth:`Writer.adopt`)."""
        import time

        rb, m = self.readback, self.writer.mirror
        if m is None or not self.writer.usable(rb.at, rb.commits):
            return "stale"
        end = time.perf_counter() + budget
        for kind, payload in self._parts:
            if kind == "none":
                return "differs"
            if kind == "head":
                *counts, base, base_chains_ = payload
                same = (counts == [len(m.ingress), len(m.egress), len(m.covered), len(m.chains), len(m.sets)]
                        and base == m.base and base_chains_ == m.base_chains)
            elif kind == "covered":
                same = payload.keys() <= m.covered
            else:  # (with the counts equal, every entry found equal makes the whole equal)
                same = payload.items() <= getattr(m, kind).items()
            if not same:
                return "differs"
            if time.perf_counter() > end:
                return None
        return "equal"


def _readback_main(table: str) -> None:
    """The child of :class:`Readback`: the generation the table was read at, then the table."""
    import marshal
    import sys

    have, at = read_consistent(table)
    out = sys.stdout.buffer
    out.write(b"-\n" if at is None else b"%d\n" % at)
    for part in _pack(have) if have is not None else [None]:
        data = marshal.dumps(part)
        out.write(len(data).to_bytes(4, "big") + data)


if __name__ == "__main__":
    import sys

    _readback_main(sys.argv[1] if len(sys.argv) > 1 else TABLE)
