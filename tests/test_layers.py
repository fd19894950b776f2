"""The dependency rule of docs/architecture.md, checked on the source: net/ uses only spec/ and the
leaf utilities record.py, lockfile.py and jsonlite.py (never the SDK or a plugin), spec/ only record.py
and jsonlite.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "pycni"
ALLOWED = {"net": ("pycni.net", "pycni.spec", "pycni.record", "pycni.lockfile", "pycni.jsonlite"),
           "spec": ("pycni.spec", "pycni.record", "pycni.jsonlite")}


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
