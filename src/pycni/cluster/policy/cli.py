"""The operator verbs of network policy, in calicoctl's and kubectl's spirit.

    pycni endpoint list [-n NS | -A] [-o wide|json|yaml]
    pycni endpoint label NS/POD key=value ... [key-] [--create]
    pycni endpoint ports NS/POD name=PORT/PROTO ... [name-] [--create]
    pycni namespace label NS key=value ... [key-]
    pycni policy apply -f FILE|-                 warns when no live node enforces, or a port name is undefined
    pycni policy list [-n NS | -A] [-o wide|json|yaml]
    pycni policy delete NS/NAME
    pycni policy why SRC DST PORT[/PROTO]       SRC, DST: NS/POD or an IP address; exit 0 ALLOWED, 3 DENIED
    pycni ipam show --show-blocks NETWORK       (pycni.cli reads the network; the rows are made here)

Every verb takes the etcd flags of ``pycni node`` (pycni.cluster.settings.add_etcd_arguments) and
prints through pycni.output (docs/api.md "Conventions for a verb").
Label and port records are read-modify-written with a compare on their revision, so two
operators editing the same pod never lose each other's keys.
"""

from __future__ import annotations

import sys

from pycni.cluster.model import Keys, PodMeta
from pycni.cluster.policy.records import update_meta
from pycni.output import EXIT_NO, cell
from pycni.spec.errors import UNKNOWN_CONTAINER, CNIError, invalid_config

TYPE_CHECKING = False  # `pycni` builds every parser at start: keep this module's import cheap
if TYPE_CHECKING:
    import argparse
    from typing import Any


def add_parsers(sub: Any) -> None:
    """Register ``endpoint``, ``namespace`` and ``policy`` on the ``pycni`` sub-parsers."""
    from pycni.cluster.settings import add_etcd_arguments
    from pycni.output import add_output_argument

    ep = sub.add_parser("endpoint", help="workload endpoints in etcd: list, label, named ports")
    ep_sub = ep.add_subparsers(dest="endpoint_verb", metavar="ACTION")
    ep_sub.required = True
    text = "the workload endpoints: WORKLOAD NODE NETWORKS INTERFACE (wide: also PROFILES, LABELS)"
    sp = ep_sub.add_parser("list", help=text, description=text)
    _scope_flags(sp)
    add_output_argument(sp, "endpoints")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_endpoint_list)
    sp = ep_sub.add_parser("label", help="set (key=value) or remove (key-) a pod's labels",
                           description="Set (key=value) or remove (key-) a pod's labels. The pod must have an "
                           "endpoint or labels already; --create pre-labels a pod that is not there yet.")
    sp.add_argument("target", metavar="NS/POD", help="the pod, as NAMESPACE/NAME")
    sp.add_argument("changes", nargs="+", metavar="key=value|key-", help="labels to set or remove")
    sp.add_argument("--create", action="store_true", help="label a pod no endpoint or record knows yet (before "
                    "its ADD)")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_endpoint_label)
    sp = ep_sub.add_parser("ports", help="set (name=PORT/PROTO) or remove (name-) a pod's named ports")
    sp.add_argument("target", metavar="NS/POD", help="the pod, as NAMESPACE/NAME")
    sp.add_argument("changes", nargs="+", metavar="name=PORT/PROTO|name-", help="named ports to set or remove")
    sp.add_argument("--create", action="store_true", help="set them for a pod no endpoint or record knows yet")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_endpoint_ports)

    ns = sub.add_parser("namespace", help="namespace labels in etcd (for namespaceSelector)")
    ns_sub = ns.add_subparsers(dest="namespace_verb", metavar="ACTION")
    ns_sub.required = True
    sp = ns_sub.add_parser("label", help="set (key=value) or remove (key-) a namespace's labels")
    sp.add_argument("target", metavar="NS", help="the namespace")
    sp.add_argument("changes", nargs="+", metavar="key=value|key-", help="labels to set or remove")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_namespace_label)

    pol = sub.add_parser("policy", help="Kubernetes NetworkPolicy objects in etcd: apply, list, delete, why")
    pol_sub = pol.add_subparsers(dest="policy_verb", metavar="ACTION")
    pol_sub.required = True
    text = "create or replace the NetworkPolicy objects of a YAML or JSON file"
    sp = pol_sub.add_parser("apply", help=text, description=text + " (as `kubectl get networkpolicy -o yaml` "
                            "writes them, a List included); warns when no live node enforces policy.")
    sp.add_argument("-f", "--filename", required=True, metavar="FILE", help="the file, or - for stdin")
    sp.add_argument("-n", "--namespace", default="default", help="for policies that name none (default: default)")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_policy_apply)
    text = "the policies: NAMESPACE NAME POD-SELECTOR POLICY-TYPES (json/yaml: the stored objects)"
    sp = pol_sub.add_parser("list", help=text, description=text)
    _scope_flags(sp)
    add_output_argument(sp, "policies")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_policy_list)
    sp = pol_sub.add_parser("delete", help="delete policy NS/NAME")
    sp.add_argument("target", metavar="NS/NAME", help="the policy, as NAMESPACE/NAME")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_policy_delete)
    text = "whether a flow is allowed, and by which policies"
    sp = pol_sub.add_parser("why", help=text, description=text + f"; exit 0 when ALLOWED, {EXIT_NO} when DENIED.")
    sp.add_argument("source", metavar="SRC", help="NS/POD or an IP address")
    sp.add_argument("destination", metavar="DST", help="NS/POD or an IP address")
    sp.add_argument("port", metavar="PORT[/PROTO]", help="e.g. 80/TCP (TCP when no protocol)")
    add_etcd_arguments(sp)
    sp.set_defaults(fn=cmd_policy_why)


def _scope_flags(sp: argparse.ArgumentParser) -> None:
    g = sp.add_mutually_exclusive_group()
    g.add_argument("-n", "--namespace", default="default", help="this namespace only (default: default)")
    g.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")


def _client(opts: argparse.Namespace) -> tuple[Any, Keys]:
    from pycni.cluster.settings import cli_client

    return cli_client(opts)


def _mapped(fn: Any) -> Any:
    from pycni.cluster.settings import etcd_errors_mapped

    return etcd_errors_mapped(fn)


def _split_target(text: str, what: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise invalid_config(f"invalid {what} {text!r}", f"give it as NAMESPACE/NAME, e.g. default/{text}")
    return ns, name


def _check_name(text: str, what: str) -> str:
    if not text or "/" in text or len(text) > 253:
        raise invalid_config(f"invalid {what} {text!r}", "1-253 characters, no '/'")
    return text


# ---- labels and named ports ---------------------------------------------------------------------

def label_changes(labels: dict[str, str], changes: list[str]) -> dict[str, str]:
    """``labels`` after ``key=value`` (set, overwriting) and ``key-`` (remove) changes, kubectl's syntax."""
    from pycni.cluster.policy.model import PolicyError, check_label_key, check_label_value

    out = dict(labels)
    for ch in changes:
        try:
            if "=" in ch:
                k, v = ch.split("=", 1)
                out[check_label_key(k, "label")] = check_label_value(v, f"label {k}")
            elif ch.endswith("-"):
                out.pop(check_label_key(ch[:-1], "label"), None)
            else:
                raise PolicyError(f"{ch!r}: write key=value to set a label, key- to remove it")
        except PolicyError as e:
            raise invalid_config("invalid label change", str(e)) from None
    return out


def port_changes(ports: list[tuple[str, int, str]], changes: list[str]) -> list[tuple[str, int, str]]:
    """Named ports after ``name=PORT/PROTO`` (set) and ``name-`` (remove) changes."""
    from pycni.cluster.policy.model import PROTOCOLS, PolicyError, check_port_name

    out = {(n, proto): p for n, p, proto in ports}
    for ch in changes:
        try:
            if "=" in ch:
                name, spec = ch.split("=", 1)
                check_port_name(name, "port")
                num, _, proto = spec.partition("/")
                proto = (proto or "TCP").upper()
                if proto not in PROTOCOLS or not num.isdigit() or not 1 <= int(num) <= 65535:
                    raise PolicyError(f"{ch!r}: write name=PORT/PROTO with PORT 1-65535 and PROTO one of "
                                      f"{', '.join(PROTOCOLS)}, e.g. http=8080/TCP")
                out[(name, proto)] = int(num)
            elif ch.endswith("-"):
                for key in [k for k in out if k[0] == ch[:-1]]:
                    del out[key]
            else:
                raise PolicyError(f"{ch!r}: write name=PORT/PROTO to set a named port, name- to remove it")
        except PolicyError as e:
            raise invalid_config("invalid named port change", str(e)) from None
    return sorted((n, p, proto) for (n, proto), p in out.items())


def _require_pod(kv: Any, keys: Keys, ns: str, pod: str, create: bool) -> None:
    """Refuse (code 3) to label a pod that exists nowhere, no endpoint and no record of it (a typo
    would be accepted silently and select nothing), unless ``--create`` says it is coming."""
    from pycni.cluster.model import WorkloadEndpoint

    if create or kv.get(keys.pod(ns, pod)) is not None:
        return
    for item in kv.get_prefix(keys.endpoints)[0]:
        ep = WorkloadEndpoint.from_json(item.value)
        if ep is not None and (ep.namespace, ep.pod) == (ns, pod):
            return
    raise CNIError(UNKNOWN_CONTAINER, f"no pod {ns}/{pod}", "no endpoint and no record of it in etcd; "
                   "`pycni endpoint list -A` lists the pods; pass --create to label a pod before its ADD")


@_mapped
def cmd_endpoint_label(opts: argparse.Namespace) -> int:
    ns, pod = _split_target(opts.target, "pod")
    kv, keys = _client(opts)
    label_changes({}, opts.changes)  # refuse a bad change before touching etcd
    with kv:
        _require_pod(kv, keys, ns, pod, opts.create)
        meta, _ = update_meta(kv, keys.pod(ns, pod),
                            lambda m: PodMeta(labels=label_changes(m.labels, opts.changes), ports=m.ports))
    print(f"pod {ns}/{pod} labels: {cell(meta.labels)}")
    return 0


@_mapped
def cmd_endpoint_ports(opts: argparse.Namespace) -> int:
    ns, pod = _split_target(opts.target, "pod")
    kv, keys = _client(opts)
    port_changes([], opts.changes)
    with kv:
        _require_pod(kv, keys, ns, pod, opts.create)
        meta, _ = update_meta(kv, keys.pod(ns, pod),
                            lambda m: PodMeta(labels=m.labels, ports=port_changes(m.ports, opts.changes)))
    print(f"pod {ns}/{pod} named ports: {', '.join(f'{n}={p}/{pr}' for n, p, pr in meta.ports) or '(none)'}")
    return 0


@_mapped
def cmd_namespace_label(opts: argparse.Namespace) -> int:
    from pycni.cluster.policy.model import NS_NAME_LABEL

    ns = _check_name(opts.target, "namespace")
    if any(c.split("=", 1)[0].rstrip("-") == NS_NAME_LABEL for c in opts.changes):
        raise invalid_config(f"{NS_NAME_LABEL} cannot be changed", "every namespace carries it, set to "
                       "its own name, as in Kubernetes")
    kv, keys = _client(opts)
    label_changes({}, opts.changes)
    with kv:
        meta, _ = update_meta(kv, keys.namespace(ns), lambda m: PodMeta(labels=label_changes(m.labels, opts.changes)))
    print(f"namespace {ns} labels: {cell({**meta.labels, NS_NAME_LABEL: ns})}")
    return 0




# ---- endpoint list ------------------------------------------------------------------------------

def _view(kv: Any, keys: Keys) -> Any:
    from pycni.cluster.policy.agent import PolicyView

    view = PolicyView(keys)
    view.load(kv)
    return view


@_mapped
def cmd_endpoint_list(opts: argparse.Namespace) -> int:
    import json

    from pycni.output import emit

    kv, keys = _client(opts)
    with kv:
        view = _view(kv, keys)
    eps = sorted((ep for ep in view.endpoints.values() if opts.all_namespaces or ep.namespace == opts.namespace),
                 key=lambda e: (e.namespace, e.pod, e.network, e.ifname))
    items = []
    for ep in eps:
        obj = json.loads(ep.to_json())
        obj["labels"] = dict(view.workload(ep).labels)
        obj["workload"] = ep.workload
        items.append(obj)
    where = "" if opts.all_namespaces else f" in namespace {opts.namespace}"
    emit(opts.output, items, [("WORKLOAD", "workload"), ("NODE", "node"), ("NETWORKS", "ipNetworks"),
                              ("INTERFACE", "interfaceName")],
         wide=[("PROFILES", "profiles"), ("LABELS", "labels")],
         empty=f"no workload endpoint{where}")
    return 0


# ---- policies -----------------------------------------------------------------------------------

def _read_file(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        with open(name, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise invalid_config(f"cannot read {name}", e.strerror or str(e)) from None


@_mapped
def cmd_policy_apply(opts: argparse.Namespace) -> int:
    from pycni.cluster.policy.model import PolicyError, parse_policies

    try:
        policies = parse_policies(_read_file(opts.filename), default_namespace=opts.namespace)
    except PolicyError as e:
        raise invalid_config("invalid NetworkPolicy", str(e)) from None
    if not policies:
        raise invalid_config(f"no NetworkPolicy in {opts.filename}", "the file holds no document")
    from pycni.cluster.policy.records import put_policies

    kv, keys = _client(opts)
    with kv:
        outcome = put_policies(kv, keys, policies)
        warnings = _apply_warnings(kv, keys, policies)
    for p in policies:
        print(f"networkpolicy {p.key} {outcome[p.key]}")
    for w in warnings:
        sys.stderr.write(f"pycni: warning: {w}\n")
    return 0


def _apply_warnings(kv: Any, keys: Keys, policies: list[Any]) -> list[str]:
    """What a user applying ``policies`` would want to know but etcd cannot refuse: no live node
    enforces policy (they are stored, not applied), or a rule names a port no pod defines (it
    matches nothing until one does; accepted, as Kubernetes accepts it)."""
    from pycni.cluster.model import NodeInfo

    out = []
    nodes = [NodeInfo.from_json(kv_.key[len(keys.nodes):], kv_.value) for kv_ in kv.get_prefix(keys.nodes)[0]]
    enforcing = [n.name for n in nodes if n is not None and n.policy]
    if not enforcing:
        out.append(f"no live node enforces network policy ({len(nodes)} registered under {keys.prefix}, none "
                   "enforcing): these policies are stored but not applied; `pycni node` enforces unless started "
                   "with --no-policy (`pycni node status` shows which do)")
    defined = {name for kv_ in kv.get_prefix(keys.pods)[0] for name, _, _ in PodMeta.from_json(kv_.value).ports}
    for p in policies:
        spec = p.source.get("spec", {})
        named = sorted({port["port"] for rule in (spec.get("ingress") or []) + (spec.get("egress") or [])
                        if isinstance(rule, dict) for port in rule.get("ports") or ()
                        if isinstance(port, dict) and isinstance(port.get("port"), str)})
        for name in named:
            if name not in defined:
                out.append(f"networkpolicy {p.key}: no pod defines a port named {name!r}, so the rules naming it "
                           f"match nothing until one does (`pycni endpoint ports NS/POD {name}=PORT/PROTO`)")
    return out


@_mapped
def cmd_policy_list(opts: argparse.Namespace) -> int:
    from pycni.output import emit

    kv, keys = _client(opts)
    with kv:
        view = _view(kv, keys)
    pols = sorted((p for p in view.policies.values() if opts.all_namespaces or p.namespace == opts.namespace),
                  key=lambda p: p.key)
    where = "" if opts.all_namespaces else f" in namespace {opts.namespace}"
    if opts.output in ("json", "yaml"):  # the stored objects, as applied
        emit(opts.output, [p.source for p in pols], ())
    else:
        items = [{"namespace": p.namespace, "name": p.name, "podSelector": str(p.pod_selector),
                  "policyTypes": sorted(p.policy_types), "ingress": len(p.source.get("spec", {}).get("ingress")
                                                                        or ()),
                  "egress": len(p.source.get("spec", {}).get("egress") or ())} for p in pols]
        emit(opts.output, items, [("NAMESPACE", "namespace"), ("NAME", "name"), ("POD-SELECTOR", "podSelector"),
                                  ("POLICY-TYPES", "policyTypes")],
             wide=[("INGRESS-RULES", "ingress"), ("EGRESS-RULES", "egress")], empty=f"no network policy{where}")
    for key, why in sorted(view.errors.items()):
        if key.startswith(keys.policies):
            sys.stderr.write(f"pycni: warning: ignored (not a valid policy): {key}: {why}\n")
    return 0


@_mapped
def cmd_policy_delete(opts: argparse.Namespace) -> int:
    ns, name = _split_target(opts.target, "policy")
    kv, keys = _client(opts)
    from pycni.cluster.policy.records import delete_policy

    with kv:
        gone = delete_policy(kv, keys, ns, name)
    if not gone:
        raise CNIError(UNKNOWN_CONTAINER, f"networkpolicy {ns}/{name} not found", "`pycni policy list -A` lists them")
    print(f"networkpolicy {ns}/{name} deleted")
    return 0


@_mapped
def cmd_policy_why(opts: argparse.Namespace) -> int:
    """Exit 0 when allowed, EXIT_NO (3) when denied (2 is argparse's usage error); the reasons on stdout."""
    from pycni.cluster.policy.evaluate import decide, parse_party

    port_text, _, proto = opts.port.partition("/")
    proto = (proto or "TCP").upper()
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535 or proto not in ("TCP", "UDP", "SCTP"):
        raise invalid_config(f"invalid port {opts.port!r}", "give PORT[/PROTO], e.g. 80/TCP or 53/UDP")
    kv, keys = _client(opts)
    with kv:
        view = _view(kv, keys)
    cluster, pods = view.cluster()
    parties = []
    for text in (opts.source, opts.destination):
        try:
            parties.append(parse_party(text, pods.values()))
        except KeyError:
            raise CNIError(UNKNOWN_CONTAINER, f"no workload {text}", "give NS/POD of a pod with an endpoint (`pycni "
                           "endpoint list -A`) or an IP address") from None
    d = decide(cluster, parties[0], parties[1], int(port_text), proto)
    print(f"{opts.source} -> {opts.destination} {port_text}/{proto}: {'ALLOWED' if d.allowed else 'DENIED'}")
    for r in d.reasons:
        print(f"  {r}")
    return 0 if d.allowed else EXIT_NO


# ---- ipam show ----------------------------------------------------------------------------------

def ipam_show(cfg: Any, pools: list[Any] | None, show_blocks: bool, fmt: str | None = None) -> int:
    """Per pool (and with ``show_blocks`` per block): CIDR, IPS TOTAL, IPS IN USE, IPS FREE, and
    the block's node (calicoctl's ``ipam show --show-blocks``); ``pycni ipam show`` calls it.
    ``pools`` None (etcd named by flags, no conflist to read the ranges from): one row per IP
    version over every block instead of per pool."""
    from pycni.cluster.session import session
    from pycni.output import emit

    with session(cfg, who="") as store:
        blocks = store.blocks()

    def row(grouping: str, cidr: str, total: int, used: int, node: str = "") -> dict[str, Any]:
        return {"grouping": grouping, "cidr": cidr, "total": total, "inUse": used, "free": total - used,
                "node": node}

    def pct(field: str) -> Any:
        return lambda r: f"{r[field]} ({round(100 * r[field] / r['total']) if r['total'] else 0}%)"

    groups: list[tuple[str, str, list[Any], int]] = []
    if pools is None:
        for version in (4, 6):
            inside = [b for b in blocks if b.cidr.version == version]
            if inside:
                groups.append(("Blocks", f"(all IPv{version})", inside, sum(b.cidr.num_addresses for b in inside)))
    else:
        for pool in pools:
            inside = [b for b in blocks if b.cidr.version == pool.version and b.cidr.subnet_of(pool)]
            groups.append(("IP Pool", str(pool), inside, pool.num_addresses))
    rows = []
    for grouping, cidr, inside, total in groups:
        rows.append(row(grouping, cidr, total, sum(len(b.allocations) for b in inside)))
        if show_blocks:
            for b in sorted(inside, key=lambda b: b.cidr):
                rows.append(row("Block", str(b.cidr), b.cidr.num_addresses, len(b.allocations), b.node))
    emit(fmt, rows, [("GROUPING", "grouping"), ("CIDR", "cidr"), ("IPS TOTAL", "total"),
                     ("IPS IN USE", pct("inUse")), ("IPS FREE", pct("free")), ("NODE", "node")],
         empty=f"network {cfg.network} has no block and no pool to show")
    return 0
