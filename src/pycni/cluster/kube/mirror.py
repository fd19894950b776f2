"""API objects as pycni's records: what ``pycni kube-controllers`` writes for each.

Pure functions from an API object (a dict as the API serves it) to the record the operator
verbs would write (:class:`~pycni.cluster.model.PodMeta` for pods and namespaces, a validated
:class:`~pycni.cluster.policy.model.NetworkPolicy`); the writes themselves go through
:mod:`pycni.cluster.policy.records`, the one home of those writes.
"""

from __future__ import annotations

from pycni.cluster.model import PodMeta

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pycni.cluster.policy.model import NetworkPolicy

SOURCE = "k8s"


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((obj.get("metadata") or {}).get("labels") or {}).items()}


def pod_meta(pod: dict[str, Any]) -> PodMeta:
    """A pod's labels and the named ports of its containers (``containers[].ports[]`` with a
    name; protocol TCP when unset, as the API defaults it), with its UID."""
    ports: set[tuple[str, int, str]] = set()
    for c in (pod.get("spec") or {}).get("containers") or ():
        for p in (c or {}).get("ports") or ():
            if isinstance(p, dict) and p.get("name") and isinstance(p.get("containerPort"), int):
                ports.add((str(p["name"]), int(p["containerPort"]), str(p.get("protocol") or "TCP")))
    return PodMeta(labels=_labels(pod), ports=sorted(ports), uid=str((pod.get("metadata") or {}).get("uid") or ""),
                   source=SOURCE)


def namespace_meta(ns: dict[str, Any]) -> PodMeta:
    return PodMeta(labels=_labels(ns), uid=str((ns.get("metadata") or {}).get("uid") or ""), source=SOURCE)


def network_policy(obj: dict[str, Any]) -> NetworkPolicy:
    """The policy as ``pycni policy apply`` would validate it (PolicyError when pycni refuses it):
    the API's bookkeeping (uid, resourceVersion, managedFields, status...) is not part of it."""
    from pycni.cluster.policy.model import parse_policy

    meta = obj.get("metadata") or {}
    manifest = {"apiVersion": obj.get("apiVersion", "networking.k8s.io/v1"), "kind": obj.get("kind", "NetworkPolicy"),
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
                "spec": obj.get("spec") or {}}
    return parse_policy(manifest)


def pod_on_node(pod: dict[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")
