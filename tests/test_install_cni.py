"""`pycni install-cni` on its real default paths, inside a private mount namespace.

Each run is ``unshare --mount`` with tmpfs over /opt and /run and the test's temporary
directories bound onto /opt/cni/bin, /etc/cni/net.d, the service account dir and
/etc/systemd/system, so install-cni writes where it would on a node while the machine's own
directories are never touched; the test reads what it wrote from the temporary directories.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_proc import DaemonProc, needs_privileges
from etcd_util import EtcdCluster, etcd_available
from netns_util import Namespace, new_namespace

from pycni.install_cni import MANIFEST_NAME

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare (a private mount namespace)")

PREFIX = "pi32"
SA = "/var/run/secrets/kubernetes.io/serviceaccount"
GO_BRIDGE = "/usr/lib/cni/bridge"
TEMPLATE = """{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {"type": "bridge", "bridge": "pi32br0", "mtu": __CNI_MTU__, "isGateway": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.7.0/24"}]], "dataDir": "__DATA_DIR__"},
     "args": {"pycni": {"node": "__KUBERNETES_NODE_NAME__", "kubeconfig": "__KUBECONFIG_FILEPATH__",
              "etcd": "__ETCD_ENDPOINTS__"}}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"""

# Mount the scratch dirs over the real ones, then run the command given after it.
_MOUNTS = r"""
set -e
mount -t tmpfs pi32-opt /opt && mkdir -p /opt/cni/bin && mount --bind "$T/bin" /opt/cni/bin
mount --bind "$T/net" /etc/cni/net.d
mount -t tmpfs pi32-run /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount
mount --bind "$T/sa" /run/secrets/kubernetes.io/serviceaccount
mount --bind "$T/units" /etc/systemd/system
exec "$@"
"""


class Node:
    """The scratch directories standing for one node's /opt/cni/bin, /etc/cni/net.d, service account, units."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for d in ("bin", "net", "sa", "units", "data"):
            (root / d).mkdir()
        self.bin, self.net, self.sa, self.units = root / "bin", root / "net", root / "sa", root / "units"
        (self.sa / "token").write_text("token-one\n")
        (self.sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIpi32\n-----END CERTIFICATE-----\n")
        self.template = root / "template.conflist"
        self.template.write_text(TEMPLATE.replace("__DATA_DIR__", str(root / "data")))

    def env(self, **extra: str) -> dict[str, str]:
        e = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "T": str(self.root),
             "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
             "KUBERNETES_NODE_NAME": "pi32-node", "CNI_NETWORK_CONFIG_FILE": str(self.template)}
        e.update(extra)
        return e

    def command(self, *args: str, netns: Namespace | None = None) -> list[str]:
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNTS, "sh",
               sys.executable, "-m", "pycni", "install-cni", *args]
        return ["ip", "netns", "exec", netns.name, *cmd] if netns else cmd

    def run(self, *args: str, env: dict[str, str] | None = None,
            netns: Namespace | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args, netns=netns), env=env or self.env(), capture_output=True,
                              text=True, timeout=120)

    def files(self) -> dict[str, tuple[int, int, bytes]]:
        """Every file under bin, net and units: (inode, mtime_ns, content) by relative path."""
        out = {}
        for d in (self.bin, self.net, self.units):
            for p in sorted(d.rglob("*")):
                if p.is_file() or p.is_symlink():
                    st = p.lstat()
                    out[str(p.relative_to(self.root))] = (st.st_ino, st.st_mtime_ns,
                                                          os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
        return out

    def kubeconfig(self) -> dict[str, object]:
        import yaml

        return yaml.safe_load((self.net / "pycni-kubeconfig").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line (no traceback) of a refused run."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pycni: "), proc.stderr
    return lines[0]


def test_fresh_install_on_the_default_paths(node: Node) -> None:
    ok(node.run())
    from pycni.plugins.registry import PLUGIN_MODULES
    from pycni.shim import shim_type

    for name in PLUGIN_MODULES:
        assert shim_type(str(node.bin / name)) == name
        assert "pycni.shim import main" in (node.bin / name).read_text()  # the daemon path, one-shot without it
    conf = json.loads((node.net / "10-pycni.conflist").read_text())
    bridge = conf["plugins"][0]
    assert bridge["mtu"] == 1500 and bridge["args"]["pycni"] == {
        "node": "pi32-node", "kubeconfig": "/etc/cni/net.d/pycni-kubeconfig", "etcd": ""}
    kc_path = node.net / "pycni-kubeconfig"
    assert kc_path.stat().st_mode & 0o777 == 0o600
    kc = node.kubeconfig()
    assert kc["current-context"] == "pycni-context"
    assert kc["clusters"][0]["cluster"]["server"] == "https://10.96.0.1:443"  # type: ignore[index]
    assert kc["users"][0]["user"]["token"] == "token-one"  # type: ignore[index]
    import base64

    ca = base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"])  # type: ignore[index]
    assert ca == (node.sa / "ca.crt").read_bytes()
    # the manifest lists every file written, with what was written
    manifest = json.loads((node.bin / MANIFEST_NAME).read_text())["files"]
    assert "/etc/cni/net.d/10-pycni.conflist" in manifest and f"/opt/cni/bin/{'bridge'}" in manifest
    # every executable answers VERSION (through Python: the input is one the sh front passes on)
    for name in ("bridge", "host-local", "portmap"):
        proc = subprocess.run([str(node.bin / name)], input=b'{"cniVersion": "0.4.0", "x": 1}',
                              env={"CNI_COMMAND": "VERSION", "PYCNI_SOCKET": "off"}, capture_output=True)
        assert proc.returncode == 0 and "supportedVersions" in json.loads(proc.stdout)


def test_rerun_with_nothing_changed_writes_nothing(node: Node) -> None:
    ok(node.run())
    before = node.files()
    out = ok(node.run())
    assert "0 file(s) written (all up to date)" in out
    assert node.files() == before  # same inodes, same mtimes: no file was replaced


def test_calico_environment_names(node: Node) -> None:
    (node.net / "10-calico.conflist").write_text("{}")
    text = node.template.read_text()
    env = node.env(CNI_NETWORK_CONFIG_FILE="", CNI_NETWORK_CONFIG=text, CNI_MTU="1400", KUBERNETES_NODE_NAME="n7",
                   CNI_CONF_NAME="05-pi32.conflist", CNI_OLD_CONF_NAME="10-calico.conflist",
                   SKIP_CNI_BINARIES="dhcp,tap", ETCD_ENDPOINTS="http://192.0.2.1:2379")
    ok(node.run(env=env))
    conf = json.loads((node.net / "05-pi32.conflist").read_text())
    assert conf["plugins"][0]["mtu"] == 1400
    assert conf["plugins"][0]["args"]["pycni"]["node"] == "n7"
    assert conf["plugins"][0]["args"]["pycni"]["etcd"] == "http://192.0.2.1:2379"
    assert not (node.net / "10-calico.conflist").exists()
    assert not (node.bin / "dhcp").exists() and not (node.bin / "tap").exists() and (node.bin / "bridge").exists()
    # UPDATE_CNI_BINARIES=false: an executable already there is left as it is
    (node.bin / "bridge").write_text((node.bin / "bridge").read_text() + "# local change\n")
    ok(node.run(env={**env, "UPDATE_CNI_BINARIES": "false"}))
    assert (node.bin / "bridge").read_text().endswith("# local change\n")
    ok(node.run(env=env))  # updated by default
    assert not (node.bin / "bridge").read_text().endswith("# local change\n")


def test_token_rotation_rewrites_the_kubeconfig(node: Node) -> None:
    proc = subprocess.Popen(node.command("--watch", "--watch-interval", "0.2"), env=node.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (node.net / "10-pycni.conflist").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        assert node.kubeconfig()["users"][0]["user"]["token"] == "token-one"  # type: ignore[index]
        (node.sa / "token").write_text("token-two\n")  # what the kubelet does when it rotates the projected token
        while node.kubeconfig()["users"][0]["user"]["token"] != "token-two":  # type: ignore[index]
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        assert (node.net / "pycni-kubeconfig").stat().st_mode & 0o777 == 0o600
        # the template changes: the conflist follows
        node.template.write_text(node.template.read_text().replace("__CNI_MTU__", "1380"))
        while json.loads((node.net / "10-pycni.conflist").read_text())["plugins"][0]["mtu"] != 1380:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_uninstall_removes_exactly_what_it_wrote(node: Node) -> None:
    (node.bin / "pi32-other").write_text("#!/bin/sh\n")
    (node.net / "99-other.conflist").write_text("{}")
    ok(node.run())
    (node.net / "pycni-kubeconfig").write_text("changed by someone else\n")  # no longer what it wrote
    out = ok(node.run("--uninstall"))
    assert "left /etc/cni/net.d/pycni-kubeconfig: changed since" in out
    assert sorted(p.name for p in node.bin.iterdir()) == ["pi32-other"]
    assert sorted(p.name for p in node.net.iterdir()) == ["99-other.conflist", "pycni-kubeconfig"]
    assert "nothing to remove" in ok(node.run("--uninstall"))


@pytest.mark.parametrize("template, problem", [
    ('{"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "bridge", "mtu": "__CNI_MTU__x"}]}',
     "plugin bridge: 'mtu' must be an integer"),
    ('{"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "pi32-nosuch"}]}',
     "failed to find plugin 'pi32-nosuch' in path ['/opt/cni/bin']"),
    ('{"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "bridge"', "invalid JSON"),
    ('{"cniVersion": "1.0.0", "name": "x", "plugins": []}', "'plugins' is empty"),
])
def test_bad_template_is_refused_and_nothing_written(node: Node, template: str, problem: str) -> None:
    node.template.write_text(template)
    line = refused(node.run())
    assert "does not render to a valid conflist; nothing written" in line and problem in line, line
    assert node.files() == {}


def test_foreign_binary_is_never_overwritten_without_force(node: Node) -> None:
    if not os.path.exists(GO_BRIDGE):
        pytest.fail(f"{GO_BRIDGE} (Debian's containernetworking-plugins, installed by scripts/setup --test) is missing")
    shutil.copy(GO_BRIDGE, node.bin / "bridge")
    go = (node.bin / "bridge").read_bytes()
    line = refused(node.run())
    assert "refusing to replace executables that pycni did not write" in line and "/opt/cni/bin/bridge" in line
    assert (node.bin / "bridge").read_bytes() == go and sorted(node.files()) == ["bin/bridge"]
    ok(node.run("--skip-binaries", "bridge"))  # left alone, the rest installed; the conflist uses Go's bridge
    assert (node.bin / "bridge").read_bytes() == go and (node.net / "10-pycni.conflist").exists()
    ok(node.run("--uninstall"))
    assert sorted(node.files()) == ["bin/bridge"]
    ok(node.run("--force"))
    from pycni.shim import shim_type

    assert shim_type(str(node.bin / "bridge")) == "bridge"


def test_systemd_units_written_enabled_and_removed(node: Node) -> None:
    ok(node.run("--systemd", "--etcd-endpoints", "http://192.0.2.1:2379", "--underlay-ip", "192.0.2.11",
                "--node-name", "pi32-node"))
    units = node.units
    for name in ("pycni.socket", "pycni.service", "pycni-node.service"):
        assert (units / name).is_file()
    assert os.readlink(units / "sockets.target.wants" / "pycni.socket") == "../pycni.socket"
    assert os.readlink(units / "multi-user.target.wants" / "pycni.service") == "../pycni.service"
    assert os.readlink(units / "multi-user.target.wants" / "pycni-node.service") == "../pycni-node.service"
    assert "ListenStream=/run/pycni/pycni.sock" in (units / "pycni.socket").read_text()
    node_unit = (units / "pycni-node.service").read_text()
    assert f"ExecStart={sys.executable} -m pycni node --etcd-endpoints http://192.0.2.1:2379 --underlay-ip " \
           "192.0.2.11 --node-name pi32-node" in node_unit
    analyze = shutil.which("systemd-analyze")
    if analyze:
        proc = subprocess.run([analyze, "verify", "--man=no", *(str(units / n) for n in
                               ("pycni.socket", "pycni.service", "pycni-node.service"))],
                              capture_output=True, text=True, env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    (units / "pi32-other.service").write_text("[Service]\nExecStart=/bin/true\n")
    ok(node.run("--uninstall"))
    left = sorted(str(p.relative_to(units)) for p in units.rglob("*"))
    assert left == ["multi-user.target.wants", "pi32-other.service", "sockets.target.wants"] or \
        left == ["pi32-other.service"]


@needs_privileges
def test_installed_executables_take_the_daemon_path_and_fall_back(node: Node, tmp_path: Path) -> None:
    """The executables install-cni writes are served by a running daemon and still work without one."""
    sock = str(tmp_path / "d.sock")
    assert f"no pycni daemon listens on {sock} yet: plugin calls run one-shot" in ok(node.run("--socket", sock))
    ns = new_namespace(PREFIX)
    try:
        conf = json.dumps({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}).encode()
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "pi32", "CNI_NETNS": ns.path, "CNI_IFNAME": "lo",
               "CNI_PATH": str(node.bin), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        daemon = DaemonProc(sock, tmp_path / "d.log", "--debug", "--workers", "1").ready()
        try:
            assert f"a pycni daemon listens on {sock}: plugin calls take the daemon path" in \
                ok(node.run("--socket", sock))
            proc = subprocess.run([str(node.bin / "loopback")], input=conf, env=env, capture_output=True)
            assert proc.returncode == 0, proc
            deadline = time.monotonic() + 30
            while "loopback" not in (tmp_path / "d.log").read_text():  # the daemon served it
                assert time.monotonic() < deadline, (tmp_path / "d.log").read_text()
                time.sleep(0.1)
        finally:
            daemon.terminate()
            daemon.reap()
        served = (tmp_path / "d.log").read_text().count("loopback")
        proc = subprocess.run([str(node.bin / "loopback")], input=conf, env={**env, "CNI_COMMAND": "DEL"},
                              capture_output=True)
        assert proc.returncode == 0, proc  # one-shot, the daemon being down
        assert (tmp_path / "d.log").read_text().count("loopback") == served
    finally:
        ns.delete()


@pytest.mark.skipif(not etcd_available(), reason="needs etcd")
def test_conflist_waits_for_the_node_agent(node: Node) -> None:
    """--wait-for-agent: no conflist until this node's `pycni node` has registered in etcd."""
    with EtcdCluster(size=1, subnet="10.232.32.0/24", prefix=PREFIX) as cluster:
        assert cluster.underlay is not None
        endpoints = ",".join(cluster.endpoints)
        args = ("--wait-for-agent", "--wait-timeout", "90", "--etcd-endpoints", endpoints, "--etcd-prefix", "/pi32")
        inst = subprocess.Popen(node.command(*args, netns=cluster.underlay), env=node.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        agent: subprocess.Popen[str] | None = None
        try:
            deadline = time.monotonic() + 60
            while not (node.bin / "bridge").exists():
                assert inst.poll() is None and time.monotonic() < deadline, inst.communicate()
                time.sleep(0.1)
            time.sleep(1.5)
            assert inst.poll() is None and not (node.net / "10-pycni.conflist").exists()
            n1 = cluster.nodes[0]
            agent = subprocess.Popen(["ip", "netns", "exec", n1.ns.name, sys.executable, "-m", "pycni", "node",
                                      "--etcd-endpoints", endpoints, "--etcd-prefix", "/pi32", "--node-name",
                                      "pi32-node", "--underlay-ip", n1.ip, "--flows-socket", ""],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert inst.wait(90) == 0, inst.communicate()
            assert (node.net / "10-pycni.conflist").exists()
            with cluster.client(timeout=5) as etcd:
                kv = etcd.get("/pi32/nodes/pi32-node")
                assert kv is not None and kv.lease  # what it waited for
        finally:
            for p in (inst, agent):
                if p is not None and p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()


def test_unreachable_etcd_is_try_again_and_no_conflist(node: Node) -> None:
    ns = new_namespace(PREFIX)  # nothing listens there
    try:
        line = refused(node.run("--wait-for-agent", "--wait-timeout", "2", "--etcd-endpoints",
                                "http://127.0.0.1:2379", netns=ns))
        assert "(code 11)" in line and "no conflist written" in line, line
        assert not (node.net / "10-pycni.conflist").exists()
    finally:
        ns.delete()


def test_install_cni_writes_what_install_plugins_writes(tmp_path: Path) -> None:
    """Byte for byte the executables (and forwarder) of `pycni install-plugins`: the path the CRI
    benchmark measures for the daemon and one-shot variants is the one install-cni installs."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    plugins = subprocess.run([sys.executable, "-m", "pycni", "install-plugins", "--dir", str(tmp_path / "a")],
                             env=env, capture_output=True, text=True, timeout=120)
    assert plugins.returncode == 0, plugins.stderr
    assert "no pycni daemon listens on /run/pycni/pycni.sock yet" in plugins.stderr or \
        "a pycni daemon listens on /run/pycni/pycni.sock" in plugins.stderr
    ok(subprocess.run([sys.executable, "-m", "pycni", "install-cni", "--bin-dir", str(tmp_path / "b"), "--net-dir",
                       str(tmp_path / "net"), "--service-account-dir", str(tmp_path / "none")],
                      env=env, capture_output=True, text=True, timeout=120))
    a = {p.name: p.read_bytes().replace(str(tmp_path / "a").encode(), b"DIR") for p in (tmp_path / "a").iterdir()}
    b = {p.name: p.read_bytes().replace(str(tmp_path / "b").encode(), b"DIR") for p in (tmp_path / "b").iterdir()
         if p.name != MANIFEST_NAME}
    assert a == b


def test_lib_dir_for_a_host_python_and_its_removal(node: Node) -> None:
    """--lib-dir: the package copied for another interpreter (the host's, in a DaemonSet), which the
    executables then run; --uninstall takes the copy away with the rest."""
    python = "/usr/bin/python3"
    if subprocess.run([python, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]).returncode != 0:
        pytest.fail(f"{python} 3.11 or newer is needed (Debian's python3)")
    lib = node.root / "lib"
    ok(node.run("--lib-dir", str(lib), "--python", python))
    assert (lib / "pycni" / "shim.py").read_bytes() == Path(__import__("pycni.shim").shim.__file__).read_bytes()
    text = (node.bin / "bridge").read_text()
    assert f"py='{python}'" in text and f"sys.path[:0] = ['{lib}']" in text
    ok(node.run("--lib-dir", str(lib), "--uninstall"))
    assert not lib.exists() or list(lib.iterdir()) == []


def test_executables_failing_version_are_put_back(node: Node) -> None:
    ok(node.run())
    before = {k: v[2] for k, v in node.files().items()}
    fake = node.root / "broken-python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    line = refused(node.run("--lib-dir", str(node.root / "lib"), "--python", str(fake)))
    assert "installed executables fail VERSION; what was there is put back" in line and "(code 5)" in line, line
    assert {k: v[2] for k, v in node.files().items()} == before
    assert not list((node.root / "lib").rglob("*.py"))


def test_wait_for_agent_without_etcd_is_refused_before_anything(node: Node) -> None:
    env = node.env()
    env.pop("PYCNI_ETCD_ENDPOINTS", None)
    line = refused(node.run("--wait-for-agent", env=env))
    assert "--etcd-endpoints is required" in line and "(code 7)" in line, line
    assert node.files() == {}
