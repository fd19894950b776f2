"""The policy model, pure: parsing and validation of NetworkPolicy manifests, the YAML subset,
selectors, and the evaluator against the upstream-style truth tables (tests/policy_cases.py)."""

from __future__ import annotations

import pytest
from policy_cases import CASES, KEYS, NAMED_PORTS, PORTS, expected, policies_text, render

from pycni import ipaddr
from pycni.cluster.policy.evaluate import Cluster, Workload, decide
from pycni.cluster.policy.model import (
    LabelSelector,
    PolicyError,
    parse_label_selector_text,
    parse_policies,
    parse_policy,
    parse_selector,
)

NODES = {"n1": (ipaddr.ip_address("192.0.2.1"),), "n2": (ipaddr.ip_address("192.0.2.2"),),
         "n3": (ipaddr.ip_address("192.0.2.3"),)}


def workloads() -> dict[str, Workload]:
    out = {}
    for i, key in enumerate(KEYS):
        ns, pod = key.split("/")
        out[key] = Workload(ns, pod, {"pod": pod}, (ipaddr.ip_address(f"10.90.{i}.{i + 10}"),),
                            dict(NAMED_PORTS), node=f"n{i % 3 + 1}")
    return out


def cluster_for(case: dict[str, object], pods: dict[str, Workload]) -> Cluster:
    text = policies_text(case, {k: str(w.ips[0]) for k, w in pods.items()})
    return Cluster(policies=parse_policies(text), namespaces={ns: {"ns": ns} for ns in "xyz"}, nodes=NODES,
                   default_deny=bool(case["default_deny"]))


@pytest.mark.parametrize("case", CASES, ids=[str(c["name"]) for c in CASES])
def test_truth_table(case: dict[str, object]) -> None:
    pods = workloads()
    cluster = cluster_for(case, pods)
    for port, proto in PORTS:
        got = {(s, d): decide(cluster, pods[s], pods[d], port, proto).allowed for s in KEYS for d in KEYS}
        want = expected(case, port, proto)
        assert got == want, f"{case['name']} on {port}/{proto}\n{render(got, want)}"


def test_own_node_always_allowed_other_nodes_only_by_ipblock() -> None:
    pods = workloads()
    deny = parse_policies("""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
""")
    cluster = Cluster(policies=deny, nodes=NODES)
    xa = pods["x/a"]
    own, other = NODES[xa.node][0], NODES["n2"][0]
    assert decide(cluster, own, xa, 80).allowed
    assert decide(cluster, xa, own, 80).allowed
    d = decide(cluster, other, xa, 80)
    assert not d.allowed and "x/deny" in d.reasons[0]
    assert not decide(cluster, xa, other, 80).allowed
    cluster.policies += parse_policies("""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: nodes, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24}}]}]
""")
    d = decide(cluster, other, xa, 80)
    assert d.allowed and "x/nodes (ingress rule 0)" in d.reasons[0]


def test_reasons_name_the_policies() -> None:
    pods = workloads()
    case = next(c for c in CASES if str(c["name"]).startswith("policies are additive"))
    cluster = cluster_for(case, pods)
    d = decide(cluster, pods["y/a"], pods["x/a"], 80)
    assert d.allowed
    assert d.reasons == ("egress from y/a: allowed, no policy selects the pod for Egress",
                         "ingress to x/a: allowed by x/xa-from-y (ingress rule 0)")
    d = decide(cluster, pods["y/a"], pods["x/b"], 81, "udp")
    assert not d.allowed
    assert d.reasons[1] == ("ingress to x/b: denied; selected by x/deny-all, x/x-from-zc and no rule of theirs"
                            " allows y/a on 81/UDP")


def test_named_port_resolves_on_the_destination_pod() -> None:
    pods = workloads()
    pods["x/b"] = Workload("x", "b", {"pod": "b"}, pods["x/b"].ips, {("web", "TCP"): 8080})
    cluster = Cluster(policies=parse_policies("""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: x}
spec:
  podSelector: {}
  ingress: [{ports: [{port: web}]}]
"""))
    assert decide(cluster, pods["y/a"], pods["x/b"], 8080).allowed
    assert not decide(cluster, pods["y/a"], pods["x/b"], 8080, "UDP").allowed
    assert not decide(cluster, pods["y/a"], pods["x/a"], 8080).allowed  # x/a has no port named web


def test_ipv6_ipblock() -> None:
    a = Workload("x", "a", {"pod": "a"}, (ipaddr.ip_address("10.0.0.1"), ipaddr.ip_address("fd00::1")))
    b = Workload("y", "b", {"pod": "b"}, (ipaddr.ip_address("10.0.0.2"), ipaddr.ip_address("fd00::2")))
    cluster = Cluster(policies=parse_policies("""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: v6, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: "fd00::/64", except: ["fd00::2/128"]}}, {ipBlock: {cidr: 10.0.0.0/8}}]}]
"""))
    assert decide(cluster, b, a, 80, version=4).allowed
    assert not decide(cluster, b, a, 80, version=6).allowed
    assert decide(cluster, ipaddr.ip_address("fd00::3"), a, 80).allowed


# --- parsing ---------------------------------------------------------------------------------

def _policy(spec: str, meta: str = "{name: p, namespace: x}") -> str:
    return f"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {meta}\nspec:\n{spec}\n"


def test_policy_types_default() -> None:
    (p,) = parse_policies(_policy("  podSelector: {}"))
    assert p.policy_types == {"Ingress"} and p.ingress == ()
    (p,) = parse_policies(_policy("  podSelector: {}\n  egress: [{}]"))
    assert p.policy_types == {"Ingress", "Egress"}
    (p,) = parse_policies(_policy("  podSelector: {}\n  egress: []"))
    assert p.policy_types == {"Ingress"}
    (p,) = parse_policies(_policy("  podSelector: {}\n  policyTypes: [Egress]\n  ingress: [{}]"))
    assert p.policy_types == {"Egress"}


def test_namespace_defaults_and_json() -> None:
    (p,) = parse_policies('{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",'
                          ' "metadata": {"name": "j"}, "spec": {"podSelector": {}}}', default_namespace="dev")
    assert p.key == "dev/j"
    import json

    item = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"}
    listed = {"apiVersion": "v1", "kind": "List", "items": [{**item, "metadata": {"name": n}} for n in "ab"]}
    items = parse_policies(json.dumps(listed))
    assert [p.name for p in items] == ["a", "b"]


@pytest.mark.parametrize(("spec", "message"), [
    ("  podSelector: {matchLabels: {app: 1}}", "spec.podSelector.matchLabels.app: label value must be a string"),
    ("  podSelector: {app: web}", "spec.podSelector: unknown field(s) app"),
    ("  podSelector:\n    matchExpressions: [{key: a, operator: In}]",
     "spec.podSelector.matchExpressions[0].values: must be non-empty when operator is In"),
    ("  podSelector:\n    matchExpressions: [{key: a, operator: Exists, values: [b]}]",
     "values: must be empty when operator is Exists"),
    ("  podSelector:\n    matchExpressions: [{key: a, operator: in, values: [b]}]",
     "operator: must be one of In, NotIn, Exists, DoesNotExist, got 'in'"),
    ("  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/33}",
     "spec.ingress[0].from[0].ipBlock.cidr: must be a CIDR"),
    ("  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/24]}",
     "except[0]: 11.0.0.0/24 must be strictly within the block's cidr 10.0.0.0/8"),
    ("  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/8}\n      podSelector: {}",
     "ipBlock cannot be combined with podSelector or namespaceSelector"),
    ("  podSelector: {}\n  ingress:\n  - from:\n    - {}", "from[0]: must name podSelector, namespaceSelector"),
    ("  podSelector: {}\n  ingress:\n  - ports: [{port: 0}]", "ports[0].port: must be between 1 and 65535, got 0"),
    ("  podSelector: {}\n  ingress:\n  - ports: [{port: 80, protocol: tcp}]",
     "protocol: must be one of TCP, UDP, SCTP (upper case), got 'tcp'"),
    ("  podSelector: {}\n  ingress:\n  - ports: [{port: http, endPort: 90}]",
     "endPort: may only be set with a numeric port"),
    ("  podSelector: {}\n  ingress:\n  - ports: [{port: 90, endPort: 80}]", "endPort: must be at least port (90)"),
    ("  podSelector: {}\n  ingress:\n  - ports: [{port: Web_Port}]", "port name 'Web_Port' must be 1-15"),
    ("  podSelector: {}\n  policyTypes: [Ingress, ingress]", "spec.policyTypes[1]: must be Ingress or Egress"),
    ("  podSelector: {}\n  ingres: []", "spec: unknown field(s) ingres"),
    ("  podSelector: {}\n  ingress:\n  - form: []", "spec.ingress[0]: unknown field(s) form"),
])
def test_invalid_policies_name_the_field(spec: str, message: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policies(_policy(spec))
    assert message in str(e.value)
    assert str(e.value).startswith("document 1 (p): ")


def test_invalid_metadata_and_kind() -> None:
    with pytest.raises(PolicyError, match="metadata.name: must be a DNS subdomain"):
        parse_policy({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "A"}})
    with pytest.raises(PolicyError, match="expected apiVersion networking.k8s.io/v1 and kind NetworkPolicy"):
        parse_policy({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}})
    with pytest.raises(PolicyError, match="document 2"):
        parse_policies(_policy("  podSelector: {}") + "---\nkind: Service\n")


def test_selector_semantics() -> None:
    sel = parse_selector({"matchLabels": {"a": "1"}, "matchExpressions": [
        {"key": "b", "operator": "NotIn", "values": ["x"]}, {"key": "c", "operator": "DoesNotExist"}]}, "s")
    assert sel.matches({"a": "1"})
    assert sel.matches({"a": "1", "b": "y"})
    assert not sel.matches({"a": "1", "b": "x"})
    assert not sel.matches({"a": "1", "c": ""})
    assert not sel.matches({"a": "2"})
    assert LabelSelector().matches({}) and LabelSelector().empty
    t = parse_label_selector_text("app=web, tier in (a,b), !legacy, env!=prod, zone")
    assert t.matches({"app": "web", "tier": "a", "zone": "1"})
    assert not t.matches({"app": "web", "tier": "c", "zone": "1"})
    assert not t.matches({"app": "web", "tier": "a", "zone": "1", "env": "prod"})
    assert not t.matches({"app": "web", "tier": "a"})
