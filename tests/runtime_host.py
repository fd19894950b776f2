"""A throwaway host for real container runtimes (podman, containerd) in tests and benchmarks.

:class:`RuntimeHost` starts a reaper as PID 1 of a new PID namespace, in a private mount
namespace, inside a throwaway network namespace that plays the host. In that mount namespace
scratch directories replace the paths runtimes and CNI use (/etc/cni/net.d, /opt/cni/bin,
/var/lib/cni, /run, /etc/containers, /var/lib/containers, /var/lib/containerd), so the
machine's own network, CNI config, plugins and state stay untouched. Every command runs with
``nsenter`` into all three namespaces; :meth:`RuntimeHost.close` kills PID 1, and the kernel
kills everything else in the PID namespace with it (podman, conmon, containerd, its shims,
runc, the containers), whether the test passed or not.

The image is a busybox-static rootfs (no registry is reachable): :func:`busybox_rootfs`
writes it once per session; ``podman import`` loads it, ``podman save`` + ``ctr images
import`` hands it to containerd.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from netns_util import Namespace, have_root, new_namespace

IMAGE = "localhost/pycni-busybox:test"
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Paths bound to scratch directories in the private mount namespace. /opt and /var/lib are
# overlays (their contents stay visible, writes go to scratch: /opt/cni and /var/lib/cni need
# not exist on the machine); the rest are empty scratch directories mounted over them.
OVERLAID = ("/opt", "/var/lib")
REPLACED = ("/etc/cni/net.d", "/etc/containers", "/etc/containerd", "/var/lib/containers",
            "/var/lib/containerd", "/opt/cni/bin", "/var/lib/cni")

CONTAINERS_CONF = """\
[containers]
# no CAP_SYS_RESOURCE here: raising RLIMIT_NOFILE would fail
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
# crun refuses hybrid cgroup hierarchies
runtime = "runc"

[network]
network_backend = "cni"
cni_plugin_dirs = ["/opt/cni/bin"]
network_config_dir = "/etc/cni/net.d"
"""

STORAGE_CONF = """\
[storage]
driver = "%(driver)s"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
"""

# containerd's CRI plugin as kubeadm's nodes run it, fitted to this host: the sandbox ("pause")
# image is a local one (no registry), runc on cgroupfs (no systemd here), and
# restrict_oom_score_adj because root lacks CAP_SYS_RESOURCE (runc could not set a sandbox's -998)
CRI_CONFIG = """\
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%(sandbox_image)s"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  disable_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "%(snapshotter)s"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
"""
DAEMON_PID = "/run/pycni-daemon.pid"
CRI_NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps its images and sandboxes in

POLICY = {"default": [{"type": "insecureAcceptAnything"}]}

# The shell that becomes the new namespaces' first process: mounts, then the reaper.
INIT = r"""
set -eu
S=$1
for d in opt varlib; do mkdir -p "$S/overlay/$d/upper" "$S/overlay/$d/work"; done
mount -t overlay overlay -o "lowerdir=/opt,upperdir=$S/overlay/opt/upper,workdir=$S/overlay/opt/work" /opt
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$S/overlay/varlib/upper,workdir=$S/overlay/varlib/work" /var/lib
for p in %(replaced)s; do
  mkdir -p "$p" "$S/fs$p"
  mount --bind "$S/fs$p" "$p"
done
mount -t tmpfs -o mode=755 tmpfs /run
# a sysfs of this network namespace, the machine's cgroup hierarchies kept under it
mkdir -p "$S/cgroup"
mount --rbind /sys/fs/cgroup "$S/cgroup"
mount -t sysfs sysfs /sys
mount --move "$S/cgroup" /sys/fs/cgroup
mkdir -p /run/netns
echo ok > "$S/ready"
exec "$2" -c '
import os, time
while True:  # PID 1 of the namespace: reap orphans (conmon, shims) so their PIDs do not linger
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
'
"""

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec: the host's ``unshare`` gets SIGKILL if the test process dies first."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def fs_type(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it)."""
    best, kind = "", ""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mount_point, fstype = fields[4], fields[fields.index("-") + 1]
            if (target == mount_point or target.startswith(mount_point.rstrip("/") + "/")) \
                    and len(mount_point) >= len(best):
                best, kind = mount_point, fstype
    return kind


def missing(*binaries: str) -> list[str]:
    return [b for b in binaries if shutil.which(b, path=PATH_ENV) is None]


def need(*binaries: str) -> None:
    """Skip the test, saying why, unless it runs as root and every runtime binary is installed."""
    import pytest

    if not have_root():
        pytest.skip("real runtimes need root")
    absent = missing(*binaries)
    if absent:
        reason = f"runtime binaries not installed: {', '.join(absent)} (bash scripts/setup --test installs them)"
        print(f"SKIP: {reason}", file=sys.stderr)
        pytest.skip(reason)


def busybox_rootfs(dest: Path) -> Path:
    """Write a tarball of a minimal rootfs: busybox-static and its applets, a page under /www."""
    busybox = shutil.which("busybox", path=PATH_ENV)
    if busybox is None:
        raise FileNotFoundError("busybox (Debian package busybox-static) is not installed")
    root = dest / "rootfs"
    for d in ("bin", "etc", "proc", "sys", "dev", "tmp", "www", "root"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "www" / "index.html").write_text("pycni\n")
    tar = dest / "busybox-rootfs.tar"
    with tarfile.open(tar, "w") as t:
        for entry in sorted(root.iterdir()):
            t.add(entry, arcname=entry.name)
    return tar


class RuntimeHost:
    """One throwaway host (network + mount + PID namespaces) where runtimes run."""

    def __init__(self, scratch: Path, python: str = "/usr/bin/python3") -> None:
        self.scratch = scratch
        self.ns: Namespace = new_namespace()
        self._unshare: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.containerd: str | None = None  # address, once started
        self.ctr_namespace = f"pycni-{self.ns.name.rsplit('-', 1)[-1]}"
        # image layers are overlay mounts unless the scratch dir is itself on overlayfs (a
        # containerised CI): then podman copies layers (vfs) and containerd too (native)
        self.overlay_ok = fs_type(scratch) != "overlay"
        self.snapshotter = "overlayfs" if self.overlay_ok else "native"
        try:
            self._start(python)
        except BaseException:
            self.close()
            raise

    def _start(self, python: str) -> None:
        init = self.scratch / "init.sh"
        init.write_text(INIT % {"replaced": " ".join(REPLACED)})
        log = open(self.scratch / "init.log", "wb")
        with log:
            self._unshare = subprocess.Popen(
                ["nsenter", f"--net={self.ns.path}", "unshare", "--mount", "--pid", "--fork", "--mount-proc",
                 "--kill-child", "sh", str(init), str(self.scratch), python],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        ready = self.scratch / "ready"
        deadline = time.monotonic() + 20
        while not ready.exists():
            if self._unshare.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"runtime host did not start: {(self.scratch / 'init.log').read_text()}")
            time.sleep(0.02)
        # nsenter exec'd unshare; unshare's only child is the namespaces' PID 1
        children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children").read_text().split()
        self.pid = int(children[0])
        etc = self.scratch / "fs" / "etc" / "containers"
        (etc / "containers.conf").write_text(CONTAINERS_CONF)
        (etc / "storage.conf").write_text(STORAGE_CONF % {"driver": "overlay" if self.overlay_ok else "vfs"})
        (etc / "policy.json").write_text(json.dumps(POLICY))
        (etc / "registries.conf").write_text("unqualified-search-registries = []\n")

    # ---- running things ----------------------------------------------------------------------

    def argv(self, cmd: Sequence[str]) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "-p", "--", *cmd]

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"PATH": PATH_ENV, "HOME": "/root", **(extra or {})}

    def run(self, cmd: Sequence[str], check: bool = True, input: str | None = None,
            env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a command on this host (its network, mounts and PID namespace)."""
        proc = subprocess.run(self.argv(cmd), input=input, env=self.env(env), capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} on the runtime host failed ({proc.returncode}):\n"
                                 f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def popen(self, cmd: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a long-running process on this host; it dies with the host."""
        with open(log, "ab") as out:
            return subprocess.Popen(self.argv(cmd), env=self.env(env), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)

    def sh(self, script: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        return self.run(["sh", "-c", script], check=check, env=env).stdout

    def path(self, inside: str) -> Path:
        """Where a path bound to scratch (one of REPLACED) lives as seen from outside."""
        for p in REPLACED:
            if inside == p or inside.startswith(p + "/"):
                return self.scratch / "fs" / inside.lstrip("/")
        raise ValueError(f"{inside} is not a scratch path")

    # ---- CNI plugins ---------------------------------------------------------------------------

    def install_ours(self, pycni: str, plugin_dir: str = "/opt/cni/bin") -> None:
        """Replace the plugins in ``plugin_dir`` by ours (``pycni install-plugins``)."""
        self.sh(f"rm -rf {plugin_dir}/* && {pycni} install-plugins --dir {plugin_dir} >/dev/null")

    def install_go(self, go_dir: str = "/usr/lib/cni", plugin_dir: str = "/opt/cni/bin") -> None:
        """Replace the plugins in ``plugin_dir`` by the Go reference plugins."""
        self.sh(f"rm -rf {plugin_dir}/* && cp -a {go_dir}/. {plugin_dir}/")

    def start_pycni_daemon(self, pycni: str, *args: str) -> None:
        """``pycni daemon`` on its default socket (this host's /run/pycni/pycni.sock), in this
        host's PID namespace so the peer credentials of its callers resolve."""
        self.popen(["sh", "-c", f"echo $$ > {DAEMON_PID}; exec {pycni} daemon {' '.join(args)}"],
                   self.scratch / "daemon.log")
        deadline = time.monotonic() + 30
        while self.run(["test", "-S", "/run/pycni/pycni.sock"], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"pycni daemon did not start: {(self.scratch / 'daemon.log').read_text()}")
            time.sleep(0.05)

    def stop_pycni_daemon(self) -> None:
        """SIGTERM to the daemon :meth:`start_pycni_daemon` started; back once its socket is gone."""
        self.sh(f"kill $(cat {DAEMON_PID}) && rm -f {DAEMON_PID} && for i in $(seq 300); do "
                "[ -S /run/pycni/pycni.sock ] || exit 0; sleep 0.1; done; exit 1")

    # ---- podman --------------------------------------------------------------------------------

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        return self.run(["podman", *args], check=check, timeout=timeout).stdout.strip()

    def podman_import(self, rootfs_tar: Path) -> None:
        self.podman("import", "--change", "CMD=/bin/sh", str(rootfs_tar), IMAGE)

    # ---- containerd ----------------------------------------------------------------------------

    def cri_config(self, sandbox_image: str) -> str:
        """A containerd config whose CRI plugin runs pods with ``sandbox_image`` (see CRI_CONFIG)."""
        return CRI_CONFIG % {"sandbox_image": sandbox_image, "snapshotter": self.snapshotter}

    def start_containerd(self, config: str | None = None) -> str:
        """containerd on a socket in this host's /run; its state in the scratch /var/lib.
        ``config`` (a config.toml's text, e.g. :meth:`cri_config`) goes to the scratch
        /etc/containerd; without it containerd runs on its defaults."""
        if self.containerd:
            return self.containerd
        address = "/run/containerd/containerd.sock"
        self.run(["mkdir", "-p", "/run/containerd"])
        cmd = ["containerd", "--root", "/var/lib/containerd", "--state", "/run/containerd", "--address", address]
        if config is not None:
            self.path("/etc/containerd/config.toml").write_text(config)
            cmd += ["--config", "/etc/containerd/config.toml"]
        self.popen(cmd, self.scratch / "containerd.log")
        deadline = time.monotonic() + 30
        while self.run(["ctr", "--address", address, "version"], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start: {(self.scratch / 'containerd.log').read_text()}")
            time.sleep(0.1)
        self.containerd = address
        return address

    def import_image(self, rootfs_tar: Path, image: str, cmd: Sequence[str], namespace: str = CRI_NAMESPACE) -> None:
        """Load the rootfs as ``image`` running ``cmd`` into containerd's ``namespace`` (the
        CRI's by default): ``podman import`` builds it, ``podman save`` + ``ctr images import``
        hand it over."""
        archive = self.scratch / f"{image.replace('/', '_').replace(':', '_')}.tar"
        self.podman("import", "--change", "CMD=" + json.dumps(list(cmd), separators=(",", ":")), str(rootfs_tar), image)
        self.podman("save", "-o", str(archive), image)
        self.run(["ctr", "--address", str(self.containerd), "--namespace", namespace, "images", "import",
                  "--snapshotter", self.snapshotter, str(archive)])

    def outside_path(self, inside: str) -> str:
        """A path of this host's mount namespace (its /run, say) as the test process can open it."""
        return f"/proc/{self.pid}/root{inside}"

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        assert self.containerd, "start_containerd() first"
        return self.run(self.ctr_argv(*args), check=check, timeout=timeout).stdout.strip()

    def ctr_argv(self, *args: str) -> list[str]:
        """A ctr command line for this host's containerd, namespace and snapshotter."""
        assert self.containerd, "start_containerd() first"
        if args[:2] == ("images", "import"):
            args = ("images", "import", "--snapshotter", self.snapshotter, *args[2:])
        elif args[:1] == ("run",):
            args = ("run", "--snapshotter", self.snapshotter, *args[1:])
        return ["ctr", "--address", self.containerd, "--namespace", self.ctr_namespace, *args]

    # ---- teardown ------------------------------------------------------------------------------

    def _cgroup_leftovers(self) -> list[str]:
        """Container IDs whose cgroups the runtimes may leave when killed mid-way."""
        ids: list[str] = []
        with contextlib.suppress(Exception):
            ids += self.run(["podman", "ps", "-aq", "--no-trunc"], check=False, timeout=30).stdout.split()
        return ids

    def close(self) -> None:
        """Stop everything: best-effort orderly removal first, then SIGKILL to PID 1."""
        ids: list[str] = []
        if self.pid:
            ids = self._cgroup_leftovers()
            with contextlib.suppress(Exception):
                self.run(["podman", "rm", "-af", "-t", "0"], check=False, timeout=60)
        if self._unshare is not None:
            self._unshare.kill()  # unshare ignores SIGTERM; --kill-child takes PID 1 with it
            self._unshare.wait()
        if self.pid:
            deadline = time.monotonic() + 10
            while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        self._remove_cgroups(ids)
        self.ns.delete()

    def _remove_cgroups(self, ids: list[str]) -> None:
        base = Path("/sys/fs/cgroup")
        for ctrl in base.iterdir() if base.is_dir() else []:
            dirs = [ctrl / self.ctr_namespace]
            for cid in ids:
                dirs += [ctrl / "libpod_parent" / f"libpod-{cid}", ctrl / "libpod_parent" / f"libpod-conmon-{cid}"]
            for d in dirs:
                if d.is_dir():
                    for sub in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                        if sub.is_dir():
                            with contextlib.suppress(OSError):
                                sub.rmdir()
                    with contextlib.suppress(OSError):
                        d.rmdir()

    def __enter__(self) -> RuntimeHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_outside(host: RuntimeHost, outside: Namespace, host_ip: str = "192.0.2.1",
                    outside_ip: str = "192.0.2.2") -> None:
    """A veth between the runtime host and an "outside" namespace, a /24 between them."""
    peer = "out0"
    # made from outside: the host's /run (where netns files live) is private to it
    outside.run(["ip", "link", "add", peer, "type", "veth", "peer", "name", "uplink0", "netns", host.ns.path])
    host.run(["ip", "addr", "add", f"{host_ip}/24", "dev", "uplink0"])
    host.run(["ip", "link", "set", "uplink0", "up"])
    outside.run(["ip", "addr", "add", f"{outside_ip}/24", "dev", peer])
    outside.run(["ip", "link", "set", peer, "up"])
    outside.run(["ip", "route", "add", "default", "via", host_ip])
    host.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
