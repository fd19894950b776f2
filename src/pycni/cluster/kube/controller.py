"""``pycni kube-controllers``: keep pycni's etcd records equal to the Kubernetes API.

Four informers (Namespace, Pod, NetworkPolicy, Node; see :mod:`.informer`) feed one key queue;
one writer (this replica, while it leads: :mod:`.leader`) turns each key into the record the
operator verbs would write, through :mod:`pycni.cluster.policy.records`, guarded by the leader
key. A periodic reconcile (``resync`` seconds, and on taking the lead) compares every record with
the caches and fixes what differs — an etcd restored from a backup converges — and removes what
the API no longer has: records the mirror wrote (``source`` "k8s") of pods and namespaces, and
every NetworkPolicy (with kube-controllers running, ``P/policies/`` belongs to the API).

Garbage collection, both only after ``grace`` seconds of absence and a fresh GET answering 404
(a cache can lag; the API cannot be wrong about "exists"), never while the API is unreachable:

- a workload endpoint of a Kubernetes pod that no longer exists (or exists under another UID:
  re-created with the same name): its attachment is released as cluster-ipam's DEL would
  (handle, addresses, endpoint, a tombstone) — a lost DEL leaks nothing for ever;
- a node that is in etcd (registration, affinities) but no longer in the API, while the API has
  Nodes: its registration is removed and its blocks and affinities released, as ``pycni ipam
  release --node`` does.
"""

from __future__ import annotations

import logging
import threading
import time

from pycni.cluster.kube.client import KINDS, KubeClient, KubeError
from pycni.cluster.kube.informer import Backoff, Informer
from pycni.cluster.kube.leader import DEFAULT_TTL, Leadership
from pycni.cluster.kube.mirror import SOURCE, namespace_meta, network_policy, pod_meta
from pycni.cluster.model import Keys, PodMeta, PolicyStatus, WorkloadEndpoint

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pycni.cluster.settings import EtcdSettings

log = logging.getLogger("pycni.kube")

DEFAULT_RESYNC = 300.0
DEFAULT_GRACE = 60.0


class Controller:
    """The mirror: informers, one writer while leading, periodic reconcile and GC."""

    def __init__(self, kube: KubeClient, etcd: EtcdSettings, *, resync: float = DEFAULT_RESYNC,
                 grace: float = DEFAULT_GRACE, lease_ttl: int = DEFAULT_TTL, identity: str = "",
                 page: int = 500) -> None:
        from pycni.cluster.settings import client

        self.kube = kube
        self.etcd_settings = etcd
        self.kv = client(etcd, one_shot=False)
        self.keys = Keys(etcd.prefix)
        self.resync = max(1.0, resync)
        self.grace = max(0.0, grace)
        self.stop = threading.Event()
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str], None] = {}  # ordered set
        self.informers = {k: Informer(kube, k, self.enqueue, self.stop, page=page) for k in KINDS}
        self.leader = Leadership(self.kv, self.keys.kube_leader, lease_ttl, identity)
        self._absent: dict[str, float] = {}  # GC candidates (endpoint key / node:NAME) -> first seen absent
        self.writes = 0

    # -- the queue --

    def enqueue(self, kind: str, key: str) -> None:
        with self._cond:
            self._pending[(kind, key)] = None
            self._cond.notify()

    def _take(self, timeout: float) -> list[tuple[str, str]]:
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout)
            batch = list(self._pending)
            self._pending.clear()
            return batch

    # -- the loop --

    def run(self) -> int:
        """Until :attr:`stop`: informers, then lead (or wait to) and mirror."""
        from pycni.cluster.settings import client

        for inf in self.informers.values():
            inf.start()
        while not self.stop.is_set():
            if not self.leader.campaign(self.stop):
                break
            keep_stop = threading.Event()
            keeper_kv = client(self.etcd_settings, one_shot=False)
            keeper = threading.Thread(target=self.leader.keep, args=(keep_stop, keeper_kv), daemon=True)
            keeper.start()
            try:
                self._lead()
            finally:
                keep_stop.set()
                keeper.join(timeout=5)
                keeper_kv.close()
                if self.stop.is_set():
                    self.leader.resign()
        return 0

    def _synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self.informers.values())

    def _lead(self) -> None:
        from pycni.cluster.etcd import EtcdError
        from pycni.cluster.policy.records import GuardLost
        from pycni.spec.errors import CNIError

        while not self._synced():  # a reconcile against half-filled caches would delete the rest
            if self.stop.wait(0.1) or self.leader.lost.is_set():
                return
        log.info("caches synced; reconciling")
        next_resync = 0.0
        next_gc = time.monotonic() + min(self.grace, self.resync) / 4
        backoff = Backoff()
        while not self.stop.is_set() and not self.leader.lost.is_set():
            try:
                now = time.monotonic()
                if now >= next_resync:
                    self.reconcile()
                    next_resync = now + self.resync
                if now >= next_gc:
                    self.collect()
                    next_gc = now + max(0.5, min(self.grace, self.resync) / 4)
                # at most half a second: a stop (SIGTERM) is noticed within that
                batch = self._take(min(0.5, max(0.05, min(next_resync, next_gc) - time.monotonic())))
                for i, (kind, key) in enumerate(batch):
                    try:
                        self.sync(kind, key)
                    except BaseException:
                        for item in batch[i:]:
                            self.enqueue(*item)
                        raise
                backoff.reset()
            except GuardLost:
                log.warning("another replica leads now: this one stops writing")
                self.leader.lost.set()
            except (EtcdError, KubeError, CNIError) as e:  # (CNIError: a record that kept changing)
                pause = backoff.next()
                log.warning("etcd or the API failed (%s); retrying in %.1fs", e, pause)
                self.stop.wait(pause)

    # -- one key --

    def sync(self, kind: str, key: str) -> None:
        """Make the record of one API object equal to the cache (or remove it)."""
        from pycni.cluster.policy import records

        guard = self.leader.guard
        obj = self.informers[kind].get(key)
        if kind == "Pod":
            ns, _, name = key.partition("/")
            rkey = self.keys.pod(ns, name)
            if obj is not None:
                self._count(records.set_meta(self.kv, rkey, pod_meta(obj), guard))
            else:
                self._delete_owned(rkey)
        elif kind == "Namespace":
            rkey = self.keys.namespace(key)
            if obj is not None:
                self._count(records.set_meta(self.kv, rkey, namespace_meta(obj), guard))
            else:
                self._delete_owned(rkey)
        elif kind == "NetworkPolicy":
            ns, _, name = key.partition("/")
            if obj is None:
                self._count(records.delete_policy(self.kv, self.keys, ns, name, guard))
                records.delete_policy_status(self.kv, self.keys, ns, name, guard)
                return
            self._put_policy(ns, name, obj)
        # Node: nothing to mirror; a deleted node is collected by collect() after the grace period

    def _count(self, wrote: bool) -> None:
        self.writes += int(wrote)

    def _delete_owned(self, rkey: str) -> None:
        """Remove a pod's or namespace's record that the mirror wrote (an operator's stays)."""
        from pycni.cluster.policy import records

        cur = self.kv.get(rkey)
        if cur is not None and PodMeta.from_json(cur.value).source == SOURCE:
            self._count(records.delete_meta(self.kv, rkey, self.leader.guard))

    def _put_policy(self, ns: str, name: str, obj: dict[str, Any]) -> None:
        from pycni.cluster.policy import records
        from pycni.cluster.policy.model import PolicyError

        guard = self.leader.guard
        meta = obj.get("metadata") or {}
        try:
            policy = network_policy(obj)
        except PolicyError as e:
            status = PolicyStatus(error=str(e), resource_version=str(meta.get("resourceVersion") or ""),
                                  uid=str(meta.get("uid") or ""))
            if records.put_policy_status(self.kv, self.keys, ns, name, status, guard):
                kept = self.kv.get(self.keys.policy(ns, name)) is not None
                log.warning("NetworkPolicy %s/%s refused: %s (%s)", ns, name, e,
                            "its previous version stays enforced" if kept else "nothing of it is enforced")
            return
        out = records.put_policies(self.kv, self.keys, [policy], guard)
        self._count(out.get(policy.key) != records.UNCHANGED)
        if records.delete_policy_status(self.kv, self.keys, ns, name, guard):
            log.info("NetworkPolicy %s/%s accepted now", ns, name)

    # -- the whole picture --

    def reconcile(self) -> None:
        """Compare every record with the caches; queue what differs, remove what the API lost."""
        from pycni.cluster.policy import records

        guard = self.leader.guard
        want_pods = {k: pod_meta(o).to_json() for k in self.informers["Pod"].keys()
                     if (o := self.informers["Pod"].get(k)) is not None}
        want_ns = {k: namespace_meta(o).to_json() for k in self.informers["Namespace"].keys()
                   if (o := self.informers["Namespace"].get(k)) is not None}
        stale = 0
        for prefix, want, kind in ((self.keys.pods, want_pods, "Pod"), (self.keys.namespaces, want_ns, "Namespace")):
            kvs, _ = self.kv.get_prefix(prefix)
            have = {kv.key[len(prefix):]: kv.value for kv in kvs}
            for k, text in want.items():
                if have.get(k) != text:
                    self.enqueue(kind, k)
                    stale += 1
            for k, text in have.items():
                if k not in want and PodMeta.from_json(text).source == SOURCE:
                    self.enqueue(kind, k)
                    stale += 1
        pols = self.informers["NetworkPolicy"]
        api_pols = set(pols.keys())
        for prefix in (self.keys.policies, self.keys.policy_statuses):
            kvs, _ = self.kv.get_prefix(prefix)
            for kv in kvs:
                k = kv.key[len(prefix):]
                if k not in api_pols:
                    ns, _, name = k.partition("/")
                    if prefix == self.keys.policies:
                        self._count(records.delete_policy(self.kv, self.keys, ns, name, guard))
                        log.info("NetworkPolicy %s: not in the API; removed", k)
                    else:
                        records.delete_policy_status(self.kv, self.keys, ns, name, guard)
                    stale += 1
        for k in api_pols:
            self.enqueue("NetworkPolicy", k)  # put_policies writes only what differs
        if stale:
            log.info("reconcile: %d record(s) differed from the API", stale)

    def collect(self) -> None:
        """Release what belongs to pods and nodes the API no longer has (after the grace period)."""
        now = time.monotonic()
        seen: set[str] = set()
        pods = self.informers["Pod"]
        kvs, _ = self.kv.get_prefix(self.keys.endpoints)
        for kv in kvs:
            ep = WorkloadEndpoint.from_json(kv.value)
            if ep is None or ep.orchestrator != "k8s" or _same_pod(ep, pods.get(ep.workload)):
                continue
            seen.add(kv.key)
            first = self._absent.setdefault(kv.key, now)
            if now - first >= self.grace and self._confirm_gone("Pod", ep.namespace, ep.pod, ep.pod_uid):
                self._release_endpoint(ep)
                self._absent.pop(kv.key, None)
        nodes = self.informers["Node"]
        if nodes.keys():
            for name in self._etcd_nodes():
                if nodes.get(name) is not None:
                    continue
                tag = f"node:{name}"
                seen.add(tag)
                first = self._absent.setdefault(tag, now)
                if now - first >= self.grace and self._confirm_gone("Node", "", name):
                    self.release_node(name)
                    self._absent.pop(tag, None)
        for k in [k for k in self._absent if k not in seen]:
            del self._absent[k]

    def _confirm_gone(self, kind: str, namespace: str, name: str, uid: str = "") -> bool:
        """The API, asked now, has no such object (or, with ``uid``, only another of that name)."""
        if self.leader.lost.is_set():
            return False
        try:
            obj = self.kube.exists(kind, namespace, name)
            return obj is None or bool(uid) and (obj.get("metadata") or {}).get("uid") != uid
        except KubeError as e:
            log.warning("not collecting %s %s/%s: the API did not confirm it is gone (%s)", kind, namespace, name, e)
            return False

    def _release_endpoint(self, ep: WorkloadEndpoint) -> None:
        from pycni.cluster.ipam import ClusterStore

        store = ClusterStore(self.kv, ep.network, ep.node, self.keys.prefix)
        ips = store.release(ep.container_id, ep.ifname)
        self.kv.delete(self.keys.endpoint(ep.node, ep.network, ep.container_id, ep.ifname))
        log.warning("pod %s is gone from the API but its attachment %s/%s on %s was never deleted: released %s",
                    ep.workload, ep.container_id, ep.ifname, ep.node, ", ".join(ips) or "its endpoint")

    def _etcd_nodes(self) -> set[str]:
        """Node names pycni's etcd knows: registrations and block affinities."""
        out: set[str] = set()
        for prefix in (self.keys.nodes, self.keys.affinities):
            kvs, _ = self.kv.range(prefix, prefix=True, keys_only=True)
            for kv in kvs:
                out.add(kv.key[len(prefix):].split("/", 1)[0])
        return out

    def release_node(self, name: str) -> tuple[int, int]:
        """Everything node ``name`` holds, in every network: registration, handles, blocks and
        affinities (``pycni ipam release --node`` for each). Returns (handles, blocks) released."""
        from pycni.cluster.ipam import ClusterStore
        from pycni.cluster.node import remove_node

        networks: set[str] = set()
        kvs, _ = self.kv.range(f"{self.keys.affinities}{name}/", prefix=True, keys_only=True)
        networks.update(kv.key.split("/")[-2] for kv in kvs)
        kvs, _ = self.kv.range(self.keys.blocks, prefix=True, keys_only=True)
        networks.update(kv.key[len(self.keys.blocks):].split("/", 1)[0] for kv in kvs)
        handles = blocks = 0
        remove_node(self.kv, self.keys.prefix, name)
        for net in sorted(networks):
            h, b = ClusterStore(self.kv, net, name, self.keys.prefix).release_node()
            handles, blocks = handles + len(h), blocks + len(b)
        log.warning("node %s is gone from the API: released %d attachment(s) and %d block(s)", name, handles, blocks)
        return handles, blocks


def _same_pod(ep: WorkloadEndpoint, pod: dict[str, Any] | None) -> bool:
    """Whether ``pod`` (from the cache) is the pod the endpoint was made for: same name, and the
    same UID when the endpoint knows it."""
    if pod is None:
        return False
    return not ep.pod_uid or (pod.get("metadata") or {}).get("uid") == ep.pod_uid
