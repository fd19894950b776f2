"""The policy engine's one incremental index (the shape of Felix's calculation graph).

Inputs, one event at a time: an attachment (a :class:`~pycni.cluster.policy.evaluate.Workload`
built from its :class:`~pycni.cluster.model.WorkloadEndpoint` and pod record), a namespace's
labels, a policy. The index keeps what depends on them, each fact updated only where an event
can change it:

- per active pod selector (:class:`~pycni.cluster.policy.model.PeerSelector`, the same
  ``matches`` that :func:`~pycni.cluster.policy.evaluate.decide` uses): the attachments it picks
  and their addresses, counted. A selector bound to a namespace by name is looked at only for
  attachments of that namespace; a namespaceSelector one for every attachment, and for a
  namespace's attachments when that namespace's labels change.
- per port name that some used policy names: the address . protocol . port elements;
- per local attachment: the policies selecting it in each direction (a policy selects pods of
  its own namespace only, so a policy event judges again only that namespace's local pods),
  and the verdict chain of that selection, shared by the attachments with the same one;
  per (policy, direction): the local attachments it selects. A policy's chain exists while it
  selects some local attachment; its selectors and port names are acquired and released with it
  (reference counts), their member sets made and deleted with them.

From these it maintains the :class:`~pycni.cluster.policy.compile.Desired` nftables state and
the :class:`~pycni.cluster.policy.nftsync.Dirty` objects since the last :meth:`collect`, which
the writer sends. :func:`~pycni.cluster.policy.compile.compile_full` computes the same state
from nothing: the tests' oracle (random event sequences: index = full compile = decide()).
"""

from __future__ import annotations

from collections.abc import Mapping

from pycni.cluster.policy.compile import (
    LOG,
    PORT_SET_TYPES,
    SET_TYPES,
    Desired,
    LogSpec,
    Rendered,
    accept_chain,
    accept_rules,
    address_elements,
    default_deny,
    fixed_chains,
    policy_chain,
    policy_comment,
    port_elements,
    port_set,
    render,
    selecting,
    selector_set,
    verdict_chain,
    verdict_chain_name,
)
from pycni.cluster.policy.evaluate import EGRESS, INGRESS, Workload
from pycni.cluster.policy.model import NetworkPolicy, PeerSelector, namespace_labels
from pycni.cluster.policy.nftsync import Dirty

DIRECTIONS = (INGRESS, EGRESS)
Key = tuple[object, ...]


class _Members:
    """The elements of a pair of member sets (IPv4, IPv6), counted (two pods may share one)."""

    def __init__(self, names: dict[int, str], types: dict[int, str]) -> None:
        self.names = names
        self.types = types
        self.count: dict[int, dict[str, int]] = {4: {}, 6: {}}
        self.refs = 0


class _Selector(_Members):
    def __init__(self, sel: PeerSelector) -> None:
        super().__init__({v: selector_set(sel.key, v) for v in (4, 6)}, SET_TYPES)
        self.sel = sel
        self.picked: set[str] = set()  # attachment keys


class PolicyIndex:
    """Node ``me``'s share of policy, kept up to date event by event (see the module docstring)."""

    def __init__(self, me: str, log: LogSpec | None = LOG) -> None:
        self.me = me
        self.log = log  # the log rules' spec (None: none)
        self.policies: dict[str, NetworkPolicy] = {}                  # NS/NAME -> policy
        self.by_ns: dict[str, dict[str, NetworkPolicy]] = {}           # namespace -> NS/NAME -> policy
        self.ns_labels: dict[str, dict[str, str]] = {}                 # namespace -> labels (with its name)
        self.workloads: dict[str, Workload] = {}                       # attachment key -> workload
        self.in_ns: dict[str, set[str]] = {}                           # namespace -> attachment keys
        self.local_in_ns: dict[str, set[str]] = {}                     # namespace -> this node's
        self.named: dict[str, set[str]] = {}                           # port name -> attachment keys
        self.selection: dict[str, dict[str, tuple[str, ...]]] = {}     # local key -> direction -> NS/NAMEs
        self.vusers: dict[str, set[str]] = {}                          # verdict chain -> local keys using it
        self.users: dict[tuple[str, str], set[str]] = {}               # (NS/NAME, direction) -> local keys
        self.rendered: dict[tuple[str, str], tuple[NetworkPolicy, Rendered]] = {}
        self.selectors: dict[Key, _Selector] = {}
        self.sel_by_ns: dict[str, set[Key]] = {}                       # namespace -> selectors bound to it
        self.sel_any: set[Key] = set()                                 # namespaceSelector ones
        self.ports: dict[str, _Members] = {}                           # port name -> its sets
        self.state = Desired(chains=dict(fixed_chains(log)), log=log)
        self._covered: set[str] = set()
        self._sources: dict[str, tuple[str, dict[str, int]]] = {}      # set name -> (type, counted elements)
        self._stale: set[str] = set()                                  # set names to materialize
        self.dirty = Dirty(chains=set(self.state.chains))
        # for the flows resolver (docs/flows.md), read from the collector's thread: plain dict gets
        self.tokens: dict[str, str] = {}                               # p_/v_ chain -> what decided
        self.addresses: dict[str, str] = {}                            # pod address -> NS/POD

    # -- inputs --

    def set_workload(self, key: str, new: Workload | None) -> None:
        """An attachment appeared, changed (labels, ports, addresses...) or went (None)."""
        old = self.workloads.get(key)
        if old is new:
            return
        spaces = {w.namespace for w in (old, new) if w is not None}
        cands = set(self.sel_any)
        for ns in spaces:
            cands |= self.sel_by_ns.get(ns, set())
        for skey in cands:
            s = self.selectors[skey]
            was = key in s.picked
            now = new is not None and s.sel.matches(new.namespace, new.labels, self._nsl(new.namespace))
            if was and now and old is not None and new is not None and old.ips == new.ips:
                continue
            if was and old is not None:
                s.picked.discard(key)
                self._count(s, address_elements(old), -1)
            if now and new is not None:
                s.picked.add(key)
                self._count(s, address_elements(new), +1)
        old_names = {n for n, _ in old.named_ports} if old is not None else set()
        new_names = {n for n, _ in new.named_ports} if new is not None else set()
        for name in old_names:
            self.named.get(name, set()).discard(key)
            if name in self.ports and old is not None:
                self._count(self.ports[name], port_elements(old, name), -1)
        for name in new_names:
            self.named.setdefault(name, set()).add(key)
            if name in self.ports and new is not None:
                self._count(self.ports[name], port_elements(new, name), +1)
        if old is not None:
            for ip in old.ips:
                if self.addresses.get(str(ip)) == old.key:
                    del self.addresses[str(ip)]
        if new is not None:
            for ip in new.ips:
                self.addresses[str(ip)] = new.key
        if old is not None:
            self.in_ns[old.namespace].discard(key)
            if old.node == self.me:
                self.local_in_ns[old.namespace].discard(key)
            del self.workloads[key]
        if new is not None:
            self.workloads[key] = new
            self.in_ns.setdefault(new.namespace, set()).add(key)
            if new.node == self.me:
                self.local_in_ns.setdefault(new.namespace, set()).add(key)
        self._settle(self._judge(key, old, new))

    def set_namespace(self, ns: str, labels: Mapping[str, str] | None) -> None:
        """A namespace's labels (None: its record is gone): only namespaceSelector members move."""
        nsl = namespace_labels(ns, labels)
        if self.ns_labels.get(ns) == nsl:
            return
        self.ns_labels[ns] = nsl
        for skey in self.sel_any:
            s = self.selectors[skey]
            ns_ok = s.sel.matches_namespace(ns, nsl)
            for key in self.in_ns.get(ns, ()):
                w = self.workloads[key]
                was, now = key in s.picked, ns_ok and s.sel.matches_pod(w.labels)
                if was != now:
                    (s.picked.add if now else s.picked.discard)(key)
                    self._count(s, address_elements(w), +1 if now else -1)

    def set_policy(self, pkey: str, new: NetworkPolicy | None) -> None:
        """A policy created, replaced or deleted (None): its namespace's local pods judged again."""
        old = self.policies.get(pkey)
        if old is new:
            return
        ns = (new or old).namespace  # type: ignore[union-attr]
        if new is None:
            del self.policies[pkey]
            del self.by_ns[ns][pkey]
        else:
            self.policies[pkey] = new
            self.by_ns.setdefault(ns, {})[pkey] = new
        touched = {(pkey, d) for d in DIRECTIONS}
        for key in list(self.local_in_ns.get(ns, ())):
            # only this policy's membership in the pod's selection can change: no other is asked
            w = self.workloads[key]
            cur = self.selection[key]
            after = {}
            for d in DIRECTIONS:
                has = pkey in cur[d]
                want = new is not None and new.applies_to(w.namespace, w.labels, d)
                after[d] = cur[d] if has == want else tuple(sorted({*cur[d], pkey} if want else set(cur[d]) - {pkey}))
            if after != cur:
                touched |= self._judge(key, w, w, after)
        self._settle(touched)

    # -- output --

    def collect(self) -> tuple[Desired, Dirty]:
        """The wanted state and what changed in it since the last call (then forgotten)."""
        self._materialize()
        dirty, self.dirty = self.dirty, Dirty()
        return self.state, dirty

    def desired(self) -> Desired:
        """A copy of the wanted state (for comparisons; changes nothing)."""
        self._materialize()
        s = self.state
        return Desired(sets=dict(s.sets), chains=dict(s.chains), ingress=dict(s.ingress), egress=dict(s.egress),
                       covered=frozenset(self._covered), comments=dict(s.comments), log=s.log)

    @property
    def endpoints(self) -> int:
        """Local attachments enforced (in the covered set)."""
        return len(self._covered)

    # -- inner workings --

    def _nsl(self, ns: str) -> dict[str, str]:
        nsl = self.ns_labels.get(ns)
        if nsl is None:
            nsl = self.ns_labels[ns] = namespace_labels(ns, None)
        return nsl

    def _materialize(self) -> None:
        for name in self._stale:
            src = self._sources.get(name)
            if src is None:
                self.state.sets.pop(name, None)
            else:
                self.state.sets[name] = (src[0], frozenset(src[1]))
        self._stale = set()
        if self.dirty.covered:
            self.state.covered = frozenset(self._covered)

    def _count(self, m: _Members, elems: list[tuple[int, str]], delta: int) -> None:
        for v, e in elems:
            c = m.count[v]
            n = c.get(e, 0) + delta
            if n > 0:
                c[e] = n
            else:
                c.pop(e, None)
            if n <= 0 or n == delta:  # appeared or went
                self._stale.add(m.names[v])
                self.dirty.sets.add(m.names[v])

    def _judge(self, key: str, old: Workload | None, new: Workload | None,
               known: dict[str, tuple[str, ...]] | None = None) -> set[tuple[str, str]]:
        """Which policies select local attachment ``key`` now (``known``: already worked out), and
        its verdict objects; returns the (policy, direction) pairs whose users changed."""
        was_local = old is not None and old.node == self.me
        is_local = new is not None and new.node == self.me
        if not was_local and not is_local:
            return set()
        before = self.selection.pop(key, {d: () for d in DIRECTIONS})
        after: dict[str, tuple[str, ...]] = {d: () for d in DIRECTIONS}
        if is_local and new is not None:
            if known is not None:
                after = known
            else:
                pols = self.by_ns.get(new.namespace, {}).values()
                after = {d: tuple(p.key for p in selecting(pols, new, d)) for d in DIRECTIONS}
            self.selection[key] = after
        moved = was_local and old is not None and (not is_local or new is None or new.iface != old.iface)
        if moved and old is not None:
            for d, table in ((INGRESS, self.state.ingress), (EGRESS, self.state.egress)):
                self._map(d, table, old.iface, None)
            self._covered.discard(old.iface)
            self.dirty.covered.add(old.iface)
        if is_local and new is not None:
            for d, table in ((INGRESS, self.state.ingress), (EGRESS, self.state.egress)):
                if after[d]:
                    chain = verdict_chain_name(after[d], d)
                    users = self.vusers.setdefault(chain, set())
                    if not users:
                        self._chain(chain, verdict_chain((self.policies[k] for k in after[d]), d, self.log))
                        self.tokens[chain] = f"default deny: selected by {', '.join(after[d])}"
                    users.add(key)
                    self._map(d, table, new.iface, f"jump {chain}")
                else:
                    self._map(d, table, new.iface, default_deny(d, self.log) if new.default_deny else None)
            if new.iface not in self._covered:
                self._covered.add(new.iface)
                self.dirty.covered.add(new.iface)
        for d in DIRECTIONS:  # (after the new ones are in: a chain kept by this pod is never dropped)
            if before[d] and before[d] != after[d]:
                chain = verdict_chain_name(before[d], d)
                users = self.vusers[chain]
                users.discard(key)
                if not users:
                    del self.vusers[chain]
                    self._chain(chain, None)
                    self.tokens.pop(chain, None)
        touched: set[tuple[str, str]] = set()
        for d in DIRECTIONS:
            for pk in set(before[d]) - set(after[d]):
                self.users[(pk, d)].discard(key)
                touched.add((pk, d))
            for pk in set(after[d]) - set(before[d]):
                self.users.setdefault((pk, d), set()).add(key)
                touched.add((pk, d))
        return touched

    def _chain(self, name: str, rules: tuple[str, ...] | None, comment: str = "") -> None:
        chains = self.state.chains
        if rules is None:
            if name in chains:
                del chains[name]
                self.state.comments.pop(name, None)
                self.dirty.chains.add(name)
        elif chains.get(name) != rules:
            chains[name] = rules
            if comment:
                self.state.comments[name] = comment
            self.dirty.chains.add(name)

    def _map(self, d: str, table: dict[str, str], iface: str, verdict: str | None) -> None:
        if table.get(iface) == verdict:
            return
        if verdict is None:
            del table[iface]
        else:
            table[iface] = verdict
        (self.dirty.ingress if d == INGRESS else self.dirty.egress).add(iface)

    def _settle(self, pairs: set[tuple[str, str]]) -> None:
        """Bring the chains of these (policy, direction) pairs in line with their users."""
        for pk, d in sorted(pairs):
            users = self.users.get((pk, d))
            policy = self.policies.get(pk)
            cur = self.rendered.get((pk, d))
            if users and policy is not None:
                if cur is not None and cur[0] is policy:
                    continue
                r = render(policy, d, self.log)
                for sel in r.selectors:
                    self._acquire(sel)
                for name in r.names:
                    self._acquire_name(name)
                if cur is not None:
                    self._release(cur[1])
                self.rendered[(pk, d)] = (policy, r)
                if self.log is not None:
                    self._chain(accept_chain(policy, d), accept_rules(policy, d, self.log))
                self._chain(policy_chain(policy, d), r.rules, policy_comment(policy, d))
                self.tokens[policy_chain(policy, d)] = pk
            else:
                if not users:
                    self.users.pop((pk, d), None)
                if cur is not None:
                    self._release(cur[1])
                    del self.rendered[(pk, d)]
                    self._chain(policy_chain(cur[0], d), None)
                    self.tokens.pop(policy_chain(cur[0], d), None)
                    self._chain(accept_chain(cur[0], d), None)

    def _release(self, r: Rendered) -> None:
        for sel in r.selectors:
            s = self.selectors[sel.key]
            s.refs -= 1
            if not s.refs:
                del self.selectors[sel.key]
                (self.sel_any if sel.namespace is None else self.sel_by_ns[sel.namespace]).discard(sel.key)
                self._drop_sets(s)
        for name in r.names:
            m = self.ports[name]
            m.refs -= 1
            if not m.refs:
                del self.ports[name]
                self._drop_sets(m)

    def _drop_sets(self, m: _Members) -> None:
        for v in (4, 6):
            self._sources.pop(m.names[v], None)
            self._stale.add(m.names[v])
            self.dirty.sets.add(m.names[v])

    def _new_sets(self, m: _Members) -> None:
        for v in (4, 6):
            self._sources[m.names[v]] = (m.types[v], m.count[v])
            self._stale.add(m.names[v])
            self.dirty.sets.add(m.names[v])

    def _acquire(self, sel: PeerSelector) -> None:
        s = self.selectors.get(sel.key)
        if s is None:
            s = self.selectors[sel.key] = _Selector(sel)
            if sel.namespace is None:
                self.sel_any.add(sel.key)
                spaces = list(self.in_ns)
            else:
                self.sel_by_ns.setdefault(sel.namespace, set()).add(sel.key)
                spaces = [sel.namespace]
            self._new_sets(s)
            for ns in spaces:
                if not sel.matches_namespace(ns, self._nsl(ns)):
                    continue
                for key in self.in_ns.get(ns, ()):
                    w = self.workloads[key]
                    if sel.matches_pod(w.labels):
                        s.picked.add(key)
                        self._count(s, address_elements(w), +1)
        s.refs += 1

    def _acquire_name(self, name: str) -> None:
        m = self.ports.get(name)
        if m is None:
            m = self.ports[name] = _Members({v: port_set(name, v) for v in (4, 6)}, PORT_SET_TYPES)
            self._new_sets(m)
            for key in self.named.get(name, ()):
                self._count(m, port_elements(self.workloads[key], name), +1)
        m.refs += 1
