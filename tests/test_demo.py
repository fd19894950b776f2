"""The README's main job (scripts/demo runs `python -m pycni.demo`) works and cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from netns_util import have_root

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not have_root(), reason="the demo creates network namespaces: needs root")
def test_demo_main_job() -> None:
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    proc = subprocess.run([sys.executable, "-m", "pycni.demo", "--conf-dir", os.path.join(REPO, "conf", "net.d")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "3 received, 0% packet loss" in out
    assert "got: 'hello from pycni-demo-c1-" in out
    assert "the main job worked" in out and out.count(": deleted") == 2
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [ns for ns in after if ns.startswith("pycni-demo-") and ns not in before]
