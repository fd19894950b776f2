"""deploy/: the manifests validate offline against the Kubernetes schemas, their `pycni` command
lines parse with our own CLI parser, the ConfigMap's template renders to a conflist our parsers
accept, and the RBAC grants what the code calls and nothing more (docs/kubernetes.md showing
the same rules)."""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from daemon_proc import DaemonProc, needs_privileges

from pycni.cli import _parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))
K8S_VERSION = "1.33.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.relative_to(DEPLOY)}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


DOCS = documents()


def by_kind(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=[i for i, _ in DOCS])
def test_manifest_validates_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_refuses_a_broken_manifest() -> None:
    """The check above is not vacuous: a misspelled field and a wrong type are refused."""
    ds = copy.deepcopy(by_kind("DaemonSet", "pycni-node"))
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)
    ds = copy.deepcopy(by_kind("DaemonSet", "pycni-node"))
    ds["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "often"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for ident, doc in DOCS:
        if doc["kind"] in ("DaemonSet", "Deployment"):
            yield ident, doc["spec"]["template"]["spec"]


def _command_lines() -> Iterator[tuple[str, list[str]]]:
    """Every `pycni ...` command line in a container's command/args or a probe, `$(VAR)` and
    `"$VAR"` given a stand-in value; a `sh -c` script is split as sh would."""
    for ident, spec in _pod_specs():
        for c in spec.get("initContainers", []) + spec["containers"]:
            lines = [("", [*c.get("command", []), *c.get("args", [])])]
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if "exec" in c.get(probe, {}):
                    lines.append((f" {probe}", c[probe]["exec"]["command"]))
            for what, words in lines:
                if words[:2] == ["sh", "-c"]:
                    words = shlex.split(re.sub(r'"\$\w+"', "x", words[2]))
                    words = words[words.index("exec") + 1:] if "exec" in words else words
                if words and words[0] == "pycni":
                    words = [re.sub(r"\$\(\w+\)", "x", w) for w in words]
                    yield f"{ident}:{c['name']}{what}", words


COMMANDS = list(_command_lines())


def test_every_pod_runs_pycni() -> None:
    names = {i.split(":")[-1] for i, _ in COMMANDS}
    assert {"install-cni", "daemon", "node", "cni-config", "kube-controllers", "uninstall-cni"} <= names, names


@pytest.mark.parametrize("words", [w for _, w in COMMANDS], ids=[i for i, _ in COMMANDS])
def test_command_line_parses(words: list[str]) -> None:
    try:
        opts = _parser().parse_args(words[1:])
    except SystemExit as e:
        pytest.fail(f"`{shlex.join(words)}` does not parse (exit {e.code})")
    assert opts.verb == words[1]


def test_daemonset_shape() -> None:
    spec = by_kind("DaemonSet", "pycni-node")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    (init,) = spec["initContainers"]
    assert init["command"][:2] == ["pycni", "install-cni"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert containers["daemon"]["command"][:2] == ["pycni", "daemon"]
    # metrics on the host's loopback only (the pod has the host's network)
    assert _parser().parse_args(containers["daemon"]["command"][1:]).metrics_address == ("127.0.0.1", 9464)
    assert containers["node"]["command"][:2] == ["pycni", "node"]
    assert "--no-policy" not in containers["node"]["command"]  # policy enforced (the agent's default)
    cfg = containers["cni-config"]["command"]
    assert cfg[:2] == ["pycni", "install-cni"] and "--wait-for-agent" in cfg and "--watch" in cfg
    for name in ("daemon", "node"):
        assert "readinessProbe" in containers[name] and "livenessProbe" in containers[name]
    # the agent's own probes, on the address its command line serves them (docs/metrics.md)
    host, port = _parser().parse_args(containers["node"]["command"][1:]).metrics_address
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        assert containers["node"][probe]["httpGet"] == {"host": host, "port": port, "path": path}
    # the daemon's socket is the host's, where the executables look for it
    volumes = {v["name"]: v for v in spec["volumes"]}
    run = [m for m in containers["daemon"]["volumeMounts"] if m["mountPath"] == "/run/pycni"]
    assert run and volumes[run[0]["name"]]["hostPath"]["path"] == "/run/pycni"
    # the install containers hold no capability at all
    for c in (init, containers["cni-config"]):
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # host paths mounted at the same paths: what install-cni writes names the host's files
    for c in (init, containers["cni-config"]):
        for m in c["volumeMounts"]:
            hp = volumes[m["name"]].get("hostPath")
            assert hp is None or m["mountPath"] == hp["path"], m


def test_kube_controllers_shape() -> None:
    dep = by_kind("Deployment", "pycni-kube-controllers")
    assert dep["spec"]["replicas"] == 2
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][:2] == ["pycni", "kube-controllers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]} and c["securityContext"]["runAsNonRoot"]


DOCS_MD = DEPLOY.parent / "docs" / "kubernetes.md"

# What pycni calls in the API, from the code (src/pycni/cluster/kube/): the informers list and
# watch four kinds (client.KINDS), the garbage collection GETs a Pod or a Node (Controller.
# _confirm_gone). tests/test_rbac.py shows each of these is needed and enough.
CALLED = {("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
          ("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),
          ("", "namespaces", "list"), ("", "namespaces", "watch"),
          ("networking.k8s.io", "networkpolicies", "list"), ("networking.k8s.io", "networkpolicies", "watch")}


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_controller_rbac_is_exactly_what_it_calls() -> None:
    rules = by_kind("ClusterRole", "pycni-kube-controllers")["rules"]
    assert _grants(rules) == CALLED
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no wildcards by name, no resourceNames
    # nothing else is bound: no Role (no Lease), no role for the node's account
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in DOCS if "rbac.authorization.k8s.io" in d["apiVersion"]}
    assert kinds == {("ClusterRole", "pycni-kube-controllers"), ("ClusterRoleBinding", "pycni-kube-controllers")}
    binding = by_kind("ClusterRoleBinding", "pycni-kube-controllers")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pycni-kube-controllers",
                                    "namespace": "kube-system"}]


def test_nothing_on_a_node_holds_a_token() -> None:
    """Nothing on a node calls the API, so its account has no role and its pods mount no token."""
    assert by_kind("ServiceAccount", "pycni-node")["automountServiceAccountToken"] is False
    spec = by_kind("DaemonSet", "pycni-node")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "pycni-node" and spec["automountServiceAccountToken"] is False
    for _, d in DOCS:
        for subject in d.get("subjects", []):
            assert subject["name"] != "pycni-node", d["metadata"]["name"]


def _docs_rbac() -> list[dict[str, Any]]:
    text = DOCS_MD.read_text()
    section = text[text.index("\n## RBAC\n"):]
    section = section[:section.index("\n## ", 1)]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return [d for d in yaml.safe_load_all(block) if d]


def test_docs_rbac_is_the_deployed_one() -> None:
    """One source: docs/kubernetes.md's RBAC section shows deploy/rbac.yaml's role and binding."""
    shown = {(d["kind"], d["metadata"]["name"]): d for d in _docs_rbac()}
    assert set(shown) == {("ClusterRole", "pycni-kube-controllers"), ("ClusterRoleBinding", "pycni-kube-controllers")}
    for (kind, name), doc in shown.items():
        deployed = copy.deepcopy(by_kind(kind, name))
        deployed["metadata"].pop("labels", None)
        assert doc == deployed, kind


def test_configmap_template_renders_to_a_valid_conflist(tmp_path: Path) -> None:
    """The shipped template through `pycni install-cni`'s own render and checks, into scratch dirs."""
    cm = by_kind("ConfigMap", "pycni-config")["data"]
    tls = {}
    for name in ("etcd-ca", "etcd-cert", "etcd-key"):
        tls[name] = tmp_path / name
        tls[name].write_text(f"{name}\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_NETWORK_CONFIG": cm["cni_network_config"],
           "CNI_MTU": cm["veth_mtu"], "KUBERNETES_NODE_NAME": "pi32-node",
           "ETCD_ENDPOINTS": "http://192.0.2.1:2379,http://192.0.2.2:2379", "ETCD_CA_CERT_FILE": str(tls["etcd-ca"]),
           "ETCD_CERT_FILE": str(tls["etcd-cert"]), "ETCD_KEY_FILE": str(tls["etcd-key"])}
    net = tmp_path / "net"
    proc = subprocess.run([sys.executable, "-m", "pycni", "install-cni", "--bin-dir", str(tmp_path / "bin"),
                           "--net-dir", str(net), "--no-forwarder", "--service-account-dir", str(tmp_path / "none")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    conf = json.loads((net / "10-pycni.conflist").read_text())
    ipam = conf["plugins"][0]["ipam"]
    assert conf["plugins"][0]["mtu"] == int(cm["veth_mtu"]) and ipam["nodeName"] == "pi32-node"
    assert ipam["etcdEndpoints"] == ["http://192.0.2.1:2379", "http://192.0.2.2:2379"]
    # the TLS files are copied beside the conflist (the host has no Secret mounted), 0600
    assert ipam["etcdCACert"] == str(net / "pycni-tls" / "etcd-ca")
    assert (net / "pycni-tls" / "etcd-key").stat().st_mode & 0o777 == 0o600
    assert (net / "pycni-tls" / "etcd-cert").read_text() == "etcd-cert\n"


@needs_privileges
def test_daemon_probe_passes_only_while_the_daemon_serves(tmp_path: Path) -> None:
    """The daemon container's probe script, run against a real daemon (its socket and the forwarder
    moved to scratch paths): 0 while it serves, non-zero once it is gone."""
    from pycni import forwarder

    fwd = forwarder.build(str(tmp_path))
    if fwd is None:
        pytest.fail("no C compiler: scripts/setup --test installs gcc")
    spec = by_kind("DaemonSet", "pycni-node")["spec"]["template"]["spec"]
    (daemon,) = [c for c in spec["containers"] if c["name"] == "daemon"]
    sock = str(tmp_path / "d.sock")
    script = daemon["readinessProbe"]["exec"]["command"][2]
    assert daemon["livenessProbe"]["exec"]["command"][2] == script
    script = script.replace("/usr/local/pycni/pycni-forward", fwd).replace("/run/pycni/pycni.sock", sock)
    proc = DaemonProc(sock, tmp_path / "d.log", "--workers", "1").ready()
    try:
        assert subprocess.run(["sh", "-c", script], capture_output=True, timeout=30).returncode == 0
    finally:
        proc.terminate()
        proc.reap()
    assert subprocess.run(["sh", "-c", script], capture_output=True, timeout=30).returncode != 0


def test_containerfile_forwarder_builds_static_and_install_cni_takes_it(tmp_path: Path) -> None:
    """The Containerfile's forwarder step, run here (its /src and /usr/local/pycni moved to this
    clone and a scratch dir): a static binary, which `install-cni --forwarder` installs as is."""
    text = (DEPLOY / "Containerfile").read_text()
    (gcc,) = re.findall(r"&& (gcc [^\n\\]+)", text)
    repo = DEPLOY.parent
    cmd = shlex.split(gcc.replace("/src/", f"{repo}/").replace("/usr/local/pycni/", f"{tmp_path}/"))
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0, cmd
    fwd = tmp_path / "pycni-forward"
    ldd = subprocess.run(["ldd", str(fwd)], capture_output=True, text=True)
    assert ldd.returncode != 0 and "not a dynamic executable" in ldd.stdout + ldd.stderr  # runs on any host libc
    proc = subprocess.run([sys.executable, "-m", "pycni", "install-cni", "--bin-dir", str(tmp_path / "bin"),
                           "--net-dir", str(tmp_path / "net"), "--forwarder", str(fwd), "--service-account-dir",
                           str(tmp_path / "none")], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "bin" / ".pycni-forward").read_bytes() == fwd.read_bytes()
    assert f"'{tmp_path / 'bin' / '.pycni-forward'}'" in (tmp_path / "bin" / "bridge").read_text()
