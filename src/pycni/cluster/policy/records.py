"""Writing what policy reads: pod and namespace metadata and NetworkPolicy objects in etcd.

The one home of these writes. Two writers call it: the operator verbs (``pycni endpoint
label|ports``, ``pycni namespace label``, ``pycni policy apply|delete``) and the Kubernetes mirror
(``pycni kube-controllers``); the node agent and ``routed`` only read what it writes. The records
are the contract between those writers and the policy engine:

- ``Keys.pod(NS, POD)`` holds a :class:`~pycni.cluster.model.PodMeta` (labels, named ports);
- ``Keys.namespace(NS)`` a :class:`~pycni.cluster.model.PodMeta` whose labels are the namespace's;
- ``Keys.policy(NS, NAME)`` the NetworkPolicy manifest as validated (:func:`policy_document`).

Read-modify-writes compare on the record's revision, so two writers editing the same pod never
lose each other's keys; a write that would store the same bytes stores nothing (an etcd watch
then sees no event, and ``policy apply`` says "unchanged").

Every write takes an optional ``guard``: etcd compares that must hold in the same transaction
(the Kubernetes mirror passes "the leader key is still mine", so a deposed leader cannot write);
when the guard no longer holds the write raises :class:`GuardLost` and stores nothing. The mirror
also records the policies it had to refuse (:func:`put_policy_status`).
"""

from __future__ import annotations

from pycni.cluster.model import Keys, PodMeta, PolicyStatus
from pycni.spec.errors import TRY_AGAIN, CNIError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

    from pycni.cluster.policy.model import NetworkPolicy

CREATED, CONFIGURED, UNCHANGED = "created", "configured", "unchanged"
_TRIES = 16


class GuardLost(CNIError):
    """The write's ``guard`` no longer held (for the mirror: another replica leads now)."""

    def __init__(self, key: str) -> None:
        super().__init__(TRY_AGAIN, f"not written: {key}", "the write's guard no longer holds (leadership lost)")


def _txn(kv: Any, key: str, compare: list[dict[str, Any]], ops: list[dict[str, Any]],
         guard: Sequence[dict[str, Any]]) -> bool:
    """One guarded transaction: True when written; False when ``compare`` failed (the caller
    retries); GuardLost when ``guard`` did."""
    if kv.txn([*guard, *compare], ops).succeeded:
        return True
    if guard and not kv.txn(list(guard), []).succeeded:
        raise GuardLost(key)
    return False


def update_meta(kv: Any, key: str, change: Callable[[PodMeta], PodMeta],
                guard: Sequence[dict[str, Any]] = ()) -> tuple[PodMeta, bool]:
    """Read-modify-write the :class:`PodMeta` at ``key`` (a pod's or a namespace's) with a compare
    on its revision, retried when it moved; returns the record and whether anything was written."""
    from pycni.cluster.kv import if_absent, if_mod, op_put

    for _ in range(_TRIES):
        cur = kv.get(key)
        meta = PodMeta.from_json(cur.value) if cur is not None else PodMeta()
        new = change(meta)
        text = new.to_json()
        if cur is not None and cur.value == text:
            return new, False
        same = if_mod(key, cur.mod_revision) if cur is not None else if_absent(key)
        if _txn(kv, key, [same], [op_put(key, text)], guard):
            return new, True
    raise CNIError(TRY_AGAIN, f"{key} kept changing under this update", "try again")


def set_meta(kv: Any, key: str, meta: PodMeta, guard: Sequence[dict[str, Any]] = ()) -> bool:
    """Make the record at ``key`` exactly ``meta`` (what a mirror of another source of truth
    writes); True when it changed."""
    return update_meta(kv, key, lambda _old: meta, guard)[1]


def delete_meta(kv: Any, key: str, guard: Sequence[dict[str, Any]] = ()) -> bool:
    """Remove a pod's or a namespace's record; True when there was one."""
    return _delete(kv, key, guard)


def _delete(kv: Any, key: str, guard: Sequence[dict[str, Any]]) -> bool:
    if not guard:
        return bool(kv.delete(key))
    from pycni.cluster.kv import if_mod, op_delete

    for _ in range(_TRIES):
        cur = kv.get(key)
        if cur is None:
            return False
        if _txn(kv, key, [if_mod(key, cur.mod_revision)], [op_delete(key)], guard):
            return True
    raise CNIError(TRY_AGAIN, f"{key} kept changing under this delete", "try again")


def policy_document(policy: NetworkPolicy) -> str:
    """The stored form of a validated policy: its manifest, keys sorted (so equal manifests are
    equal bytes)."""
    import json

    return json.dumps(policy.source, sort_keys=True)


def put_policies(kv: Any, keys: Keys, policies: Iterable[NetworkPolicy],
                 guard: Sequence[dict[str, Any]] = ()) -> dict[str, str]:
    """Store ``policies`` in one transaction (a stream applies whole or not at all); per policy key
    (NS/NAME) what happened: ``created``, ``configured`` or ``unchanged``. Unchanged ones are not
    rewritten."""
    from pycni.cluster.kv import op_put

    outcome: dict[str, str] = {}
    puts = []
    for p in policies:
        key = keys.policy(p.namespace, p.name)
        text = policy_document(p)
        cur = kv.get(key)
        if cur is not None and cur.value == text:
            outcome[p.key] = UNCHANGED
            continue
        outcome[p.key] = CONFIGURED if cur is not None else CREATED
        puts.append(op_put(key, text))
    if puts and not kv.txn(list(guard), puts).succeeded:
        raise GuardLost(keys.policies)
    return outcome


def delete_policy(kv: Any, keys: Keys, namespace: str, name: str, guard: Sequence[dict[str, Any]] = ()) -> bool:
    """Remove one policy; True when there was one."""
    return _delete(kv, keys.policy(namespace, name), guard)


def put_policy_status(kv: Any, keys: Keys, namespace: str, name: str, status: PolicyStatus,
                      guard: Sequence[dict[str, Any]] = ()) -> bool:
    """Record why a policy of the API was refused (the mirror); True when it changed."""
    from pycni.cluster.kv import op_put

    key = keys.policy_status(namespace, name)
    text = status.to_json()
    cur = kv.get(key)
    if cur is not None and cur.value == text:
        return False
    if not kv.txn(list(guard), [op_put(key, text)]).succeeded:
        raise GuardLost(key)
    return True


def delete_policy_status(kv: Any, keys: Keys, namespace: str, name: str,
                         guard: Sequence[dict[str, Any]] = ()) -> bool:
    """Forget a refusal (the policy became valid, or is gone); True when there was one."""
    return _delete(kv, keys.policy_status(namespace, name), guard)
