"""What ``pycni node`` and ``pycni kube-controllers`` export on ``--metrics-address`` (docs/metrics.md).

Counters and histograms are updated where things happen (an etcd request, a resync, a
convergence); gauges of state — endpoints, addresses in use and free per pool, blocks per node,
routes programmed, the API objects mirrored — are read from the process's own view when
Prometheus scrapes (a custom collector), so they cost nothing between scrapes and never drift
from what the process holds. Built only when the flag is given: prometheus_client is imported
here, never on a plugin's path.
"""

from __future__ import annotations

from pycni.metrics import LATENCY_BUCKETS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from pycni.cluster.kube.controller import Controller
    from pycni.cluster.node import Agent


class EtcdMetrics:
    """Every etcd request of this process, by verb and outcome, with its latency
    (:func:`pycni.cluster.etcd.observe`)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        from pycni.cluster import etcd

        self.requests = Counter("pycni_etcd_requests", "etcd requests, by verb (range, put, txn, deleterange, "
                                "grant, keepalive, revoke) and outcome (success, unavailable, error)",
                                ["verb", "outcome"], registry=registry)
        self.duration = Histogram("pycni_etcd_request_duration_seconds", "etcd request latency, retries "
                                  "across endpoints included, by verb", ["verb"], buckets=LATENCY_BUCKETS,
                                  registry=registry)
        etcd.observe(self.observe)

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        self.requests.labels(verb, outcome).inc()
        self.duration.labels(verb).observe(seconds)


class AgentMetrics:
    """The node agent's: its resyncs and errors, route convergence, and (read at scrape time)
    this node's endpoints, the cluster's addresses per pool, blocks per node, routes programmed."""

    def __init__(self, agent: Agent, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        self.agent = agent
        self.etcd = EtcdMetrics(registry)
        self.resyncs = Counter("pycni_agent_resyncs", "Full reads of etcd followed by a convergence (at start, "
                               "after a broken watch)", registry=registry)
        self.kernel_checks = Counter("pycni_agent_kernel_checks", "Periodic checks of the kernel against what the "
                                     "agent wants, inside the watch (every --resync seconds)", registry=registry)
        self.errors = Counter("pycni_agent_errors", "Errors the agent retried, by kind (etcd_unavailable, "
                              "etcd, watch, config)", ["kind"], registry=registry)
        self.convergence = Histogram("pycni_route_convergence_seconds", "From a watch event's arrival to the "
                                     "kernel holding the routes it asks for", buckets=LATENCY_BUCKETS,
                                     registry=registry)
        self.route_changes = Counter("pycni_route_changes", "Route (and vxlan peer) changes made in the kernel",
                                     registry=registry)
        self.policy_programming = Histogram("pycni_policy_programming_seconds", "From a watch batch's arrival "
                                            "to the kernel holding the policy change it asks for",
                                            buckets=LATENCY_BUCKETS, registry=registry)
        self.flows: Any = None
        if agent.policy is not None and agent.policy.logspec is not None:
            from pycni.cluster.flows.collector import FlowMetrics

            self.flows = FlowMetrics(registry)  # (the collector counts into it)
        registry.register(_AgentState(agent))


class _AgentState:
    """Gauges read from the agent's view when scraped."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def describe(self) -> list[Any]:
        return []  # (unchecked names: the collector's output is its own)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from pycni import ipaddr

        view, me = self.agent.view, self.agent.opts.name
        handles = list(view.handles.items())
        affinity = list(view.affinity.items())
        endpoints = GaugeMetricFamily("pycni_endpoints", "Attachments (pods' interfaces) on this node, "
                                      "from cluster-ipam's handles in etcd")
        endpoints.add_metric([], sum(1 for _k, (node, _ips) in handles if node == me))
        yield endpoints
        used: dict[str, int] = {}
        for key, (_node, ips) in handles:
            parsed = view.keys.parse(key)
            if parsed is not None:
                used[parsed.network] = used.get(parsed.network, 0) + len(ips)
        size: dict[str, int] = {}
        blocks: dict[tuple[str, str], int] = {}
        for key, (cidr, node) in affinity:
            parsed = view.keys.parse(key)
            if parsed is None:
                continue
            size[parsed.network] = size.get(parsed.network, 0) + ipaddr.ip_network(cidr).num_addresses
            blocks[(parsed.network, node)] = blocks.get((parsed.network, node), 0) + 1
        in_use = GaugeMetricFamily("pycni_ipam_addresses_in_use", "Addresses held in the cluster, per pool "
                                   "(the cluster-ipam network)", labels=["pool"])
        free = GaugeMetricFamily("pycni_ipam_addresses_free", "Addresses still free in the blocks already "
                                 "claimed, per pool (a pool's unclaimed blocks are not counted)", labels=["pool"])
        for pool in sorted(set(used) | set(size)):
            in_use.add_metric([pool], used.get(pool, 0))
            free.add_metric([pool], max(0, size.get(pool, 0) - used.get(pool, 0)))
        yield in_use
        yield free
        per_node = GaugeMetricFamily("pycni_ipam_blocks", "Address blocks claimed, per pool and node",
                                     labels=["pool", "node"])
        for (pool, node), n in sorted(blocks.items()):
            per_node.add_metric([pool, node], n)
        yield per_node
        applied = self.agent.applied
        routes = GaugeMetricFamily("pycni_routes_programmed", "Routes to other nodes' blocks (and borrowed "
                                   "addresses) this node last converged on")
        routes.add_metric([], len(applied.routes) if applied is not None else 0)
        yield routes
        nodes = GaugeMetricFamily("pycni_nodes", "Nodes registered in etcd, as this agent sees them")
        nodes.add_metric([], len(view.nodes))
        yield nodes
        if self.agent.policy is not None:
            yield from _policy_state(self.agent.policy)


def _policy_state(enf: Any) -> Iterator[Any]:
    """The policy engine's gauges and counters (a :class:`~pycni.cluster.policy.agent.PolicyEnforcer`)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    endpoints = GaugeMetricFamily("pycni_policy_endpoints", "Local endpoints (pods' interfaces) policy is "
                                  "enforced on: in the table's covered set")
    endpoints.add_metric([], enf.index.endpoints)
    yield endpoints
    policies = GaugeMetricFamily("pycni_policy_policies", "NetworkPolicies known to this agent (the cluster's, "
                                 "valid ones)")
    policies.add_metric([], len(enf.view.policies))
    yield policies
    mirror = enf.writer.mirror
    if mirror is not None:  # (None between a refusal or a resync and the next write: no figure then)
        rules = GaugeMetricFamily("pycni_policy_rules_programmed", "Rules in this node's nftables table inet "
                                  f"{enf.writer.table}, as last committed")
        rules.add_metric([], sum(len(tags) for tags in list(mirror.chains.values()))
                         + sum(len(tags) for _prio, tags in list(mirror.base_chains.values())))
        yield rules
    reconciles = CounterMetricFamily("pycni_policy_reconciles", "Times the policy table was read back from the "
                                     "kernel and compared whole (start, a later full read or periodic check that "
                                     "found a commit not ours, after a refusal)")
    reconciles.add_metric([], enf.writer.reads)
    yield reconciles
    skips = CounterMetricFamily("pycni_policy_reconcile_skips", "Periodic checks of the policy table answered by "
                                "the nf_tables generation id alone (nothing committed since the agent's own commit)")
    skips.add_metric([], enf.writer.skips)
    yield skips
    errors = CounterMetricFamily("pycni_policy_errors", "Policy engine errors, by kind: kernel_refused (a "
                                 "transaction the kernel refused; the next write reconciles), index_rebuilt (an "
                                 "incremental update failed; the index was rebuilt)", labels=["kind"])
    errors.add_metric(["kernel_refused"], enf.refused)
    errors.add_metric(["index_rebuilt"], enf.rebuilds)
    yield errors


class KubeMetrics:
    """``pycni kube-controllers``': leadership, objects cached per kind, lists, record writes."""

    def __init__(self, controller: Controller, registry: Any) -> None:
        self.etcd = EtcdMetrics(registry)
        registry.register(_KubeState(controller))


class _KubeState:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ctl = self.ctl
        leader = GaugeMetricFamily("pycni_kube_leader", "1 while this replica leads (writes etcd), else 0")
        leader.add_metric([], 1 if ctl.leader.lease and not ctl.leader.lost.is_set() else 0)
        yield leader
        objects = GaugeMetricFamily("pycni_kube_objects", "API objects in the informers' caches, by kind",
                                    labels=["kind"])
        relists = CounterMetricFamily("pycni_kube_relists", "Lists after the first (a 410 Gone, an error), by "
                                      "kind", labels=["kind"])
        synced = GaugeMetricFamily("pycni_kube_synced", "1 once a kind's first list is cached", labels=["kind"])
        for kind, inf in sorted(ctl.informers.items()):
            objects.add_metric([kind], len(inf.keys()))
            relists.add_metric([kind], inf.relists)
            synced.add_metric([kind], 1 if inf.synced.is_set() else 0)
        yield objects
        yield relists
        yield synced
        writes = CounterMetricFamily("pycni_kube_record_writes", "etcd records the mirror wrote or removed")
        writes.add_metric([], ctl.writes)
        yield writes
