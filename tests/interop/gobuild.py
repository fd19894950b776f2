"""Build the Go interop programs in tests/interop/<name>/ against the Go reference libcni.

The reference source comes from Debian's golang-github-appc-cni-dev (GOPATH
/usr/share/gocode, libcni 1.1.x, results up to 1.0.0), so the build works offline
(GO111MODULE=off). Set PYCNI_GO_CNI_GOPATH to a GOPATH holding a newer
github.com/containernetworking/cni to build against that instead; gotypes needs only
pkg/types (stdlib-only), e.g. ``git archive v1.3.0 pkg/types | tar -x -C
$GOPATH/src/github.com/containernetworking/cni``, which makes the type comparison cover 1.1.0.
"""

from __future__ import annotations

import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GOPATH = "/usr/share/gocode"


class GoUnavailable(Exception):
    """No Go toolchain: the caller skips, naming this reason."""


def gopath() -> str:
    return os.environ.get("PYCNI_GO_CNI_GOPATH", DEFAULT_GOPATH)


def build(name: str, out_dir: str) -> str:
    """Compile tests/interop/<name>/main.go into ``out_dir``; return the binary's path."""
    go = shutil.which("go")
    if go is None:
        raise GoUnavailable("the `go` toolchain is not installed (apt-get install golang-go)")
    src = os.path.join(HERE, name, "main.go")
    out = os.path.join(out_dir, name)
    env = dict(os.environ, GO111MODULE="off", GOPATH=gopath(), GOCACHE=os.path.join(out_dir, "gocache"),
               GOFLAGS="", CGO_ENABLED="0")
    proc = subprocess.run([go, "build", "-o", out, src], env=env, capture_output=True, text=True,
                          timeout=600, cwd=os.path.join(HERE, name))
    if proc.returncode != 0:
        raise RuntimeError(f"building {src} against GOPATH={gopath()} failed:\n{proc.stderr}")
    return out
