"""`pip install .` from a clone: nothing left behind in it, nothing stale in the wheel (issue 24)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_build_leaves_no_build_dir_and_ships_no_stale_module(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    # what an earlier build of a tree that still had this module left behind
    (clone / "build" / "lib" / "pycni").mkdir(parents=True)
    (clone / "build" / "lib" / "pycni" / "removed_since.py").write_text("STALE = True\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", ".", "-w", str(tmp_path / "w")],
                          cwd=clone, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (clone / "build").exists()
    (wheel,) = (tmp_path / "w").glob("pycni-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pycni/cli.py" in names and "pycni/shim.py" in names
    assert not [n for n in names if "removed_since" in n], names
