"""The executables `pycni install-plugins` writes: VERSION from sh, the rest in Python, no clobbering.

VERSION is asked of every plugin of every network on every podman command, so the generated
executables answer it from a POSIX sh front without starting Python; every other command (and
any VERSION input the front does not parse) execs Python on the same file. The answer must be
exactly what skel gives in-process, and the Go libcni and our runtime must accept it. Installing
must never replace an executable that is not ours (a Go plugin) unless forced.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pycni.install_plugins import ForeignExecutable, install
from pycni.plugins import registry
from pycni.shim import plugin_of, shim_type
from pycni.skel import dispatch

GO_BRIDGE = "/usr/lib/cni/bridge"
PYCNI = [sys.executable, "-m", "pycni"]

# What runtimes send (Go libcni, our runtime), then everything the sh front hands to Python.
USUAL_INPUTS = [b'{"cniVersion":"1.0.0"}', b'{"cniVersion": "0.4.0"}\n', b'', b'{"cniVersion":"9.9.9"}',
                b'{"cniVersion":"1.0"}', b'\n']
UNUSUAL_INPUTS = [b' {\n\t"cniVersion" : "0.3.1"\n}\n', b'{"cniVersion":"0.1.0"}\n\n', b'{"cniVersion":"1.0.0"}\nx',
                  b'{"cniVersion":"1.0.0"}\n\n\n', b'a\nb\nc', b' {"cniVersion":"1.0.0"}',
                  b'{}', b'not json', b'{"cniVersion":""}', b'{"name":"x","cniVersion":"0.2.0"}',
                  b'{"cniVersion":"1.0.0"', b'{"cniVersion":"1.0.0"} x', b'{"cniVersion":"1.0.\\u0030"}',
                  b'{"cniVersion":1}', b'[1]', b'{"cniVersion":"1.1.0","cniVersion":"0.4.0"}',
                  b'{"cniVersion":"1.0.0"}\r\n', b'{"cniVersion":"1.0.0-rc1"}', b'{ "cniVersion" : "1.0.0" , }']


def version_of(exe: str, stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([exe, *args], input=stdin, capture_output=True, timeout=60, env={"CNI_COMMAND": "VERSION"})


def skel_answer(plugin: str, stdin: bytes) -> bytes:
    outcome = dispatch(registry.load(plugin), {"CNI_COMMAND": "VERSION"}, stdin)
    assert outcome.exit_code == 0
    return outcome.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Both kinds of executables, every plugin: {"daemon": dir, "direct": dir}."""
    base = tmp_path_factory.mktemp("bin")
    install(str(base / "daemon"), daemon=True)
    install(str(base / "direct"))
    return {"daemon": str(base / "daemon"), "direct": str(base / "direct")}


@pytest.fixture
def no_python(tmp_path: Path) -> tuple[str, Path]:
    """An 'interpreter' that only records that it was started (and fails)."""
    marker = tmp_path / "python-started"
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 3\n")
    fake.chmod(0o755)
    return str(fake), marker


@pytest.mark.parametrize("plugin", sorted(registry.PLUGIN_MODULES))
def test_version_answered_by_sh_without_python(plugin: str, no_python: tuple[str, Path], tmp_path: Path) -> None:
    fake, marker = no_python
    (exe,) = install(str(tmp_path / "bin"), [plugin], python=fake, daemon=True, check_python=False)
    for stdin in USUAL_INPUTS:
        proc = version_of(exe, stdin)
        assert (proc.returncode, proc.stderr) == (0, b""), proc
        assert proc.stdout == skel_answer(plugin, stdin), stdin
    assert not marker.exists(), "VERSION started the interpreter"
    # anything else goes to Python (here the fake one, which says so and fails)
    assert version_of(exe, b'{}').returncode == 3 and marker.exists()


@pytest.mark.parametrize("kind", ["daemon", "direct"])
def test_version_answer_is_skels_for_any_input(kind: str, installed: dict[str, str]) -> None:
    for plugin in ("bridge", "firewall", "bandwidth", "host-local"):
        exe = os.path.join(installed[kind], plugin)
        for stdin in USUAL_INPUTS + UNUSUAL_INPUTS:
            proc = version_of(exe, stdin)
            assert (proc.returncode, proc.stdout, proc.stderr) == (0, skel_answer(plugin, stdin), b""), (plugin, stdin)
    firewall = json.loads(version_of(os.path.join(installed[kind], "firewall"), b'{"cniVersion":"0.3.1"}').stdout)
    assert firewall["cniVersion"] == "1.1.0" and "0.3.1" not in firewall["supportedVersions"]


def test_other_commands_run_python_with_stdin_args_and_exit_code(installed: dict[str, str], tmp_path: Path) -> None:
    exe = os.path.join(installed["daemon"], "host-local")
    conf = json.dumps({"cniVersion": "1.0.0", "name": "inst", "ipam": {
        "type": "host-local", "subnet": "10.66.0.0/24", "dataDir": str(tmp_path / "ipam")}}).encode()
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "inst1", "CNI_NETNS": "/nonexistent", "CNI_IFNAME": "eth0",
           "CNI_PATH": installed["daemon"], "PYCNI_SOCKET": "off"}
    added = subprocess.run([exe], input=conf, env=env, capture_output=True, timeout=60)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["ips"][0]["address"] == "10.66.0.2/24"
    assert (tmp_path / "ipam" / "inst" / "10.66.0.2").read_text().startswith("inst1")
    bad = subprocess.run([exe], input=b"{", env=env, capture_output=True, timeout=60)
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == 6
    assert subprocess.run([exe], input=conf, env=dict(env, CNI_COMMAND="DEL"), capture_output=True,
                          timeout=60).returncode == 0
    assert not (tmp_path / "ipam" / "inst" / "10.66.0.2").exists()
    # with arguments the plugin's own main() runs (as `dhcp daemon ...` needs): VERSION too
    by_hand = version_of(exe, b'{"cniVersion":"0.4.0"}', "extra")
    assert by_hand.returncode == 0 and json.loads(by_hand.stdout)["cniVersion"] == "0.4.0"
    # by hand, no CNI_COMMAND: the plugin describes itself
    about = subprocess.run([exe], input=b"", env={"PYCNI_SOCKET": "off"}, capture_output=True, timeout=60)
    assert about.returncode == 0 and b"CNI protocol versions supported" in about.stderr


def test_generated_file_is_one_of_ours_for_delegation(installed: dict[str, str]) -> None:
    for kind in ("daemon", "direct"):
        path = os.path.join(installed[kind], "host-local")
        assert shim_type(path) == "host-local"
        assert plugin_of(path) == "host-local"
        assert Path(path).read_text().startswith("#!/bin/sh\n# pycni plugin 'host-local'")
    if os.path.exists(GO_BRIDGE):
        assert shim_type(GO_BRIDGE) is None


def _conflist(d: Path, version: str) -> Path:
    d.mkdir()
    plugins: list[dict[str, Any]] = [
        {"type": "bridge", "bridge": "vbr0", "ipam": {"type": "host-local", "subnet": "10.67.0.0/24"}},
        {"type": "portmap", "capabilities": {"portMappings": True}}, {"type": "firewall"}, {"type": "tuning"},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}}]
    (d / "10-vnet.conflist").write_text(json.dumps({"cniVersion": version, "name": "vnet", "plugins": plugins}))
    return d


@pytest.mark.parametrize("version", ["1.0.0", "0.4.0"])
def test_version_answer_accepted_by_go_libcni_and_our_runtime(version: str, go_libcni_tool: str,
                                                              installed: dict[str, str], tmp_path: Path) -> None:
    conf = _conflist(tmp_path / "net.d", version)
    go = [go_libcni_tool, "-confdir", str(conf), "-net", "vnet", "-path", installed["daemon"],
          "-cachedir", str(tmp_path / "cache"), "-cid", "v", "-netns", "/nonexistent"]
    validated = subprocess.run([*go, "validate"], capture_output=True, text=True, timeout=60)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert set(validated.stdout.strip().split(",")) == {"portMappings", "bandwidth"}
    seen = json.loads(subprocess.run([*go, "version"], capture_output=True, text=True, timeout=60, check=True).stdout)
    for plugin, supported in seen.items():
        assert supported == list(registry.load(plugin).versions)
    ours = subprocess.run([*PYCNI, "validate", "vnet", "--conf-dir", str(conf), "--cni-path", installed["daemon"]],
                          capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert ours.returncode == 0, ours.stdout + ours.stderr
    from pycni.invoke import get_version_info

    info = get_version_info(os.path.join(installed["daemon"], "bridge"), {}, version)
    assert info["cniVersion"] == version and version in info["supportedVersions"]


# ---- never replace someone else's plugin ------------------------------------------------------------

def install_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PYCNI, "install-plugins", *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"]})


@pytest.mark.skipif(not os.path.exists(GO_BRIDGE), reason="needs containernetworking-plugins (a Go bridge)")
def test_refuses_to_replace_a_go_plugin_without_force(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy2(GO_BRIDGE, bin_dir / "bridge")
    go_bytes = (bin_dir / "bridge").read_bytes()
    (bin_dir / "portmap").symlink_to(GO_BRIDGE.replace("bridge", "portmap"))

    proc = install_cli("--dir", str(bin_dir), "host-local", "bridge", "portmap")
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("pycni: refusing to replace executables that pycni did not write")
    assert line.endswith("(code 5)")
    assert str(bin_dir / "bridge") in line and str(bin_dir / "portmap") in line and "--force" in line
    # nothing was written: the Go binary is intact, the symlink too, host-local was not installed either
    assert (bin_dir / "bridge").read_bytes() == go_bytes
    assert os.readlink(bin_dir / "portmap") == GO_BRIDGE.replace("bridge", "portmap")
    assert sorted(p.name for p in bin_dir.iterdir()) == ["bridge", "portmap"]
    with pytest.raises(ForeignExecutable) as exc:
        install(str(bin_dir), ["bridge"])
    assert exc.value.paths == [str(bin_dir / "bridge")]

    forced = install_cli("--dir", str(bin_dir), "--force", "host-local", "bridge", "portmap")
    assert forced.returncode == 0, forced.stderr
    assert shim_type(str(bin_dir / "bridge")) == "bridge"
    assert not (bin_dir / "portmap").is_symlink() and shim_type(str(bin_dir / "portmap")) == "portmap"
    # our own executables are replaced without --force (upgrades, --direct <-> daemon, another socket)
    again = install_cli("--dir", str(bin_dir), "--direct", "bridge")
    assert again.returncode == 0, again.stderr
    assert "pycni.shim" not in (bin_dir / "bridge").read_text()


def test_socket_option(tmp_path: Path) -> None:
    proc = install_cli("--dir", str(tmp_path / "a"), "--socket", "/srv/pycni/d.sock", "loopback")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "a" / "loopback").read_text()
    assert "main('loopback', 'pycni.plugins.main.loopback', '/srv/pycni/d.sock')" in text
    assert "on /srv/pycni/d.sock" in text.splitlines()[1]
    for bad in ("d.sock", "/x\n/y.sock", "/" + "x" * 107):
        refused = install_cli("--dir", str(tmp_path / "b"), "--socket", bad, "loopback")
        assert refused.returncode == 1 and "absolute path" in refused.stderr and not (tmp_path / "b").exists()
    both = install_cli("--dir", str(tmp_path / "c"), "--socket", "/x.sock", "--direct", "loopback")
    assert both.returncode == 2 and "not allowed with" in both.stderr


# ---- unusual sizes, and an executable whose interpreter or pycni is gone (issue 24) ------------------
@pytest.mark.parametrize("stdin", [b'{"cniVersion": "' + b"A" * 3_000_000, b'{"cniVersion":"1.0.0"}' + b"\n" * 500_000,
                                   b'{"cniVersion":' + b"\n" * 200_000 + b'"1.0.0"}', b"{" * 1_000_000])
def test_version_of_large_input_is_skels_answer(installed: dict[str, str], stdin: bytes) -> None:
    """The front reads at most two lines (linear: a quadratic read loop once hung here for minutes)
    and hands the rest to Python, which answers as skel does."""
    exe = os.path.join(installed["daemon"], "vlan")
    proc = subprocess.run([exe], input=stdin, capture_output=True, timeout=120, env={"CNI_COMMAND": "VERSION"})
    assert (proc.returncode, proc.stdout) == (0, skel_answer("vlan", stdin)), proc.stderr[-500:]


COMMANDS = ["VERSION", "ADD", "DEL", "CHECK", "STATUS", "GC"]


def _call(exe: str, command: str, stdin: bytes = b'{"cniVersion":"1.0.0","name":"n","type":"bridge"}'
          ) -> subprocess.CompletedProcess[bytes]:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/nonexistent", "CNI_IFNAME": "eth0",
           "CNI_PATH": os.path.dirname(exe), "PYCNI_SOCKET": "off"}
    return subprocess.run([exe], input=stdin, env=env, capture_output=True, timeout=60)


@pytest.mark.parametrize("kind", ["daemon", "direct"])
def test_missing_interpreter_is_a_cni_error_for_every_command(tmp_path: Path, kind: str) -> None:
    python = tmp_path / "venv-python"
    python.symlink_to(sys.executable)
    (exe,) = install(str(tmp_path / "bin"), ["bridge"], python=str(python), daemon=kind == "daemon")
    assert _call(exe, "VERSION").returncode == 0
    python.unlink()  # the venv was rebuilt, the clone moved...
    for command in COMMANDS:
        proc = _call(exe, command)
        e = json.loads(proc.stdout)
        assert proc.returncode == 1 and e["code"] == 50, (command, proc)
        assert str(python) in e["msg"] and "pycni install-plugins" in e["details"], e
    python.write_text("#!/bin/sh\nexit 0\n")  # there, but not executable by the caller
    python.chmod(0o644)
    assert json.loads(_call(exe, "ADD").stdout)["code"] == 50


@pytest.mark.parametrize("kind", ["daemon", "direct"])
def test_interpreter_without_pycni_is_a_cni_error(tmp_path: Path, kind: str) -> None:
    from pycni.install_plugins import executable_text
    from pycni.plugins.registry import PLUGIN_MODULES

    gone = tmp_path / "site-packages"
    (gone / "pycni").mkdir(parents=True)
    (gone / "pycni" / "shim.py").write_text("raise ImportError('a half-removed installation')\n")
    exe = tmp_path / "bridge"
    exe.write_text(executable_text("bridge", PLUGIN_MODULES["bridge"], registry.load("bridge").versions,
                                   python=sys.executable, paths=[str(gone)], daemon=kind == "daemon"))
    exe.chmod(0o755)
    # the front still finds both: it answers what runtimes send; any other input needs Python
    assert _call(str(exe), "VERSION", b'{"cniVersion":"1.0.0"}').returncode == 0
    for command in COMMANDS:
        proc = _call(str(exe), command)
        e = json.loads(proc.stdout)
        assert proc.returncode == 1 and e["code"] == 50 and str(gone) in e["msg"], (command, proc)
        assert "pycni install-plugins" in e["details"] and "Error" in e["details"], e
    (gone / "pycni" / "shim.py").unlink()
    e = json.loads(_call(str(exe), "VERSION").stdout)
    assert e["code"] == 50 and str(gone) in e["msg"], e


def test_install_refuses_an_interpreter_that_cannot_run_pycni(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    for python in ("/nonexistent", str(fake), "no-such-python-here"):
        proc = subprocess.run([*PYCNI, "install-plugins", "--dir", str(tmp_path / "bin"), "--python", python],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and python in proc.stderr, proc
        assert not (tmp_path / "bin").exists()
    # a name on PATH is baked in as its absolute path
    (exe,) = install(str(tmp_path / "bin"), ["bridge"], python=os.path.basename(sys.executable)
                              if shutil.which(os.path.basename(sys.executable)) == sys.executable else sys.executable)
    assert f"py='{sys.executable}'" in Path(exe).read_text()
