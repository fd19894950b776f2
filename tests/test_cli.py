"""The ``pycni`` command: cnitool's verbs and environment, errors, and real runs in namespaces.

Real runs use the Go reference bridge + host-local from /usr/lib/cni inside a throwaway
"host" namespace (``ip netns exec``), attaching throwaway "container" namespaces; config,
cache and IPAM data directories are pytest temporary directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace, have_root, new_namespace

from pycni.cli import cnitool_container_id

GO_PLUGINS = "/usr/lib/cni"
PYCNI = [sys.executable, "-m", "pycni"]


def run(args: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    full_env = {"PATH": os.environ["PATH"], **(env or {})}
    return subprocess.run([*PYCNI, *args], env=full_env, capture_output=True, text=True, timeout=120, **kw)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert proc.returncode == 1, proc
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("pycni: ") and lines[0].endswith(f"(code {code})"), lines[0]
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


# ---- container ID as cnitool derives it ------------------------------------------------------

GO_CONTAINER_ID = r"""package main

import (
	"crypto/sha512"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	for _, p := range os.Args[1:] {
		abs, _ := filepath.Abs(p)
		s := sha512.Sum512([]byte(abs))
		fmt.Printf("cnitool-%x\n", s[:10])
	}
}
"""


def test_container_id_is_cnitools(tmp_path: Path) -> None:
    """Same IDs as cnitool's code (run in Go), relative and unclean paths included."""
    paths = ["/var/run/netns/ctr1", "//var/run//netns/./ctr1/", "rel/ns", "../x/../ns"]
    ours = [cnitool_container_id(p) for p in paths]
    assert ours[0] == "cnitool-" + hashlib.sha512(b"/var/run/netns/ctr1").hexdigest()[:20]
    assert ours[0] == ours[1] and len(ours[0]) == len("cnitool-") + 20
    if not shutil.which("go"):
        pytest.skip("needs golang-go for the Go side")
    (tmp_path / "main.go").write_text(GO_CONTAINER_ID)
    env = dict(os.environ, GO111MODULE="off", GOCACHE=str(tmp_path / "gocache"), GOFLAGS="")
    proc = subprocess.run(["go", "run", str(tmp_path / "main.go"), *paths], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ours


# ---- verbs that need no namespace ------------------------------------------------------------

def test_version() -> None:
    proc = run(["version"])
    assert proc.returncode == 0
    assert proc.stdout.startswith("pycni ") and "1.1.0" in proc.stdout and "0.1.0" in proc.stdout


def test_errors_are_one_line_with_code(tmp_path: Path) -> None:
    (tmp_path / "a.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "net1",
                                                     "plugins": [{"type": "bridge"}]}))
    env = {"NETCONFPATH": str(tmp_path), "CNI_PATH": GO_PLUGINS}
    assert_one_line_error(run(["add", "nosuch", "/var/run/netns/x"], env), 7, 'name "nosuch"', str(tmp_path))
    assert_one_line_error(run(["add", "net1", "/x"], dict(env, CAP_ARGS="{nope")), 6, "CAP_ARGS")
    assert_one_line_error(run(["add", "net1", "/x"], dict(env, CAP_ARGS="[1]")), 6, "JSON object")
    assert_one_line_error(run(["del", "net1", "/x"], dict(env, CNI_ARGS="A=1;B")), 4, "'B'")
    assert_one_line_error(run(["check", "net1", "/x", "--ifname", "bad/name"], env), 4, "interface name")
    assert_one_line_error(run(["add", "net1", "/x"], {"NETCONFPATH": str(tmp_path), "CNI_PATH": str(tmp_path)}),
                          7, "bridge")
    (tmp_path / "b.conflist").write_text("{oops")
    assert_one_line_error(run(["status", "zzz"], env), 6, str(tmp_path / "b.conflist"))
    usage = run(["add", "net1"], env)  # argparse: usage on stderr, exit 2, no traceback
    assert usage.returncode == 2 and "usage:" in usage.stderr and "Traceback" not in usage.stderr


@pytest.mark.skipif(not os.path.exists(f"{GO_PLUGINS}/bridge"), reason="needs containernetworking-plugins")
def test_failed_add_is_one_error_unless_the_cleanup_failed_otherwise(tmp_path: Path, host_ns: Namespace) -> None:
    """The DEL after a failed ADD refused for the same reason adds nothing; for another, it is told.
    Run in a throwaway host: Go's bridge makes cni0 before it finds the netns missing."""

    def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return host_ns.run([*PYCNI, *args], check=False, env={"PATH": os.environ["PATH"], **env})

    (tmp_path / "a.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "net1",
                                                     "plugins": [{"type": "bridge", "mtu": "x"}]}))
    (tmp_path / "b.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "net2",
                                                     "plugins": [{"type": "bridge", "ipam": {"type": "nosuch"}}]}))
    env = {"NETCONFPATH": str(tmp_path), "CNI_PATH": GO_PLUGINS}
    same = run(["add", "net1", "/var/run/netns/x", "--cache-dir", str(tmp_path / "cache")], env)
    assert_one_line_error(same, 999, "NetConf.mtu")
    assert "also failed" not in same.stderr and same.stderr.count("NetConf.mtu") == 1, same.stderr
    other = run(["add", "net2", "/var/run/netns/x", "--cache-dir", str(tmp_path / "cache")], env)
    assert_one_line_error(other, 999, "failed to open netns", "cleaning up after the failed ADD also failed",
                          '"nosuch"')


def test_list_shows_networks_plugins_errors_and_shadowing(tmp_path: Path) -> None:
    (tmp_path / "10-a.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "net1",
        "plugins": [{"type": "bridge"}, {"type": "portmap", "capabilities": {"portMappings": True}}]}))
    (tmp_path / "20-b.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "net1",
                                                       "plugins": [{"type": "ptp"}]}))
    (tmp_path / "30-c.conflist").write_text("not json")
    (tmp_path / "40-old.conf").write_text(json.dumps({"cniVersion": "0.3.1", "name": "old", "type": "macvlan"}))
    proc = run(["list", "--conf-dir", str(tmp_path)])
    assert proc.returncode == 1, proc.stderr  # a broken file is listed, and the exit status says so
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert rows[0] == ["NAME", "VERSION", "PLUGINS", "FILE", "NOTE"]
    assert rows[1] == ["net1", "1.0.0", "bridge,portmap", str(tmp_path / "10-a.conflist")]
    assert rows[2][:4] == ["net1", "1.0.0", "ptp", str(tmp_path / "20-b.conflist")] and "shadowed:" in rows[2]
    assert rows[3] == [str(tmp_path / "30-c.conflist"), "ERROR", "(see", "stderr)"]
    assert rows[4] == ["old", "0.3.1", "macvlan", str(tmp_path / "40-old.conf")]
    (err,) = proc.stderr.splitlines()
    assert err.startswith(f"pycni: {tmp_path / '30-c.conflist'}: ") and err.endswith("(code 6)"), err
    wide = json.loads(run(["list", "--conf-dir", str(tmp_path), "-o", "json"]).stdout)
    assert wide[0]["capabilities"] == ["portMappings"] and wide[1]["shadowed"] and wide[2]["error"]


def test_list_exit_status(tmp_path: Path) -> None:
    assert_one_line_error(run(["list", "--conf-dir", str(tmp_path / "missing")]), 5, str(tmp_path / "missing"))
    (tmp_path / "10-a.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "net1",
                                                       "plugins": [{"type": "bridge"}]}))
    assert run(["list", "--conf-dir", str(tmp_path)]).returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run(["list", "--conf-dir", str(empty)])
    assert proc.returncode == 0 and proc.stdout == "" and "no network configurations" in proc.stderr


def test_help_version_and_demo_verb() -> None:
    proc = run(["--version"])
    assert proc.returncode == 0 and proc.stdout.startswith("pycni ")
    top = run(["--help"])
    assert top.returncode == 0
    for name in ("CNI_ARGS", "CAP_ARGS", "PYCNI_SOCKET", "PYCNI_DEBUG", "PYCNI_ETCD_ENDPOINTS", "NETCONFPATH",
                 "CNI_PATH", "demo",
                 "throwaway namespace"):
        assert name in top.stdout, name
    verbs = ("add", "check", "del", "gc", "status", "validate", "list", "version", "install-plugins", "plugin",
             "daemon", "demo")
    for verb in verbs:
        sub = run([verb, "--help"])
        assert sub.returncode == 0, (verb, sub.stderr)
        description = sub.stdout.split("\n\n")[1]  # usage, then the description paragraph
        assert not description.startswith(("positional", "options")), (verb, sub.stdout)


def test_debug_shows_the_failing_plugins_stderr(tmp_path: Path) -> None:
    plugin = tmp_path / "bin" / "noisy"
    plugin.parent.mkdir()
    plugin.write_text("#!/bin/sh\necho 'noisy: the thing that went wrong' >&2\n"
                      "echo '{\"code\": 5, \"msg\": \"noisy failed\"}'\nexit 1\n")
    plugin.chmod(0o755)
    (tmp_path / "n.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "n",
                                                     "plugins": [{"type": "noisy"}]}))
    env = {"NETCONFPATH": str(tmp_path), "CNI_PATH": str(plugin.parent)}
    quiet = run(["add", "n", "/x", "--cache-dir", str(tmp_path / "cache")], env)
    assert_one_line_error(quiet, 5, "noisy failed")
    # (a fresh cache: the failed ADD's clean-up failed too, so its attachment is cached for a DEL)
    loud = run(["add", "n", "/x", "--cache-dir", str(tmp_path / "cache2")], dict(env, PYCNI_DEBUG="1"))
    assert loud.returncode == 1 and "noisy: the thing that went wrong" in loud.stderr
    assert "Traceback" not in loud.stderr


def test_plugin_without_privileges_says_what_it_needs(host_ns: Namespace, container_ns: Namespace) -> None:
    """EPERM from the kernel names the missing privilege (run as nobody, in a throwaway host namespace)."""
    import tempfile

    from pycni.install_plugins import install

    public = tempfile.mkdtemp(prefix="pycni-eperm-")  # nobody must reach the plugins: not under pytest's 0700 tmp
    try:
        os.chmod(public, 0o755)
        install(os.path.join(public, "bin"), ["bridge", "host-local"])
        conf = json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "bridge", "bridge": "br-eperm",
                           "ipam": {"type": "host-local", "subnet": "10.99.0.0/24",
                                    "dataDir": os.path.join(public, "ipam")}})
        env = {"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
               "CNI_NETNS": container_ns.path, "CNI_PATH": os.path.join(public, "bin")}
        proc = subprocess.run(["ip", "netns", "exec", host_ns.name, "setpriv", "--reuid=65534", "--regid=65534",
                               "--clear-groups", *PYCNI, "plugin", "bridge"],
                              input=conf, env=env, capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(public, ignore_errors=True)
    assert proc.returncode == 1, proc
    err = json.loads(proc.stdout)
    assert "needs root or CAP_NET_ADMIN" in err.get("details", ""), err
    assert "br-eperm" not in host_ns.run(["ip", "link"]).stdout


def test_validate_with_go_plugins(tmp_path: Path) -> None:
    (tmp_path / "a.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "net1",
        "plugins": [{"type": "bridge", "ipam": {"type": "host-local"}},
                    {"type": "portmap", "capabilities": {"portMappings": True}}]}))
    (tmp_path / "b.conflist").write_text(json.dumps({"cniVersion": "1.1.0", "name": "new",
                                                    "plugins": [{"type": "bridge"}]}))
    env = {"NETCONFPATH": str(tmp_path), "CNI_PATH": GO_PLUGINS}
    proc = run(["validate", "net1"], env)
    assert proc.returncode == 0, proc.stderr
    assert "is valid" in proc.stdout and "capabilities: portMappings" in proc.stdout
    # the Go plugins v1.1.1 speak up to 1.0.0
    assert_one_line_error(run(["validate", "new"], env), 1, 'does not support config version "1.1.0"')


def test_install_plugins_and_plugin_verb(tmp_path: Path) -> None:

    name = "loopback"
    proc = run(["install-plugins", "--direct", "--dir", str(tmp_path / "bin"), name])
    assert proc.returncode == 0, proc.stderr
    shim = tmp_path / "bin" / name
    assert proc.stdout.strip() == str(shim)
    assert os.access(shim, os.X_OK) and shim.read_text().startswith("#!/bin/sh\n# pycni plugin ")
    assert f"py='{sys.executable}'\n" in shim.read_text() and 'exec "$py" -IS "$0" "$@"' in shim.read_text()
    for cmd in ([str(shim)], [*PYCNI, "plugin", name]):
        ver = subprocess.run(cmd, input='{"cniVersion":"1.0.0"}', env={"CNI_COMMAND": "VERSION"},
                             capture_output=True, text=True, timeout=60)
        assert ver.returncode == 0, ver.stderr
        assert "1.0.0" in json.loads(ver.stdout)["supportedVersions"]
    assert_one_line_error(run(["install-plugins", "--dir", str(tmp_path / "bin"), "nosuch"]), 7, "nosuch")
    assert_one_line_error(run(["plugin", "nosuch"]), 7, "unknown plugin type")


# ---- real runs: Go bridge + host-local in throwaway namespaces ---------------------------------

@pytest.fixture
def pc33_ns() -> Iterator[Callable[[], Namespace]]:
    """Throwaway namespaces named pc33-* (the user's-path tests' own), all deleted afterwards."""
    if not have_root():
        pytest.skip("network namespaces need root")
    made: list[Namespace] = []

    def make() -> Namespace:
        made.append(new_namespace(prefix="pc33"))
        return made[-1]

    yield make
    for ns in reversed(made):
        ns.delete()


@pytest.fixture
def bridge_net(tmp_path: Path) -> dict[str, str]:
    """A bridge + host-local network in tmp dirs; returns the environment for pycni."""
    conf = tmp_path / "net.d"
    conf.mkdir()
    (conf / "10-clinet.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "clinet",
        "plugins": [{"type": "bridge", "bridge": "pycnibr0", "isGateway": True, "ipMasq": False,
                     "ipam": {"type": "host-local", "subnet": "10.123.0.0/24",
                              "dataDir": str(tmp_path / "ipam")}}]}))
    return {"NETCONFPATH": str(conf), "CNI_PATH": GO_PLUGINS, "PATH": os.environ["PATH"],
            "CACHE": str(tmp_path / "cache"), "IPAM": str(tmp_path / "ipam" / "clinet")}


def pycni_in(ns: Namespace, args: list[str], env: dict[str, str], check: bool = True,
             ) -> subprocess.CompletedProcess[str]:
    return ns.run([*PYCNI, *args, "--cache-dir", env["CACHE"]], env=env, check=check)


def addresses(ns: Namespace, ifname: str) -> list[str]:
    proc = ns.run(["ip", "-j", "addr", "show", "dev", ifname], check=False)
    if proc.returncode != 0:
        return []
    return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(proc.stdout) for a in link["addr_info"]
            if a["family"] == "inet"]


@pytest.mark.skipif(not os.path.exists(f"{GO_PLUGINS}/bridge"), reason="needs containernetworking-plugins")
def test_add_check_del_in_namespaces(host_ns: Namespace, container_ns: Namespace,
                                     bridge_net: dict[str, str]) -> None:
    env = dict(bridge_net, CNI_IFNAME="net0", CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAME=web")
    add = pycni_in(host_ns, ["add", "clinet", container_ns.path], env)
    result = json.loads(add.stdout)
    assert result["cniVersion"] == "1.0.0"
    (ip,) = result["ips"]
    assert ip["address"].startswith("10.123.0.") and ip["gateway"] == "10.123.0.1"
    assert addresses(container_ns, "net0") == [ip["address"]]
    assert addresses(host_ns, "pycnibr0") == ["10.123.0.1/24"]
    ping = container_ns.run(["ping", "-c1", "-W2", "10.123.0.1"], check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    cid = cnitool_container_id(container_ns.path)
    cache = Path(env["CACHE"]) / "results" / f"clinet-{cid}-net0"
    cached = json.loads(cache.read_text())
    assert cached["containerId"] == cid and cached["netns"] == container_ns.path
    assert cached["cniArgs"] == [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "web"]]
    assert (Path(env["IPAM"]) / ip["address"].split("/")[0]).read_text().startswith(cid)

    assert pycni_in(host_ns, ["check", "clinet", container_ns.path], env).returncode == 0
    # break the attachment: CHECK reports the plugin's error, one line with its code
    container_ns.run(["ip", "addr", "flush", "dev", "net0"])
    assert_one_line_error(pycni_in(host_ns, ["check", "clinet", container_ns.path], env, check=False), 999,
                          'plugin type="bridge" failed (check)')

    pycni_in(host_ns, ["del", "clinet", container_ns.path], env)
    assert addresses(container_ns, "net0") == []
    assert not cache.exists()
    assert not (Path(env["IPAM"]) / ip["address"].split("/")[0]).exists()
    pycni_in(host_ns, ["del", "clinet", container_ns.path], env)  # DEL again: still fine


@pytest.mark.skipif(not os.path.exists(f"{GO_PLUGINS}/bridge"), reason="needs containernetworking-plugins")
def test_gc_deletes_stale_attachments_and_status(host_ns: Namespace, netns_factory: Callable[[], Namespace],
                                                 bridge_net: dict[str, str]) -> None:
    keep, stale = netns_factory(), netns_factory()
    env = dict(bridge_net)
    for ns in (keep, stale):
        pycni_in(host_ns, ["add", "clinet", ns.path, "--container-id", ns.name], env)
    assert addresses(stale, "eth0") and addresses(keep, "eth0")
    pycni_in(host_ns, ["gc", "clinet", "--valid", f"{keep.name}:eth0"], env)
    assert addresses(stale, "eth0") == [] and addresses(keep, "eth0") != []
    remaining = [p.name for p in (Path(env["CACHE"]) / "results").iterdir()]
    assert remaining == [f"clinet-{keep.name}-eth0"]
    assert pycni_in(host_ns, ["status", "clinet", keep.path], env).stdout == ""  # 1.0.0: nothing to ask
    # cnitool's spelling (no list: nothing is valid) is refused, and says what it would do
    assert_one_line_error(pycni_in(host_ns, ["gc", "clinet", "ignored-netns"], env, check=False), 4,
                          "without --valid", f"all 1 cached attachment(s) ({keep.name}:eth0)", "--all")
    assert addresses(keep, "eth0") != []
    done = pycni_in(host_ns, ["gc", "clinet", "--all"], env)
    assert done.stdout == f"gc clinet: deleted 1 cached attachment(s) ({keep.name}:eth0), kept 0\n"
    assert addresses(keep, "eth0") == []
    assert list((Path(env["CACHE"]) / "results").iterdir()) == []


def test_install_plugins_daemon_shims_fall_back_to_in_process(tmp_path: Path) -> None:
    from pycni.install_plugins import install

    proc = run(["install-plugins", "--dir", str(tmp_path), "loopback"])
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "loopback").read_text()
    assert "from pycni.shim import main" in text and "main('loopback', 'pycni.plugins.main.loopback')" in text
    ver = subprocess.run([str(tmp_path / "loopback")], input='{"cniVersion":"1.0.0"}', capture_output=True,
                         text=True, timeout=60,
                         env={"CNI_COMMAND": "VERSION", "PYCNI_SOCKET": str(tmp_path / "no-daemon.sock")})
    assert ver.returncode == 0 and "1.0.0" in json.loads(ver.stdout)["supportedVersions"], ver.stderr
    direct = install(str(tmp_path / "direct"), ["loopback"])  # what tests' plugin_dir uses
    assert "pycni.shim" not in Path(direct[0]).read_text()


def test_daemon_refuses_a_relative_socket() -> None:
    """As install-plugins --socket: the shims find the daemon by an absolute path."""
    for sock in ("rel.sock", "/" + "x" * 107):
        proc = run(["daemon", "--socket", sock])
        assert proc.returncode == 2 and "must be an absolute path" in proc.stderr, proc


def test_daemon_refuses_a_socket_in_a_directory_that_does_not_exist(tmp_path: Path) -> None:
    """It used to create the directories (/nonexistent/dir on the root file system, left there)."""
    sock = tmp_path / "nonexistent" / "dir" / "x.sock"
    proc = run(["daemon", "--socket", str(sock), "--no-preload", "--workers", "1"])
    assert proc.returncode != 0 and f"directory {sock.parent} does not exist" in proc.stderr, proc
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3") or os.geteuid() != 0,
                    reason="needs root to drop to another user, and a Python that user may run")
def test_non_root_add_says_root_is_needed(tmp_path: Path) -> None:
    """Run as nobody with the system Python on this clone's source (the venv's may not be readable)."""
    import pycni
    from pycni.install_plugins import install

    src = os.path.dirname(os.path.dirname(pycni.__file__))
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                            "import sys; sys.path.insert(0, sys.argv[1]); import pycni.cli", src], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"/usr/bin/python3 cannot import pycni from {src} as nobody: {probe.stderr[-200:]!r}")
    tmp_path.chmod(0o755)
    install(str(tmp_path / "bin"), python="/usr/bin/python3")
    conf = tmp_path / "net.d"
    conf.mkdir()
    (conf / "a.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": "net1", "plugins": [
        {"type": "bridge", "ipam": {"type": "host-local", "subnet": "10.9.9.0/24", "dataDir": str(tmp_path / "d")}}]}))
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-m",
                           "pycni", "add", "net1", "/var/run/netns/nc-nothere"], capture_output=True, text=True,
                          timeout=60, env={"PATH": os.environ["PATH"], "PYTHONPATH": src, "NETCONFPATH": str(conf),
                                           "CNI_PATH": str(tmp_path / "bin")})
    assert proc.returncode == 1 and "pycni add needs root (this is uid 65534)" in proc.stderr, proc
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_validate_runs_our_plugins_config_parsing(tmp_path: Path, plugin_dir: str) -> None:
    """What ADD would refuse, validate refuses (it once said "valid"); unread keys are warnings."""
    def conflist(name: str, *plugins: dict[str, Any]) -> None:
        (tmp_path / f"{name}.conflist").write_text(json.dumps({"cniVersion": "1.0.0", "name": name,
                                                               "plugins": list(plugins)}))
    ipam = {"type": "host-local", "subnet": "10.1.0.0/24"}
    conflist("masq", {"type": "bridge", "ipMasq": "true", "ipam": ipam})
    conflist("ipamtype", {"type": "bridge", "ipam": dict(ipam, type="host-locl")})
    conflist("prefix", {"type": "bridge", "ipam": dict(ipam, subnet="10.1.0.0/33")})
    conflist("typo", {"type": "bridge", "isGatway": True, "ipam": dict(ipam, rnages=[])},
             {"type": "portmap", "capabilities": {"portMappings": True}}, {"type": "tuning"}, {"type": "firewall"})
    env = {"NETCONFPATH": str(tmp_path), "CNI_PATH": plugin_dir}
    assert_one_line_error(run(["validate", "masq"], env), 7, "'ipMasq' must be true or false")
    assert_one_line_error(run(["validate", "ipamtype"], env), 7, "(ipam host-locl)", "failed to find plugin")
    assert_one_line_error(run(["validate", "prefix"], env), 7, "(ipam host-local)", "10.1.0.0/33")
    typo = run(["validate", "typo"], env)
    assert typo.returncode == 0 and "is valid" in typo.stdout, typo
    assert typo.stderr.splitlines() == [
        "pycni: warning: plugin bridge: key 'isGatway' is not read by bridge (misspelled?)",
        "pycni: warning: plugin bridge (ipam host-local): key 'ipam.rnages' is not read by host-local (misspelled?)"]


def test_node_tls_files_are_named(tmp_path: Path) -> None:
    """A missing TLS file is the flag and the path, before any connection (it was an internal error)."""
    for flag in ("--etcd-ca-cert", "--etcd-cert", "--etcd-key"):
        extra = ["--etcd-cert", str(tmp_path / "c.pem")] if flag == "--etcd-key" else []
        if extra:
            (tmp_path / "c.pem").write_text("x")
        proc = run(["node", "status", "--etcd-endpoints", "https://192.0.2.1:2379", flag, "/nonexistent/x.pem",
                    *extra])
        assert_one_line_error(proc, 7, f"invalid {flag}", "/nonexistent/x.pem: no such file")


@pytest.mark.skipif(not os.path.exists(f"{GO_PLUGINS}/bridge"), reason="needs containernetworking-plugins")
def test_second_add_is_refused_and_the_live_attachment_survives(pc33_ns: Callable[[], Namespace],
                                                                 bridge_net: dict[str, str]) -> None:
    """A second ADD of a cached attachment is refused before any plugin runs; its rollback used to
    DEL the first attachment (address gone, reservation freed, cache entry left, CHECK failing)."""
    host_ns, container_ns = pc33_ns(), pc33_ns()
    env = dict(bridge_net)
    (ip,) = json.loads(pycni_in(host_ns, ["add", "clinet", container_ns.path], env).stdout)["ips"]
    again = pycni_in(host_ns, ["add", "clinet", container_ns.path], env, check=False)
    assert_one_line_error(again, 4, "already exists", "DEL it first")
    assert addresses(container_ns, "eth0") == [ip["address"]]
    assert (Path(env["IPAM"]) / ip["address"].split("/")[0]).exists()
    assert pycni_in(host_ns, ["check", "clinet", container_ns.path], env).returncode == 0
    pycni_in(host_ns, ["del", "clinet", container_ns.path], env)
    assert addresses(container_ns, "eth0") == []


# ---- the conventions every verb follows (docs/api.md "Conventions for a verb") -------------------------

def _verbs(parser: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any, str]]:
    """(path, parser, its help line) of every verb and sub-verb under ``parser``."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name) or ""
                yield from _verbs(sub, (*path, name))


def test_every_verb_has_help_lines_and_list_and_show_verbs_take_o() -> None:
    """Walks the parser as built (the verbs other modules register included): every verb and flag
    has a help line; every list / show / status sub-verb takes -o wide|json|yaml; every verb that
    names etcd takes the one set of etcd flags."""
    import argparse

    from pycni.cli import _parser

    missing, no_output, etcd_partial = [], [], []
    verbs = list(_verbs(_parser()))
    assert len(verbs) > 20
    for path, sp, text in verbs:
        if not text:
            missing.append(" ".join(path))
        options = {o for a in sp._actions for o in a.option_strings}
        for a in sp._actions:
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction) and a.help != argparse.SUPPRESS \
                    and not a.help:
                missing.append(f"{' '.join(path)} {a.option_strings[-1] if a.option_strings else a.dest}")
        actions = {c for a in sp._actions if not a.option_strings and a.choices and not isinstance(
            a, argparse._SubParsersAction) for c in a.choices}
        listing = (path[-1] in ("list", "show") or (len(path) > 1 and path[-1] == "status")
                   or {"list", "show", "status"} & actions)
        if listing:
            out = next((a for a in sp._actions if "-o" in a.option_strings), None)
            if out is None or not {"wide", "json", "yaml"} <= set(out.choices or ()):
                no_output.append(" ".join(path))
        if "--etcd-endpoints" in options and not {"--etcd-prefix", "--etcd-ca-cert", "--etcd-cert", "--etcd-key",
                                                  "--etcd-timeout"} <= options:
            etcd_partial.append(" ".join(path))
    assert missing == [] and no_output == [] and etcd_partial == [], (missing, no_output, etcd_partial)


def test_unknown_flag_prints_the_sub_verbs_usage() -> None:
    proc = run(["policy", "why", "a/b", "c/d", "80", "--bogus"])
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: pycni policy why ") and "unrecognized arguments: --bogus" in proc.stderr
    proc = run(["ipam", "list", "--nope", "net"])
    assert proc.returncode == 2 and proc.stderr.startswith("usage: pycni ipam list "), proc.stderr
    # (one "pycni:" on etcd's errors: tests/test_user_path.py, in a namespace of its own)
