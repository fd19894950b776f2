"""The native forwarder (``forward.c``): a daemon-served plugin call without starting Python.

Every call through a Python shim pays an interpreter start (~8 ms of CPU, ~10 ms with the
shim's imports) even when a running ``pycni daemon`` does the work; a pod cycle under CRI makes
four to eight such calls. ``pycni install-plugins --daemon`` therefore compiles the forwarder
into the bin directory (``.pycni-forward``) when a C compiler is at hand, and the executables'
sh front runs it in place of Python. It forwards exactly as :mod:`pycni.shim` does, and runs
the Python command line unchanged in every case the shim would not forward (no daemon
listening, VERSION, arguments, ``PYCNI_SOCKET=off``), so results never depend on it. Without
a compiler nothing changes: the executables start Python as before.
"""

from __future__ import annotations

import os
import shutil
import subprocess

NAME = ".pycni-forward"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forward.c")

# Built once per process (installing into many directories, as tests do, copies it).
_built: str | None = None


def compiler() -> str | None:
    """``$CC``, else cc or gcc on PATH; None when there is none."""
    for cand in (os.environ.get("CC", ""), "cc", "gcc"):
        if cand:
            found = shutil.which(cand)
            if found:
                return found
    return None


def build(target_dir: str) -> str | None:
    """The forwarder in ``target_dir`` (compiled, or copied from this process's earlier build);
    None when it cannot be built (no compiler, no source, a failed compile)."""
    global _built
    path = os.path.join(target_dir, NAME)
    tmp = f"{path}.tmp{os.getpid()}"
    if _built is None or not os.path.exists(_built):
        cc = compiler()
        if cc is None or not os.path.exists(SOURCE):
            return None
        proc = None
        # Static where the C library allows it (as the image builds it, deploy/Containerfile): no
        # dynamic loader at each start, ~0.17 ms of a call's ~1.5 ms here, and on every call of a
        # pod cycle (the one-shot fallback passes through it too). Else linked as usual.
        for flags in (["-static"], []):
            try:
                proc = subprocess.run([cc, "-O2", *flags, "-o", tmp, SOURCE], capture_output=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                proc = None
            if proc is not None and proc.returncode == 0:
                break
        if proc is None or proc.returncode != 0:
            if os.path.exists(tmp):
                os.unlink(tmp)
            return None
    else:
        shutil.copyfile(_built, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    _built = path
    return path
