"""The cluster store's compare-and-swap paths without a server: pycni.cluster.memkv.MemKV holds
etcd's revision semantics, and its interceptor reorders requests or loses their answers. The
same behaviour against a real 3-member etcd is in tests/test_cluster_ipam.py."""

from __future__ import annotations

import threading

import pytest

from pycni import ipaddr
from pycni.cluster.etcd import EtcdCompacted, EtcdUnavailable, TxnResult
from pycni.cluster.ipam import ClusterStore, IpamError
from pycni.cluster.kv import if_absent, if_created, if_mod, if_value, if_version, op_delete, op_get, op_put
from pycni.cluster.memkv import MemKV, Pending, lose_answer
from pycni.cluster.model import Affinity, Block, Keys, NodeInfo, handle_json
from pycni.cluster.node import ClusterView
from pycni.cluster.session import session
from pycni.cluster.settings import ClusterSettings, EtcdSettings
from pycni.ipranges import parse_range_set
from pycni.spec.errors import INTERNAL, TRY_AGAIN, CNIError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pycni.cluster.kv import KVStore

RS = [parse_range_set([{"subnet": "10.90.0.0/24"}])]
SIZES = (26, 122)


def store(kv: MemKV, node: str = "n1", network: str = "net") -> ClusterStore:
    return ClusterStore(kv, network, node)


def ip_of(got: list) -> str:  # type: ignore[type-arg]
    return str(got[0].ip)


# ---- the memory store keeps etcd's rules --------------------------------------------------------


def test_revisions_versions_and_compares() -> None:
    kv = MemKV()
    assert kv.revision == 1
    r = kv.put("/a", "1")
    assert r == 2
    a = kv.get("/a")
    assert a is not None and (a.create_revision, a.mod_revision, a.version) == (2, 2, 1)
    res = kv.txn([], [op_put("/a", "2"), op_put("/b", "x")])  # one txn, one revision for both
    assert res.succeeded and res.revision == 3
    a, b = kv.get("/a"), kv.get("/b")
    assert a is not None and b is not None
    assert (a.create_revision, a.mod_revision, a.version) == (2, 3, 2) and b.mod_revision == 3
    assert kv.txn([], [op_get("/a")]).revision == 3  # a read bumps nothing
    assert kv.delete("/nothing") == 0 and kv.revision == 3  # nor does deleting nothing
    # compares: an absent key compares as zeros, but a VALUE compare on it fails
    assert kv.txn([if_absent("/c"), if_mod("/c", 0), if_version("/c", 0)]).succeeded
    assert not kv.txn([if_value("/c", "")]).succeeded
    assert kv.txn([if_value("/a", "2"), if_version("/a", 2), if_created("/a", 2), if_mod("/a", 3)]).succeeded
    failed = kv.txn([if_mod("/a", 2)], [op_put("/a", "no")], [op_get("/a")])
    assert not failed.succeeded and failed.responses[0][0].value == "2" and kv.revision == 3
    # delete and re-create: a new incarnation (create revision, version from 1)
    assert kv.delete("/a") == 1 and kv.revision == 4
    kv.put("/a", "new")
    a = kv.get("/a")
    assert a is not None and (a.create_revision, a.version) == (5, 1)
    assert not kv.txn([if_created("/a", 2)]).succeeded


def test_range_prefix_limit_keys_only() -> None:
    kv = MemKV()
    for k in ("/p/b", "/p/a", "/q/x", "/p0"):
        kv.put(k, k)
    kvs, rev = kv.get_prefix("/p/")
    assert [x.key for x in kvs] == ["/p/a", "/p/b"] and rev == kv.revision
    only, _ = kv.range("/p/", prefix=True, keys_only=True, limit=1)
    assert [(x.key, x.value) for x in only] == [("/p/a", "")]
    assert kv.delete_prefix("/p/") == 2 and kv.dump() == {"/p0": "/p0", "/q/x": "/q/x"}


def test_watch_from_revision_and_compaction() -> None:
    kv = MemKV()
    kv.put("/w/a", "1")
    start = kv.revision
    kv.put("/w/a", "2")
    kv.put("/other", "x")
    kv.delete("/w/a")
    with kv.watch("/w/", prefix=True, start_revision=start, prev_kv=True) as w:
        batch = w.next(timeout=0)
        assert batch is not None
        assert [(e.type, e.kv.value) for e in batch.events] == [("PUT", "1"), ("PUT", "2"), ("DELETE", "")]
        assert batch.events[2].prev is not None and batch.events[2].prev.value == "2"
        assert w.next(timeout=0) is None  # nothing new
    kv.compact()
    with pytest.raises(EtcdCompacted):
        kv.watch("/w/", prefix=True, start_revision=start)


def test_lease_revoke_deletes_its_keys_in_one_revision() -> None:
    kv = MemKV()
    lease = kv.lease_grant(10)
    kv.put("/nodes/a", "x", lease=lease)
    kv.put("/nodes/b", "y", lease=lease)
    assert kv.lease_keepalive(lease) == 10
    rev = kv.revision
    kv.expire(lease)
    assert kv.dump() == {} and kv.revision == rev + 1 and kv.lease_keepalive(lease) == 0


# ---- the codec ----------------------------------------------------------------------------------


def test_keys_round_trip_and_stored_bytes() -> None:
    keys = Keys("/pycni/")
    cidr = ipaddr.ip_network("10.90.0.64/26")
    assert keys.block("net", cidr) == "/pycni/ipam/blocks/net/10.90.0.64-26"
    assert keys.affinity("n1", "net", cidr) == "/pycni/ipam/affinity/n1/net/10.90.0.64-26"
    assert keys.handle("net", "c1", "eth0") == "/pycni/ipam/handles/net/c1/eth0"
    p = keys.parse(keys.affinity("n1", "net", cidr))
    assert p is not None and (p.kind, p.node, p.network, p.cidr) == ("affinity", "n1", "net", cidr)
    p = keys.parse(keys.handle("net", "c1", "eth0"))
    assert p is not None and (p.kind, p.network, p.container_id, p.ifname) == ("handle", "net", "c1", "eth0")
    assert keys.parse("/pycni/ipam/blocks/net/garbage") is None and keys.parse("/elsewhere") is None
    # the values are what earlier releases wrote, byte for byte
    b = Block(cidr=cidr, node="n1", allocations={3: "c1/eth0", 1: "c0/eth0"}, next=4)
    assert b.to_json() == ('{"cidr":"10.90.0.64/26","node":"n1","allocations":{"1":"c0/eth0","3":"c1/eth0"},'
                           '"next":4}')
    assert Affinity(cidr=cidr, node="n1", network="net").to_json() == \
        '{"cidr":"10.90.0.64/26","node":"n1","network":"net"}'
    assert handle_json("net", "c1", "eth0", "n1", ["10.90.0.67/24"], ["10.90.0.64/26"]) == (
        '{"network":"net","containerID":"c1","ifname":"eth0","node":"n1","ips":["10.90.0.67/24"],'
        '"blocks":["10.90.0.64/26"]}')
    info = NodeInfo(name="n1", underlay_ips=["192.0.2.1"], vtep_mac="0e:00:00:00:00:01")
    assert info.to_json() == ('{"name": "n1", "underlayIP": "192.0.2.1", "underlayIPs": ["192.0.2.1"], '
                              '"vtepIP": "192.0.2.1", "vtepMAC": "0e:00:00:00:00:01"}')
    # an affinity whose value is unreadable still names its block and node through its key
    aff = Affinity.from_kv(keys, keys.affinity("n2", "net", cidr), "not json")
    assert aff is not None and (aff.cidr, aff.node, aff.network) == (cidr, "n2", "net")


# ---- the store ----------------------------------------------------------------------------------


def test_add_is_one_write_repeat_is_the_same_and_del_frees() -> None:
    kv = MemKV()
    s = store(kv)
    got = s.assign("c1", "eth0", RS, [], SIZES)
    assert ip_of(got) == "10.90.0.2"  # .0 is the network, .1 the default gateway
    writes = []
    kv.interceptor = lambda p: (writes.append(p) if p.writes else None) or p.apply()
    assert ip_of(s.assign("c1", "eth0", RS, [], SIZES)) == "10.90.0.2" and writes == []  # a repeat writes nothing
    assert ip_of(s.assign("c2", "eth0", RS, [], SIZES)) == "10.90.0.3" and len(writes) == 1
    assert s.release("c1", "eth0") == ["10.90.0.2/24"]
    assert s.release("c1", "eth0") == []
    assert [h["containerID"] for h in s.handles()] == ["c2"] and s.inconsistencies() == []


def test_lost_cas_is_retried_on_fresh_state() -> None:
    """Another writer changes the block between this ADD's read and its write: the write's compare
    fails, the ADD reads again and takes the next address; nobody gets an address twice."""
    kv = MemKV()
    a, b = store(kv), store(kv)
    a.assign("c0", "eth0", RS, [], SIZES)  # the node holds a block
    done: list[str] = []

    def hook(p: Pending) -> TxnResult:
        if p.writes and not done:
            done.append("b")
            b.assign("cb", "eth0", RS, [], SIZES)  # lands first (through this hook: done is set)
        return p.apply()

    kv.interceptor = hook
    got = a.assign("ca", "eth0", RS, [], SIZES)
    assert a.lost_races == 1
    owners = {str(blk.ip(o)): h for blk in a.blocks() for o, h in blk.allocations.items()}
    assert owners == {"10.90.0.2": "c0/eth0", "10.90.0.3": "cb/eth0", ip_of(got): "ca/eth0"}
    assert a.inconsistencies() == []


def test_claim_race_two_nodes_one_block_each() -> None:
    """Two nodes claim the first free block at once: one wins it, the other's claim compare
    (block and affinity absent) fails, and it claims the next block."""
    kv = MemKV()
    n1, n2 = store(kv, "n1"), store(kv, "n2")
    done: list[int] = []

    def hook(p: Pending) -> TxnResult:
        if p.writes and not done:
            done.append(1)
            n2.assign("c2", "eth0", RS, [], SIZES)
        return p.apply()

    kv.interceptor = hook
    got = n1.assign("c1", "eth0", RS, [], SIZES)
    blocks = {str(b.cidr): b.node for b in n1.blocks()}
    assert blocks == {"10.90.0.0/26": "n2", "10.90.0.64/26": "n1"} and ip_of(got) == "10.90.0.64"
    view = ClusterView("/pycni")  # the agent reads the same keys through the same codec
    view.load(kv)
    assert view.blocks() == blocks and n1.inconsistencies() == []


def test_borrowing_and_strict_affinity() -> None:
    """One block in the range: the second node borrows from it, unless strictAffinity forbids."""
    kv = MemKV()
    small = [parse_range_set([{"subnet": "10.91.0.0/26"}])]
    store(kv, "n1").assign("c1", "eth0", small, [], SIZES)
    n2 = store(kv, "n2")
    with pytest.raises(IpamError) as e:
        n2.assign("c2", "eth0", small, [], SIZES, strict_affinity=True)
    assert e.value.kind == "strict"
    got = n2.assign("c2", "eth0", small, [], SIZES)
    assert ip_of(got) == "10.91.0.3"
    [blk] = n2.blocks()
    assert blk.node == "n1" and blk.allocations[3] == "c2/eth0"
    h = n2.handle("c2", "eth0")
    assert h is not None and h["node"] == "n2" and h["blocks"] == ["10.91.0.0/26"]


def test_lost_answer_of_add_then_retry_gets_the_same_address() -> None:
    """The ADD's write is applied but its answer lost: the runtime's retry finds the handle and
    answers with the same address; nothing is allocated twice."""
    kv = MemKV()
    s = store(kv)
    kv.interceptor = lose_answer(lambda p: p.writes)
    with pytest.raises(EtcdUnavailable):
        s.assign("c1", "eth0", RS, [], SIZES)
    assert ip_of(s.assign("c1", "eth0", RS, [], SIZES)) == "10.90.0.2"
    [blk] = s.blocks()
    assert blk.allocations == {2: "c1/eth0"} and s.inconsistencies() == []


def test_lost_answer_of_del_then_retry_is_success() -> None:
    kv = MemKV()
    s = store(kv)
    s.assign("c1", "eth0", RS, [], SIZES)
    kv.interceptor = lose_answer(lambda p: p.writes)
    with pytest.raises(EtcdUnavailable):
        s.release("c1", "eth0")
    assert s.release("c1", "eth0") == [] and s.handles() == [] and not s.blocks()[0].allocations


def test_add_lands_between_del_read_and_write() -> None:
    """A DEL has read the handle and its block; another ADD takes an address in that block before
    the DEL writes: the DEL's compare fails, it reads again, and frees only its own address."""
    kv = MemKV()
    s = store(kv)
    s.assign("c1", "eth0", RS, [], SIZES)
    done: list[int] = []

    def hook(p: Pending) -> TxnResult:
        if p.writes and not done and any("/handles/" in k for k in p.keys()) and \
                any(op.get("request_delete_range") for op in p.success):
            done.append(1)
            store(kv).assign("c2", "eth0", RS, [], SIZES)
        return p.apply()

    kv.interceptor = hook
    assert s.release("c1", "eth0") == ["10.90.0.2/24"] and s.lost_races == 1
    [blk] = s.blocks()
    assert blk.allocations == {3: "c2/eth0"} and s.inconsistencies() == []


def test_parallel_adds_from_threads_get_distinct_addresses() -> None:
    kv = MemKV()
    got: list[str] = []
    lock = threading.Lock()

    def add(i: int) -> None:
        r = store(kv, f"n{i % 2}").assign(f"c{i}", "eth0", RS, [], SIZES)
        with lock:
            got.append(ip_of(r))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 16 and store(kv).inconsistencies() == []


# ---- the session: the plugin's path, mapped to CNI errors ---------------------------------------


def _settings(tmp_path: object) -> ClusterSettings:
    return ClusterSettings(network="net", etcd=EtcdSettings(endpoints=["http://mem"]), node="n1",
                           lock_dir=str(tmp_path))


def test_session_maps_errors_and_keeps_the_hint(tmp_path: object) -> None:
    kv = MemKV()
    cfg = _settings(tmp_path)
    with session(cfg, lock=True, kv=kv) as s:
        s.assign("c1", "eth0", RS, [], SIZES)
    with session(cfg, lock=True, kv=kv) as s:
        assert [str(c) for c in s.hint] == ["10.90.0.0/26"]  # read back from the lock directory
    kv.interceptor = lose_answer(lambda p: p.writes)
    with pytest.raises(CNIError) as e, session(cfg, lock=True, kv=kv) as s:
        s.assign("c2", "eth0", RS, [], SIZES)
    assert e.value.code == TRY_AGAIN and "etcd unavailable" in e.value.msg
    full = [parse_range_set([{"subnet": "10.92.0.0/30"}])]  # one usable address: .2 (.1 is the gateway)
    kv.interceptor = None
    with session(cfg, kv=kv) as s:
        s.assign("f1", "eth0", full, [], SIZES)
    with pytest.raises(CNIError) as e, session(cfg, kv=kv) as s:
        s.assign("f2", "eth0", full, [], SIZES)
    assert e.value.code == INTERNAL and "no IP addresses available" in e.value.msg


def test_delete_marker_ops_unchanged() -> None:
    """op_delete with a prefix removes exactly the keys under it (a codec sanity check the
    release_node path relies on)."""
    kv = MemKV()
    kv.put("/pycni/ipam/blocks/net/10.90.0.0-26", "x")
    kv.put("/pycni/ipam/blocks/net2/10.90.0.0-26", "y")
    res = kv.txn([], [op_delete("/pycni/ipam/blocks/net/", prefix=True)])
    assert res.responses == [1] and list(kv.dump()) == ["/pycni/ipam/blocks/net2/10.90.0.0-26"]


# ---- MemKV against a real etcd: the same script, the same observations --------------------------


def _script(kv: object) -> list[object]:
    """Requests whose answers depend on etcd's revision rules; revisions relative to the start."""
    k: KVStore = kv  # type: ignore[assignment]  (the interface both implement)
    base = k.put("/cl/seed", "0")
    out: list[object] = []

    def rel(x: int) -> int:
        return x - base if x else 0

    def snap(key: str) -> object:
        got = k.get(key)
        return None if got is None else (got.value, rel(got.create_revision), rel(got.mod_revision), got.version)

    out.append(rel(k.put("/cl/a", "1")))
    out.append(rel(k.txn([], [op_put("/cl/a", "2"), op_put("/cl/b", "x")]).revision))
    out.append((snap("/cl/a"), snap("/cl/b")))
    out.append(rel(k.txn([], [op_get("/cl/a")]).revision))
    out.append((k.delete("/cl/none"), rel(k.get_prefix("/cl/")[1])))
    for compare in ([if_absent("/cl/c")], [if_mod("/cl/c", 0)], [if_version("/cl/c", 0)], [if_value("/cl/c", "")],
                    [if_value("/cl/a", "2"), if_version("/cl/a", 2)], [if_mod("/cl/a", base + 1)]):
        out.append(k.txn(compare).succeeded)
    res = k.txn([if_mod("/cl/a", base + 1)], [op_put("/cl/a", "no")], [op_get("/cl/a"), op_delete("/cl/b")])
    out.append((res.succeeded, rel(res.revision), [r if isinstance(r, int) else [x.value for x in r]
                                                    for r in res.responses]))
    k.delete("/cl/a")
    k.put("/cl/a", "again")
    out.append(snap("/cl/a"))
    kvs, _rev = k.range("/cl/", prefix=True, keys_only=True, limit=1)
    out.append([(x.key, x.value, x.version) for x in kvs])
    with k.watch("/cl/a", start_revision=base + 1, prev_kv=True) as w:
        events: list[object] = []
        while len(events) < 5:
            batch = w.next(timeout=5)
            if batch is None:
                break
            events.extend((e.type, e.kv.value, rel(e.kv.mod_revision), e.prev.value if e.prev else None)
                          for e in batch.events)
    out.append(events)
    return out


def test_memkv_answers_as_etcd_does() -> None:
    """The same requests on MemKV and on a real etcd member give the same answers."""
    from etcd_util import EtcdCluster, etcd_available

    if not etcd_available():
        pytest.skip("needs root and /usr/bin/etcd (Debian etcd-server) to compare with")
    with EtcdCluster(size=1, subnet="10.231.77.0/24", prefix="cl-etcd") as cluster, \
            cluster.client(timeout=10) as real:
        real.delete_prefix("/cl/")
        want = _script(real)
    assert _script(MemKV()) == want
