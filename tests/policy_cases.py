"""The NetworkPolicy truth tables: pods a, b, c in namespaces x, y, z, ports 80/81 over TCP and UDP.

As the upstream e2e suite and Cyclonus do it: each case is a set of policies and the whole
expected reachability matrix (rows: from, columns: to; ``.`` allowed, ``X`` denied). The same
cases drive the pure evaluator's unit test and the real-packet dataplane test, so a matrix here
is the one truth both must reproduce. A pod talking to itself never leaves it (allowed).

Policies are YAML templates: ``$xa`` etc. stand for the pods' addresses (which IPAM picks).
"""

from __future__ import annotations

from string import Template

NAMESPACES = ("x", "y", "z")
PODS = ("a", "b", "c")
KEYS = tuple(f"{ns}/{p}" for ns in NAMESPACES for p in PODS)
PORTS = ((80, "TCP"), (81, "TCP"), (80, "UDP"), (81, "UDP"))
# named ports every pod serves, as upstream's agnhost pods name them
NAMED_PORTS = {(f"serve-{port}-{proto.lower()}", proto): port for port, proto in PORTS}

ALL = "*"  # the matrix for every port/protocol not listed


def grid(text: str) -> dict[tuple[str, str], bool]:
    """A matrix written as a table with a header line (``xa xb ...``) into {(from, to): allowed}."""
    lines = [ln.split() for ln in text.strip().splitlines()]
    header, rows = lines[0], lines[1:]
    out = {}
    for row in rows:
        src = f"{row[0][0]}/{row[0][1]}"
        for col, mark in zip(header, row[1:], strict=True):
            assert mark in ".X", mark
            out[(src, f"{col[0]}/{col[1]}")] = mark == "."
    assert len(out) == 81, f"a matrix has 9x9 entries, got {len(out)}"
    return out


def render(matrix: dict[tuple[str, str], bool], expected: dict[tuple[str, str], bool] | None = None) -> str:
    """The matrix as a table; with ``expected``, a wrong entry shows as ``!`` (allowed, should not be)
    or ``?`` (denied, should be allowed)."""
    head = "      " + " ".join(k.replace("/", "") for k in KEYS)
    out = [head]
    for s in KEYS:
        cells = []
        for d in KEYS:
            got = matrix[(s, d)]
            mark = "." if got else "X"
            if expected is not None and expected[(s, d)] != got:
                mark = "!" if got else "?"
            cells.append(f" {mark}")
        out.append(f"  {s.replace('/', '')}  " + " ".join(cells))
    return "\n".join(out)


ALLOW_ALL = grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")

DENY_ALL = grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  X  X  X  X  X  X
  xb  X  .  X  X  X  X  X  X  X
  xc  X  X  .  X  X  X  X  X  X
  ya  X  X  X  .  X  X  X  X  X
  yb  X  X  X  X  .  X  X  X  X
  yc  X  X  X  X  X  .  X  X  X
  za  X  X  X  X  X  X  .  X  X
  zb  X  X  X  X  X  X  X  .  X
  zc  X  X  X  X  X  X  X  X  .
""")

DENY_INGRESS_X = grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  .  .  .  .  .  .
  xb  X  .  X  .  .  .  .  .  .
  xc  X  X  .  .  .  .  .  .  .
  ya  X  X  X  .  .  .  .  .  .
  yb  X  X  X  .  .  .  .  .  .
  yc  X  X  X  .  .  .  .  .  .
  za  X  X  X  .  .  .  .  .  .
  zb  X  X  X  .  .  .  .  .  .
  zc  X  X  X  .  .  .  .  .  .
""")

XA_INGRESS_DENIED = grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  X  .  .  .  .  .  .  .  .
  xc  X  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  X  .  .  .  .  .  .  .  .
  yc  X  .  .  .  .  .  .  .  .
  za  X  .  .  .  .  .  .  .  .
  zb  X  .  .  .  .  .  .  .  .
  zc  X  .  .  .  .  .  .  .  .
""")


def _case(name: str, policies: str, matrices: dict[object, dict[tuple[str, str], bool]],
          default_deny: bool = False) -> dict[str, object]:
    return {"name": name, "policies": policies, "matrices": matrices, "default_deny": default_deny}


CASES = [
    _case("no policy: everything reaches everything", "", {ALL: ALLOW_ALL}),

    _case("deny-all ingress in x", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
""", {ALL: DENY_INGRESS_X}),

    _case("deny-all egress in x", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress, namespace: x}
spec:
  podSelector: {}
  policyTypes:
  - Egress
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  X  X  X  X  X  X
  xb  X  .  X  X  X  X  X  X  X
  xc  X  X  .  X  X  X  X  X  X
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("x/a allows ingress from pod=b of its own namespace", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-b
  namespace: x
spec:
  podSelector:
    matchLabels:
      pod: a
  ingress:
  - from:
    - podSelector:
        matchLabels:
          pod: b
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  .  .  .  .  .  .  .  .  .
  xc  X  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  X  .  .  .  .  .  .  .  .
  yc  X  .  .  .  .  .  .  .  .
  za  X  .  .  .  .  .  .  .  .
  zb  X  .  .  .  .  .  .  .  .
  zc  X  .  .  .  .  .  .  .  .
""")}),

    _case("x allows ingress from namespace y", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-ns-y, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: "y"}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  .  .  .  .  .  .
  xb  X  .  X  .  .  .  .  .  .
  xc  X  X  .  .  .  .  .  .  .
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  X  X  X  .  .  .  .  .  .
  zb  X  X  X  .  .  .  .  .  .
  zc  X  X  X  .  .  .  .  .  .
""")}),

    _case("both selectors in one peer are an AND (y/b only)", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: and, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: "y"}}
      podSelector: {matchLabels: {pod: b}}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  X  .  .  .  .  .  .  .  .
  xc  X  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  X  .  .  .  .  .  .  .  .
  za  X  .  .  .  .  .  .  .  .
  zb  X  .  .  .  .  .  .  .  .
  zc  X  .  .  .  .  .  .  .  .
""")}),

    _case("two peers are an OR (namespace y, or pod=b of x)", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: or, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: "y"}}
    - podSelector: {matchLabels: {pod: b}}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  .  .  .  .  .  .  .  .  .
  xc  X  .  .  .  .  .  .  .  .
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  X  .  .  .  .  .  .  .  .
  zb  X  .  .  .  .  .  .  .  .
  zc  X  .  .  .  .  .  .  .  .
""")}),

    _case("namespaceSelector {} with a podSelector: pod=c of every namespace", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: any-ns-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {}
      podSelector: {matchLabels: {pod: c}}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  X  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  X  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  X  .  .  .  .  .  .  .  .
  zb  X  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("matchExpressions: namespaces NotIn (y), pods Exists pod and DoesNotExist other", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: exprs, namespace: x}
spec:
  podSelector:
    matchExpressions:
    - {key: pod, operator: In, values: [a, b]}
  ingress:
  - from:
    - namespaceSelector:
        matchExpressions:
        - key: ns
          operator: NotIn
          values: ["y"]
      podSelector:
        matchExpressions:
        - {key: pod, operator: Exists}
        - {key: other, operator: DoesNotExist}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  X  X  .  .  .  .  .  .  .
  yb  X  X  .  .  .  .  .  .  .
  yc  X  X  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("ipBlock with except (every address but y/a's)", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ipblock, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - ipBlock:
        cidr: 0.0.0.0/0
        except:
        - $ya/32
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("ipBlock with two excepts (every address but y/a's and z/b's: an anonymous interval set)", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ipblock2, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - ipBlock:
        cidr: 0.0.0.0/0
        except:
        - $ya/32
        - $zb/32
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  X  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("a named port (serve-81-tcp) opens 81/TCP only", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports:
    - port: serve-81-tcp
      protocol: TCP
""", {(81, "TCP"): ALLOW_ALL, ALL: DENY_INGRESS_X}),

    _case("a named port matches by name and protocol (serve-81-tcp over UDP: nothing)", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named-udp, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports:
    - {port: serve-81-tcp, protocol: UDP}
""", {ALL: DENY_INGRESS_X}),

    _case("endPort: 81-90/TCP into x/a", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: range, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports:
    - {protocol: TCP, port: 81, endPort: 90}
""", {(81, "TCP"): ALLOW_ALL, ALL: XA_INGRESS_DENIED}),

    _case("numeric UDP port 80 from namespace z", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: udp80-from-z, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: z}}
    ports:
    - {protocol: UDP, port: 80}
""", {(80, "UDP"): grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  .  .  .  .  .  .  .
  xb  X  .  .  .  .  .  .  .  .
  xc  X  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  X  .  .  .  .  .  .  .  .
  yc  X  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
"""), ALL: XA_INGRESS_DENIED}),

    _case("egress from x/a to y/b only", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-yb, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {ns: "y"}}
      podSelector: {matchLabels: {pod: b}}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  X  .  X  X  X  X
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("egress from x/a to an ipBlock (z/a, z/b) on 80/TCP", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-ipblock, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: $za/32}
    - ipBlock: {cidr: $zb/32}
    ports:
    - port: 80
""", {(80, "TCP"): grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  X  X  X  .  .  X
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
"""), ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  X  X  X  X  X  X
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("egress rules without policyTypes make x/a Ingress+Egress (ingress then allows nothing)", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: implied-types, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  egress:
  - to:
    - podSelector: {matchLabels: {pod: b}}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  .  X  X  X  X  X  X  X
  xb  X  .  .  .  .  .  .  .  .
  xc  X  .  .  .  .  .  .  .  .
  ya  X  .  .  .  .  .  .  .  .
  yb  X  .  .  .  .  .  .  .  .
  yc  X  .  .  .  .  .  .  .  .
  za  X  .  .  .  .  .  .  .  .
  zb  X  .  .  .  .  .  .  .  .
  zc  X  .  .  .  .  .  .  .  .
""")}),

    _case("ingress: [{}] allows all, egress: [] none (x/a)", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: all-in-none-out, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  ingress:
  - {}
  egress: []
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  X  X  X  X  X  X
  xb  .  .  .  .  .  .  .  .  .
  xc  .  .  .  .  .  .  .  .  .
  ya  .  .  .  .  .  .  .  .  .
  yb  .  .  .  .  .  .  .  .  .
  yc  .  .  .  .  .  .  .  .  .
  za  .  .  .  .  .  .  .  .  .
  zb  .  .  .  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("policies are additive: deny-all in x, x/a from y, x from z/c", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: xa-from-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: "y"}}
---
# every pod of x from z/c
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-from-zc, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}
      podSelector: {matchLabels: {pod: c}}
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  .  .  .  .  .  .
  xb  X  .  X  .  .  .  .  .  .
  xc  X  X  .  .  .  .  .  .  .
  ya  .  X  X  .  .  .  .  .  .
  yb  .  X  X  .  .  .  .  .  .
  yc  .  X  X  .  .  .  .  .  .
  za  X  X  X  .  .  .  .  .  .
  zb  X  X  X  .  .  .  .  .  .
  zc  .  .  .  .  .  .  .  .  .
""")}),

    _case("defaultPolicy deny: nothing without a policy", "", {ALL: DENY_ALL}, default_deny=True),

    _case("defaultPolicy deny with x/a open both ways to namespace y", """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: xa-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
  egress:
  - to: [{namespaceSelector: {matchLabels: {ns: "y"}}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: y-x, namespace: "y"}
spec:
  podSelector: {}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: x}}}]
  egress:
  - to: [{namespaceSelector: {matchLabels: {ns: x}}}]
""", {ALL: grid("""
      xa xb xc ya yb yc za zb zc
  xa  .  X  X  .  .  .  X  X  X
  xb  X  .  X  X  X  X  X  X  X
  xc  X  X  .  X  X  X  X  X  X
  ya  .  X  X  .  X  X  X  X  X
  yb  .  X  X  X  .  X  X  X  X
  yc  .  X  X  X  X  .  X  X  X
  za  X  X  X  X  X  X  .  X  X
  zb  X  X  X  X  X  X  X  .  X
  zc  X  X  X  X  X  X  X  X  .
""")}, default_deny=True),
]


def policies_text(case: dict[str, object], addresses: dict[str, str]) -> str:
    """The case's YAML with ``$xa``... replaced by the pods' addresses (keys like ``x/a``)."""
    return Template(str(case["policies"])).substitute({k.replace("/", ""): v for k, v in addresses.items()})


def expected(case: dict[str, object], port: int, proto: str) -> dict[tuple[str, str], bool]:
    matrices = case["matrices"]
    assert isinstance(matrices, dict)
    return matrices.get((port, proto), matrices[ALL])
