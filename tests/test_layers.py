"""The rules of docs/architecture.md, checked on the source (relative imports resolved): net/ uses
only spec/ and the leaf utilities record.py, lockfile.py, jsonlite.py, ipaddr.py and callscope.py
(never the SDK or a plugin), spec/ only record.py, jsonlite.py and ipaddr.py; cluster/ never a
plugin, the runtime or the CLI (the plugins use it, not the other way round); cli.py no plugin
module but the registry; unixsock.py, daemon/protocol.py, ipaddr.py and cluster/names.py import nothing of pycni's,
and no module imports the stdlib's ipaddress; plugins never decode netlink; no module imports
typing or dataclasses at run time (the policy engine's agent-only modules excepted, as the doc
says); plugins are loaded by type in one place; registry, shim and install_plugins form no import
cycle, and only the CLI and the installers import install_plugins; plugins
import the SDK, net/ and the leaves only; code 7 is raised one way; unixsock.py is the only
listener; forward.c's frame constants are daemon/protocol.py's; the values several modules
need (routed's interface prefix, the policy table, the default socket) are each written in one home."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "pycni"
ALLOWED = {"net": ("pycni.net", "pycni.spec", "pycni.record", "pycni.lockfile", "pycni.jsonlite", "pycni.callscope",
                   "pycni.ipaddr"),
           # leaves: the listener both daemons use, and the wire format the shim's forwarding path imports
           "unixsock.py": ("pycni.unixsock",),
           "daemon/protocol.py": ("pycni.daemon.protocol",),
           "ipaddr.py": ("pycni.ipaddr",),  # a leaf: IP values, importing nothing
           "cluster/names.py": ("pycni.cluster.names",),  # a leaf: routed's and the policy agent's kernel names
           "spec": ("pycni.spec", "pycni.record", "pycni.jsonlite", "pycni.ipaddr"),
           "cluster": ("pycni.cluster", "pycni.spec", "pycni.net", "pycni.record", "pycni.jsonlite", "pycni.lockfile",
                       "pycni.netconf", "pycni.ipranges", "pycni.statefile", "pycni.ipaddr", "pycni.output",
                       "pycni.metrics", "pycni.unixsock"),  # unixsock: the flows socket (cluster/flows/server.py)
           "output.py": ("pycni.output",)}  # a leaf: how every verb prints, and its exit statuses


def _package(path: Path) -> str:
    """The dotted package ``path`` (a module under src/pycni) belongs to."""
    parts = ["pycni", *path.relative_to(SRC).parts[:-1]]
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, path: Path) -> list[str]:
    """The modules an ``from X import a, b`` names, relative ones resolved against ``path``'s package."""
    if node.level:
        base = _package(path).split(".")  # a module's package; an __init__.py's is its own directory
        base = base[:len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    # "from pycni import netconf" and "from . import x" name modules; "from pycni.x import f" names pycni.x
    if node.module is None or module == "pycni":
        return [f"{module}.{a.name}" for a in node.names]
    return [module]


def _pycni_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = _absolute(node, path)
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.update(n for n in names if n == "pycni" or n.startswith("pycni."))
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports(layer: str) -> None:
    files = (SRC / layer).rglob("*.py") if (SRC / layer).is_dir() else [SRC / layer]
    bad = {f"{p.relative_to(SRC)}: {m}" for p in files for m in _pycni_imports(p)
           if not m.startswith(ALLOWED[layer])}
    assert not bad, sorted(bad)


def test_relative_imports_are_resolved() -> None:
    """The checks above see ``from . import x`` and ``from .x import y`` as the modules they name."""
    tree = ast.parse("from . import a\nfrom .b import c\nfrom .. import d\n")
    where = SRC / "plugins" / "ipam" / "dhcp" / "daemon.py"
    got = [_absolute(n, where) for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert got == [["pycni.plugins.ipam.dhcp.a"], ["pycni.plugins.ipam.dhcp.b"], ["pycni.plugins.ipam.d"]]
    init = SRC / "plugins" / "ipam" / "dhcp" / "__init__.py"
    (node,) = ast.parse("from .lease import x").body
    assert isinstance(node, ast.ImportFrom) and _absolute(node, init) == ["pycni.plugins.ipam.dhcp.lease"]


def test_plugins_never_decode_netlink() -> None:
    """docs/architecture.md: what a link carries is on net.link.Link; plugins never decode IFLA_* themselves
    (a comment naming the kernel's constant is fine; a string key is decoding)."""
    bad = set()
    for path in (SRC / "plugins").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(
                    ("IFLA_", "IFA_", "RTA_", "NDA_", "FRA_")):
                bad.add(f"{path.relative_to(SRC)}:{node.lineno}: {node.value}")
    assert not bad, sorted(bad)


def test_cli_uses_no_plugin_internals() -> None:
    """The CLI reaches plugins only through the registry; cluster-ipam's settings and session are
    the cluster layer's (pycni.cluster.settings, pycni.cluster.session)."""
    bad = set()
    for node in ast.walk(ast.parse((SRC / "cli.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pycni.plugins"):
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "pycni.plugins" else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("pycni.plugins")]
        else:
            continue
        bad.update(n for n in names if n != "pycni.plugins.registry")
    assert not bad, sorted(bad)


def _run_time_imports(nodes: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run: everything but the bodies of ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out.extend(_run_time_imports(node.orelse))
        else:
            for name in ("body", "orelse", "finalbody", "handlers"):
                sub = getattr(node, name, None)
                if isinstance(sub, list):
                    out.extend(_run_time_imports(sub))
    return out


# The policy engine runs in the node agent and the CLI only, long-lived or interactive, never on a
# plugin's start path (routed imports pycni.cluster.policy.workload, which is held to the rule).
AGENT_ONLY = {"cluster/policy/agent.py", "cluster/policy/compile.py", "cluster/policy/evaluate.py",
              "cluster/policy/model.py", "cluster/policy/cli.py", "cluster/policy/nftsync.py",
              "cluster/policy/index.py"}


def test_no_typing_at_run_time() -> None:
    """No module a plugin can load imports ``typing`` or ``dataclasses`` when it runs (docs/architecture.md:
    a plugin's start path stays light; ``TYPE_CHECKING = False`` guards and ``pycni.record`` instead)."""
    bad = set()
    for path in SRC.rglob("*.py"):
        if str(path.relative_to(SRC)) in AGENT_ONLY:
            continue
        for node in _run_time_imports(ast.parse(path.read_text()).body):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad.update(f"{path.relative_to(SRC)}:{node.lineno}: {m}" for m in mods
                       if m.split(".")[0] in ("typing", "dataclasses"))
    assert not bad, sorted(bad)


def test_one_kind_of_ip_value() -> None:
    """IP values are pycni.ipaddr's everywhere (docs/architecture.md): no module imports the stdlib's
    ipaddress, which pulls functools and collections (~3.4 ms of every one-shot call)."""
    bad = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad.update(f"{path.relative_to(SRC)}:{node.lineno}" for m in mods if m == "ipaddress")
    assert not bad, sorted(bad)


def _imports_at_import_time(path: Path) -> set[str]:
    """The pycni modules ``path`` imports when it is imported (module level, outside TYPE_CHECKING)."""
    out = set()
    for node in _run_time_imports([n for n in ast.parse(path.read_text()).body
                                   if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "pycni" else [f"pycni.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.update(n for n in names if n.startswith("pycni"))
    return out


def test_one_plugin_loader() -> None:
    """Plugins are imported by their type in one place, pycni.plugins.registry (load / run_main):
    no other module calls __import__ or importlib.import_module."""
    bad = set()
    for path in SRC.rglob("*.py"):
        if path == SRC / "plugins" / "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")):
                bad.add(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bad, sorted(bad)


def _run_time_pycni_imports(path: Path) -> set[str]:
    """The pycni modules ``path`` imports when it runs, anywhere in it (TYPE_CHECKING blocks excepted)."""
    out = set()
    for node in _run_time_imports(ast.parse(path.read_text()).body):
        names = _absolute(node, path) if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        out.update(n for n in names if n == "pycni" or n.startswith("pycni."))
    return out


# Who may import pycni.install_plugins (the executables' file format and their installation): the
# CLI and the installers. No plugin call loads it (the shim recognises an executable itself).
INSTALL_PLUGINS_USERS = {"cli.py", "install_cni.py", "demo.py"}


def test_registry_shim_install_no_cycle() -> None:
    """The registry is type -> module and imports nothing of pycni's (only the plugins it loads); the
    shim imports the registry (to load a plugin; not at import time: the forwarding path) and never
    install_plugins; install_plugins imports the registry and the shim (its header line, shim_type)."""
    assert not _run_time_pycni_imports(SRC / "plugins" / "registry.py")
    assert "pycni.plugins.registry" not in _imports_at_import_time(SRC / "shim.py")
    assert "pycni.install_plugins" not in _pycni_imports(SRC / "shim.py")


def test_who_imports_install_plugins() -> None:
    """Only the CLI and the installers import pycni.install_plugins (never a plugin, the shim, the
    registry, the daemon or the cluster layer)."""
    users = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "pycni.install_plugins" in _pycni_imports(p)}
    assert users <= INSTALL_PLUGINS_USERS, sorted(users - INSTALL_PLUGINS_USERS)


def test_forwarder_constants_are_the_protocols() -> None:
    """The native forwarder (forward.c) speaks daemon/protocol.py's frame: its magic, its size
    limit and the default socket are the Python side's (one home: protocol.py; the C copy is
    checked against it)."""
    import re

    from pycni.daemon import protocol

    text = (SRC / "forward.c").read_text()
    magic = re.search(r'#define MAGIC "([^"]*)"', text)
    assert magic is not None and magic.group(1).encode() == protocol.MAGIC
    size = re.search(r"#define MAX_FRAME \((\d+)u \* (\d+)u \* (\d+)u\)", text)
    assert size is not None and int(size.group(1)) * int(size.group(2)) * int(size.group(3)) == protocol.MAX_FRAME
    assert re.search(r'path = \*baked \? baked : "([^"]*)"', text).group(1) == protocol.DEFAULT_SOCKET  # type: ignore[union-attr]


def test_constants_have_one_home() -> None:
    """A value more than one module needs is written once (docs/architecture.md): routed's host-interface
    prefix in cluster/names.py (routed and the policy compiler import it), the policy table's name in
    cluster/policy/workload.py, the daemon's default socket in daemon/protocol.py. The one copy allowed is
    the shim's default socket (its non-forwarding path does not import the protocol), checked equal here."""
    from pycni.cluster.names import HOST_PREFIX
    from pycni.cluster.policy.workload import TABLE
    from pycni.daemon.protocol import DEFAULT_SOCKET

    homes = {HOST_PREFIX: {"cluster/names.py"}, TABLE: {"cluster/policy/workload.py"},
             DEFAULT_SOCKET: {"daemon/protocol.py", "shim.py"}}
    found: dict[str, set[str]] = {value: set() for value in homes}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in found:
                found[node.value].add(str(path.relative_to(SRC)))
    assert found == homes


def test_netfilter_numbers_have_one_home() -> None:
    """nfnetlink's and nf_tables' numbers are written in net/nfnl.py only: no other module assigns a
    name that module defines (the probes, the table reader, the batch writer, the rule encoder,
    NFLOG and conntrack import them)."""

    def assigned(path: Path) -> set[str]:
        names: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Name):
                        names.add(t.id)
        return names

    home = SRC / "net" / "nfnl.py"
    numbers = assigned(home)
    assert {"NETLINK_NETFILTER", "NFNL_SUBSYS_NFTABLES", "NFTA_SET_ELEM_KEY", "VERDICTS"} <= numbers
    again = {f"{path.relative_to(SRC)}: {name}" for path in SRC.rglob("*.py") if path != home
             for name in assigned(path) & numbers}
    assert not again, sorted(again)


# What a plugin may import (docs/architecture.md "A plugin uses the SDK ... and net/"): the SDK,
# net/, spec/, the leaf utilities, the cluster library (cluster-ipam, routed), other plugin
# modules, the frame and listener the dhcp daemon shares with the main daemon.
PLUGIN_ALLOWED = ("pycni.skel", "pycni.netconf", "pycni.rollback", "pycni.ipam", "pycni.statefile", "pycni.invoke",
                  "pycni.net", "pycni.spec", "pycni.record", "pycni.jsonlite", "pycni.ipaddr", "pycni.ipranges",
                  "pycni.cniargs", "pycni.lockfile", "pycni.callscope", "pycni.cluster", "pycni.plugins",
                  "pycni.daemon.protocol", "pycni.unixsock")


def test_what_plugins_import() -> None:
    """Plugins use the SDK and net/ (and the rest of PLUGIN_ALLOWED), never the CLI, the runtime,
    the daemon's server, the shim or the forwarder (the registry and ``-m pycni.plugins`` are
    the loader, not plugins)."""
    bad = set()
    for path in (SRC / "plugins").rglob("*.py"):
        if path.name in ("registry.py", "__main__.py") and path.parent == SRC / "plugins":
            continue
        for mod in _pycni_imports(path):
            if mod != "pycni" and not any(mod == a or mod.startswith(a + ".") for a in PLUGIN_ALLOWED):
                bad.add(f"{path.relative_to(SRC)}: {mod}")
    assert not bad, sorted(bad)


def test_code_7_one_way() -> None:
    """A bad configuration is raised one way: spec.errors.invalid_config (docs/architecture.md); no
    module builds ``CNIError(7, ...)`` / ``CNIError(INVALID_CONFIG, ...)`` itself."""
    bad = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "spec" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "CNIError" \
                    and node.args:
                first = node.args[0]
                if (isinstance(first, ast.Constant) and first.value == 7) or \
                        getattr(first, "id", getattr(first, "attr", "")) == "INVALID_CONFIG":
                    bad.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bad, bad


def test_unixsock_is_the_only_listener() -> None:
    """unixsock.py is the one Unix-socket listener (docs/architecture.md): no other module calls
    ``listen`` on a socket."""
    bad = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "unixsock.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "listen" \
                    and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "unixsock"):
                bad.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bad, bad
