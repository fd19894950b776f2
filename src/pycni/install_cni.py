"""``pycni install-cni``: put pycni on a node, keep its files current, take them away again.

What Calico's install-cni does for a DaemonSet's init container, with its environment names so
existing manifests carry over (flags win over the environment):

- the plugin executables (:mod:`pycni.shim`'s format, daemon path by default: a running ``pycni
  daemon`` serves every call, one-shot in-process when it is down) written into the bin dir
  atomically, identical ones skipped, a foreign file of the same name (a Go plugin) never replaced
  without ``--force``, each checked by running VERSION through its interpreter;
- optionally the pycni package itself copied to ``--lib-dir`` (a host that has Python but not
  pycni: the DaemonSet's case), the executables then importing it from there;
- the conflist rendered from a template (Calico's ``__PLACEHOLDERS__``, replaced as plain text),
  checked by our own parsers (the runtime's, then each of our plugins' ``parse_conf``) before an
  atomic write; a template that does not render to a valid conflist is refused, nothing written;
- a kubeconfig (mode 0600) from the pod's service account, rewritten when the token rotates;
- with ``--systemd``, units for ``pycni daemon`` (socket-activated) and ``pycni node``.

Every file it writes is listed, with the SHA-256 of what it wrote, in a manifest in the bin dir
(:data:`MANIFEST_NAME`): ``--uninstall`` removes exactly those files still holding what it wrote,
and nothing else. Writing the conflist is what lets the runtime start pods on the node, so it can
wait (``--wait-for-agent``) until the node agent's registration is live in etcd.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time

from pycni import statefile
from pycni.daemon.protocol import DEFAULT_SOCKET
from pycni.spec.errors import INVALID_ENV, IO_FAILURE, TRY_AGAIN, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's (see pycni.record)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import Any

    from pycni.cluster.settings import EtcdSettings

DEFAULT_BIN_DIR = "/opt/cni/bin"
DEFAULT_NET_DIR = "/etc/cni/net.d"
DEFAULT_CONF_NAME = "10-pycni.conflist"
DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
DEFAULT_MTU = 1500  # Calico's CNI_MTU default
KUBECONFIG_NAME = "pycni-kubeconfig"
# In the bin dir: runtimes look there only for plugins by name, and libcni would read a .json in net.d.
MANIFEST_NAME = ".pycni-install-cni.json"
WATCH_INTERVAL = 5.0
WAIT_INTERVAL = 1.0

# Calico's placeholders, replaced as plain text (no template language: a value is never re-read).
PLACEHOLDERS = ("__KUBERNETES_NODE_NAME__", "__CNI_MTU__", "__KUBECONFIG_FILEPATH__", "__ETCD_ENDPOINTS__",
                "__ETCD_CA_CERT_FILE__", "__ETCD_CERT_FILE__", "__ETCD_KEY_FILE__")


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise CNIError(INVALID_ENV, f"invalid {name}={env[name]!r}", "use true or false")


def add_arguments(sp: argparse.ArgumentParser) -> None:
    """The flags of ``pycni install-cni`` (defaults from Calico's environment names)."""
    env = os.environ
    from pycni.cluster.settings import add_etcd_arguments

    sp.add_argument("--bin-dir", default=DEFAULT_BIN_DIR, help=f"CNI bin dir (default {DEFAULT_BIN_DIR})")
    sp.add_argument("--net-dir", default=env.get("CNI_NET_DIR") or DEFAULT_NET_DIR,
                    help=f"CNI config dir (default: $CNI_NET_DIR or {DEFAULT_NET_DIR})")
    sp.add_argument("--template", metavar="FILE", default=env.get("CNI_NETWORK_CONFIG_FILE", ""),
                    help="conflist template (default: $CNI_NETWORK_CONFIG_FILE, else the text in $CNI_NETWORK_CONFIG; "
                    "with neither, no conflist is written)")
    sp.add_argument("--conf-name", default=env.get("CNI_CONF_NAME") or DEFAULT_CONF_NAME,
                    help=f"the conflist's file name (default: $CNI_CONF_NAME or {DEFAULT_CONF_NAME})")
    sp.add_argument("--old-conf-name", default=env.get("CNI_OLD_CONF_NAME", ""),
                    help="a config file to remove from the config dir (default: $CNI_OLD_CONF_NAME)")
    sp.add_argument("--node-name", default=env.get("KUBERNETES_NODE_NAME", ""),
                    help="this node's name (default: $KUBERNETES_NODE_NAME, else the host name)")
    sp.add_argument("--mtu", default=env.get("CNI_MTU") or str(DEFAULT_MTU),
                    help=f"__CNI_MTU__ (default: $CNI_MTU or {DEFAULT_MTU})")
    sp.add_argument("--skip-binaries", default=env.get("SKIP_CNI_BINARIES", ""),
                    help="plugin types not to install, comma-separated (default: $SKIP_CNI_BINARIES)")
    sp.add_argument("--no-update-binaries", action="store_true",
                    default=not _env_bool(env, "UPDATE_CNI_BINARIES", True),
                    help="write missing executables only, never replace one (UPDATE_CNI_BINARIES=false)")
    sp.add_argument("--force", action="store_true",
                    help="replace executables pycni did not write (e.g. the Go plugins); refused otherwise")
    sp.add_argument("--python", default="",
                    help="the interpreter the executables run (default: this one; it must import pycni)")
    sp.add_argument("--lib-dir", default="",
                    help="copy the pycni package here and have the executables import it from here (a host "
                    "without pycni installed: the DaemonSet's case)")
    sp.add_argument("--socket", default="", metavar="PATH",
                    help=f"the daemon's socket baked into the executables (default {DEFAULT_SOCKET})")
    fwd = sp.add_mutually_exclusive_group()
    fwd.add_argument("--no-forwarder", action="store_true", help="do not install the native forwarder")
    fwd.add_argument("--forwarder", default="", metavar="FILE",
                     help="install this prebuilt native forwarder (an image's, built static) instead of compiling one")
    sp.add_argument("--service-account-dir", default=DEFAULT_SA_DIR,
                    help=f"token and ca.crt for the kubeconfig (default {DEFAULT_SA_DIR}); with "
                    "$KUBERNETES_SERVICE_HOST/PORT")
    sp.add_argument("--kubeconfig-out", default="",
                    help=f"where the kubeconfig goes (default: NETDIR/{KUBECONFIG_NAME}); written only when the "
                    "service account has a token and $KUBERNETES_SERVICE_HOST is set")
    sp.add_argument("--watch", action="store_true", default=_env_bool(env, "SLEEP", False),
                    help="keep running (SLEEP=true): rewrite the kubeconfig when the token rotates and the conflist "
                    "when the template changes; SIGTERM stops it")
    sp.add_argument("--watch-interval", type=float, default=WATCH_INTERVAL,
                    help=f"seconds between two looks at the token and the template (default {WATCH_INTERVAL:g})")
    sp.add_argument("--wait-for-agent", action="store_true",
                    help="write the conflist only once this node's `pycni node` registration is live in etcd")
    sp.add_argument("--wait-timeout", type=float, default=0.0,
                    help="give up waiting for the agent after this many seconds (code 11; default: wait forever)")
    sp.add_argument("--systemd", action="store_true",
                    help="also write and enable systemd units for `pycni daemon` (socket-activated) and `pycni node`")
    sp.add_argument("--unit-dir", default=DEFAULT_UNIT_DIR, help=f"where units go (default {DEFAULT_UNIT_DIR})")
    sp.add_argument("--underlay-ip", default="", help="for the pycni-node unit: `pycni node --underlay-ip`")
    sp.add_argument("--uninstall", action="store_true",
                    help="remove exactly what install-cni wrote (its manifest), nothing else")
    add_etcd_arguments(sp)


# ---- files written and recorded ------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


class Manifest:
    """What install-cni wrote: path -> SHA-256 of its content (or ``link:TARGET`` for a symlink)."""

    def __init__(self, path: str) -> None:
        self.path = path
        raw = statefile.read_json(path)
        self.files: dict[str, str] = dict(raw.get("files", {})) if isinstance(raw, dict) else {}
        self.changed = False

    def record(self, path: str, digest: str) -> None:
        if self.files.get(path) != digest:
            self.files[path] = digest
            self.changed = True

    def save(self) -> None:
        if self.changed:
            statefile.write_json(self.path, {"files": dict(sorted(self.files.items()))}, mode=0o644, dir_mode=0o755,
                                 indent=1, failure="cannot write install-cni's manifest")
            self.changed = False


class Installer:
    """One node's installation: the settings from flags and environment, and what it did."""

    def __init__(self, ns: argparse.Namespace, env: Mapping[str, str], out: Any = None) -> None:
        import socket

        self.ns = ns
        self.env = env
        self.out = out or sys.stdout
        self.bin_dir = os.path.abspath(ns.bin_dir)
        self.net_dir = os.path.abspath(ns.net_dir)
        self.conf_path = os.path.join(self.net_dir, ns.conf_name)
        self.kubeconfig = os.path.abspath(ns.kubeconfig_out or os.path.join(self.net_dir, KUBECONFIG_NAME))
        self.node_name = ns.node_name or socket.gethostname()
        self.manifest = Manifest(os.path.join(self.bin_dir, MANIFEST_NAME))
        self.written: list[str] = []
        self.stopping = False
        self.plan: dict[str, bytes] = {}
        self.rendered: str | None = None  # the template text of the conflist written
        # what this run replaced: path -> (content before or None, its mode, its manifest digest or None)
        self.undo: dict[str, tuple[bytes | None, int, str | None]] = {}
        self.forwarder: str | None = None
        self.said_no_token = False
        for name in (ns.conf_name, ns.old_conf_name):
            if name and (os.sep in name or name in (".", "..")):
                raise invalid_config("invalid config file name", f"{name!r}: a file name, not a path")
        try:
            mtu = int(ns.mtu)
        except ValueError:
            mtu = 0
        if not 68 <= mtu <= 65535:
            raise invalid_config(f"invalid --mtu / CNI_MTU {ns.mtu!r}", "an integer from 68 to 65535")
        self.mtu = mtu

    def say(self, line: str) -> None:
        self.out.write(f"install-cni: {line}\n")
        self.out.flush()

    def write(self, path: str, data: bytes, mode: int, what: str) -> bool:
        """``data`` to ``path`` atomically unless it already holds exactly that; recorded either way
        when it is ours (written now or before)."""
        current = _read(path)
        digest = _sha(data)
        if current == data and os.stat(path).st_mode & 0o7777 == mode:
            if path in self.manifest.files:
                self.manifest.record(path, digest)
            return False
        if path not in self.undo:
            self.undo[path] = (current, os.stat(path).st_mode & 0o7777 if current is not None else 0,
                               self.manifest.files.get(path))
        statefile.write_bytes(path, data, mode=mode, dir_mode=0o755, failure=f"cannot write {what}")
        self.manifest.record(path, digest)
        self.manifest.save()  # at once: an interrupted run still knows what it wrote
        self.written.append(path)
        self.say(f"wrote {path}")
        return True

    def rollback(self) -> None:
        """Every file this run wrote back as it was (a new one removed), the manifest with it."""
        for path, (data, mode, digest) in reversed(list(self.undo.items())):
            if data is None:
                statefile.remove(path)
            else:
                statefile.write_bytes(path, data, mode=mode, dir_mode=0o755, failure="cannot put back")
            if digest is None:
                self.manifest.files.pop(path, None)
            else:
                self.manifest.files[path] = digest
            self.manifest.changed = True
            self.say(f"put back {path}")
        self.undo.clear()
        if self.manifest.files:
            self.manifest.save()
        else:
            statefile.remove(self.manifest.path)

    # ---- the package and the executables --------------------------------------------------------

    def import_paths(self) -> list[str]:
        """What the executables import pycni from: ``--lib-dir`` when given, else this installation."""
        from pycni.install_plugins import import_paths

        return [os.path.abspath(self.ns.lib_dir)] if self.ns.lib_dir else import_paths()

    def copy_package(self) -> None:
        """The pycni package under ``--lib-dir`` (stdlib only: nothing else to copy)."""
        import pycni

        if not self.ns.lib_dir:
            return
        lib = os.path.abspath(self.ns.lib_dir)
        src = os.path.dirname(os.path.abspath(pycni.__file__))
        for root, dirs, files in os.walk(src):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(root, src)
            for name in sorted(files):
                if name.endswith((".pyc", ".so")) or name.startswith("."):
                    continue
                data = _read(os.path.join(root, name))
                if data is not None:
                    self.write(os.path.normpath(os.path.join(lib, "pycni", rel, name)), data, 0o644,
                               "the pycni package")

    def plan_binaries(self) -> dict[str, bytes]:
        """Plugin type -> the executable to write (all checks before anything is written): unknown
        skips, foreign files in the way, an interpreter that cannot import pycni."""
        from pycni.forwarder import NAME, compiler
        from pycni.install_plugins import checked_interpreter
        from pycni.plugins.registry import PLUGIN_MODULES
        from pycni.shim import shim_type

        skip = {s.strip() for s in self.ns.skip_binaries.split(",") if s.strip()}
        unknown = sorted(skip - set(PLUGIN_MODULES))
        if unknown:
            raise invalid_config("invalid --skip-binaries / SKIP_CNI_BINARIES", f"unknown plugin type(s) {unknown}; "
                                 f"available: {sorted(PLUGIN_MODULES)}")
        names = sorted(set(PLUGIN_MODULES) - skip)
        foreign = [p for n in names if os.path.lexists(p := os.path.join(self.bin_dir, n)) and shim_type(p) is None]
        if foreign and not self.ns.force:
            raise CNIError(IO_FAILURE, f"refusing to replace executables that pycni did not write in {self.bin_dir}",
                           f"{', '.join(foreign)} (another implementation's plugin?); nothing was written; move them "
                           "away, skip them (--skip-binaries), or pass --force to replace them")
        paths = self.import_paths()
        python = sys.executable
        if self.ns.python and not self.ns.lib_dir:
            try:
                python = checked_interpreter(self.ns.python, paths)
            except ValueError as e:
                raise invalid_config("cannot install plugins", str(e)) from None
        elif self.ns.python:  # the package is not in --lib-dir yet: VERSION checks the pair once it is
            python = self.ns.python
            if not os.path.isabs(python) or not os.access(python, os.X_OK):
                raise invalid_config("cannot install plugins", f"--python {python}: give the absolute path of an "
                                     "executable interpreter")
        if self.ns.forwarder and _read(self.ns.forwarder) is None:
            raise invalid_config("cannot read --forwarder", self.ns.forwarder)
        usable = self.ns.forwarder or compiler()
        self.forwarder = None if self.ns.no_forwarder or not usable else os.path.join(self.bin_dir, NAME)
        return self.texts(names, python, paths)

    def texts(self, names: list[str], python: str, paths: list[str]) -> dict[str, bytes]:
        """Plugin type -> its executable running ``python`` with ``paths``."""
        from pycni.install_plugins import executable_text
        from pycni.plugins.registry import PLUGIN_MODULES, load

        plan: dict[str, bytes] = {}
        for name in names:
            try:
                text = executable_text(name, PLUGIN_MODULES[name], load(name).versions, python=python, paths=paths,
                                       daemon=True, socket=self.ns.socket or None, forwarder=self.forwarder)
            except ValueError as e:
                raise invalid_config("cannot install plugins", str(e)) from None
            plan[name] = text.encode()
        return plan

    def install_binaries(self, plan: Mapping[str, bytes]) -> None:
        """The package, the forwarder and the executables written; each executable then answers
        VERSION through its interpreter, or the run fails before the conflist."""
        self.copy_package()
        if self.forwarder:
            self.install_forwarder()
        for name, data in plan.items():
            path = os.path.join(self.bin_dir, name)
            if self.ns.no_update_binaries and os.path.lexists(path):
                continue
            self.write(path, data, 0o755, "the plugin executables")
        bad = [f"{n}: {why}" for n in plan if (why := version_problem(os.path.join(self.bin_dir, n)))]
        if bad:
            self.rollback()
            raise CNIError(IO_FAILURE, "installed executables fail VERSION; what was there is put back, no "
                           "conflist written", "; ".join(bad))

    def install_forwarder(self) -> None:
        """The native forwarder beside the executables (built in a scratch dir, then written like any
        file: skipped when identical)."""
        import shutil
        import tempfile

        from pycni import forwarder

        if self.ns.forwarder:
            data = _read(self.ns.forwarder)
        else:
            scratch = tempfile.mkdtemp(prefix="pycni-forward-")
            try:
                built = forwarder.build(scratch)
                data = _read(built) if built else None
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        if data is None:
            self.say("the native forwarder did not build: the executables forward through Python")
            return
        self.write(os.path.join(self.bin_dir, forwarder.NAME), data, 0o755, "the native forwarder")

    # ---- the conflist -----------------------------------------------------------------------------

    def template(self) -> str | None:
        if self.ns.template:
            data = _read(self.ns.template)
            if data is None:
                raise invalid_config("cannot read the conflist template", f"{self.ns.template} (--template / "
                                     "CNI_NETWORK_CONFIG_FILE)")
            return data.decode("utf-8", "replace")
        return self.env.get("CNI_NETWORK_CONFIG") or None

    def tls_files(self) -> dict[str, tuple[str, str]]:
        """Placeholder -> (the etcd TLS file given, its copy under NETDIR/pycni-tls). The copies are
        what the conflist names: the plugins run on the host (one-shot), where a container's
        mounted Secret is not; Calico's install-cni copies them the same way."""
        e, ns = self.env, self.ns
        out = {}
        for placeholder, given, name in (
                ("__ETCD_CA_CERT_FILE__", ns.etcd_ca_cert or e.get("ETCD_CA_CERT_FILE", ""), "etcd-ca"),
                ("__ETCD_CERT_FILE__", ns.etcd_cert or e.get("ETCD_CERT_FILE", ""), "etcd-cert"),
                ("__ETCD_KEY_FILE__", ns.etcd_key or e.get("ETCD_KEY_FILE", ""), "etcd-key")):
            if given:
                out[placeholder] = (given, os.path.join(self.net_dir, "pycni-tls", name))
        return out

    def values(self, copies: bool = True) -> dict[str, str]:
        """Each placeholder's text. ``__ETCD_ENDPOINTS__`` joins several endpoints with ``", "``, so
        ``["__ETCD_ENDPOINTS__"]`` renders as a JSON list of them (one endpoint: Calico's string)."""
        e = self.env
        endpoints = self.ns.etcd_endpoints or e.get("ETCD_ENDPOINTS", "") or e.get("PYCNI_ETCD_ENDPOINTS", "")
        out = {"__KUBERNETES_NODE_NAME__": self.node_name, "__CNI_MTU__": str(self.mtu),
               "__KUBECONFIG_FILEPATH__": self.kubeconfig,
               "__ETCD_ENDPOINTS__": '", "'.join(x.strip() for x in endpoints.split(",") if x.strip()),
               "__ETCD_CA_CERT_FILE__": "", "__ETCD_CERT_FILE__": "", "__ETCD_KEY_FILE__": ""}
        for placeholder, (given, copy) in self.tls_files().items():
            out[placeholder] = copy if copies else given
        return out

    def install_tls(self, text: str) -> None:
        """The copies of the etcd TLS files the template names (mode 0600)."""
        for placeholder, (given, copy) in self.tls_files().items():
            if placeholder in text:
                data = _read(given)
                if data is None:
                    raise invalid_config("cannot read an etcd TLS file", f"{given} ({placeholder})")
                self.write(copy, data, 0o600, "the etcd TLS files")

    def substitute(self, text: str, copies: bool = True) -> str:
        for key, value in self.values(copies).items():
            text = text.replace(key, value)
        return text

    def render(self, text: str, plan: Mapping[str, bytes]) -> bytes:
        """The template with the placeholders replaced, refused (one line, nothing written) unless our
        parsers accept it as ``pycni validate`` would with the executables of ``plan`` installed: the
        runtime's conflist parser, every plugin found and speaking the version, our plugins' own
        config parsing. Run before anything is written (the plan's executables in a scratch dir)."""
        import shutil
        import tempfile

        from pycni.cli import _parse_with_ours
        from pycni.runtime import CNI
        from pycni.runtime.conf import conflist_from_bytes

        # Checked with the TLS files as given (their copies are not written yet), written with the copies.
        data = self.substitute(text, copies=True).encode()
        checked = self.substitute(text, copies=False).encode()
        where = self.ns.template or "$CNI_NETWORK_CONFIG"
        from pycni.install_plugins import import_paths

        scratch = tempfile.mkdtemp(prefix="pycni-install-check-")
        try:  # the plan's plugins as this process runs them (a --lib-dir copy is not written yet)
            for name, exe in self.texts(list(plan), sys.executable, import_paths()).items():
                with open(os.path.join(scratch, name), "wb") as f:
                    f.write(exe)
                os.chmod(os.path.join(scratch, name), 0o755)
            net = conflist_from_bytes(checked, self.conf_path)
            rt = CNI(conf_dir=self.net_dir, plugin_path=[scratch, self.bin_dir, *_extra_path(self.env)])
            rt.validate(net)
            errors, _ = _parse_with_ours(rt, net)
            if errors:
                raise errors[0]
        except CNIError as e:
            msg, details = (t.replace(f"'{scratch}', ", "") for t in (e.msg, e.details))  # the search path shown
            raise CNIError(e.code, f"the conflist template {where} does not render to a valid conflist; nothing "
                           f"written: {msg}", details) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return data

    def install_conflist(self, data: bytes) -> None:
        self.write(self.conf_path, data, 0o644, "the conflist")

    def remove_old_conf(self) -> None:
        name = self.ns.old_conf_name
        if name and name != self.ns.conf_name:
            path = os.path.join(self.net_dir, name)
            if statefile.remove(path):
                self.say(f"removed {path} (CNI_OLD_CONF_NAME)")

    # ---- the kubeconfig ---------------------------------------------------------------------------

    def kubeconfig_text(self) -> bytes | None:
        """A kubeconfig naming the API server, the CA and the token itself (YAML, through PyYAML);
        None when there is no service account or API address."""
        import base64

        import yaml

        host = self.env.get("KUBERNETES_SERVICE_HOST", "")
        token = _read(os.path.join(self.ns.service_account_dir, "token"))
        if not host or token is None:
            return None
        port = self.env.get("KUBERNETES_SERVICE_PORT", "") or "443"
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        ca = _read(os.path.join(self.ns.service_account_dir, "ca.crt"))
        cluster: dict[str, Any] = {"server": server}
        if ca is not None:
            cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
        else:
            cluster["insecure-skip-tls-verify"] = True
        obj = {"apiVersion": "v1", "kind": "Config",
               "clusters": [{"name": "local", "cluster": cluster}],
               "users": [{"name": "pycni", "user": {"token": token.decode("utf-8", "replace").strip()}}],
               "contexts": [{"name": "pycni-context", "context": {"cluster": "local", "user": "pycni"}}],
               "current-context": "pycni-context"}
        return yaml.safe_dump(obj, sort_keys=False).encode()

    def install_kubeconfig(self) -> None:
        data = self.kubeconfig_text()
        if data is not None:
            self.write(self.kubeconfig, data, 0o600, "the kubeconfig")
        elif self.env.get("KUBERNETES_SERVICE_HOST") and not self.stopping and not self.said_no_token:
            self.said_no_token = True
            self.say(f"no kubeconfig: no token in {self.ns.service_account_dir}")

    # ---- systemd ----------------------------------------------------------------------------------

    def install_units(self) -> None:
        from pycni import systemd_units

        units = systemd_units.units(sys.executable, self.ns, self.ns.socket or "")
        unit_dir = os.path.abspath(self.ns.unit_dir)
        for name, text in units.items():
            self.write(os.path.join(unit_dir, name), text.encode(), 0o644, "the systemd units")
        if systemd_units.NODE not in units:
            self.say(f"{systemd_units.NODE} not written: give --etcd-endpoints and --underlay-ip for the node agent")
        for name in units:
            link = os.path.join(unit_dir, systemd_units.WANTED_BY[name] + ".wants", name)
            target = os.path.join("..", name)
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            os.makedirs(os.path.dirname(link), mode=0o755, exist_ok=True)
            tmp = f"{link}.tmp{os.getpid()}"
            statefile.remove(tmp)
            os.symlink(target, tmp)
            os.replace(tmp, link)
            self.manifest.record(link, "link:" + target)
            self.manifest.save()
            self.written.append(link)
            self.say(f"enabled {name} ({link})")
        if systemd_units.running():
            systemd_units.systemctl("daemon-reload")
            systemd_units.systemctl("start", *units)
            self.say(f"started {', '.join(units)}")
        else:
            self.say("systemd is not running here: the units start at the next boot")

    # ---- the agent --------------------------------------------------------------------------------

    def etcd_settings(self) -> EtcdSettings:
        """The etcd flags (``ETCD_ENDPOINTS``, Calico's, when --etcd-endpoints and
        PYCNI_ETCD_ENDPOINTS are unset); code 7 naming the flag for anything wrong."""
        from pycni.cluster.settings import etcd_settings_from_args

        if not self.ns.etcd_endpoints:
            self.ns.etcd_endpoints = self.env.get("ETCD_ENDPOINTS", "")
        return etcd_settings_from_args(self.ns)

    def wait_for_agent(self) -> None:
        """Until ``P/nodes/<node>`` exists bound to a live lease (what ``pycni node`` keeps while it
        runs); code 11 when --wait-timeout passes first (etcd unreachable, or no agent)."""
        from pycni.cluster.etcd import EtcdError
        from pycni.cluster.model import Keys
        from pycni.cluster.settings import client

        settings = self.etcd_settings()
        key = Keys(settings.prefix).node(self.node_name)
        deadline = time.monotonic() + self.ns.wait_timeout if self.ns.wait_timeout > 0 else None
        said = ""
        while not self.stopping:
            why = ""
            try:
                with client(settings, one_shot=True) as etcd:
                    kv = etcd.get(key)
                    if kv is not None and kv.lease:  # a key bound to a lease lives only as long as it
                        self.say(f"node agent registered ({key})")
                        return
                    why = "no live registration yet"
            except (EtcdError, CNIError, OSError) as e:
                why = f"etcd: {e}"
            if why != said:
                self.say(f"waiting for the node agent of {self.node_name} ({key}): {why}")
                said = why
            if deadline is not None and time.monotonic() >= deadline:
                raise CNIError(TRY_AGAIN, f"the node agent of {self.node_name} did not register within "
                               f"{self.ns.wait_timeout:g} s; no conflist written", f"{key}: {why}")
            time.sleep(WAIT_INTERVAL)
        raise CNIError(TRY_AGAIN, "stopped while waiting for the node agent; no conflist written")

    # ---- the whole run ----------------------------------------------------------------------------

    def install(self) -> int:
        text = self.template()
        if self.ns.wait_for_agent:  # refuse missing or bad etcd flags before anything is written
            self.etcd_settings()
        plan = self.plan = self.plan_binaries()
        data = self.render(text, plan) if text is not None else None
        self.install_binaries(plan)
        self.install_kubeconfig()
        if self.ns.systemd:
            self.install_units()
        self.remove_old_conf()
        if text is not None and data is not None:
            self.install_tls(text)
            if self.ns.wait_for_agent:
                self.wait_for_agent()
            self.install_conflist(data)
            self.rendered = text
        else:
            self.say("no template (--template, CNI_NETWORK_CONFIG_FILE, CNI_NETWORK_CONFIG): no conflist written")
        self.manifest.save()
        from pycni.install_plugins import daemon_note

        self.say(daemon_note(self.ns.socket or None))
        self.say(f"done: {len(self.written)} file(s) written" + ("" if self.written else " (all up to date)"))
        return 0

    def watch(self) -> int:
        """Keep the kubeconfig and the conflist current until SIGTERM/SIGINT."""

        def stop(*_: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.say(f"watching the service account token and the template every {self.ns.watch_interval:g} s")
        while not self.stopping:
            time.sleep(self.ns.watch_interval)
            if self.stopping:
                break
            try:
                self.install_kubeconfig()
                text = self.template()
                if text is not None:
                    self.install_tls(text)  # rotated certificates too
                    if text != self.rendered:  # checked once per change, not every interval
                        self.rendered = text
                        self.install_conflist(self.render(text, self.plan))
            except CNIError as e:
                self.say(f"not updated: {e.msg}" + (f": {e.details}" if e.details else ""))
        return 0

    # ---- removing ---------------------------------------------------------------------------------

    def uninstall(self) -> int:
        from pycni import systemd_units

        files = self.manifest.files
        if not files:
            self.say(f"nothing to remove: no manifest at {self.manifest.path}")
            return 0
        units = [os.path.basename(p) for p in files if p.endswith((".service", ".socket")) and not os.path.islink(p)]
        if units and systemd_units.running():
            systemd_units.systemctl("stop", *units)
        removed, kept = 0, []
        dirs: set[str] = set()
        # the conflist first: from then on the runtime starts no pod here
        for path, digest in sorted(files.items(), key=lambda kv: kv[0] != self.conf_path):
            if digest.startswith("link:"):
                ours = os.path.islink(path) and os.readlink(path) == digest[5:]
            else:
                data = _read(path)
                ours = data is not None and not os.path.islink(path) and _sha(data) == digest
            if ours:
                statefile.remove(path)
                removed += 1
                dirs.add(os.path.dirname(path))
                self.say(f"removed {path}")
                if path.endswith(".py"):  # and the bytecode the interpreter compiled from it
                    import glob

                    stem = os.path.basename(path)[:-3]
                    cache = os.path.join(os.path.dirname(path), "__pycache__")
                    for pyc in glob.glob(os.path.join(glob.escape(cache), f"{glob.escape(stem)}.*.pyc")):
                        statefile.remove(pyc)
                        dirs.add(cache)
            elif os.path.lexists(path):
                kept.append(path)
        if units and systemd_units.running():
            systemd_units.systemctl("daemon-reload")
        lib = os.path.abspath(self.ns.lib_dir) if self.ns.lib_dir else ""
        # Directories the removed files leave empty, below the ones install-cni writes into (and
        # --lib-dir itself), never above them.
        roots = [r for r in (self.bin_dir, self.net_dir, os.path.abspath(self.ns.unit_dir), lib) if r]
        for d in sorted(dirs, key=len, reverse=True):
            while any(d.startswith(r + os.sep) for r in roots) or d == lib:
                try:
                    os.rmdir(d)
                except OSError:
                    break
                d = os.path.dirname(d)
        statefile.remove(self.manifest.path)
        for path in kept:
            self.say(f"left {path}: changed since install-cni wrote it")
        self.say(f"done: {removed} file(s) removed" + (f", {len(kept)} left (changed since)" if kept else ""))
        return 0


def version_problem(path: str) -> str:
    """'' when the executable answers VERSION through its interpreter and pycni, else why not. The
    input is one the sh front hands to Python (it answers plain ``{"cniVersion": ...}`` itself),
    so the interpreter and the import path baked in are what is checked."""
    import json
    import subprocess

    try:
        proc = subprocess.run([path], input=b'{"cniVersion": "0.4.0", "name": "install-cni-check"}\n',
                              capture_output=True, timeout=60,
                              env={"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        answer = None
    if proc.returncode != 0 or not isinstance(answer, dict) or "supportedVersions" not in answer:
        msg = answer.get("msg") if isinstance(answer, dict) else (proc.stdout + proc.stderr).decode(errors="replace")
        return f"exit {proc.returncode}: {str(msg).strip()[:200]}"
    return ""


def _extra_path(env: Mapping[str, str]) -> list[str]:
    return [p for p in env.get("CNI_PATH", "").split(os.pathsep) if p]


def main(ns: argparse.Namespace) -> int:
    """``pycni install-cni``; errors are CNIErrors (one line from the CLI), nothing left half-written."""
    inst = Installer(ns, os.environ)
    if ns.uninstall:
        return inst.uninstall()
    status = inst.install()
    if ns.watch:
        return inst.watch()
    return status
