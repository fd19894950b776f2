"""A one-shot call ends without the interpreter's teardown (pycni.shim._exit): what teardown would
have done that a caller sees — the output, the exit status, ``atexit`` functions — still happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pycni.install_plugins import install

# Runs an executable's Python part as its sh front does, with an atexit function of its own.
_WRAPPER = """
import atexit, sys
_mark = sys.argv[1]
atexit.register(lambda: open(_mark, "w").write("ran"))
_path = sys.argv[2]
sys.argv = [_path]
exec(compile(open(_path).read(), _path, "exec"), {"__name__": "__main__"})
"""


def _run(exe: Path, mark: Path, env: dict[str, str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-IS", "-c", _WRAPPER, str(mark), str(exe)], input=stdin, env=env,
                          capture_output=True, timeout=60)


def test_one_shot_error_keeps_output_status_and_atexit(tmp_path: Path) -> None:
    install(str(tmp_path / "bin"), ["loopback"], daemon=True, forwarder=False)
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "pcr-exit", "CNI_IFNAME": "lo", "CNI_PATH": str(tmp_path),
           "PYCNI_SOCKET": "off"}
    mark = tmp_path / "mark"
    proc = _run(tmp_path / "bin" / "loopback", mark, env, b"{not json")
    assert proc.returncode == 1, proc
    assert json.loads(proc.stdout)["code"] == 6  # error decoding the config, on stdout, flushed
    assert proc.stderr == b""
    assert mark.read_text() == "ran"


def test_one_shot_success_keeps_empty_output_and_atexit(tmp_path: Path) -> None:
    install(str(tmp_path / "bin"), ["loopback"], daemon=True, forwarder=False)
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "pcr-exit", "CNI_IFNAME": "lo", "CNI_NETNS": "",
           "CNI_PATH": str(tmp_path), "PYCNI_SOCKET": "off"}
    mark = tmp_path / "mark"
    conf = {"cniVersion": "0.3.1", "name": "cni-loopback", "type": "loopback"}
    proc = _run(tmp_path / "bin" / "loopback", mark, env, json.dumps(conf).encode())
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")  # DEL without a netns: nothing to do
    assert mark.read_text() == "ran"


def test_one_shot_exit_status_through_the_executable(tmp_path: Path) -> None:
    """The executable itself (sh front, then Python): the status and the error JSON as before."""
    install(str(tmp_path / "bin"), ["bandwidth"], daemon=True, forwarder=False)
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "pcr-exit", "CNI_IFNAME": "eth0", "CNI_NETNS": "/nonexistent",
           "CNI_PATH": str(tmp_path), "PYCNI_SOCKET": "off", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(tmp_path / "bin" / "bandwidth")], input=b'{"cniVersion": "1.0.0"}', env=env,
                          capture_output=True, timeout=60)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["code"] == 7  # missing network name


def test_one_shot_without_stdout_still_exits_with_the_plugins_status(tmp_path: Path) -> None:
    """A runtime that starts the plugin with stdout closed: a DEL's status is still 0 (nothing to
    flush), as it was when the interpreter's teardown ended the process."""
    install(str(tmp_path / "bin"), ["loopback"], daemon=True, forwarder=False)
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "pcr-exit", "CNI_IFNAME": "lo", "CNI_NETNS": "",
           "CNI_PATH": str(tmp_path), "PYCNI_SOCKET": "off"}
    conf = {"cniVersion": "0.3.1", "name": "cni-loopback", "type": "loopback"}
    script = str(tmp_path / "bin" / "loopback")
    proc = subprocess.run([sys.executable, "-IS", script], input=json.dumps(conf).encode(), env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert (proc.returncode, proc.stderr) == (0, b"")
