"""Guards on what the installed plugin executables import (modules, not time).

Start-up is most of a one-shot plugin's cost (see DESIGN.md, "Performance shape"): VERSION and
the IPAM plugins that touch no netlink must stay on the standard library, and the daemon
forwarding path must import next to nothing. Each case runs a generated executable exactly as
its shebang would (``python -IS``), records ``sys.modules`` at exit, and subtracts what the
bare interpreter and the recording wrapper load anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import plugin_util
import pytest
from netns_util import Namespace
from plugin_util import daemon_in_thread

from pycni.install_plugins import install
from pycni.plugins.registry import PLUGIN_MODULES

# Run a shim file as its shebang does and dump sys.modules (exit included: the shim calls sys.exit).
_WRAPPER = """
import sys
_out = sys.argv[1]
def _dump():
    with open(_out, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
import atexit
atexit.register(_dump)
_path = sys.argv[2]
sys.argv = [_path]
exec(compile(open(_path).read(), _path, "exec"), {"__name__": "__main__"})
"""

# What `python -IS` does not load by itself but a forwarding shim needs: os.environ and _socket
# (not even __future__: see pycni.shim).
FORWARDING_STDLIB = {"os", "os.path", "posixpath", "genericpath", "stat", "_stat", "_collections_abc", "_socket"}

# Never acceptable on any plugin's VERSION path: netlink, and what @dataclass drags in (inspect, with
# ast, dis and tokenize: ~20 ms a call; pycni.record replaces it on the start path), and PyYAML (the
# CLI's and the agent's, for policy files and -o yaml).
NEVER_ON_VERSION = ("pyroute2", "asyncio", "multiprocessing", "dataclasses", "inspect", "yaml")

# Never acceptable on the stdlib-only paths.
HEAVY = (*NEVER_ON_VERSION, "ctypes", "pycni.net", "pycni.runtime", "pycni.daemon.server", "subprocess",
         "pycni.invoke")

# What pycni.jsonlite and spec.validate.charset_match keep off the one-shot path (~5 ms a call).
NO_JSON_NO_RE = ("json", "re", "enum", "shlex")

# Never on a one-shot ADD/DEL of the namespace and meta plugins: the ctypes package (~3.5 ms; setns
# goes through _ctypes, see pycni.net.netns), contextlib (~3.5 ms with what it pulls: small classes
# with __enter__/__exit__ do its work) and threading (~0.7 ms; _thread is free).
NOT_ONE_SHOT = ("ctypes", "contextlib", "threading")

# Never on any plugin's one-shot ADD/DEL: the stdlib's ipaddress (pycni.ipaddr does its work) and
# what it pulls, functools and collections (with operator, keyword, reprlib, itertools, types).
# Measured with python3.11 -IS (perf stat task-clock): bare 6.9 ms, `import ipaddress` 10.3 ms, so
# ~3.4 ms of CPU a call; a run-time `from collections.abc import ...` alone costs ~2.1 ms.
NO_STDLIB_IP = ("ipaddress", "functools", "collections")

# Never on a one-shot call: the copy module (with weakref: ~1.6 ms). bandwidth and tuning copy
# their previous result through pycni.record.deep_copy.
NO_COPY = ("copy",)


def _modules(shim: str, env: dict[str, str], stdin: bytes, tmp: Path, ns: Namespace | None = None) -> set[str]:
    out = tmp / f"mods-{os.path.basename(shim)}-{len(list(tmp.iterdir()))}.txt"
    cmd = [sys.executable, "-IS", "-c", _WRAPPER, str(out), shim]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns.name, *cmd]
    proc = subprocess.run(cmd, input=stdin, env=env, capture_output=True, timeout=60)
    assert out.exists(), proc.stderr.decode()
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()
    return set(out.read_text().split())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """What the interpreter and the wrapper import with an empty script."""
    tmp = tmp_path_factory.mktemp("base")
    empty = tmp / "empty.py"
    empty.write_text("pass\n")
    return _modules(str(empty), {}, b"", tmp)


@pytest.fixture(scope="module")
def shims(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("bin")
    install(str(d), daemon=True)
    return str(d)


def _heavy(mods: set[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in heavy))


@pytest.mark.parametrize("plugin", sorted(PLUGIN_MODULES))
def test_version_imports_no_netlink(plugin: str, shims: str, baseline: set[str], tmp_path: Path) -> None:
    """VERSION of every plugin answers without pyroute2 (netlink is imported where it is used) or dataclasses."""
    mods = _modules(os.path.join(shims, plugin), {"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "1.0.0"}', tmp_path)
    assert "pycni.skel" in mods
    assert _heavy(mods - baseline, NEVER_ON_VERSION) == []


# Never imported by merely importing a plugin's module (every command pays for that): what the
# guards above keep off the paths they run, plus socket (selectors, enum; _socket does a client's
# work), secrets and random (base64, hmac, hashlib; os.urandom does), for the plugins no other
# guard here runs (dhcp, flannel, tap, vrf, sbr, ...).
NEVER_AT_IMPORT = (*NEVER_ON_VERSION, "ctypes", "pycni.runtime", "pycni.daemon.server", "subprocess",
                   *NO_JSON_NO_RE, *NOT_ONE_SHOT, *NO_STDLIB_IP, *NO_COPY, "typing", "socket", "selectors",
                   "secrets", "random", "hashlib", "shutil", "logging")


@pytest.mark.parametrize("plugin", sorted(PLUGIN_MODULES))
def test_plugin_module_import_is_light(plugin: str) -> None:
    """Importing a plugin's module (what its shim does before any command) loads none of NEVER_AT_IMPORT."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    code = (f"import sys; sys.path.insert(0, {src!r}); before = set(sys.modules); "
            f"import {PLUGIN_MODULES[plugin]}; print(' '.join(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert _heavy(set(proc.stdout.split()), NEVER_AT_IMPORT) == [], plugin


@pytest.mark.parametrize("plugin", ["host-local", "static", "cluster-ipam"])
def test_version_of_stdlib_ipam_is_stdlib_only(plugin: str, shims: str, baseline: set[str], tmp_path: Path) -> None:
    mods = _modules(os.path.join(shims, plugin), {"CNI_COMMAND": "VERSION"}, b'{"cniVersion": "1.0.0"}', tmp_path)
    assert _heavy(mods - baseline) == []


@pytest.mark.parametrize("plugin", ["host-local", "static"])
def test_ipam_add_del_is_stdlib_only(plugin: str, shims: str, baseline: set[str], tmp_path: Path,
                                     netns_factory: Callable[[], Namespace]) -> None:
    """A real host-local or static ADD and DEL in one-shot mode import no netlink, no subprocess, no runtime,
    no dataclasses."""
    host, ctr = netns_factory(), netns_factory()
    ipam = {"host-local": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]],
                           "dataDir": str(tmp_path / "ipam")},
            "static": {"type": "static", "addresses": [{"address": "10.77.1.2/24", "gateway": "10.77.1.1"}]}}[plugin]
    conf = json.dumps({"cniVersion": "1.0.0", "name": "imp", "type": "bridge", "ipam": ipam}).encode()
    for command in ("ADD", "DEL"):
        env = plugin_util.env(command, "imp1", ctr, cni_path=shims)
        mods = _modules(os.path.join(shims, plugin), env, conf, tmp_path, host)
        assert f"pycni.plugins.ipam.{plugin.replace('-', '_')}" in mods
        assert _heavy(mods - baseline, (*HEAVY, *NO_JSON_NO_RE, *NO_STDLIB_IP)) == [], command
    if plugin == "host-local":
        assert not any(p.name.startswith("10.") for p in (tmp_path / "ipam" / "imp").iterdir())


@pytest.fixture
def daemon_socket(tmp_path: Path) -> Iterator[str]:
    sock = str(tmp_path / "d.sock")
    with daemon_in_thread(sock):
        yield sock


def test_forwarding_path_imports_almost_nothing(shims: str, baseline: set[str], tmp_path: Path,
                                                daemon_socket: str, netns_factory: Callable[[], Namespace]) -> None:
    """With a daemon listening the shim loads only itself and the wire format (no json, no skel)."""
    host, ctr = netns_factory(), netns_factory()
    conf = json.dumps({"cniVersion": "1.0.0", "name": "imp", "type": "bridge",
                       "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.78.0.0/24"}]],
                                "dataDir": str(tmp_path / "ipam")}}).encode()
    for command in ("ADD", "DEL"):
        env = plugin_util.env(command, "fwd1", ctr, cni_path=shims, PYCNI_SOCKET=daemon_socket)
        mods = _modules(os.path.join(shims, "host-local"), env, conf, tmp_path, host)
        ours = {"pycni", "pycni.shim", "pycni.daemon", "pycni.daemon.protocol"}
        assert mods - baseline - FORWARDING_STDLIB <= ours, sorted(mods - baseline)


def test_no_module_imports_pyroute2() -> None:
    """pycni speaks netlink through pycni.net.nl only (docs/architecture.md): nothing imports pyroute2."""
    import ast

    import pycni

    root = Path(pycni.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] == "pyroute2"]
    assert offenders == []


def test_bridge_one_shot_needs_no_pyroute2(shims: str, tmp_path: Path,
                                             netns_factory: Callable[[], Namespace]) -> None:
    """A real one-shot bridge ADD/DEL (host-local in-process, ipMasq) speaks netlink through pycni.net.nl only.

    pyroute2 (asyncio, multiprocessing) and dataclasses (inspect) cost a one-shot call more than the
    whole rest of the bridge ADD did; neither may come back on this path.
    """
    host, ctr = netns_factory(), netns_factory()
    conf = json.dumps({"cniVersion": "1.0.0", "name": "lean", "type": "bridge", "bridge": "lean0", "isGateway": True,
                       "ipMasq": True,
                       "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.76.0.0/24"}]],
                                "dataDir": str(tmp_path / "ipam")}}).encode()
    for command in ("ADD", "DEL"):
        env = plugin_util.env(command, "lean1", ctr, cni_path=shims)
        mods = _modules(os.path.join(shims, "bridge"), env, conf, tmp_path, host)
        assert {"pycni.net.nl", "pycni.plugins.ipam.host_local"} <= mods, command
        heavy = sorted(m for m in mods if m.split(".")[0] in ("pyroute2", "asyncio", "multiprocessing",
                                                              "dataclasses", "inspect", *NO_STDLIB_IP))
        assert heavy == [], command


def test_podman_chain_one_shot_imports_no_subprocess_json_or_re(shims: str, tmp_path: Path,
                                                                netns_factory: Callable[[], Namespace]) -> None:
    """Podman's chain (bridge with ipMasq, portmap, firewall, tuning) one-shot, ADD and DEL for real.

    Each plugin runs iptables-restore, iptables or nft through pycni.net.tools (posix_spawn):
    subprocess (signal, threading, selectors, locale), shutil (bz2, lzma), typing and hashlib
    (OpenSSL) cost a one-shot call more CPU than the tools they run; json (pycni.jsonlite does its
    work) and re (with enum) cost ~5 ms a call; ipaddress, functools and collections ~3.4 ms
    (NO_STDLIB_IP). None may come back.
    """
    host, ctr = netns_factory(), netns_factory()
    chain: list[dict[str, object]] = [
        {"type": "bridge", "bridge": "podm0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(tmp_path / "ipam"),
                  "ranges": [[{"subnet": "10.75.0.0/24", "gateway": "10.75.0.1"}]]}},
        {"type": "portmap", "capabilities": {"portMappings": True},
         "runtimeConfig": {"portMappings": [{"hostPort": 8081, "containerPort": 80, "protocol": "tcp"}]}},
        {"type": "firewall", "backend": ""},
        {"type": "tuning", "dataDir": str(tmp_path / "tuning")}]  # never the machine's /run/cni
    never = ("subprocess", "shutil", "typing", "hashlib", "pyroute2", "asyncio", "multiprocessing", "dataclasses",
             "inspect", *NO_JSON_NO_RE, *NOT_ONE_SHOT, *NO_STDLIB_IP, *NO_COPY)
    prev: object = None
    for command, order in (("ADD", chain), ("DEL", chain[::-1])):
        for plugin in order:
            conf = dict(plugin, cniVersion="1.0.0", name="podm")
            if prev is not None:
                conf["prevResult"] = prev
            out = tmp_path / "result.json"
            wrapper = _WRAPPER.replace("sys.argv = [_path]", "sys.argv = [_path]\nsys.stdout = open(_res, 'w')")
            cmd = ["ip", "netns", "exec", host.name, sys.executable, "-IS", "-c", "_res = " + repr(str(out)) + "\n"
                   + wrapper, str(tmp_path / "mods.txt"), os.path.join(shims, str(plugin["type"]))]
            proc = subprocess.run(cmd, input=json.dumps(conf).encode(), capture_output=True, timeout=60,
                                  env=plugin_util.env(command, "podm1", ctr, cni_path=shims))
            assert proc.returncode == 0, (plugin["type"], command, proc.stderr.decode(), out.read_text())
            mods = set((tmp_path / "mods.txt").read_text().split())
            assert f"pycni.plugins.{'main' if plugin['type'] == 'bridge' else 'meta'}.{plugin['type']}" in mods
            heavy = sorted(m for m in mods if m.split(".")[0] in never)
            assert heavy == [], (plugin["type"], command)
            if plugin["type"] == "tuning":  # podman's tuning changes no link: no netlink, and DEL no setns
                assert "pycni.net.nl" not in mods and (command == "ADD" or "ctypes" not in mods), command
            if command == "ADD":
                prev = json.loads(out.read_text())


def _call(shim: str, env: dict[str, str], conf: dict[str, object], tmp: Path, ns: Namespace) -> tuple[set[str], str]:
    """Run one plugin for real as its shebang does (in ``ns``); the modules it imported and its stdout."""
    out, mods = tmp / "result.json", tmp / "mods.txt"
    wrapper = _WRAPPER.replace("sys.argv = [_path]", "sys.argv = [_path]\nsys.stdout = open(_res, 'w')")
    cmd = ["ip", "netns", "exec", ns.name, sys.executable, "-IS", "-c", f"_res = {str(out)!r}\n{wrapper}",
           str(mods), shim]
    proc = subprocess.run(cmd, input=json.dumps(conf).encode(), capture_output=True, timeout=60, env=env)
    assert proc.returncode == 0, (shim, env["CNI_COMMAND"], proc.stderr.decode(), out.read_text())
    return set(mods.read_text().split()), out.read_text()


def test_namespace_plugins_one_shot_import_no_ctypes_contextlib_or_threading(
        shims: str, tmp_path: Path, netns_factory: Callable[[], Namespace]) -> None:
    """ptp with bandwidth and tuning chained, macvlan, host-device, loopback and tap, ADD and DEL for real.

    Each enters the container's namespace (setns through _ctypes, not the ctypes package), takes
    locks and runs host-local in-process: none may import ctypes, contextlib or threading, nor
    ipaddress, functools or collections (NO_STDLIB_IP), nor copy (NO_COPY: bandwidth and tuning
    copy their previous result), nor subprocess (tools run through pycni.net.tools).
    """
    host, ctr = netns_factory(), netns_factory()
    host.run(["ip", "link", "add", "spm0", "type", "veth", "peer", "name", "spm1"])
    host.run(["ip", "link", "add", "spd0", "type", "veth", "peer", "name", "spd1"])
    host.run(["ip", "link", "set", "spm0", "up"])

    def ipam(subnet: str) -> dict[str, object]:
        return {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(tmp_path / "ipam")}

    chains: list[tuple[str, list[dict[str, object]]]] = [
        ("eth0", [{"type": "ptp", "ipam": ipam("10.74.0.0/24")},
                  {"type": "bandwidth", "ingressRate": 1_000_000, "ingressBurst": 100_000},
                  {"type": "tuning", "mtu": 1400, "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"},
                   "dataDir": str(tmp_path / "tuning")}]),  # state in tmp, never the machine's /run/cni
        ("eth1", [{"type": "macvlan", "master": "spm0", "ipam": ipam("10.74.1.0/24")}]),
        ("eth2", [{"type": "host-device", "device": "spd1", "dataDir": str(tmp_path / "host-device")}]),
        ("lo", [{"type": "loopback"}]),
        ("tap0", [{"type": "tap", "ipam": ipam("10.74.2.0/24")}]),
    ]
    banned = (*NOT_ONE_SHOT, *NO_STDLIB_IP, *NO_COPY, "subprocess")
    seen = []
    for ifname, chain in chains:
        prev: object = None
        for command, order in (("ADD", chain), ("DEL", chain[::-1])):
            for plugin in order:
                conf = dict(plugin, cniVersion="1.0.0", name=f"spi-{ifname}")
                if prev is not None:
                    conf["prevResult"] = prev
                env = plugin_util.env(command, "spi1", ctr, ifname=ifname, cni_path=shims)
                mods, out = _call(os.path.join(shims, str(plugin["type"])), env, conf, tmp_path, host)
                assert "pycni.net.netns" in mods, (plugin["type"], command)  # it did enter the namespace
                assert _heavy(mods, banned) == [], (plugin["type"], command)
                if command == "ADD":
                    prev = json.loads(out)
                seen.append((plugin["type"], command))
    assert len(seen) == 14
    assert "spd1" in host.run(["ip", "link", "show"]).stdout  # host-device's DEL gave it back
