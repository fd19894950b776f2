"""Cluster IPAM under faults (issue 23). Item 1 — no ADD commits after the DEL of its attachment — on the in-memory etcd
(deterministic reorderings) and on a real 3-member etcd (an ADD's transaction held back until the
DEL has returned, then sent).

The fault: an ADD's transaction is in flight (its plugin SIGKILLed, or its answer lost) when the
runtime's DEL reads "no handle" and returns; the transaction commits afterwards and the address
outlives the DEL. The fix (pycni.cluster.ipam's docstring): every DEL leaves a tombstone the ADD's
transaction compares against.

Item 3: a failed ADD, the runtime's rollback DEL included, ends within ``etcdTimeout`` (plus the
bounded lock wait, plus one short try when the ADD's transaction went out), and says what is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_util import EtcdCluster, etcd_available
from netns_util import new_namespace

from pycni.cluster.etcd import TxnResult
from pycni.cluster.ipam import TOMBSTONE_TTL, ClusterStore, IpamError
from pycni.cluster.memkv import MemKV, Pending
from pycni.cluster.model import Tombstone
from pycni.cluster.session import session
from pycni.cluster.settings import ClusterSettings, EtcdSettings
from pycni.ipranges import parse_range_set

RS = [parse_range_set([{"subnet": "10.90.0.0/24"}])]
SIZES = (26, 122)


def _is_add_commit(p: Pending, cid: str) -> bool:
    return p.writes and any(k.endswith(f"/handles/net/{cid}/eth0") for k in p.keys()) and \
        not any("request_delete_range" in op for op in p.success)


def _leftovers(s: ClusterStore) -> tuple[list[Any], list[Any]]:
    return s.handles(), [b.allocations for b in s.blocks() if b.allocations]


def test_add_sent_before_del_cannot_commit_after_it() -> None:
    """The killed ADD's transaction reaches the store only after the DEL read "no handle" and
    returned: its compare on the tombstone fails, nothing is allocated."""
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    s.assign("other", "eth0", RS, [], SIZES)  # the node holds a block already
    held: list[Pending] = []

    class Killed(Exception):
        pass

    def hook(p: Pending) -> TxnResult:
        if _is_add_commit(p, "c1") and not held:
            held.append(p)
            raise Killed  # the plugin dies with its request on the wire
        return p.apply()

    kv.interceptor = hook
    with pytest.raises(Killed):
        ClusterStore(kv, "net", "n1").assign("c1", "eth0", RS, [], SIZES)
    assert s.release("c1", "eth0") == []  # the runtime's DEL: no handle, success
    tomb = kv.get(s.tombstone_key("c1", "eth0"))
    assert tomb is not None and tomb.lease and kv.leases[tomb.lease].ttl == TOMBSTONE_TTL
    late = held[0].apply()  # now the in-flight transaction lands
    assert not late.succeeded
    handles, allocs = _leftovers(s)
    assert [h["containerID"] for h in handles] == ["other"] and allocs == [{2: "other/eth0"}]
    assert s.inconsistencies() == []


def test_add_whose_answer_was_lost_does_not_come_back_after_del() -> None:
    """The ADD's transaction commits but its answer is lost; the runtime gives up and DELs (the
    handle is released); then the client sends the same request again (its retry on another
    member): it must not allocate again."""
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    deleted: list[int] = []

    def hook(p: Pending) -> TxnResult:
        if _is_add_commit(p, "c1") and not deleted:
            deleted.append(1)
            assert p.apply().succeeded  # committed; the answer never arrives
            assert s.release("c1", "eth0") == ["10.90.0.2/24"]  # DEL runs meanwhile
        return p.apply()  # the same request, sent again

    kv.interceptor = hook
    with pytest.raises(IpamError) as e:
        ClusterStore(kv, "net", "n1").assign("c1", "eth0", RS, [], SIZES)
    assert e.value.kind == "deleted"
    assert _leftovers(s) == ([], [])


def test_add_in_progress_when_del_lands_gives_up() -> None:
    """A DEL lands between this ADD's read and its commit (the ADD is alive and retries): the
    commit fails on the tombstone, and the ADD gives up rather than resurrect the attachment."""
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    done: list[int] = []

    def hook(p: Pending) -> TxnResult:
        if _is_add_commit(p, "c1") and not done:
            done.append(1)
            s.release("c1", "eth0")
        return p.apply()

    kv.interceptor = hook
    with pytest.raises(IpamError) as e:
        ClusterStore(kv, "net", "n1").assign("c1", "eth0", RS, [], SIZES)
    assert e.value.kind == "deleted" and "deleted while this ADD was in progress" in e.value.msg
    assert _leftovers(s) == ([], [])


def test_add_after_del_is_a_new_attachment() -> None:
    """A later ADD of the same attachment (the runtime's retry) is not refused: it reads the
    tombstone, compares on it and deletes it; a DEL after that writes a new one."""
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    assert s.release("c1", "eth0") == []  # DEL first (a runtime cleaning up), then ADD
    first = kv.get(s.tombstone_key("c1", "eth0"))
    assert first is not None
    time.sleep(0.01)
    got = ClusterStore(kv, "net", "n1").assign("c1", "eth0", RS, [], SIZES)
    assert str(got[0].ip) == "10.90.0.2" and kv.get(s.tombstone_key("c1", "eth0")) is None
    assert s.release("c1", "eth0") == ["10.90.0.2/24"]
    again = kv.get(s.tombstone_key("c1", "eth0"))
    assert again is not None and again.mod_revision > first.mod_revision
    assert _leftovers(s) == ([], [])


def test_tombstone_decision_uses_revisions_not_clocks() -> None:
    """Whether a tombstone is this ADD's own DEL is decided by etcd revisions: a tombstone whose
    wall-clock stamp lies in the future (a clock stepped back since) does not refuse a re-ADD, and
    one stamped long ago (a clock stepped forward, or another node's) landing during an ADD does."""
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    tkey = s.tombstone_key("c1", "eth0")
    kv.put(tkey, Tombstone(node="n1", deleted=time.time() + 3600).to_json())  # a DEL, "an hour from now"
    got = ClusterStore(kv, "net", "n1").assign("c1", "eth0", RS, [], SIZES)
    assert str(got[0].ip) == "10.90.0.2" and kv.get(tkey) is None
    assert s.release("c1", "eth0") == ["10.90.0.2/24"]
    done: list[int] = []

    def hook(p: Pending) -> TxnResult:
        if _is_add_commit(p, "c2") and not done:
            done.append(1)  # a DEL stamped with a clock far behind lands between the read and the commit
            kv.put(s.tombstone_key("c2", "eth0"), Tombstone(node="n1", deleted=0.0).to_json())
        return p.apply()

    kv.interceptor = hook
    with pytest.raises(IpamError) as e:
        ClusterStore(kv, "net", "n1").assign("c2", "eth0", RS, [], SIZES)
    assert e.value.kind == "deleted"
    assert _leftovers(s) == ([], [])


def _lagging_first_read(kv: MemKV, lag: MemKV) -> Any:
    """An interceptor that serves serializable reads from ``lag`` (a member that has not applied
    the latest writes) and everything else from ``kv`` (the leader)."""
    def hook(p: Pending) -> TxnResult:
        if not p.writes and any(op.get("request_range", {}).get("serializable") for op in p.success):
            return lag.txn(p.compare, p.success, p.failure)
        return p.apply()
    return hook


def test_re_add_read_from_a_lagging_member_is_not_refused_with_the_floor() -> None:
    """The runtime's DEL returned; the re-ADD's first (serializable) read comes from a member that
    has not applied the DEL's tombstone yet, so its commit fails on a tombstone newer than its read.
    Without more, that looks like a DEL during the ADD (refused, code 11, once); the node's floor
    (the DEL's revision, kept beside the lock) tells it is the DEL this re-ADD follows."""
    kv, lag = MemKV(), MemKV()
    for store in (ClusterStore(kv, "net", "n1"), ClusterStore(lag, "net", "n1")):
        store.assign("other", "eth0", RS, [], SIZES)  # both members hold the same state
    dele = ClusterStore(kv, "net", "n1")
    assert dele.release("c1", "eth0") == [] and dele.floor == kv.revision  # applied on the leader only
    kv.interceptor = _lagging_first_read(kv, lag)
    with pytest.raises(IpamError) as e:  # no floor (lockDir off): indistinguishable, refused
        ClusterStore(kv, "net", "n1").assign("c1", "eth0", RS, [], SIZES)
    assert e.value.kind == "deleted"
    again = ClusterStore(kv, "net", "n1")
    again.floor = dele.floor  # what the session reads from beside the lock
    got = again.assign("c1", "eth0", RS, [], SIZES)
    assert str(got[0].ip) == "10.90.0.3" and kv.get(dele.tombstone_key("c1", "eth0")) is None
    kv.interceptor = None
    assert again.inconsistencies() == []


def test_a_floor_from_another_etcd_is_forgotten() -> None:
    """A floor above the store's revision (etcd rebuilt, revisions started again) would make every
    tombstone look old; a linearizable read shows it for what it is, and a DEL during the ADD is
    still refused."""
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    done: list[int] = []

    def hook(p: Pending) -> TxnResult:
        if _is_add_commit(p, "c1") and not done:
            done.append(1)
            s.release("c1", "eth0")
        return p.apply()

    kv.interceptor = hook
    add = ClusterStore(kv, "net", "n1")
    add.floor = 10**9
    with pytest.raises(IpamError) as e:
        add.assign("c1", "eth0", RS, [], SIZES)
    assert e.value.kind == "deleted" and add.floor == 0
    assert s.floor == kv.revision  # a DEL's floor is its own write's revision
    assert _leftovers(s) == ([], [])


def test_session_keeps_the_floor_beside_the_lock(tmp_path: Path) -> None:
    """A DEL's tombstone revision is kept in the node's hint file; the next command reads it."""
    kv = MemKV()
    cfg = ClusterSettings(network="net", etcd=EtcdSettings(endpoints=["http://mem"]), node="n1",
                          lock_dir=str(tmp_path))
    with session(cfg, lock=True, kv=kv) as s:
        s.assign("c1", "eth0", RS, [], SIZES)
    with session(cfg, lock=True, kv=kv) as s:
        assert s.floor == 0
        s.release("c1", "eth0")
    floor = kv.revision
    with session(cfg, lock=True, kv=kv) as s:
        assert s.floor == floor and [str(c) for c in s.hint] == ["10.90.0.0/26"]
        s.assign("c2", "eth0", RS, [], SIZES)
    with session(cfg, lock=True, kv=kv) as s:
        assert s.floor == floor  # an ADD leaves it as it was


def test_tombstone_expires_with_its_lease() -> None:
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    s.release("c1", "eth0")
    s.release("c2", "eth0")
    t1, t2 = kv.get(s.tombstone_key("c1", "eth0")), kv.get(s.tombstone_key("c2", "eth0"))
    assert t1 is not None and t2 is not None and t1.lease == t2.lease  # one lease per store
    kv.expire(t1.lease)
    assert kv.get(s.tombstone_key("c1", "eth0")) is None and kv.get(s.tombstone_key("c2", "eth0")) is None


def test_del_racing_a_committing_add_releases_it() -> None:
    """The DEL reads "no handle", and the ADD commits before the DEL's tombstone write: that write
    (conditional on the handle's absence) fails, and the DEL releases what the ADD took."""
    kv = MemKV()
    s = ClusterStore(kv, "net", "n1")
    done: list[int] = []

    def hook(p: Pending) -> TxnResult:
        if p.writes and not done and any("/deleted/" in k for k in p.keys()):
            done.append(1)
            ClusterStore(kv, "net", "n1").assign("c1", "eth0", RS, [], SIZES)
        return p.apply()

    kv.interceptor = hook
    assert s.release("c1", "eth0") == ["10.90.0.2/24"] and s.lost_races == 1
    assert _leftovers(s) == ([], [])


# ---- the same on a real etcd ----------------------------------------------------------------------


class HeldBack:
    """A real etcd client whose ADD commit for ``cid`` waits (in its thread) until released:
    the request is built from a read made before the DEL, and sent after the DEL returned."""

    def __init__(self, etcd: Any, cid: str) -> None:
        self.etcd, self.cid = etcd, cid
        self.waiting = threading.Event()
        self.go = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.etcd, name)

    def txn(self, compare: Any, success: Any = (), failure: Any = ()) -> TxnResult:
        p = Pending(list(compare), list(success), list(failure), lambda: TxnResult(False, 0))
        if _is_add_commit(p, self.cid) and not self.go.is_set():
            self.waiting.set()
            assert self.go.wait(30)
        return self.etcd.txn(compare, success, failure)


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    if not etcd_available():
        pytest.skip("needs root and etcd (Debian's etcd-server)")
    with EtcdCluster(size=3, subnet="10.243.0.0/24", prefix="sf-tb") as c:
        yield c


def test_real_etcd_add_held_past_del(cluster: EtcdCluster) -> None:
    prefix = f"/sf-tomb-{time.monotonic_ns()}"
    with cluster.client(timeout=10) as etcd:
        held = HeldBack(etcd, "c1")
        outcome: list[Any] = []

        def add() -> None:
            try:
                outcome.append(ClusterStore(held, "net", "n1", prefix).assign("c1", "eth0", RS, [], SIZES))  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
                outcome.append(e)

        t = threading.Thread(target=add)
        t.start()
        assert held.waiting.wait(30)  # the ADD has read and built its transaction
        s = ClusterStore(etcd, "net", "n1", prefix)
        assert s.release("c1", "eth0") == []  # the DEL finds no handle, leaves its tombstone
        held.go.set()  # the ADD's transaction goes out after the DEL returned
        t.join(30)
        assert isinstance(outcome[0], IpamError) and outcome[0].kind == "deleted", outcome
        assert _leftovers(s) == ([], [])
        tomb = etcd.get(s.tombstone_key("c1", "eth0"))
        assert tomb is not None and tomb.lease
        # the runtime's next ADD of the same attachment works, and takes the tombstone away
        got = s.assign("c1", "eth0", RS, [], SIZES)
        assert str(got[0].ip) == "10.90.0.2" and etcd.get(s.tombstone_key("c1", "eth0")) is None
        assert s.release("c1", "eth0") == ["10.90.0.2/24"] and _leftovers(s) == ([], [])
        etcd.delete_prefix(prefix + "/")


# ---- item 3: a failed ADD, its rollback included, within the budget ---------------------------------

BUDGET = 4  # etcdTimeout of the network below


def _pycni_add(cluster: EtcdCluster, tmp: Path, bin_dir: str,
               cid: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``pycni add`` of a routed + cluster-ipam network from node1, as a runtime: a failed ADD is
    DELeted again before the command returns. (seconds taken, the process)."""
    node = cluster.nodes[0]
    conf_dir = tmp / "net.d"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / "10-budget.conflist").write_text(json.dumps({
        "cniVersion": "1.1.0", "name": "budget", "plugins": [{
            "type": "routed", "ipam": {"type": "cluster-ipam", "etcdEndpoints": cluster.endpoints,
                                       "etcdPrefix": "/sf-budget", "nodeName": node.name, "etcdTimeout": BUDGET,
                                       "lockDir": str(tmp / "locks"), "ranges": [[{"subnet": "10.88.0.0/24"}]]}}]}))
    pod = new_namespace("sf-bp")
    try:
        start = time.monotonic()
        proc = node.ns.run([sys.executable, "-m", "pycni", "add", "budget", pod.path, "--container-id", cid,
                            "--conf-dir", str(conf_dir), "--cni-path", bin_dir, "--cache-dir", str(tmp / "cache")],
                           check=False, timeout=120)
        elapsed = time.monotonic() - start
        links = pod.run(["ip", "-o", "link", "show"]).stdout.splitlines()
        if proc.returncode != 0:
            assert len(links) == 1 and ": lo:" in links[0], links  # rolled back: the pod keeps nothing
    finally:
        pod.delete()
    return elapsed, proc


def test_failed_add_with_etcd_down_is_bounded_rollback_included(cluster: EtcdCluster, tmp_path: Path,
                                                               plugin_dir: str) -> None:
    """Every member down: the ADD gives up after its budget and the runtime's rollback DEL does not
    wait a second one (the ADD sent nothing); the error says nothing is left."""
    cluster.kill_all()
    try:
        elapsed, proc = _pycni_add(cluster, tmp_path, plugin_dir, "down1")
    finally:
        cluster.restart_all()
    assert proc.returncode != 0
    err = proc.stderr  # pycni's CLI: "pycni: <msg>: <details> (code N)"
    assert proc.returncode != 0 and "(code 11)" in err and "etcd unavailable" in err, err
    assert "nothing was allocated: nothing is left for the runtime's DEL" in err, err
    assert "cleaning up after the failed ADD also failed" not in err, err
    print(f"\nADD with etcd down, rollback included: {elapsed:.1f}s (etcdTimeout {BUDGET}s)")
    assert elapsed < 2 * BUDGET, f"{elapsed:.1f}s: the rollback waited a second budget"


def test_failed_add_whose_write_went_out_says_so(cluster: EtcdCluster, tmp_path: Path, plugin_dir: str) -> None:
    """Two members of three down: the one left answers the ADD's reads, its transaction goes out and
    never commits. The rollback DEL tries briefly and says what is left; once etcd is back the
    runtime's DEL releases it, and nothing stays."""
    _, warm = _pycni_add(cluster, tmp_path, plugin_dir, "warm")  # node1 holds a block: the ADD below
    assert warm.returncode == 0, warm.stderr                       # reads it from its own member alone
    cluster.kill(1)
    cluster.kill(2)
    try:
        elapsed, proc = _pycni_add(cluster, tmp_path, plugin_dir, "noquorum1")
    finally:
        cluster.restart_all()
    print(proc.stdout, proc.stderr)
    err = proc.stderr
    assert proc.returncode != 0 and "(code 11)" in err and "may have been applied" in err, err
    print(f"\nADD without quorum, rollback included: {elapsed:.1f}s (etcdTimeout {BUDGET}s)")
    assert elapsed < 2 * BUDGET, f"{elapsed:.1f}s: the rollback waited a second budget"
    node = cluster.nodes[0]
    for cid in ("noquorum1", "warm"):
        proc = node.ns.run([sys.executable, "-m", "pycni", "del", "budget", "/var/run/netns/none", "--container-id",
                            cid, "--conf-dir", str(tmp_path / "net.d"), "--cni-path", plugin_dir,
                            "--cache-dir", str(tmp_path / "cache")], check=False, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    with cluster.client(timeout=10) as etcd:
        s = ClusterStore(etcd, "budget", node.name, "/sf-budget")
        assert _leftovers(s) == ([], [])
        etcd.delete_prefix("/sf-budget/")


def _unreachable_conf(lock_dir: Path) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": "gone", "type": "routed", "ipam": {
        "type": "cluster-ipam", "etcdEndpoints": ["http://127.0.0.1:1"], "nodeName": "n1", "etcdTimeout": 1,
        "lockDir": str(lock_dir), "ranges": [[{"subnet": "10.88.0.0/24"}]]}}


def test_rollback_del_does_not_skip_an_earlier_add_cut_off_mid_flight(tmp_path: Path) -> None:
    """An ADD killed with its transaction on the wire writes nothing afterwards; it marks "pending"
    just before its first write goes out. A later ADD of the same attachment that fails without
    sending (etcd unreachable) keeps that mark instead of claiming "unsent", and the rollback DEL
    then does a full DEL (its tombstone stops the late commit) instead of skipping etcd."""
    from plugin_util import err, run

    from pycni.cluster.session import failed_add, note_add

    conf = _unreachable_conf(tmp_path)
    cfg = ClusterSettings(network="gone", etcd=EtcdSettings(endpoints=["http://127.0.0.1:1"]), node="n1",
                          lock_dir=str(tmp_path))
    # Alone, an ADD that sent nothing lets the rollback DEL skip etcd.
    e = err(run("cluster-ipam", "ADD", conf, container_id="c0", netns="/var/run/netns/none"))
    assert e["code"] == 11 and "nothing is left for the runtime's DEL" in e["details"], e
    assert failed_add(cfg, "c0", "eth0") == "unsent"
    assert run("cluster-ipam", "DEL", conf, container_id="c0").exit_code == 0
    assert failed_add(cfg, "c0", "eth0") == ""
    # An earlier ADD of c1 was killed after its before-write mark.
    note_add(cfg, "c1", "eth0", "pending")
    e = err(run("cluster-ipam", "ADD", conf, container_id="c1", netns="/var/run/netns/none"))
    assert e["code"] == 11 and "an earlier ADD of it was cut off" in e["details"], e
    assert failed_add(cfg, "c1", "eth0") == "pending"
    out = run("cluster-ipam", "DEL", conf, container_id="c1")
    assert out.exit_code != 0 and json.loads(out.stdout)["code"] == 11  # it went to etcd, and said so
    assert failed_add(cfg, "c1", "eth0") == "pending"  # still there for the runtime's next DEL


def test_add_marks_pending_before_its_write_and_clears_on_success(tmp_path: Path) -> None:
    """The mark is written once, just before the first transaction goes out, and a successful ADD
    (whose handle a DEL releases in full) leaves no note."""
    from pycni.cluster.session import clear_failed_add, failed_add, note_add

    kv = MemKV()
    cfg = ClusterSettings(network="net", etcd=EtcdSettings(endpoints=["http://mem"]), node="n1",
                          lock_dir=str(tmp_path))
    seen: list[str] = []

    def hook(p: Pending) -> TxnResult:
        if p.writes:
            seen.append(failed_add(cfg, "c1", "eth0"))
        return p.apply()

    kv.interceptor = hook
    with session(cfg, lock=True, kv=kv) as s:
        s.before_write = lambda: note_add(cfg, "c1", "eth0", "pending")
        s.assign("c1", "eth0", RS, [], SIZES)
    assert seen == ["pending"]
    clear_failed_add(cfg, "c1", "eth0")
    assert failed_add(cfg, "c1", "eth0") == ""
