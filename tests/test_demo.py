"""The README's main job (scripts/demo runs `python -m pycni.demo`) works and cleans up after itself."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from netns_util import have_root

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not have_root(), reason="the demo creates network namespaces: needs root")
def test_demo_main_job() -> None:
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    # the options as documented, through the CLI (they were once refused as "unrecognized arguments")
    proc = subprocess.run([sys.executable, "-m", "pycni", "demo", "--conf-dir", os.path.join(REPO, "conf", "net.d"),
                           "--network", "pycni-demo"], capture_output=True, text=True, timeout=300, cwd=REPO)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "3 received, 0% packet loss" in out
    assert "got: 'hello from pycni-demo-c1-" in out
    assert "the main job worked" in out and out.count(": deleted") == 2
    tag = re.search(r"host pycni-demo-host-(\w+)", out).group(1)  # type: ignore[union-attr]
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [ns for ns in after if ns.startswith("pycni-demo-") and ns.endswith(tag) and ns not in before]


def test_demo_help_through_the_cli() -> None:
    for args in (["demo", "--", "--help"], ["demo", "--help"]):
        proc = subprocess.run([sys.executable, "-m", "pycni", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "--conf-dir" in proc.stdout and "--network" in proc.stdout, proc


@pytest.mark.skipif(not have_root(), reason="the demo creates network namespaces: needs root")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_demo_stopped_by_a_signal_cleans_up_without_a_traceback(signum: int) -> None:
    """Stopped once its HTTP server runs: namespaces, temp dir and the server all go, no traceback."""
    demo = subprocess.Popen([sys.executable, "-m", "pycni", "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    assert demo.stdout is not None
    seen = ""
    for line in demo.stdout:
        seen += line
        if line.startswith("  got: "):  # the server answered through the port mapping
            break
    else:
        raise AssertionError(f"the demo ended before its server ran: {seen}{demo.stderr.read()}")  # type: ignore[union-attr]
    state = re.search(r"installing pycni plugins into (\S+)/bin", seen).group(1)  # type: ignore[union-attr]
    tag = re.search(r"host (pycni-demo-host-(\w+))", seen).group(2)  # type: ignore[union-attr]
    demo.send_signal(signum)
    out, err = demo.communicate(timeout=120)
    assert demo.returncode == 128 + signum, (out, err)
    assert "Traceback" not in err and f"stopped by {signal.Signals(signum).name}" in err, err
    assert not os.path.exists(state)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in left, left
    servers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if state.encode() in f.read():
                    servers.append(pid)
        except OSError:
            continue
    assert servers == [], "the demo's http.server outlived it"


@pytest.mark.skipif(not have_root(), reason="needs root to drop to another user")
def test_scripts_demo_as_non_root_says_so_before_installing_anything() -> None:
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "scripts/demo"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1 and "needs root" in proc.stderr and "setup:" not in proc.stderr, proc


def test_scripts_setup_demo_list_holds_no_test_tools() -> None:
    """The demo installs only what it needs; runtimes, Go and etcd come with `scripts/setup --test`."""
    listed = subprocess.run(["bash", "-c", 'eval "$(sed -n "/^APT_PACKAGES=/p" scripts/setup)"; '
                             'echo "${APT_PACKAGES[@]}"'], capture_output=True, text=True, cwd=REPO, timeout=60)
    demo = set(listed.stdout.split())
    assert "iproute2" in demo and not demo & {"podman", "containerd", "runc", "golang-go", "etcd-server", "dnsmasq"}
