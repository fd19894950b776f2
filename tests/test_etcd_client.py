"""pycni.cluster.etcd against a real 3-member etcd cluster in throwaway namespaces."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from etcd_util import EtcdCluster, etcd_available

from pycni.cluster.etcd import (
    Etcd,
    EtcdCompacted,
    EtcdError,
    EtcdUnavailable,
    WatchBroken,
    if_absent,
    if_mod,
    if_value,
    op_delete,
    op_get,
    op_put,
    prefix_end,
)

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(subnet="10.231.1.0/24") as c:
        yield c


@pytest.fixture
def etcd(cluster: EtcdCluster) -> Iterator[Etcd]:
    cluster.restart_all()
    with cluster.client(timeout=10) as c:
        c.delete_prefix("/t/")
        yield c


def test_prefix_end() -> None:
    assert prefix_end("/a/") == "L2Ew"  # "/a0"
    assert prefix_end("") == "AA=="


def test_bad_endpoints() -> None:
    with pytest.raises(ValueError, match="http"):
        Etcd(["10.0.0.1:2379"])
    with pytest.raises(ValueError):
        Etcd([])


def test_kv_roundtrip(etcd: Etcd) -> None:
    rev = etcd.put("/t/a", "1")
    etcd.put("/t/b", "ünïcode")
    etcd.put("/t0", "outside the prefix")
    kv = etcd.get("/t/a")
    assert kv is not None and kv.value == "1" and kv.mod_revision == rev and kv.version == 1
    assert etcd.get("/t/missing") is None
    kvs, store_rev = etcd.get_prefix("/t/")
    assert [(k.key, k.value) for k in kvs] == [("/t/a", "1"), ("/t/b", "ünïcode")]
    assert store_rev >= rev
    assert etcd.delete("/t/a") == 1 and etcd.delete("/t/a") == 0
    assert etcd.delete_prefix("/t/") == 1
    assert etcd.get("/t0") is not None
    etcd.delete("/t0")


def test_txn_both_branches(etcd: Etcd) -> None:
    first = etcd.txn([if_absent("/t/k")], [op_put("/t/k", "v1")], [op_get("/t/k")])
    assert first.succeeded and first.responses == [None]
    second = etcd.txn([if_absent("/t/k")], [op_put("/t/k", "v2")], [op_get("/t/k")])
    assert not second.succeeded  # the gateway omits "succeeded" when false
    [kvs] = second.responses
    assert kvs[0].value == "v1"
    rev = kvs[0].mod_revision
    moved = etcd.txn([if_mod("/t/k", rev), if_value("/t/k", "v1")], [op_put("/t/k", "v3"), op_delete("/t/x")])
    assert moved.succeeded and moved.responses == [None, 0]
    stale = etcd.txn([if_mod("/t/k", rev)], [op_put("/t/k", "v4")])
    assert not stale.succeeded
    assert etcd.get("/t/k").value == "v3"  # type: ignore[union-attr]


def test_invalid_request_is_not_retried(etcd: Etcd) -> None:
    with pytest.raises(EtcdError) as err:
        etcd.txn([if_absent("/t/k")], [op_put("/t/k", "a"), op_put("/t/k", "b")])
    assert not isinstance(err.value, EtcdUnavailable)
    assert "duplicate key" in str(err.value)


def test_lease_binds_keys(etcd: Etcd) -> None:
    lease = etcd.lease_grant(30)
    assert etcd.lease_keepalive(lease) == 30
    etcd.put("/t/leased", "x", lease=lease)
    assert etcd.get("/t/leased").lease == lease  # type: ignore[union-attr]
    etcd.lease_revoke(lease)
    assert etcd.get("/t/leased") is None
    assert etcd.lease_keepalive(lease) == 0
    etcd.lease_revoke(lease)  # already gone: fine


def test_watch_events_and_idle(etcd: Etcd) -> None:
    rev = etcd.put("/t/w/seed", "0")
    with etcd.watch("/t/w/", prefix=True, start_revision=rev + 1, prev_kv=True) as w:
        assert w.next(timeout=0.3) is None  # idle: nothing yet, stream intact
        etcd.put("/t/w/a", "1")
        etcd.put("/t/other", "not watched")
        etcd.delete("/t/w/a")
        seen = []
        while len(seen) < 2:
            batch = w.next(timeout=5)
            assert batch is not None
            seen.extend((e.type, e.kv.key, e.prev.value if e.prev else None) for e in batch.events)
        assert seen == [("PUT", "/t/w/a", None), ("DELETE", "/t/w/a", "1")]


def test_watch_ready_says_whether_more_has_arrived(etcd: Etcd) -> None:
    """``ready()`` is how the node agent drains a burst without sleeping on an idle stream."""
    rev = etcd.put("/t/r/seed", "0")
    with etcd.watch("/t/r/", prefix=True, start_revision=rev + 1) as w:
        assert not w.ready()  # nothing sent yet
        etcd.put("/t/r/a", "1")
        etcd.put("/t/r/b", "2")
        deadline = time.monotonic() + 10
        while not w.ready():  # the events are on their way
            assert time.monotonic() < deadline, "no event arrived"
            time.sleep(0.01)
        keys = []
        while len(keys) < 2:
            batch = w.next(timeout=5)
            assert batch is not None
            keys += [e.kv.key for e in batch.events]
        assert keys == ["/t/r/a", "/t/r/b"] and not w.ready()


def test_watch_compacted(etcd: Etcd) -> None:
    old = etcd.put("/t/c", "1")
    now = etcd.put("/t/c", "2")
    etcd.call("/v3/kv/compaction", {"revision": str(now)})
    with pytest.raises(EtcdCompacted) as err:
        w = etcd.watch("/t/c", start_revision=old)
        while True:
            w.next(timeout=5)
    assert err.value.compact_revision == now
    assert isinstance(err.value, WatchBroken)


def test_failover_and_broken_watch(cluster: EtcdCluster, etcd: Etcd) -> None:
    w = etcd.watch("/t/f/", prefix=True)
    victim = cluster.endpoints.index(w.endpoint)
    cluster.kill(victim)
    with pytest.raises(WatchBroken):
        while True:
            w.next(timeout=5)
    for i in range(5):  # the two left keep quorum: writes go on, through whichever answers
        etcd.put(f"/t/f/{i}", str(i))
    kvs, _ = etcd.get_prefix("/t/f/")
    assert len(kvs) == 5
    with etcd.watch("/t/f/", prefix=True) as w2:  # a new watch lands on a live member
        assert w2.endpoint != cluster.endpoints[victim]


def test_no_endpoint_answers(cluster: EtcdCluster) -> None:
    cluster.kill_all()
    try:
        with cluster.client(timeout=2, attempt_timeout=1) as etcd:
            start = time.monotonic()
            with pytest.raises(EtcdUnavailable) as err:
                etcd.put("/t/down", "x")
            elapsed = time.monotonic() - start
        msg = str(err.value)
        for ep in cluster.endpoints:
            assert ep in msg
        assert "connection refused" in msg
        assert err.value.timeout == 2
        assert elapsed < 2 + 10  # bounded by the budget (wide margin for a loaded machine)
    finally:
        cluster.restart_all()


def test_no_quorum_is_unavailable(cluster: EtcdCluster) -> None:
    cluster.kill(0)
    cluster.kill(1)
    try:
        with cluster.client(timeout=2, attempt_timeout=0.5) as etcd:
            with pytest.raises(EtcdUnavailable):
                etcd.put("/t/noquorum", "x")
    finally:
        cluster.restart_all()
    with cluster.client() as etcd:  # quorum back: the same client call succeeds
        etcd.put("/t/noquorum", "y")
        assert etcd.get("/t/noquorum").value == "y"  # type: ignore[union-attr]
