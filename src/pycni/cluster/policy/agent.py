"""The node agent's policy half: a view of endpoints, pod and namespace metadata and policies
kept from etcd, and the nftables it programs from them (``pycni node --policy``).

The agent (:mod:`pycni.cluster.node`) hands every watch event here; a batch of events that
changes what this node enforces gives the desired objects — patched into the last state when the
batch is endpoints and pod records only (:func:`compile.patch_node`), policies only
(:func:`compile.patch_policies`) or namespace labels only (:func:`compile.patch_namespaces`),
compiled otherwise (:func:`compile.compile_node`) — and the
difference goes out as one transaction (:class:`nftsync.Programmer`). A full read (a broken watch,
the periodic resync) is diffed the same way; only the agent's start (and a transaction the
kernel refused) rebuilds the table, atomically: the old rules hold until the new ones replace
them, so a restarted agent never opens a window, and one that is down leaves its rules — and
the fail-closed drop of pods it has not seen — in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pycni import ipaddr
from pycni.cluster.model import Keys, NodeInfo, PodMeta, WorkloadEndpoint
from pycni.cluster.policy.compile import Endpoint, Memo, compile_node, patch_namespaces, patch_node, patch_policies
from pycni.cluster.policy.evaluate import Cluster, Workload
from pycni.cluster.policy.model import NetworkPolicy, PolicyError, parse_policy
from pycni.cluster.policy.nftsync import Programmer


class PolicyView:
    """Everything policy reads from etcd, decoded (keys and values through pycni.cluster.model)."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.endpoints: dict[str, WorkloadEndpoint] = {}
        self.pods: dict[tuple[str, str], PodMeta] = {}
        self.namespaces: dict[str, PodMeta] = {}
        self.policies: dict[tuple[str, str], NetworkPolicy] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.errors: dict[str, str] = {}  # key -> why its value was ignored
        # endpoint key -> (record, pod record, compiled) while neither record object is replaced
        self._compiled: dict[str, tuple[WorkloadEndpoint, PodMeta | None, Endpoint]] = {}
        # what to look at again in refresh(): endpoint keys whose record or pod record changed
        # (None: all of them, after a full read); and each pod's endpoint keys, to find them
        self._dirty: set[str] | None = None
        self._by_pod: dict[tuple[str, str], set[str]] = {}
        self._ns_labels: dict[str, dict[str, str]] | None = None  # namespace_labels(), until it changes

    @property
    def prefixes(self) -> tuple[str, ...]:
        k = self.keys
        return (k.endpoints, k.pods, k.namespaces, k.policies, k.nodes)

    def load(self, kv: Any) -> int:
        """A full read of every prefix at one revision; returns it."""
        from pycni.cluster.kv import op_get

        res = kv.txn([], [op_get(p, prefix=True) for p in self.prefixes])
        self.endpoints, self.pods, self.namespaces, self.policies, self.nodes = {}, {}, {}, {}, {}
        self.errors, self._by_pod = {}, {}
        for kvs in res.responses:
            for item in kvs:
                self.put(item.key, item.value)
        self._dirty = self._ns_labels = None
        return int(res.revision)

    def _endpoint_gone(self, key: str) -> None:
        old = self.endpoints.pop(key, None)
        if old is not None:
            self._by_pod.get((old.namespace, old.pod), set()).discard(key)
            self._ns_labels = None
        self._touch([key])

    def _touch(self, keys: Any) -> None:
        if self._dirty is not None:
            self._dirty.update(keys)

    def put(self, key: str, value: str) -> bool:
        """Apply a key's new value; True when it is one policy reads."""
        parsed = self.keys.parse(key)
        if parsed is None:
            return False
        self.errors.pop(key, None)
        if parsed.kind == "endpoint":
            ep = WorkloadEndpoint.from_json(value)
            self._endpoint_gone(key)
            if ep is None:
                self.errors[key] = "not a workload endpoint"
            else:
                self.endpoints[key] = ep
                self._by_pod.setdefault((ep.namespace, ep.pod), set()).add(key)
                if self._ns_labels is not None and ep.namespace not in self._ns_labels:
                    self._ns_labels = None
        elif parsed.kind == "pod":
            self.pods[(parsed.namespace, parsed.name)] = PodMeta.from_json(value)
            self._touch(self._by_pod.get((parsed.namespace, parsed.name), ()))
        elif parsed.kind == "namespace":
            self.namespaces[parsed.namespace] = PodMeta.from_json(value)
            self._ns_labels = None
        elif parsed.kind == "policy":
            try:
                pol = parse_policy(json.loads(value))
                if (pol.namespace, pol.name) != (parsed.namespace, parsed.name):
                    raise PolicyError(f"stored under {parsed.namespace}/{parsed.name} but names {pol.key}")
                self.policies[(parsed.namespace, parsed.name)] = pol
            except (ValueError, PolicyError) as e:
                self.errors[key] = str(e)
                self.policies.pop((parsed.namespace, parsed.name), None)
        elif parsed.kind == "node":
            info = NodeInfo.from_json(parsed.node, value)
            if info is not None:
                self.nodes[parsed.node] = info
        else:
            return False
        return True

    def delete(self, key: str) -> bool:
        parsed = self.keys.parse(key)
        if parsed is None:
            return False
        self.errors.pop(key, None)
        if parsed.kind == "endpoint":
            self._endpoint_gone(key)
        elif parsed.kind == "pod":
            self.pods.pop((parsed.namespace, parsed.name), None)
            self._touch(self._by_pod.get((parsed.namespace, parsed.name), ()))
        elif parsed.kind == "namespace":
            self.namespaces.pop(parsed.namespace, None)
            self._ns_labels = None
        elif parsed.kind == "policy":
            self.policies.pop((parsed.namespace, parsed.name), None)
        elif parsed.kind == "node":
            self.nodes.pop(parsed.node, None)
        else:
            return False
        return True

    # -- derived --

    def workload(self, ep: WorkloadEndpoint) -> Workload:
        """The endpoint as policy sees it: its labels under the pod record's, the pod's named ports."""
        meta = self.pods.get((ep.namespace, ep.pod))
        labels = {**ep.labels, **(meta.labels if meta else {})}
        ports = {(name, proto): port for name, port, proto in (meta.ports if meta else ())}
        ips = tuple(ipaddr.ip_interface(n).ip for n in ep.ip_networks)
        return Workload(ep.namespace, ep.pod, labels, ips, ports, node=ep.node)

    def refresh(self) -> list[tuple[Endpoint | None, Endpoint | None]]:
        """Bring the compiled endpoints up to date with the records; the (old, new) pairs that
        changed. Only the endpoints whose record or pod record changed are looked at (all of
        them after a full read), so a new pod costs the same among ten or ten thousand."""
        keys = self.endpoints.keys() | self._compiled.keys() if self._dirty is None else self._dirty
        changes: list[tuple[Endpoint | None, Endpoint | None]] = []
        for key in keys:
            hit = self._compiled.get(key)
            ep = self.endpoints.get(key)
            if ep is None:
                if hit is not None:
                    del self._compiled[key]
                    changes.append((hit[2], None))
                continue
            meta = self.pods.get((ep.namespace, ep.pod))
            if hit is None or hit[0] is not ep or hit[1] is not meta:
                new = (ep, meta, Endpoint(self.workload(ep), ep.interface_name, ep.network,
                                          ep.default_policy == "deny"))
                self._compiled[key] = new
                changes.append((hit[2] if hit is not None else None, new[2]))
        self._dirty = set()
        return changes

    def compiled_endpoints(self) -> list[Endpoint]:
        """Every endpoint as the compiler takes it (rebuilt only for records that changed)."""
        self.refresh()
        return [hit[2] for hit in self._compiled.values()]

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        if self._ns_labels is None:
            names = {ep.namespace for ep in self.endpoints.values()} | set(self.namespaces)
            self._ns_labels = {ns: dict(self.namespaces[ns].labels) if ns in self.namespaces else {}
                               for ns in names}
        return self._ns_labels

    def cluster(self) -> tuple[Cluster, dict[str, Workload]]:
        """The evaluator's input, and each workload by NS/POD (one per pod: its first attachment)."""
        pods: dict[str, Workload] = {}
        deny: set[str] = set()
        for ep in sorted(self.endpoints.values(), key=lambda e: (e.namespace, e.pod, e.network, e.ifname)):
            w = self.workload(ep)
            pods.setdefault(w.key, w)
            if ep.default_policy == "deny":
                deny.add(w.key)
        nodes = {name: tuple(ipaddr.ip_address(i) for i in info.underlay_ips) for name, info in self.nodes.items()}
        cluster = Cluster(policies=list(self.policies.values()), namespaces=self.namespace_labels(), nodes=nodes)
        for key in deny:
            pods[key] = _with_default_deny(pods[key])
        return cluster, pods


def _with_default_deny(w: Workload) -> Workload:
    from dataclasses import replace

    return replace(w, default_deny=True)


class PolicyEnforcer:
    """This node's share: the view, the compiler and what was programmed."""

    def __init__(self, keys: Keys, me: str, log: Callable[[str], None]) -> None:
        self.view = PolicyView(keys)
        self.me = me
        self.log = log
        self.programmer = Programmer()
        self.memo = Memo()  # what compile_node may reuse across updates
        self.dirty = True
        self.only_endpoints = False  # every change since the last apply was an endpoint's or a pod's
        self.members_changed = True  # an endpoint, pod or namespace changed since the last apply
        self.policy_spaces: set[str] | None = set()  # namespaces of the policies changed since, when only those
        self.label_spaces: set[str] | None = set()  # namespaces whose labels changed since, when only those
        self.patched = self.compiled = 0  # how updates were computed (incrementally / in full)

    def load(self, kv: Any) -> None:
        self.view.load(kv)
        for key, why in sorted(self.view.errors.items()):
            self.log(f"policy: ignoring {key}: {why}")
        # The kernel still holds what was last applied: the fresh view is diffed against it (the
        # first load, or one after a refused update, rebuilds the table, atomically).
        self.dirty = True
        self.only_endpoints = False
        self.members_changed = True
        self.policy_spaces = self.label_spaces = None

    def event(self, kind: str, key: str, value: str) -> bool:
        touched = self.view.delete(key) if kind == "DELETE" else self.view.put(key, value)
        if touched and key in self.view.errors:
            self.log(f"policy: ignoring {key}: {self.view.errors[key]}")
        if touched:
            parsed = self.view.keys.parse(key)
            kind_of = parsed.kind if parsed is not None else ""
            if kind_of == "node":
                return False  # (nodes matter to `policy why`, not to the dataplane)
            self.only_endpoints = (self.only_endpoints or not self.dirty) and kind_of in ("endpoint", "pod")
            for kind_, spaces in (("policy", "policy_spaces"), ("namespace", "label_spaces")):
                if kind_of == kind_ and parsed is not None and (getattr(self, spaces) is not None or not self.dirty):
                    setattr(self, spaces, {*(getattr(self, spaces) or ()), parsed.namespace})
                else:
                    setattr(self, spaces, None)
            self.members_changed |= kind_of != "policy"
            self.dirty = True
        return touched

    def apply(self) -> bool:
        """Program what the view asks, if anything changed; False when the kernel refused (logged;
        the next call rebuilds everything)."""
        from pycni.spec.errors import CNIError

        if not self.dirty:
            return True
        want = None
        have = self.programmer.applied
        changes = self.view.refresh()
        if self.policy_spaces is not None and have is not None:
            try:  # policies alone changed: judge again only the local pods of their namespaces
                want = patch_policies(self.me, have, self.policy_spaces, self.view.compiled_endpoints(),
                                      self.view.policies.values(), self.view.namespace_labels(), self.memo)
            except Exception as e:  # noqa: BLE001 - a fast-path bug must cost a full compile, not the agent
                self.log(f"policy: incremental update failed ({type(e).__name__}: {e}); compiling in full")
                want = None
        if self.label_spaces is not None and have is not None and want is None:
            try:  # namespace labels alone changed: only namespaceSelector member sets move
                want = patch_namespaces(have, self.label_spaces, self.view.compiled_endpoints(),
                                        self.view.namespace_labels())
            except Exception as e:  # noqa: BLE001 - a fast-path bug must cost a full compile, not the agent
                self.log(f"policy: incremental update failed ({type(e).__name__}: {e}); compiling in full")
                want = None
        if self.only_endpoints and have is not None and want is None:
            try:
                want = patch_node(self.me, have, changes, self.view.policies.values(), self.view.namespace_labels())
            except Exception as e:  # noqa: BLE001 - a fast-path bug must cost a full compile, not the agent
                self.log(f"policy: incremental update failed ({type(e).__name__}: {e}); compiling in full")
                want = None
        if want is None:
            want = compile_node(self.me, self.view.compiled_endpoints(), self.view.policies.values(),
                                self.view.namespace_labels(), self.memo,
                                members_from=None if self.members_changed else have)
            self.compiled += 1
        else:
            self.patched += 1
        rebuilding = self.programmer.applied is None
        try:
            script = self.programmer.apply(want)
        except CNIError as e:
            self.log(f"FAILED policy update: {e.msg}: {e.details}")
            return False
        self.dirty = self.only_endpoints = self.members_changed = False
        self.policy_spaces, self.label_spaces = set(), set()
        if script:
            n = script.count("\n")
            self.log(f"policy: {'table rebuilt' if rebuilding else 'updated'} ({n} commands; "
                     f"{len(want.covered)} local endpoints, {len(self.view.policies)} policies)")
        return True
