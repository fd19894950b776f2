"""The dependency rule of docs/architecture.md, checked on the source: net/ uses only spec/ and the
leaf utilities record.py, lockfile.py and jsonlite.py (never the SDK or a plugin), spec/ only record.py
and jsonlite.py; cluster/ never a plugin, the runtime or the CLI (the plugins use it, not the other
way round); cli.py no plugin module but the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "pycni"
ALLOWED = {"net": ("pycni.net", "pycni.spec", "pycni.record", "pycni.lockfile", "pycni.jsonlite"),
           "spec": ("pycni.spec", "pycni.record", "pycni.jsonlite"),
           "cluster": ("pycni.cluster", "pycni.spec", "pycni.net", "pycni.record", "pycni.jsonlite", "pycni.lockfile",
                       "pycni.netconf", "pycni.ipranges")}


def _pycni_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "pycni" else [f"pycni.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.update(n for n in names if n == "pycni" or n.startswith("pycni."))
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports(layer: str) -> None:
    bad = {f"{p.relative_to(SRC)}: {m}" for p in (SRC / layer).glob("*.py") for m in _pycni_imports(p)
           if not m.startswith(ALLOWED[layer])}
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
