"""Flows and policy metrics on a real two-node cluster: ``pycni node`` agents (policy enforced, each
with its own ``--flows-socket`` and ``--metrics-address``), routed + cluster-ipam pods, real TCP
probes, the kernel's NFLOG log rules read by the agents, ``pycni flows`` asking an agent, ``pycni
policy why`` asking etcd, and a real Prometheus scraping both agents (docs/flows.md, docs/metrics.md).

Pods: shop/front (app=front) and other/x (app=x) on node1, shop/db (app=db) on node2 (and for a
while lock/l, of a "defaultPolicy": "deny" network, on node1). Two policies
select shop/db: ``db-from-front`` (80/TCP from app=front) and ``db-admin`` (81/TCP from app=admin).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_util import EtcdCluster, etcd_available
from policy_probe import EchoServers, probe
from prom_util import Prometheus, query, wait_above, wait_value
from test_policy_cluster import Env

from pycni.cluster.model import PodMeta

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and etcd (Debian's etcd-server)")

METRICS_PORT = 9467
PODS = {"shop/front": ({"app": "front"}, 0), "other/x": ({"app": "x"}, 0), "shop/db": ({"app": "db"}, 1)}
POLICIES = """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-front, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{podSelector: {matchLabels: {app: front}}}], ports: [{protocol: TCP, port: 80}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-admin, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{podSelector: {matchLabels: {app: admin}}}], ports: [{protocol: TCP, port: 81}]}]
"""
LATE_POLICY = """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-quiet, namespace: other}
spec:
  podSelector: {matchLabels: {app: nothing-here}}
  ingress: []
"""


def sock(env: Env, i: int) -> str:
    return str(env.tmp / f"flows-{env.nodes[i].name}.sock")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, plugin_dir: str) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("pf37-flows")
    with EtcdCluster(size=2, subnet="10.233.37.0/24", prefix="pf37-etcd") as cluster:
        e = Env(cluster, tmp, plugin_dir)
        e.pod_prefix = "pf37-pod"
        e.extra = lambda i: ["--metrics-address", f"{e.nodes[i].ip}:{METRICS_PORT}"]
        try:
            for i in range(2):
                e.start_agent(i)
            for key, (labels, i) in PODS.items():
                ns, pod = key.split("/")
                e.put(e.keys.pod(ns, pod), PodMeta(labels=labels).to_json())
                e.add(key, i)
            e.servers = EchoServers(ns for ns, _ in e.pods.values())
            e.cli("policy", "apply", "-f", "-", stdin=POLICIES)
            reach(e, {("shop/front", "shop/db", 80): True, ("shop/front", "shop/db", 81): False,
                      ("other/x", "shop/db", 81): False})
            yield e
        finally:
            e.close()


def reach(env: Env, want: dict[tuple[str, str, int], bool], timeout: float = 30.0) -> None:
    """Probe TCP flows until each passes (or not) as ``want`` says: the agents have converged."""
    flows = [(s, d, port, "TCP") for s, d, port in want]
    deadline = time.monotonic() + timeout
    while True:
        got = probe(env.pods, flows, expect=lambda f: want[(f[0], f[1], f[2])])
        if all(got[f] == want[(f[0], f[1], f[2])] for f in flows):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not enforced within {timeout:g}s: {got}")
        time.sleep(0.5)


def flows(env: Env, i: int, *args: str) -> list[dict[str, Any]]:
    """``pycni flows -o json`` asked on node ``i``'s agent socket."""
    out = subprocess.run([sys.executable, "-m", "pycni", "flows", "--socket", sock(env, i), "-o", "json", *args],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    found: list[dict[str, Any]] = json.loads(out.stdout)
    return found


def wait_flow(env: Env, i: int, args: tuple[str, ...], match: Any, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = flows(env, i, *args)
        hits = [f for f in got if match(f)]
        if hits:
            return hits[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"no such flow on {env.nodes[i].name} within {timeout:g}s: {got}")
        time.sleep(0.3)


def test_denied_flow_names_the_policies_policy_why_names(env: Env) -> None:
    probe(env.pods, [("shop/front", "shop/db", 81, "TCP")], retries=0)
    denied = wait_flow(env, 1, ("--verdict", "denied"),
                       lambda f: (f["source"], f["destination"], f["port"], f["proto"]) ==
                       ("shop/front", "shop/db", 81, "TCP"))
    assert denied["verdict"] == "denied" and denied["direction"] == "ingress" and denied["endpoint"] == "shop/db"
    assert denied["policy"] == "" and denied["reason"].startswith("default deny: selected by "), denied
    from_flow = denied["reason"].removeprefix("default deny: selected by ").split(", ")
    why = env.cli("policy", "why", "shop/front", "shop/db", "81/TCP", check=False)
    assert why.returncode == 3, why.stdout + why.stderr  # DENIED
    m = re.search(r"denied; selected by (.+?) and no rule", why.stdout)
    assert m is not None, why.stdout
    assert from_flow == m.group(1).split(", ") == ["shop/db-admin", "shop/db-from-front"]


def test_allowed_flow_names_the_allowing_policy(env: Env) -> None:
    probe(env.pods, [("shop/front", "shop/db", 80, "TCP")], retries=0)
    allowed = wait_flow(env, 1, ("--verdict", "allowed"),
                        lambda f: (f["source"], f["destination"], f["port"]) == ("shop/front", "shop/db", 80))
    assert allowed["policy"] == "shop/db-from-front" and allowed["reason"] == "", allowed
    assert "allowed by shop/db-from-front" in env.cli("policy", "why", "shop/front", "shop/db", "80/TCP").stdout
    # node1 logs the same connection leaving shop/front, which no policy selects (egress)
    out = wait_flow(env, 0, ("--verdict", "allowed"),
                    lambda f: (f["source"], f["destination"], f["port"], f["direction"]) ==
                    ("shop/front", "shop/db", 80, "egress"))
    assert out["reason"] == "no policy selects this pod" and out["endpoint"] == "shop/front"


def test_pod_and_namespace_filters_on_real_flows(env: Env) -> None:
    probe(env.pods, [("other/x", "shop/db", 81, "TCP"), ("shop/front", "shop/db", 81, "TCP")], retries=0)
    wait_flow(env, 1, ("-n", "other"), lambda f: f["source"] == "other/x")
    wait_flow(env, 1, (), lambda f: f["source"] == "shop/front")
    every = flows(env, 1)
    assert {f["source"] for f in every} >= {"other/x", "shop/front"}
    in_other = flows(env, 1, "-n", "other")
    assert in_other and all("other/" in f["source"] + f["destination"] for f in in_other)
    of_front = flows(env, 1, "--pod", "shop/front")
    assert of_front and all("shop/front" in (f["source"], f["destination"]) for f in of_front)
    assert not any(f["source"] == "other/x" for f in of_front)
    both = flows(env, 1, "--pod", "other/x", "--verdict", "denied")
    assert both and all(f["verdict"] == "denied" and f["source"] == "other/x" for f in both)


def test_network_default_deny_shows_as_such(env: Env) -> None:
    """A pod of a "defaultPolicy": "deny" network no policy selects: its drop is the network's, and
    `policy why` says the same."""
    pns, _ = env.add("lock/l", 0, defaultPolicy="deny")
    servers = EchoServers([pns])
    try:
        deadline = time.monotonic() + 20
        while True:
            probe(env.pods, [("shop/front", "lock/l", 80, "TCP")], retries=0, window=0.5)
            got = [f for f in flows(env, 0, "--pod", "lock/l", "--verdict", "denied") if f["destination"] == "lock/l"]
            if got or time.monotonic() > deadline:
                break
        assert got and got[-1]["reason"] == "default deny (no policy selects this pod)", got
        assert got[-1]["source"] == "shop/front" and got[-1]["direction"] == "ingress"
        why = env.cli("policy", "why", "shop/front", "lock/l", "80/TCP", check=False)
        assert why.returncode == 3 and "denied by the network's defaultPolicy deny (no policy selects it)" in \
            why.stdout, why.stdout
    finally:
        servers.close()
        env.delete("lock/l", defaultPolicy="deny")


def test_prometheus_sees_drops_and_policies_move(env: Env, tmp_path: Path) -> None:
    ul = env.cluster.underlay
    assert ul is not None
    targets = [f"{n.ip}:{METRICS_PORT}" for n in env.nodes]
    prom = Prometheus(ul, tmp_path / "prom", targets)
    try:
        wait_value(ul, "sum(up)", 2)
        wait_value(ul, "min(pycni_policy_policies)", 2)  # every agent knows the cluster's policies
        wait_value(ul, f'pycni_policy_endpoints{{instance="{targets[1]}"}}', 1)
        assert (query(ul, "min(pycni_policy_rules_programmed)") or 0) > 0
        assert (query(ul, "sum(pycni_policy_programming_seconds_count)") or 0) >= 1  # node2 programmed db's
        drops = 'sum(pycni_policy_dropped_packets_total{namespace="shop",pod="db"})'
        before = query(ul, drops) or 0
        probe(env.pods, [("shop/front", "shop/db", 81, "TCP")], retries=0)
        wait_above(ul, drops, before)
        env.cli("policy", "apply", "-f", "-", stdin=LATE_POLICY)
        wait_value(ul, "min(pycni_policy_policies)", 3)
        assert (query(ul, "sum(pycni_flows_logged_total)") or 0) > 0
    finally:
        prom.stop()
        env.cli("policy", "delete", "-n", "other", "x-quiet", check=False)

