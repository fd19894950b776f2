"""The node agent's policy half (``pycni node --policy``): the records policy reads from etcd,
fed event by event into the one index, written to the kernel by the reconciling writer.

Inputs (the contract with whatever writes them: ``pycni policy``/``endpoint``/``namespace``, routed,
``pycni kube-controllers``; :mod:`pycni.cluster.policy.records`): workload endpoints, pods' and
namespaces' :class:`~pycni.cluster.model.PodMeta`, NetworkPolicy manifests, nodes. The agent
(:mod:`pycni.cluster.node`) hands every watch event to :meth:`PolicyEnforcer.event`, which updates
:class:`PolicyView` (the decoded records, also what ``pycni policy why`` reads) and the
:class:`~pycni.cluster.policy.index.PolicyIndex`; after a batch :meth:`PolicyEnforcer.apply` sends
what the index marked dirty as one transaction (:class:`~pycni.cluster.policy.nftsync.Writer`).
The first full read (start) builds the index from the records and has the writer read the
kernel's table back and write only the difference: nothing on start or stop removes or empties
the table, so a restart never opens what a policy closes. A later one (a broken watch) feeds the
index what differs. The periodic check (:meth:`PolicyEnforcer.check_kernel`) compares the kernel
with the writer's mirror off the event path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pycni import ipaddr
from pycni.cluster.model import Keys, NodeInfo, PodMeta, WorkloadEndpoint
from pycni.cluster.policy.compile import LOG, LogSpec
from pycni.cluster.policy.evaluate import Cluster, Workload
from pycni.cluster.policy.index import PolicyIndex
from pycni.cluster.policy.model import NetworkPolicy, PolicyError, parse_policy
from pycni.cluster.policy.nftsync import Comparison, Readback, Writer


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
        self._by_pod: dict[tuple[str, str], set[str]] = {}  # each pod's endpoint keys
        self.raw: dict[str, str] = {}  # key -> the value last decoded from it
        self.mods: dict[str, int] = {}  # key -> its mod revision at the last full read
        self._ns_labels: dict[str, dict[str, str]] | None = None  # namespace_labels(), until it changes

    @property
    def prefixes(self) -> tuple[str, ...]:
        k = self.keys
        return (k.endpoints, k.pods, k.namespaces, k.policies, k.nodes)

    PAGE = 1000  # keys per request of a full read
    FEW = 200  # at most this many changed keys since the last full read: fetch them one by one

    def load(self, kv: Any, revision: int = 0) -> int:
        """A full read of every prefix at one revision (``revision``, else the first page's), in
        pages of :attr:`PAGE` keys: at 10,000 endpoints one request for everything is megabytes
        that a loaded etcd and agent cannot always move within a request's time budget. After
        the first, a read lists keys and revisions only and fetches the values of the keys whose
        revision moved (all values again when more than :attr:`FEW` did); a value as it was
        decoded before is not decoded again. Returns the revision."""
        rev = revision
        if self.mods:
            listed, rev = self._pages(kv, rev, keys_only=True)
            changed = [item.key for item in listed if self.mods.get(item.key) != item.mod_revision]
            if len(changed) <= self.FEW:
                items = []
                for key in changed:
                    items += kv.range(key, revision=rev)[0]
                self._merge(items, {item.key for item in listed})
                return int(rev)
        items, rev = self._pages(kv, rev, keys_only=False)
        self._merge(items, {item.key for item in items})
        return int(rev)

    def _pages(self, kv: Any, rev: int, keys_only: bool) -> tuple[list[Any], int]:
        items: list[Any] = []
        for prefix in self.prefixes:
            start, end = prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)
            while True:
                kvs, at = kv.range(start, range_end=end, limit=self.PAGE, revision=rev, keys_only=keys_only)
                rev = rev or at
                items += kvs
                if len(kvs) < self.PAGE:
                    break
                start = kvs[-1].key + "\0"
        return items, rev

    def _merge(self, items: list[Any], present: set[str]) -> None:
        """Take a full read's values (``items``) and forget what is no longer ``present``."""
        for item in items:
            if self.raw.get(item.key) != item.value:
                self.put(item.key, item.value)
            self.mods[item.key] = item.mod_revision
        for key in [k for k in self.raw if k not in present]:
            self.delete(key)
        self._ns_labels = None

    def _endpoint_gone(self, key: str) -> None:
        old = self.endpoints.pop(key, None)
        if old is not None:
            self._by_pod.get((old.namespace, old.pod), set()).discard(key)
            self._ns_labels = None

    def put(self, key: str, value: str) -> bool:
        """Apply a key's new value; True when it is one policy reads."""
        parsed = self.keys.parse(key)
        if parsed is None:
            return False
        self.errors.pop(key, None)
        self.raw[key] = value
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
        self.raw.pop(key, None)
        self.mods.pop(key, None)
        if parsed.kind == "endpoint":
            self._endpoint_gone(key)
        elif parsed.kind == "pod":
            self.pods.pop((parsed.namespace, parsed.name), None)
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
        return Workload(ep.namespace, ep.pod, labels, ips, ports, node=ep.node,
                        default_deny=ep.default_policy == "deny", iface=ep.interface_name)

    def endpoints_of(self, namespace: str, pod: str) -> list[str]:
        """The endpoint keys of a pod (its attachments)."""
        return sorted(self._by_pod.get((namespace, pod), ()))

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
            pods[key] = replace(pods[key], default_deny=True)
        return cluster, pods


class PolicyEnforcer:
    """This node's share: the records, the index and the writer.

    ``strict``: an exception while updating the index propagates (the tests, and
    ``PYCNI_POLICY_STRICT=1``); otherwise it is logged with its traceback and the index is
    rebuilt from the records and reconciled against the kernel — a bug costs a full reconcile,
    never the agent, and is never hidden."""

    def __init__(self, keys: Keys, me: str, log: Callable[[str], None], strict: bool | None = None,
                 logspec: LogSpec | None = LOG) -> None:
        self.view = PolicyView(keys)
        self.me = me
        self.log = log
        self.strict = os.environ.get("PYCNI_POLICY_STRICT") == "1" if strict is None else strict
        self.logspec = logspec  # the flow-log rules (None: flows off, no log rules)
        self.index = PolicyIndex(me, logspec)
        self.writer = Writer()
        self.rebuilds = 0  # full rebuilds of the index after an error in an incremental update
        self.loaded = False  # the index was built from a full read
        self.writes = 0  # transactions the kernel took (metrics: the programming latency)
        self.refused = 0  # transactions the kernel refused (metrics)
        self.readback: Readback | None = None  # the kernel's table being read back off the event path
        self.comparison: Comparison | None = None  # a finished read-back being compared with the mirror
        self.discarded = 0  # read-backs thrown away: a commit of ours came after them

    def resolver(self) -> Any:
        """The flows resolver (docs/flows.md): a chain's token to what decided (a policy's NS/NAME,
        or "default deny: selected by NS/A, NS/B"), an address to NS/POD, from the current index
        (plain dictionary gets: the collector's thread calls it once per flow)."""
        from pycni.cluster.flows.model import Resolver

        return Resolver(policy=lambda token: self.index.tokens.get(token),
                        pod=lambda address: self.index.addresses.get(address))

    def load(self, kv: Any, revision: int = 0) -> None:
        """A full read of etcd (start, a broken watch) — at ``revision`` when given: the one the
        caller's watch continues from, so the watch never replays an older state over a newer
        one. The first builds the index, and the next apply reads the kernel's table back and
        writes the difference; a later one feeds the index only the records that differ from what
        the watch had said, and has the kernel checked off the event path (:meth:`check_kernel`)."""
        v = self.view
        old = (dict(v.endpoints), dict(v.pods), dict(v.namespaces), dict(v.policies))
        v.load(kv, revision)
        for key, why in sorted(v.errors.items()):
            self.log(f"policy: ignoring {key}: {why}")
        if not self.loaded:
            self.loaded = True
            self.rebuild()
            return
        try:
            self._index_changes(*old)
        except Exception as e:
            if self.strict:
                raise
            self._bug(f"a full read's changes ({type(e).__name__}: {e})")
        self.check_kernel()

    def _index_changes(self, endpoints: dict[str, WorkloadEndpoint], pods: dict[tuple[str, str], PodMeta],
                       namespaces: dict[str, PodMeta], policies: dict[tuple[str, str], NetworkPolicy]) -> None:
        """Feed the index what a full read found different from the records it had."""
        v, ix = self.view, self.index

        def differ(a: object, b: object) -> bool:
            return a is not b and a != b  # (a record not read again is the same object)

        for ns in namespaces.keys() | v.namespaces.keys():
            if differ(namespaces.get(ns), v.namespaces.get(ns)):
                meta = v.namespaces.get(ns)
                ix.set_namespace(ns, meta.labels if meta is not None else None)
        for (ns, name) in policies.keys() | v.policies.keys():
            if differ(policies.get((ns, name)), v.policies.get((ns, name))):
                ix.set_policy(f"{ns}/{name}", v.policies.get((ns, name)))
        changed = {k for k in endpoints.keys() | v.endpoints.keys() if differ(endpoints.get(k), v.endpoints.get(k))}
        for pod in pods.keys() | v.pods.keys():
            if differ(pods.get(pod), v.pods.get(pod)):
                changed.update(v.endpoints_of(*pod))
        for key in sorted(changed):
            ep = v.endpoints.get(key)
            ix.set_workload(key, v.workload(ep) if ep is not None else None)

    def _bug(self, what: str) -> None:
        import traceback

        self.log(f"policy: BUG: updating the index for {what} failed; rebuilding it and reconciling with the "
                 f"kernel\n{traceback.format_exc()}")
        self.rebuilds += 1
        self.rebuild()

    def rebuild(self) -> None:
        """The index from the records, from nothing; the next write compares with the kernel."""
        index = PolicyIndex(self.me, self.logspec)
        for ns, meta in self.view.namespaces.items():
            index.set_namespace(ns, meta.labels)
        for (ns, name), pol in sorted(self.view.policies.items()):
            index.set_policy(f"{ns}/{name}", pol)
        for key, ep in sorted(self.view.endpoints.items()):
            index.set_workload(key, self.view.workload(ep))
        self.index = index
        self.writer.reconcile_next()

    def event(self, kind: str, key: str, value: str) -> bool:
        """One watch event; True when it is a record policy reads."""
        touched = self.view.delete(key) if kind == "DELETE" else self.view.put(key, value)
        if not touched:
            return False
        if key in self.view.errors:
            self.log(f"policy: ignoring {key}: {self.view.errors[key]}")
        parsed = self.view.keys.parse(key)
        if parsed is None or parsed.kind == "node":
            return False  # (nodes matter to `policy why`, not to the dataplane)
        try:
            self._index_event(parsed.kind, key, parsed.namespace, parsed.name)
        except Exception as e:
            if self.strict:
                raise
            self._bug(f"{key} ({type(e).__name__}: {e})")
        return True

    def _index_event(self, kind: str, key: str, namespace: str, name: str) -> None:
        v = self.view
        if kind == "endpoint":
            ep = v.endpoints.get(key)
            self.index.set_workload(key, v.workload(ep) if ep is not None else None)
        elif kind == "pod":
            for k in v.endpoints_of(namespace, name):
                self.index.set_workload(k, v.workload(v.endpoints[k]))
        elif kind == "namespace":
            meta = v.namespaces.get(namespace)
            self.index.set_namespace(namespace, meta.labels if meta is not None else None)
        elif kind == "policy":
            self.index.set_policy(f"{namespace}/{name}", v.policies.get((namespace, name)))

    def check_kernel(self) -> None:
        """The periodic check of the kernel's table (and after a later full read), never on the event
        path: nothing to do when nothing was committed in this namespace since the table was known
        to be as the writer left it (one netlink request: the generation id); otherwise the table is
        read back by a child process (:class:`Readback`) while events go on, and
        :meth:`poll_kernel` reconciles with it."""
        if self.readback is not None or self.writer.mirror is None:
            return  # (one at a time; without a mirror the next apply reads the kernel anyway)
        if self.writer.unchanged():
            self.writer.skips += 1
            return
        self.readback = Readback(self.writer.table, self.writer.commits)

    def poll_kernel(self) -> float | None:
        """Move a periodic check on: take a finished read-back, compare it with the mirror a part
        at a time (:class:`Comparison`, one bounded step a call) and, when it differs, write the
        whole difference in one transaction; when a commit of ours came after it (see
        :meth:`Writer.usable`), leave it to the next periodic check. Returns how long the caller
        may wait for events before calling again: None when no check is running, 0.05 while the
        child reads, 0 while comparing (call again as soon as no event is waiting)."""
        from pycni.spec.errors import CNIError

        rb = self.readback
        if rb is None:
            return None
        if self.comparison is None:
            if not rb.done():
                return 0.05
            if rb.error:
                self.readback = None
                self.log(f"policy: the table was not read back ({rb.error}); trying again at the next check")
                return None
            self.comparison = Comparison(self.writer, rb)
        verdict = self.comparison.step()
        if verdict is None:
            return 0.0
        self.readback = self.comparison = None
        if verdict == "stale":
            # (a commit of ours came after it, or a refusal since — then the next apply reads the
            # kernel itself: it is not read again at once — in a burst of our own commits that
            # would fork a reader after reader, each ~1 s of CPU beside the agent's — the next
            # periodic check reads it again)
            self.discarded += 1
            return None
        assert rb.at is not None  # (usable)
        if verdict == "equal":
            # (as written: what the index marked dirty meanwhile goes the usual way)
            self.writer.checked(rb.at)
            self.log(f"policy: reconciled with the kernel (0 commands; checked off the event path; the table "
                     f"is as written, at generation {rb.at})")
            return None
        want, _dirty = self.index.collect()  # (the whole difference below covers what is dirty)
        try:
            script = self.writer.adopt(rb.snapshot(), rb.at, rb.commits, want)
        except CNIError as e:
            self.refused += 1
            self.log(f"FAILED policy update: {e.msg}: {e.details}")
            return None
        if script is None:  # (cannot happen after the checks above; read again rather than assume)
            self.discarded += 1
            self.writer.reconcile_next()
            return None
        if script:
            self.writes += 1
        self.log(f"policy: reconciled with the kernel ({script.count(chr(10))} commands; checked off the event "
                 f"path; {len(want.covered)} local endpoints, {len(self.view.policies)} policies)")
        return None

    def apply(self, arrived: float = 0.0) -> bool:
        """Program what the index asks, if anything changed; False when the kernel refused
        (logged; the next call reads the kernel back and writes the difference). ``arrived``: when
        the watch delivered the events asking for it (``time.monotonic()``; the log line says how
        long after that the kernel took it: the agent's own share of a change's latency)."""
        import time

        from pycni.spec.errors import CNIError

        want, dirty = self.index.collect()
        if not dirty and self.writer.mirror is not None:
            return True
        try:
            script, read = self.writer.write(want, dirty)
        except CNIError as e:
            self.refused += 1
            self.log(f"FAILED policy update: {e.msg}: {e.details}")
            return False
        if script:
            self.writes += 1
        if script or read:
            n = script.count("\n")
            after = f"; {(time.monotonic() - arrived) * 1000:.1f} ms after the watch delivered it" if arrived else ""
            self.log(f"policy: {'reconciled with the kernel' if read else 'updated'} ({n} commands; "
                     f"{len(want.covered)} local endpoints, {len(self.view.policies)} policies{after})")
        return True
