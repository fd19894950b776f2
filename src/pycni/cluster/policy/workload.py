"""The plugin's side of network policy: record each attachment as a workload endpoint in etcd,
and return from ADD only once this node's agent covers the pod's host interface.

On a one-shot plugin's start path: stdlib, :mod:`pycni.jsonlite` and the cluster codec only.

- **The record** (``P/endpoints/<node>/<network>/<cid>/<ifname>``, :class:`WorkloadEndpoint`)
  is written after IPAM, in a transaction that requires the attachment's IPAM handle to exist:
  there is never an endpoint without a handle. cluster-ipam deletes the endpoint in the same
  transaction that releases the handle (DEL, GC), so neither outlives the other there; a crash
  between IPAM's commit and this write leaves a handle without endpoint — an attachment the
  runtime never saw succeed, released by its DEL or by GC like any other.
- **No window**: the agent's table drops every routed interface it has not programmed yet
  (fail closed, see :mod:`pycni.cluster.policy.compile`), so the pod is never *unprotected*;
  waiting for the agent makes it also not *cut off* once ADD returns. The wait polls the
  kernel (is the interface in the ``covered`` set?) for at most ``policySetupTimeout`` seconds,
  then fails with code 11 naming the agent. A node whose agent enforces no policy (no table)
  does not wait — unless the network's ``defaultPolicy`` is deny, which needs enforcement.
"""

from __future__ import annotations

import time

from pycni.cluster.model import PodMeta, WorkloadEndpoint
from pycni.spec.errors import TRY_AGAIN, CNIError

TYPE_CHECKING = False  # not typing's (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from pycni.cluster.kv import KVStore
    from pycni.cluster.settings import ClusterSettings

DEFAULT_NAMESPACE = "default"
DEFAULT_SETUP_TIMEOUT = 10.0
TABLE = "pycni_policy"  # our nftables table (inet): its one home; compile.py and the agent import it


def cluster_settings(conf: Mapping[str, Any]) -> ClusterSettings | None:
    """The cluster settings of a network whose IPAM is cluster-ipam; None for any other IPAM
    (no etcd, so no endpoint record)."""
    from pycni.spec.gokeys import lookup

    ipam = lookup(conf, "ipam")  # Go's key rules, as cluster-ipam reads it: "IPAM" names it too
    if not isinstance(ipam, dict) or lookup(ipam, "type") != "cluster-ipam":
        return None
    from pycni.cluster.settings import parse_cluster_settings

    return parse_cluster_settings(conf)


def workload_of(args: Mapping[str, str], container_id: str) -> tuple[str, str, str]:
    """(orchestrator, namespace, pod): Kubernetes' names from CNI_ARGS (parsed), else ``default``
    and the container ID, as Calico names a workload outside Kubernetes."""
    ns, pod = args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", "")
    if ns and pod and "/" not in ns + pod:
        return "k8s", ns, pod
    return "cni", DEFAULT_NAMESPACE, container_id


def record_endpoint(cfg: ClusterSettings, ep: WorkloadEndpoint, kv: KVStore | None = None, *,
                    pod_uid: str = "", wait_labels: float = 0.0) -> None:
    """Write ``ep``, requiring its IPAM handle; CNIError (11 when etcd does not answer) otherwise.

    With ``wait_labels`` (seconds): first wait for the pod's :class:`PodMeta` that ``pycni
    kube-controllers`` mirrors from the API (of UID ``pod_uid`` when given: a record left by an
    earlier pod of the same name is not this pod's), and write the endpoint with its labels. The
    agent reads etcd in revision order, so it learns the labels before it learns the endpoint:
    there is no moment at which it sees this pod unlabelled. Code 11 when they do not come in time.
    """
    from pycni.cluster.kv import if_absent, op_put
    from pycni.cluster.session import Session

    with Session(cfg, kv=kv, who="routed", timeout=cfg.etcd.timeout + wait_labels) as store:
        keys = store.keys
        if wait_labels > 0:
            meta = _wait_pod_meta(store.kv, keys.pod(ep.namespace, ep.pod), pod_uid, wait_labels)
            ep.labels = {**ep.labels, **meta.labels}
        handle = keys.handle(ep.network, ep.container_id, ep.ifname)
        # etcd compares only for equality: "handle absent" failing is "handle present", and the
        # failure branch writes the endpoint
        res = store.kv.txn([if_absent(handle)], [],
                           [op_put(keys.endpoint(ep.node, ep.network, ep.container_id, ep.ifname), ep.to_json())])
        if res.succeeded:
            raise CNIError(TRY_AGAIN, f"routed: the IPAM handle of {ep.container_id}/{ep.ifname} vanished before "
                           "its workload endpoint was recorded", "a DEL or GC of the same attachment ran at once")


def delete_endpoint(cfg: ClusterSettings, container_id: str, ifname: str, kv: KVStore | None = None) -> None:
    """Delete this node's endpoint of the attachment (nothing when there is none)."""
    from pycni.cluster.session import Session

    with Session(cfg, kv=kv, who="routed") as store:
        store.kv.delete(store.keys.endpoint(cfg.node, cfg.network, container_id, ifname))


def gc_endpoints(cfg: ClusterSettings, valid: Sequence[tuple[str, str]], kv: KVStore | None = None) -> list[str]:
    """Delete this node's endpoints of this network that ``valid`` (container ID, ifname) does not
    name; the keys deleted."""
    from pycni.cluster.session import Session

    keep = set(valid)
    gone = []
    with Session(cfg, kv=kv, who="routed") as store:
        prefix = store.keys.endpoints_of(cfg.node, cfg.network)
        kvs, _ = store.kv.range(prefix, prefix=True, keys_only=True)
        for item in kvs:
            parsed = store.keys.parse(item.key)
            if parsed is not None and (parsed.container_id, parsed.ifname) not in keep:
                store.kv.delete(item.key)
                gone.append(item.key)
    return gone


def _covered(iface: str) -> bool:
    """Whether the agent has programmed ``iface``: one netlink question (a set-element query,
    ~0.1 ms, no process); ``nft get element`` only where the kernel does not answer it."""
    from pycni.net import probe

    answer = probe.nft_set_has_ifname("inet", TABLE, "covered", iface)
    if answer is not None:
        return answer
    from pycni.net import nft

    try:
        nft.run(f'get element inet {TABLE} covered {{ "{iface}" }}\n', what="policy coverage check")
    except nft.NftError as e:
        # not there yet, or asked while the agent was changing the table: ask again
        if e.not_found or e.interrupted:
            return False
        raise
    return True


def _enforcing() -> bool:
    """Whether this node has our policy table: asked of the kernel (one netlink request, no ``nft``
    process: every routed ADD asks, on nodes without an agent too); ``nft list tables`` only where
    the kernel cannot be asked that way."""
    from pycni.net import probe

    present = probe.nft_object_exists("inet", TABLE)
    if present is not None:
        return present
    from pycni.net import nft

    return any(t.get("family") == "inet" and t.get("name") == TABLE
               for t in nft.objects(nft.list_json("tables"), "table"))


def wait_covered(iface: str, timeout: float, required: bool) -> bool:
    """Return once this node's agent covers ``iface`` (True), or at once when no agent enforces
    policy here and none is ``required`` (False); code 11 when the agent does not within
    ``timeout`` seconds, or is required and absent."""
    if not _enforcing():
        if required:
            raise CNIError(TRY_AGAIN, "routed: defaultPolicy is deny but no network policy is enforced on this node",
                           f"the nftables table inet {TABLE} does not exist: start the node agent (pycni node) "
                           "on this node")
        return False
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        if _covered(iface):
            return True
        now = time.monotonic()
        if now >= deadline:
            raise CNIError(TRY_AGAIN, f"routed: the node agent did not program network policy for {iface} "
                           f"within {timeout:g}s (policySetupTimeout)",
                           "is pycni node running on this node and reaching etcd? Until it programs the "
                           "interface the pod's traffic is dropped (fail closed)")
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, 0.1)


def _wait_pod_meta(kv: KVStore, key: str, uid: str, timeout: float) -> PodMeta:
    """The pod's record once it is there (and is the pod of ``uid``); code 11 past ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        cur = kv.get(key)
        if cur is not None:
            meta = PodMeta.from_json(cur.value)
            if not uid or not meta.uid or meta.uid == uid:
                return meta
        now = time.monotonic()
        if now >= deadline:
            what = "an earlier pod's (another UID)" if cur is not None else "absent"
            raise CNIError(TRY_AGAIN, f"routed: the pod's labels from the Kubernetes API were not recorded within "
                           f"{timeout:g}s (policySetupTimeout)",
                           f"{key} is {what}: is pycni kube-controllers running and reaching the API and etcd? "
                           "Until it records them the pod cannot be judged by its labels, so it is not started")
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, 0.1)
