"""scripts/setup and scripts/demo say what they are doing, one line per step (issue 33, item 12).

Run on the clone itself, where .venv is made already: setup checks, reuses and (pyproject.toml
unchanged) installs nothing, so other tests using .venv are not disturbed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", f"scripts/{script}", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": os.environ["PATH"]})


def _steps(stderr: str, who: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{who}: ")]


@pytest.mark.skipif(os.geteuid() != 0 or not (REPO / ".venv" / "bin" / "python").exists(),
                    reason="needs root (apt checks) and the clone's .venv")
def test_setup_says_each_step() -> None:
    proc = _run("setup")
    assert proc.returncode == 0, proc.stderr
    steps = _steps(proc.stderr, "setup")
    assert steps[0].startswith("setup: checking ") and "apt packages" in steps[0], steps
    assert any(".venv" in s for s in steps) and any("pycni" in s for s in steps), steps
    assert steps[-1].startswith("setup: done in "), steps
    assert len(steps) >= 4


@pytest.mark.skipif(os.geteuid() != 0 or not (REPO / ".venv" / "bin" / "python").exists(),
                    reason="needs root (apt checks) and the clone's .venv")
def test_demo_says_each_step_and_runs_as_the_readme_says() -> None:
    """README's first block, `bash scripts/demo`, as written: set-up, step by step, then the main job
    (in its own throwaway pycni-demo-* namespaces, removed at its end)."""
    proc = _run("demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(("demo: ", "setup: "))]
    assert lines[0].startswith("demo: setting up") and lines[-1].startswith("demo: running"), lines
    assert len(_steps(proc.stderr, "setup")) >= 4, proc.stderr
    assert "the main job worked" in proc.stdout, proc.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not (REPO / ".venv" / "bin" / "python").exists(),
                    reason="needs root and the clone's .venv")
def test_cluster_demo_runs_as_the_readme_says() -> None:
    """README's `bash scripts/cluster-demo`: etcd, three agents (enforcing policy, the default), pods
    pinging across nodes, all torn down (its own throwaway namespaces)."""
    from etcd_util import etcd_available

    if not etcd_available():
        pytest.skip("needs etcd (scripts/setup --test)")
    proc = _run("cluster-demo")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "all pings answered" in proc.stdout
    status = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("node")]
    assert any(row[3:4] == ["enforced"] for row in status), proc.stdout
