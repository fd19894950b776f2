"""Cluster-wide IPAM state: blocks with node affinity, and handles. Stdlib only.

The keys and values are :mod:`pycni.cluster.model`'s; the store talks to the key-value seam of
:mod:`pycni.cluster.kv` (etcd, or :class:`~pycni.cluster.memkv.MemKV` in tests).

A range set's subnets are cut into blocks (/26 and /122 by default). A node *claims* a block
by creating the block and its affinity key in one transaction that requires both to be
absent, and allocates inside its blocks. Every change is one transaction guarded by the mod
revisions it read: an ADD writes the blocks with the addresses taken *and* creates the handle
(which must not exist yet), so an address is never taken without an owner, and two writers
never both win. A DEL deletes the handle and frees its addresses in one transaction. A lost
race is retried (bounded) on fresh state. The ordinal of an address is its offset in the
block; ``next`` makes allocation within a block round robin, so a freed address is not handed
out again at once (ARP caches on a shared L2 remember it).

**No ADD commits after the DEL of its attachment.** A read cannot prove an attachment is gone:
an ADD's transaction sent before a DEL (its plugin killed, or its answer lost) may still be
committed after the DEL read "no handle" — linearizability allows that order. So every DEL
writes a *tombstone* for the attachment (``P/ipam/deleted/...``, in its release transaction, or
alone — conditional on the handle's absence — when there was nothing to release), and every ADD
transaction compares the tombstone's mod revision with the one it read: a DEL that lands
between an ADD's read and its commit makes that commit fail. Whether a tombstone is this ADD's
own DEL is decided by etcd revisions, not by a clock: the ADD's *reference* is the header
revision of its first read, raised to the node's *floor* (the newest tombstone revision a DEL of
this node recorded beside the lock before this command began). A tombstone at or below the
reference was written before the ADD looked — an earlier DEL, and this ADD is a re-ADD: it
compares on it and deletes it with the handle's creation. A tombstone above it was written after
the ADD's first read: its DEL ran while the ADD was in progress, and the ADD gives up
("deleted") rather than resurrect the attachment. The floor is what keeps a re-ADD whose first
(serializable) read came from a member that had not yet applied the DEL from being refused.
Tombstones are bound to a lease of :data:`TOMBSTONE_TTL` seconds, far longer than any request
stays in flight, so they do not pile up.
"""

from __future__ import annotations

import os
import time

from pycni import ipaddr
from pycni.cluster.kv import if_absent, if_mod, op_delete, op_get, op_put
from pycni.cluster.model import (
    DEFAULT_PREFIX,
    Affinity,
    Block,
    Keys,
    Tombstone,
    handle_from_json,
    handle_json,
    handle_to_json,
    key_cidr,
)
from pycni.cluster.settings import DEFAULT_BLOCK_V4, DEFAULT_BLOCK_V6
from pycni.ipranges import IPAddress, IPNetwork, Range, RangeSet, range_for
from pycni.record import record

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any

    from pycni.cluster.kv import KVStore

MAX_ATTEMPTS = 64  # lost races before an ADD/DEL gives up (each retry reads fresh state)
# How long a DEL's tombstone lives: it must outlast any ADD request still in flight when the DEL
# ran. A plugin gives up after etcdTimeout (at most 300 s); etcd drops a proposal it cannot commit
# within its request timeout (seconds). Ten minutes bounds both with room to spare.
TOMBSTONE_TTL = 600
BATCH = 4  # blocks an ADD reads at a time while looking for room


class IpamError(Exception):
    """An allocation that cannot be made as asked (``kind``: "exhausted", "strict", "requested",
    "contention"); the plugin maps it to a CNI error."""

    def __init__(self, kind: str, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.kind = kind
        self.msg = msg
        self.details = details


def usable(block: IPNetwork, r: Range) -> tuple[int, int] | None:
    """The ordinals of ``block`` that ``r`` may hand out (inclusive), None when none."""
    base = int(block.network_address)
    lo = max(base, r.start_int)
    hi = min(int(block.broadcast_address), r.end_int)
    return (lo - base, hi - base) if lo <= hi else None


def free_ordinal(block: Block, r: Range) -> int | None:
    """The next free, allocatable ordinal of ``block`` in round-robin order from ``block.next``."""
    span = usable(block.cidr, r)
    if span is None:
        return None
    lo, hi = span
    n = hi - lo + 1
    start = block.next if lo <= block.next <= hi else lo
    base = int(block.cidr.network_address)
    taken = block.allocations
    for i in range(n):
        o = lo + (start - lo + i) % n
        if o not in taken and not r.is_reserved(base + o):
            return o
    return None


def blocks_of(rs: RangeSet, prefixlen: int) -> Iterator[tuple[IPNetwork, Range]]:
    """The blocks of the range set's subnets that overlap rangeStart..rangeEnd, in order (lazily:
    an IPv6 /64 holds 2**58 blocks of /122)."""
    for r in rs:
        plen = max(prefixlen, r.subnet.prefixlen)
        size = 1 << (r.subnet.max_prefixlen - plen)
        first = int(r.subnet.network_address)
        value = first + ((r.start_int - first) // size) * size
        cls = ipaddr.IPv4Network if r.version == 4 else ipaddr.IPv6Network
        while value <= r.end_int:
            yield cls((value, plen)), r
            value += size


def block_for(rs: RangeSet, prefixlen: int, ip: IPAddress) -> tuple[IPNetwork, Range] | None:
    r = range_for(rs, ip)
    if r is None:
        return None
    plen = max(prefixlen, r.subnet.prefixlen)
    return ipaddr.ip_network(f"{ip}/{plen}", strict=False), r


@record
class Assigned:
    """One address handed out: the address, its range (for prefix length and gateway)."""

    ip: IPAddress
    range: Range


class ClusterStore:
    """The IPAM state of one network as seen from one node."""

    def __init__(self, kv: KVStore, network: str, node: str, prefix: str = DEFAULT_PREFIX) -> None:
        self.kv = kv
        self.network = network
        self.node = node
        self.keys = Keys(prefix)
        self.blocks_prefix = self.keys.blocks_of(network)
        self.handles_prefix = self.keys.handles_of(network)
        self.affinity_prefix = self.keys.affinities_of(node, network)
        self.lost_races = 0  # transactions that lost to a concurrent writer and were retried
        # Blocks this node used last, newest first (a node-local hint the plugin keeps between
        # commands): read together with the handle, they save the ADD and the DEL a round trip.
        # Never trusted: a hinted block is used only if the affinity read lists it, and every
        # write compares revisions.
        self.hint: list[IPNetwork] = []
        self.sent_write = False  # an ADD's transaction went out (it may be applied even if no answer came)
        # Called once, just before an ADD's first transaction goes out (the plugin notes it beside the
        # lock, so a rollback DEL knows an ADD killed mid-flight may still commit).
        self.before_write: Any = None
        self._tomb_lease = 0  # one lease for every tombstone this store writes (GC releases many)
        # The node's floor (see the module docstring): read from beside the lock before the command
        # (0: none), raised to the revision of every tombstone this store writes, and kept for the
        # node's next commands.
        self.floor = 0

    # -- keys --

    def block_key(self, cidr: IPNetwork) -> str:
        return self.keys.block(self.network, cidr)

    def affinity_key(self, cidr: IPNetwork, node: str | None = None) -> str:
        return self.keys.affinity(node or self.node, self.network, cidr)

    def handle_key(self, cid: str, ifname: str) -> str:
        return self.keys.handle(self.network, cid, ifname)

    def tombstone_key(self, cid: str, ifname: str) -> str:
        return self.keys.tombstone(self.network, cid, ifname)

    def _tombstone(self) -> tuple[str, int]:
        """A tombstone's value (written now) and its lease."""
        if not self._tomb_lease:
            self._tomb_lease = self.kv.lease_grant(TOMBSTONE_TTL)
        return Tombstone(node=self.node, deleted=time.time()).to_json(), self._tomb_lease

    def ready(self) -> None:
        """One linearizable read (STATUS: does a member with a quorum answer?); raises when not."""
        self.kv.range(self.blocks_prefix, prefix=True, keys_only=True, limit=1)

    # -- reads --

    def handle(self, cid: str, ifname: str) -> dict[str, Any] | None:
        kv = self.kv.get(self.handle_key(cid, ifname))
        return handle_from_json(kv.value) if kv else None

    def handles(self) -> list[dict[str, Any]]:
        kvs, _rev = self.kv.get_prefix(self.handles_prefix)
        return [handle_from_json(kv.value) for kv in kvs]

    def blocks(self) -> list[Block]:
        kvs, _rev = self.kv.get_prefix(self.blocks_prefix)
        return [Block.from_json(kv.value, kv.mod_revision) for kv in kvs]

    def _get_blocks(self, cidrs: Sequence[IPNetwork], serializable: bool = False) -> dict[IPNetwork, Block]:
        if not cidrs:
            return {}
        res = self.kv.txn([], [op_get(self.block_key(c), serializable=serializable) for c in cidrs])
        out = {}
        for kvs in res.responses:
            for kv in kvs:
                b = Block.from_json(kv.value, kv.mod_revision)
                out[b.cidr] = b
        return out

    # -- ADD --

    def assign(self, cid: str, ifname: str, range_sets: Sequence[RangeSet], requested: Sequence[IPAddress],
               block_sizes: tuple[int, int] = (DEFAULT_BLOCK_V4, DEFAULT_BLOCK_V6),
               strict_affinity: bool = False) -> list[Assigned]:
        """One address per range set (a requested one where it lies), recorded under the handle.

        A handle that exists already is answered with what it holds (a repeated ADD, or a retry
        of one whose answer was lost), so the same attachment always gets the same addresses.
        """
        hkey = self.handle_key(cid, ifname)
        tkey = self.tombstone_key(cid, ifname)
        ref = first = 0  # a tombstone above revision ref is a DEL of this very ADD (set by the first read)
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                _pause(attempt)  # spread racing writers
            # The first try reads from the member at hand (serializable: no round to the leader); a
            # stale view only costs a lost compare, and a retry reads linearizably.
            fast = attempt == 0
            hinted = self.hint[:2 * BATCH]
            res = self.kv.txn([], [op_get(hkey, serializable=fast), op_get(tkey, serializable=fast),
                                     op_get(self.affinity_prefix, prefix=True, serializable=fast, keys_only=True),
                                     *(op_get(self.block_key(c), serializable=fast) for c in hinted)])
            existing, tomb, affs, *got = res.responses
            if not attempt:  # the first read: everything up to its revision was there before this ADD looked
                first = res.revision
                ref = max(self.floor, first)
            elif self.floor > res.revision:
                # A floor above what a linearizable read shows is from another etcd (the cluster was
                # rebuilt, revisions started again): it proves nothing here; forget it.
                ref, self.floor = first, 0
            if existing:
                kv = existing[0] if not fast else self.kv.get(hkey)  # a handle seen stale may be gone
                if kv is not None:
                    return self._assigned_from(handle_from_json(kv.value), range_sets)
            tomb_rev = self._check_tombstone(tomb, ref, cid, ifname)
            mine = [key_cidr(kv.key.rpartition("/")[2]) for kv in affs]
            plan = _Plan(self, f"{cid}/{ifname}", mine, block_sizes, strict_affinity, fast)
            plan.prefetched([Block.from_json(kv.value, kv.mod_revision) for kvs in got for kv in kvs])
            out = [plan.take(idx, rs, _requested_in(rs, requested)) for idx, rs in enumerate(range_sets)]
            handle = handle_json(self.network, cid, ifname, self.node,
                                 [f"{a.ip}/{a.range.subnet.prefixlen}" for a in out], [str(b) for b in plan.touched])
            compare = [if_absent(hkey), if_mod(tkey, tomb_rev)]
            success = [op_put(hkey, handle)] + ([op_delete(tkey)] if tomb_rev else [])
            failure = [op_get(hkey), op_get(tkey)]
            for cidr in plan.touched:
                b = plan.blocks[cidr]
                key = self.block_key(cidr)
                if b.mod_revision:
                    compare.append(if_mod(key, b.mod_revision))
                else:  # a claim: the block and its affinity must both be new
                    compare.append(if_absent(key))
                    compare.append(if_absent(self.affinity_key(cidr)))
                    success.append(op_put(self.affinity_key(cidr),
                                          Affinity(cidr=cidr, node=self.node, network=self.network).to_json()))
                success.append(op_put(key, b.to_json()))
            if not self.sent_write and self.before_write is not None:
                self.before_write()
            self.sent_write = True
            done = self.kv.txn(compare, success, failure)
            if done.succeeded:
                self.hint = plan.newest()
                return out
            if done.responses and done.responses[0]:  # the handle appeared meanwhile (our own earlier try)
                return self._assigned_from(handle_from_json(done.responses[0][0].value), range_sets)
            if len(done.responses) > 1:
                self._check_tombstone(done.responses[1], ref, cid, ifname)  # a DEL landed meanwhile?
            self.lost_races += 1
        raise IpamError("contention", f"gave up after {MAX_ATTEMPTS} conflicting attempts",
                        "other writers changed the same blocks each time; try again")

    def _check_tombstone(self, found: list[Any], ref: int, cid: str, ifname: str) -> int:
        """The mod revision of the attachment's tombstone (0: none) for an ADD's compare; an
        IpamError "deleted" when it was written after revision ``ref`` (the ADD's first read: its
        DEL ran while the ADD was in progress)."""
        if not found:
            return 0
        rev = int(found[0].mod_revision)
        if rev > ref:
            raise IpamError("deleted", f"{cid}/{ifname} was deleted while this ADD was in progress: nothing "
                            "allocated", "a DEL of this attachment ran after the ADD began (the runtime gave up "
                            "on it); ADD it again if it is still wanted")
        return rev

    def _assigned_from(self, handle: dict[str, Any], range_sets: Sequence[RangeSet]) -> list[Assigned]:
        out = []
        for text in handle.get("ips", ()):
            ip = ipaddr.ip_interface(text).ip
            for rs in range_sets:
                r = range_for(rs, ip)
                if r is not None:
                    out.append(Assigned(ip=ip, range=r))
                    break
        return out

    # -- DEL / release --

    def release(self, cid: str, ifname: str) -> list[str]:
        """Free what the handle holds and delete it, in one transaction; [] when there is none."""
        hkey = self.handle_key(cid, ifname)
        tkey = self.tombstone_key(cid, ifname)
        hid = f"{cid}/{ifname}"
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                _pause(attempt)
            fast = attempt == 0  # serializable first (see assign); "no handle" is confirmed by a write
            hinted = self.hint[:2 * BATCH]
            res = self.kv.txn([], [op_get(hkey, serializable=fast),
                                     *(op_get(self.block_key(c), serializable=fast) for c in hinted)])
            found, *got = res.responses
            kv = found[0] if found else None
            if kv is None:
                # Nothing to release — but an ADD sent earlier may still commit: leave the tombstone
                # its transaction compares against, on condition that the handle is still absent.
                value, lease = self._tombstone()
                done = self.kv.txn([if_absent(hkey)], [op_put(tkey, value, lease=lease)], [op_get(hkey)])
                if done.succeeded:
                    self.floor = done.revision  # a write's revision: at least any true floor
                    return []
                self.lost_races += 1  # the handle appeared (that ADD just committed): release it
                continue
            handle = handle_from_json(kv.value)
            cidrs = [ipaddr.ip_network(b) for b in handle.get("blocks", ())]
            blocks = {b.cidr: b for b in (Block.from_json(k.value, k.mod_revision) for kvs in got for k in kvs)
                      if b.cidr in cidrs}
            missing = [c for c in cidrs if c not in blocks]
            blocks.update(self._get_blocks(missing, fast))
            value, lease = self._tombstone()
            compare = [if_mod(hkey, kv.mod_revision)]
            success = [op_delete(hkey), op_put(tkey, value, lease=lease),
                       # the attachment's workload endpoint (pycni.cluster.policy) goes with its handle
                       op_delete(self.keys.endpoint(str(handle.get("node") or self.node), self.network, cid,
                                                    ifname))]
            for cidr, b in blocks.items():
                freed = [o for o, owner in b.allocations.items() if owner == hid]
                if not freed:
                    continue
                for o in freed:
                    del b.allocations[o]
                compare.append(if_mod(self.block_key(cidr), b.mod_revision))
                success.append(op_put(self.block_key(cidr), b.to_json()))
            done = self.kv.txn(compare, success)
            if done.succeeded:
                self.floor = done.revision
                return list(handle.get("ips", ()))
            self.lost_races += 1
        raise IpamError("contention", f"gave up releasing {hid} after {MAX_ATTEMPTS} conflicting attempts",
                        "other writers changed the same blocks each time; try again")

    def release_ip(self, ip: IPAddress, block: IPNetwork) -> str | None:
        """Free one address (operator's release): drop it from its block and from its handle
        (deleting a handle left with nothing), in one transaction. Returns the owner, None when free."""
        bkey = self.block_key(block)
        for _attempt in range(MAX_ATTEMPTS):
            kv = self.kv.get(bkey)
            if kv is None:
                return None
            b = Block.from_json(kv.value, kv.mod_revision)
            owner = b.allocations.pop(b.ordinal(ip), None)
            if owner is None:
                return None
            compare = [if_mod(bkey, b.mod_revision)]
            success = [op_put(bkey, b.to_json())]
            cid, _, ifname = owner.partition("/")
            hkey = self.handle_key(cid, ifname)
            hkv = self.kv.get(hkey)
            compare.append(if_mod(hkey, hkv.mod_revision if hkv else 0))
            if hkv is not None:
                h = handle_from_json(hkv.value)
                h["ips"] = [t for t in h.get("ips", ()) if ipaddr.ip_interface(t).ip != ip]
                if h["ips"]:
                    success.append(op_put(hkey, handle_to_json(h)))
                else:
                    success.append(op_delete(hkey))
            if self.kv.txn(compare, success).succeeded:
                return owner
        raise IpamError("contention", f"gave up releasing {ip} after {MAX_ATTEMPTS} conflicting attempts")

    def gc(self, valid: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        """Release this node's handles of this network that no valid attachment names."""
        keep = set(valid)
        gone = []
        for h in self.handles():
            if h.get("node") != self.node or (h.get("containerID"), h.get("ifname")) in keep:
                continue
            if self.release(h["containerID"], h["ifname"]):
                gone.append(h)
        return gone

    def release_node(self) -> tuple[list[dict[str, Any]], list[IPNetwork]]:
        """Everything this store's node holds in the network, for a node that is gone for good:
        its handles are released, then each of its blocks left empty is deleted with its affinity
        (one transaction each, guarded by the block's revision). A block still holding another
        node's borrowed addresses stays. Returns (handles released, blocks freed)."""
        gone = self.gc([])
        freed = []
        for b in self.blocks():
            if b.node != self.node or b.allocations:
                continue
            if self.kv.txn([if_mod(self.block_key(b.cidr), b.mod_revision)],
                             [op_delete(self.block_key(b.cidr)), op_delete(self.affinity_key(b.cidr))]).succeeded:
                freed.append(b.cidr)
        return gone, freed

    # -- consistency --

    def inconsistencies(self) -> list[dict[str, Any]]:
        """Blocks vs handles vs affinities: every disagreement, as one JSON-able dict each."""
        problems: list[dict[str, Any]] = []
        handles = {f"{h['containerID']}/{h['ifname']}": h for h in self.handles()}
        held: dict[str, set[IPAddress]] = {
            hid: {ipaddr.ip_interface(t).ip for t in h.get("ips", ())} for hid, h in handles.items()}
        taken: dict[IPAddress, str] = {}
        for b in self.blocks():
            aff = self.kv.get(self.affinity_key(b.cidr, b.node)) if b.node else None
            if aff is None:
                problems.append({"problem": "block without affinity", "block": str(b.cidr), "node": b.node})
            for o, owner in b.allocations.items():
                ip = b.ip(o)
                taken[ip] = owner
                if owner not in handles:
                    problems.append({"problem": "orphan allocation", "ip": str(ip), "block": str(b.cidr),
                                     "handle": owner})
                elif ip not in held[owner]:
                    problems.append({"problem": "allocation not in its handle", "ip": str(ip),
                                     "block": str(b.cidr), "handle": owner})
        for hid, ips in held.items():
            listed = [ipaddr.ip_network(b) for b in handles[hid].get("blocks", ())]
            for ip in ips:
                if taken.get(ip) != hid:
                    problems.append({"problem": "handle address not allocated to it", "ip": str(ip),
                                     "handle": hid, "allocatedTo": taken.get(ip)})
                if not any(ip in b for b in listed):  # DEL frees only in the blocks the handle lists
                    problems.append({"problem": "handle address outside its blocks", "ip": str(ip),
                                     "handle": hid})
        return problems


def _pause(attempt: int) -> None:
    """A random pause growing with the attempt (os.urandom: :mod:`random` costs a one-shot plugin ~5 ms)."""
    time.sleep(min(0.002 * attempt, 0.05) * int.from_bytes(os.urandom(2), "big") / 65535)


def _requested_in(rs: RangeSet, requested: Sequence[IPAddress]) -> IPAddress | None:
    for ip in requested:
        if range_for(rs, ip) is not None:
            return ip
    return None


class _Plan:
    """The blocks one ADD attempt reads and changes, before its transaction."""

    def __init__(self, store: ClusterStore, hid: str, mine: list[IPNetwork], block_sizes: tuple[int, int],
                 strict: bool, serializable: bool) -> None:
        self.store = store
        self.hid = hid
        self.blocks: dict[IPNetwork, Block] = {}
        # This node's blocks, newest (highest) first: the last claimed is the likeliest to have room,
        # so the common ADD reads one batch of blocks however many the node holds.
        self.mine = sorted(mine, key=lambda c: (c.version, int(c.network_address)), reverse=True)
        self.serializable = serializable
        self.sizes = block_sizes
        self.strict = strict
        self.touched: list[IPNetwork] = []
        self._all_keys: set[str] | None = None
        self._everything: list[Block] | None = None

    def _size(self, rs: RangeSet) -> int:
        return self.sizes[0] if rs[0].version == 4 else self.sizes[1]

    def _take(self, b: Block, o: int, r: Range) -> Assigned:
        b.allocations[o] = self.hid
        b.next = o + 1
        if b.cidr not in self.touched:
            self.touched.append(b.cidr)
        return Assigned(ip=b.ip(o), range=r)

    def prefetched(self, blocks: Sequence[Block]) -> None:
        """Blocks read ahead (the hint): kept only when the affinity read says they are ours."""
        mine = set(self.mine)
        for b in blocks:
            if b.cidr in mine:
                self.blocks[b.cidr] = b

    def newest(self) -> list[IPNetwork]:
        """The hint for the next command: this node's newest blocks of each family."""
        v4 = [c for c in self.mine if c.version == 4][:BATCH]
        v6 = [c for c in self.mine if c.version == 6][:BATCH]
        return v4 + v6

    def take(self, idx: int, rs: RangeSet, want: IPAddress | None) -> Assigned:
        store = self.store
        size = self._size(rs)
        if want is not None:
            found = block_for(rs, size, want)
            assert found is not None
            cidr, r = found
            if r.is_reserved(int(want)):
                raise IpamError("requested", f"requested IP {want} is reserved (gateway, network or broadcast)")
            b = self.blocks.get(cidr)
            if b is None:
                kv = store.kv.get(store.block_key(cidr))
                b = Block.from_json(kv.value, kv.mod_revision) if kv else Block(cidr=cidr, node=store.node)
                self.blocks[cidr] = b
            o = b.ordinal(want)
            if o in b.allocations:
                raise IpamError("requested", f"requested IP address {want} is not available",
                                f"held by {b.allocations[o]}")
            return self._take(b, o, r)
        # 1. this node's blocks
        candidates = [c for c in self.mine if _range_of_block(rs, c) is not None]
        for i, cidr in enumerate(candidates):
            if cidr not in self.blocks:  # read the next batch of this node's blocks
                batch = [c for c in candidates[i:] if c not in self.blocks][:BATCH]
                self.blocks.update(store._get_blocks(batch, self.serializable))
            have = self.blocks.get(cidr)
            rr = _range_of_block(rs, cidr)
            if have is None or rr is None:  # released meanwhile (the affinity read was stale)
                continue
            oo = free_ordinal(have, rr)
            if oo is not None:
                return self._take(have, oo, rr)
        # 2. claim a free block
        if self._all_keys is None:
            kvs, _rev = store.kv.range(store.blocks_prefix, prefix=True, keys_only=True)
            self._all_keys = {kv.key for kv in kvs}
        for cidr, r in blocks_of(rs, size):
            if store.block_key(cidr) in self._all_keys or cidr in self.blocks:
                continue
            b = Block(cidr=cidr, node=store.node)
            oo = free_ordinal(b, r)
            if oo is None:
                continue
            self.blocks[cidr] = b
            self.mine.insert(0, cidr)
            return self._take(b, oo, r)
        if self.strict:
            raise IpamError("strict", f"no free block left for node {store.node} in range set {idx}, and "
                            "strictAffinity forbids borrowing",
                            "every block is claimed by a node and this node's blocks are full; add ranges, "
                            "free addresses, or set strictAffinity false to borrow from other nodes' blocks")
        # 3. borrow from another node's block
        if self._everything is None:
            self._everything = store.blocks()
        for other in self._everything:
            rr = _range_of_block(rs, other.cidr)
            if rr is None or other.node == store.node:
                continue
            b = self.blocks.setdefault(other.cidr, other)
            oo = free_ordinal(b, rr)
            if oo is not None:
                return self._take(b, oo, rr)
        raise IpamError("exhausted", f"no IP addresses available in range set {idx}",
                        "every block is full; free some (DEL, GC, `pycni ipam release`) or add a range")

def _range_of_block(rs: RangeSet, cidr: IPNetwork) -> Range | None:
    for r in rs:
        if r.version == cidr.version and cidr.subnet_of(r.subnet):  # type: ignore[arg-type]
            return r
    return None
