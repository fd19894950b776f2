"""Kubernetes ``networking.k8s.io/v1`` NetworkPolicy as typed, validated values.

Why a model of our own: the user-facing format is Kubernetes' own (a manifest written for a
cluster works here), but everything downstream — the evaluator that is the truth, the nftables
compiler, the records in etcd — wants one checked shape with Kubernetes' defaults applied
(``policyTypes``, ``protocol: TCP``, the namespace) and every bad input refused up front with
the path of the field, as the API server would refuse it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pycni import ipaddr
from pycni.spec.types import IPAddress, IPNetwork

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
PROTOCOLS = ("TCP", "UDP", "SCTP")
NS_NAME_LABEL = "kubernetes.io/metadata.name"  # every namespace carries it, as in Kubernetes
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class PolicyError(ValueError):
    """An invalid policy (or selector, or label): the message names the field's path."""


def _fail(path: str, msg: str) -> PolicyError:
    return PolicyError(f"{path}: {msg}" if path else msg)


def _only(obj: Mapping[str, Any], allowed: set[str], path: str, hint: str = "") -> None:
    """Refuse any field of ``obj`` not in ``allowed`` (a typo would otherwise be ignored)."""
    unknown = set(obj) - allowed
    if unknown:
        raise _fail(path, f"unknown field(s) {', '.join(sorted(unknown))}" + (f" ({hint})" if hint else ""))


# --- names and labels (Kubernetes' validation rules) -------------------------------------------

def _is_dns_label(s: str, maxlen: int = 63) -> bool:
    """RFC 1123 label: lower-case alphanumerics and '-', starting and ending alphanumeric."""
    if not s or len(s) > maxlen or not s.isascii():
        return False
    if not (s[0].isalnum() and s[-1].isalnum()):
        return False
    return all(c.isdigit() or ("a" <= c <= "z") or c == "-" for c in s)


def _is_dns_subdomain(s: str) -> bool:
    return 0 < len(s) <= 253 and all(_is_dns_label(p) for p in s.split("."))


def _is_label_name(s: str) -> bool:
    """A label key's name part (or a label value when non-empty): 63 characters of [A-Za-z0-9_.-],
    alphanumeric at both ends."""
    if not s or len(s) > 63 or not s.isascii():
        return False
    if not (s[0].isalnum() and s[-1].isalnum()):
        return False
    return all(c.isalnum() or c in "-_." for c in s)


def check_label_key(key: Any, path: str) -> str:
    """``key`` as a label key (``[prefix/]name``), or a :class:`PolicyError` saying why not."""
    if not isinstance(key, str):
        raise _fail(path, f"label key must be a string, got {key!r}")
    prefix, _, name = key.rpartition("/")
    if "/" in key and not _is_dns_subdomain(prefix):
        raise _fail(path, f"label key {key!r}: prefix {prefix!r} must be a DNS subdomain (lower case, '.', '-')")
    if not _is_label_name(name):
        raise _fail(path, f"label key {key!r}: name must be 1-63 characters of letters, digits, '-', '_' or '.',"
                          " beginning and ending with a letter or digit")
    return key


def check_label_value(value: Any, path: str) -> str:
    """``value`` as a label value (empty allowed); numbers and booleans are refused, as kubectl does."""
    if not isinstance(value, str):
        raise _fail(path, f"label value must be a string, got {value!r} (quote it: \"{value}\")")
    if value and not _is_label_name(value):
        raise _fail(path, f"label value {value!r} must be at most 63 characters of letters, digits, '-', '_'"
                          " or '.', beginning and ending with a letter or digit")
    return value


def check_labels(obj: Any, path: str) -> dict[str, str]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise _fail(path, f"must be a map of label key to value, got {obj!r}")
    return {check_label_key(k, f"{path}.{k}"): check_label_value(v, f"{path}.{k}") for k, v in obj.items()}


def check_port_name(name: str, path: str) -> str:
    """An IANA service name, as a container port's name: 1-15 of [a-z0-9-], with a letter, no '--'."""
    ok = (0 < len(name) <= 15 and name.isascii() and all(c.isdigit() or "a" <= c <= "z" or c == "-" for c in name)
          and any("a" <= c <= "z" for c in name) and name[0] != "-" and name[-1] != "-" and "--" not in name)
    if not ok:
        raise _fail(path, f"port name {name!r} must be 1-15 lower-case letters, digits and '-' with at least one"
                          " letter (an IANA service name)")
    return name


# --- selectors ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values  # an absent key is "not in", as Kubernetes
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels

    def __str__(self) -> str:
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        op = "in" if self.operator == "In" else "notin"
        return f"{self.key} {op} ({','.join(self.values)})"


@dataclass(frozen=True)
class LabelSelector:
    """``matchLabels`` and ``matchExpressions``, ANDed; the empty selector matches everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(k) == v for k, v in self.match_labels)
                and all(r.matches(labels) for r in self.match_expressions))

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.match_labels] + [str(r) for r in self.match_expressions]
        return ",".join(parts) if parts else "(all)"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [
                {"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})}
                for r in self.match_expressions]
        return out


def parse_selector(obj: Any, path: str) -> LabelSelector:
    """A LabelSelector from its Kubernetes form (None and ``{}`` are the empty selector)."""
    if obj is None:
        return LabelSelector()
    if not isinstance(obj, Mapping):
        raise _fail(path, f"must be a label selector (matchLabels, matchExpressions), got {obj!r}")
    _only(obj, {"matchLabels", "matchExpressions"}, path,
          "a selector has matchLabels and matchExpressions; labels go under matchLabels")
    labels = check_labels(obj.get("matchLabels"), f"{path}.matchLabels")
    exprs_raw = obj.get("matchExpressions") or []
    if not isinstance(exprs_raw, list):
        raise _fail(f"{path}.matchExpressions", f"must be a list, got {exprs_raw!r}")
    exprs = []
    for i, e in enumerate(exprs_raw):
        p = f"{path}.matchExpressions[{i}]"
        if not isinstance(e, Mapping):
            raise _fail(p, f"must be {{key, operator, values}}, got {e!r}")
        _only(e, {"key", "operator", "values"}, p)
        key = check_label_key(e.get("key"), f"{p}.key")
        op = e.get("operator")
        if op not in OPERATORS:
            raise _fail(f"{p}.operator", f"must be one of {', '.join(OPERATORS)}, got {op!r}")
        values = e.get("values") or []
        if not isinstance(values, list):
            raise _fail(f"{p}.values", f"must be a list of strings, got {values!r}")
        values = [check_label_value(v, f"{p}.values[{j}]") for j, v in enumerate(values)]
        if op in ("In", "NotIn") and not values:
            raise _fail(f"{p}.values", f"must be non-empty when operator is {op}")
        if op in ("Exists", "DoesNotExist") and values:
            raise _fail(f"{p}.values", f"must be empty when operator is {op}")
        exprs.append(Requirement(key, op, tuple(values)))
    return LabelSelector(tuple(sorted(labels.items())), tuple(exprs))


def parse_label_selector_text(text: str, path: str = "selector") -> LabelSelector:
    """``k=v,k2!=v2,k3,!k4,k5 in (a,b)`` (kubectl's -l syntax) as a selector."""
    labels: dict[str, str] = {}
    exprs: list[Requirement] = []
    parts: list[str] = []
    depth, cur = 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    for part in (p.strip() for p in parts):
        words = part.split(None, 1)
        if len(words) == 2 and words[1].split(None, 1)[0] in ("in", "notin"):
            op, rest = words[1].split(None, 1)
            vals = tuple(v.strip() for v in rest.strip().strip("()").split(",") if v.strip())
            exprs.append(Requirement(check_label_key(words[0], path), "In" if op == "in" else "NotIn", vals))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            exprs.append(Requirement(check_label_key(k.strip(), path), "NotIn", (check_label_value(v.strip(), path),)))
        elif "=" in part:
            k, v = part.split("=", 1)
            labels[check_label_key(k.strip().rstrip("="), path)] = check_label_value(v.strip().lstrip("="), path)
        elif part.startswith("!"):
            exprs.append(Requirement(check_label_key(part[1:].strip(), path), "DoesNotExist"))
        else:
            exprs.append(Requirement(check_label_key(part, path), "Exists"))
    return LabelSelector(tuple(sorted(labels.items())), tuple(exprs))


# --- peers, ports, rules, policies ----------------------------------------------------------

@dataclass(frozen=True)
class IPBlock:
    cidr: IPNetwork
    excepts: tuple[IPNetwork, ...] = ()

    def contains(self, ip: IPAddress) -> bool:
        return (ip.version == self.cidr.version and ip in self.cidr
                and not any(ip in e for e in self.excepts))

    def __str__(self) -> str:
        return str(self.cidr) + (f" except {', '.join(map(str, self.excepts))}" if self.excepts else "")


@dataclass(frozen=True)
class Peer:
    """One ``from``/``to`` entry: pods (by pod and/or namespace selector, ANDed) or an ipBlock.

    ``namespace_selector`` None means the policy's own namespace; ``pod_selector`` None with a
    namespace selector means every pod of the selected namespaces."""

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None

    def __str__(self) -> str:
        if self.ip_block is not None:
            return f"ipBlock {self.ip_block}"
        parts = []
        if self.namespace_selector is not None:
            parts.append(f"namespaces [{self.namespace_selector}]")
        if self.pod_selector is not None:
            parts.append(f"pods [{self.pod_selector}]")
        return " and ".join(parts)


def namespace_labels(namespace: str, labels: Mapping[str, str] | None) -> dict[str, str]:
    """A namespace's labels as selectors see them: with ``kubernetes.io/metadata.name`` (always
    there, as in Kubernetes). The one place that rule is written."""
    return {**(labels or {}), NS_NAME_LABEL: namespace}


@dataclass(frozen=True)
class PeerSelector:
    """Which pods a peer (or a whole policy's podSelector) picks: a namespace by name (``namespace``,
    a peer without ``namespaceSelector``) or by labels (``ns_selector``), and a podSelector (None:
    every pod there). The one selector implementation: :func:`evaluate.decide` and the index that
    fills the dataplane's member sets both call :meth:`matches`, so they cannot disagree."""

    namespace: str | None
    ns_selector: LabelSelector | None
    pod_selector: LabelSelector | None

    @classmethod
    def of(cls, policy_namespace: str, peer: Peer) -> PeerSelector:
        """A pod peer of a policy of ``policy_namespace`` (not an ipBlock)."""
        if peer.namespace_selector is None:
            return cls(policy_namespace, None, peer.pod_selector)
        return cls(None, peer.namespace_selector, peer.pod_selector)

    @property
    def key(self) -> tuple[object, ...]:
        """Equal for selectors that pick the same pods (its member sets are shared by that key)."""
        ns: object = ("ns", self.namespace) if self.ns_selector is None else \
            ("nssel", self.ns_selector.match_labels, self.ns_selector.match_expressions)
        pod = None if self.pod_selector is None else (self.pod_selector.match_labels,
                                                      self.pod_selector.match_expressions)
        return (ns, pod)

    def matches_namespace(self, namespace: str, ns_labels: Mapping[str, str]) -> bool:
        """The namespace half (``ns_labels`` as :func:`namespace_labels` gives them)."""
        if self.ns_selector is None:
            return namespace == self.namespace
        return self.ns_selector.matches(ns_labels)

    def matches_pod(self, labels: Mapping[str, str]) -> bool:
        return self.pod_selector is None or self.pod_selector.matches(labels)

    def matches(self, namespace: str, labels: Mapping[str, str], ns_labels: Mapping[str, str]) -> bool:
        """Whether a pod of ``namespace`` with ``labels`` is picked (``ns_labels``: its namespace's)."""
        return self.matches_namespace(namespace, ns_labels) and self.matches_pod(labels)


@dataclass(frozen=True)
class PolicyPort:
    """One ``ports`` entry: protocol, and a number, a range (``endPort``), a name, or every port."""

    protocol: str = "TCP"
    port: int | str | None = None
    end_port: int | None = None

    def __str__(self) -> str:
        if self.port is None:
            return f"any/{self.protocol}"
        if self.end_port is not None:
            return f"{self.port}-{self.end_port}/{self.protocol}"
        return f"{self.port}/{self.protocol}"


@dataclass(frozen=True)
class Rule:
    """One ingress or egress rule: empty ``peers`` means every peer, empty ``ports`` every port."""

    peers: tuple[Peer, ...] = ()
    ports: tuple[PolicyPort, ...] = ()


@dataclass(frozen=True)
class NetworkPolicy:
    namespace: str
    name: str
    pod_selector: LabelSelector
    policy_types: frozenset[str]
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    key: str = field(init=False, compare=False, repr=False)  # NAMESPACE/NAME

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")

    def applies_to(self, namespace: str, labels: Mapping[str, str], direction: str) -> bool:
        """Whether this policy selects a pod of ``namespace`` with ``labels`` for ``direction``."""
        return (direction in self.policy_types and namespace == self.namespace
                and self.pod_selector.matches(labels))


def _parse_ip_block(obj: Any, path: str) -> IPBlock:
    if not isinstance(obj, Mapping):
        raise _fail(path, f"must be {{cidr, except}}, got {obj!r}")
    _only(obj, {"cidr", "except"}, path)
    raw_cidr: Any = obj.get("cidr")
    try:
        cidr = ipaddr.ip_network(raw_cidr, strict=False)
    except (TypeError, ValueError):
        raise _fail(f"{path}.cidr", f"must be a CIDR such as 10.0.0.0/8 or fd00::/64, got {raw_cidr!r}") from None
    if "/" not in str(obj.get("cidr")):
        raise _fail(f"{path}.cidr", f"must be a CIDR with a prefix length, got {obj.get('cidr')!r}")
    excepts = []
    raw = obj.get("except") or []
    if not isinstance(raw, list):
        raise _fail(f"{path}.except", f"must be a list of CIDRs, got {raw!r}")
    for i, e in enumerate(raw):
        p = f"{path}.except[{i}]"
        try:
            net = ipaddr.ip_network(e, strict=False)
        except (TypeError, ValueError):
            raise _fail(p, f"must be a CIDR, got {e!r}") from None
        if net.version != cidr.version or not net.subnet_of(cidr) or net == cidr:  # type: ignore[arg-type]
            raise _fail(p, f"{e} must be strictly within the block's cidr {cidr}")
        excepts.append(net)
    return IPBlock(cidr, tuple(excepts))


def _parse_peer(obj: Any, path: str) -> Peer:
    if not isinstance(obj, Mapping):
        raise _fail(path, f"must be a peer (podSelector, namespaceSelector or ipBlock), got {obj!r}")
    _only(obj, {"podSelector", "namespaceSelector", "ipBlock"}, path)
    if not obj:
        raise _fail(path, "must name podSelector, namespaceSelector or ipBlock (an empty peer matches nothing"
                          " Kubernetes accepts); to allow every source leave out 'from'/'to'")
    if "ipBlock" in obj:
        if "podSelector" in obj or "namespaceSelector" in obj:
            raise _fail(path, "ipBlock cannot be combined with podSelector or namespaceSelector in one peer;"
                              " list them as two peers (an OR)")
        return Peer(ip_block=_parse_ip_block(obj["ipBlock"], f"{path}.ipBlock"))
    pod = parse_selector(obj["podSelector"], f"{path}.podSelector") if "podSelector" in obj else None
    ns = (parse_selector(obj["namespaceSelector"], f"{path}.namespaceSelector")
          if "namespaceSelector" in obj else None)
    return Peer(pod_selector=pod, namespace_selector=ns)


def _parse_port(obj: Any, path: str) -> PolicyPort:
    if not isinstance(obj, Mapping):
        raise _fail(path, f"must be {{protocol, port, endPort}}, got {obj!r}")
    _only(obj, {"protocol", "port", "endPort"}, path)
    proto = obj.get("protocol") or "TCP"
    if proto not in PROTOCOLS:
        raise _fail(f"{path}.protocol", f"must be one of {', '.join(PROTOCOLS)} (upper case), got {proto!r}")
    port = obj.get("port")
    end = obj.get("endPort")
    if isinstance(port, bool) or not (port is None or isinstance(port, (int, str))):
        raise _fail(f"{path}.port", f"must be a port number or a named port, got {port!r}")
    if isinstance(port, str) and port.isdigit():
        port = int(port)  # an IntOrString given as "80"
    if isinstance(port, int) and not 1 <= port <= 65535:
        raise _fail(f"{path}.port", f"must be between 1 and 65535, got {port}")
    if isinstance(port, str):
        check_port_name(port, f"{path}.port")
    if end is not None:
        if isinstance(end, bool) or not isinstance(end, int) or not 1 <= end <= 65535:
            raise _fail(f"{path}.endPort", f"must be a port number between 1 and 65535, got {end!r}")
        if not isinstance(port, int):
            raise _fail(f"{path}.endPort", "may only be set with a numeric port")
        if end < port:
            raise _fail(f"{path}.endPort", f"must be at least port ({port}), got {end}")
    return PolicyPort(proto, port, end)


def _parse_rules(obj: Any, path: str, peers_key: str) -> tuple[Rule, ...]:
    if obj is None:
        return ()
    if not isinstance(obj, list):
        raise _fail(path, f"must be a list of rules, got {obj!r}")
    rules = []
    for i, r in enumerate(obj):
        p = f"{path}[{i}]"
        if r is None:
            r = {}
        if not isinstance(r, Mapping):
            raise _fail(p, f"must be a rule ({peers_key}, ports), got {r!r}")
        _only(r, {peers_key, "ports"}, p, f"a rule here has {peers_key!r} and 'ports'")
        peers_raw = r.get(peers_key) or []
        ports_raw = r.get("ports") or []
        if not isinstance(peers_raw, list):
            raise _fail(f"{p}.{peers_key}", f"must be a list of peers, got {peers_raw!r}")
        if not isinstance(ports_raw, list):
            raise _fail(f"{p}.ports", f"must be a list of ports, got {ports_raw!r}")
        rules.append(Rule(tuple(_parse_peer(x, f"{p}.{peers_key}[{j}]") for j, x in enumerate(peers_raw)),
                          tuple(_parse_port(x, f"{p}.ports[{j}]") for j, x in enumerate(ports_raw))))
    return tuple(rules)


def parse_policy(obj: Any, default_namespace: str = "default") -> NetworkPolicy:
    """A validated :class:`NetworkPolicy` from a manifest (a dict as YAML or JSON gives it)."""
    if not isinstance(obj, Mapping):
        raise _fail("", f"a NetworkPolicy must be a map, got {type(obj).__name__}")
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise _fail("", f"expected apiVersion {API_VERSION} and kind {KIND}, got apiVersion"
                        f" {obj.get('apiVersion')!r} and kind {obj.get('kind')!r}")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise _fail("metadata", "is required, with at least a name")
    name = meta.get("name")
    if not isinstance(name, str) or not _is_dns_subdomain(name):
        raise _fail("metadata.name", f"must be a DNS subdomain (lower case letters, digits, '-', '.'), got {name!r}")
    namespace = meta.get("namespace") or default_namespace
    if not isinstance(namespace, str) or not _is_dns_label(namespace):
        raise _fail("metadata.namespace", f"must be a DNS label (lower case letters, digits, '-'), got {namespace!r}")
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise _fail("spec", f"must be a map, got {spec!r}")
    _only(spec, {"podSelector", "policyTypes", "ingress", "egress"}, "spec")
    selector = parse_selector(spec.get("podSelector"), "spec.podSelector")
    ingress = _parse_rules(spec.get("ingress"), "spec.ingress", "from")
    egress = _parse_rules(spec.get("egress"), "spec.egress", "to")
    types_raw = spec.get("policyTypes")
    if types_raw is None or types_raw == []:
        # Kubernetes' default: Ingress always, Egress when the policy has egress rules
        types = {"Ingress"} | ({"Egress"} if spec.get("egress") else set())
    else:
        if not isinstance(types_raw, list):
            raise _fail("spec.policyTypes", f"must be a list of Ingress/Egress, got {types_raw!r}")
        for i, t in enumerate(types_raw):
            if t not in ("Ingress", "Egress"):
                raise _fail(f"spec.policyTypes[{i}]", f"must be Ingress or Egress, got {t!r}")
        if len(set(types_raw)) != len(types_raw):
            raise _fail("spec.policyTypes", f"lists a type twice: {types_raw!r}")
        types = set(types_raw)
    source = {"apiVersion": API_VERSION, "kind": KIND,
              "metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)}
    return NetworkPolicy(namespace, name, selector, frozenset(types), ingress, egress, source)


def parse_policies(text: str, default_namespace: str = "default") -> list[NetworkPolicy]:
    """Every NetworkPolicy of a YAML stream or JSON text (a ``kind: List`` or
    ``NetworkPolicyList`` is read item by item, as ``kubectl get networkpolicy -o yaml`` writes
    it); errors name the document. YAML is PyYAML's (safe, the C loader when libyaml is there):
    all of YAML 1.1; only our validation of the objects is ours."""
    docs = load_yaml_documents(text)
    out: list[NetworkPolicy] = []
    for n, doc in enumerate(_items(docs), 1):
        try:
            out.append(parse_policy(doc, default_namespace))
        except PolicyError as e:
            name = doc.get("metadata", {}).get("name") if isinstance(doc, Mapping) else None
            what = f"document {n}" + (f" ({name})" if isinstance(name, str) else "")
            raise PolicyError(f"{what}: {e}") from None
    return out


def _items(docs: Iterable[Any]) -> Iterable[Any]:
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") in ("List", "NetworkPolicyList"):
            yield from doc.get("items") or []
        else:
            yield doc


def load_yaml_documents(text: str) -> list[Any]:
    """The documents of a YAML stream (JSON is YAML, and is read as JSON first: tabs and all), with
    ``yaml.safe_load_all``'s semantics plus a refusal of a key given twice in one mapping (as
    kubectl refuses it: the second would silently win). PolicyError names the line."""
    import json

    if text.lstrip().startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except ValueError:
            pass  # YAML's flow style, say: PyYAML reads it below
    import yaml

    try:
        return [d for d in yaml.load_all(text, Loader=_unique_key_loader()) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise PolicyError(f"invalid YAML: {where}{problem}") from None


_LOADER: Any = None


def _unique_key_loader() -> Any:
    """PyYAML's safe loader (its C one when built with libyaml) refusing duplicate keys."""
    global _LOADER
    if _LOADER is None:
        import yaml

        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

        class UniqueKeyLoader(base):  # type: ignore[misc,valid-type]
            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        if key in seen:
                            raise yaml.constructor.ConstructorError(
                                "while reading a mapping", node.start_mark, f"duplicate key {key!r}",
                                key_node.start_mark)
                        seen.add(key)
                    except TypeError:
                        pass  # an unhashable key: the base class refuses it
                return super().construct_mapping(node, deep)

        _LOADER = UniqueKeyLoader
    return _LOADER
