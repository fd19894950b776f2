"""What an installed plugin executable runs: forward to the daemon if one listens, else run here.

The executables written by ``pycni install-plugins`` call :func:`main` with their CNI type
(their sh front has answered VERSION already, unless its input was unusual). With a daemon on
the socket — ``$PYCNI_SOCKET``, else the one baked in by ``install-plugins --socket``, else
/run/pycni/pycni.sock, so a runtime that filters the environment still finds it — the request — environment,
stdin, and implicitly this process's network namespace, which the daemon learns from the
socket's peer credentials — is served there with warm imports, and stdout, stderr and the exit
code are relayed byte for byte. With no daemon listening the plugin runs in this process.
``PYCNI_SOCKET=off`` disables forwarding.

This module is on the start-up path of every plugin call, so the forwarding path imports
only ``_socket`` and :mod:`pycni.daemon.protocol` (which imports nothing): ``socket``, json,
base64 and typing would cost more than the rest of the shim together. The in-process path
loads pyroute2 lean (see :func:`lean_pyroute2`) and lets our own IPAM delegates run in this
process instead of starting another interpreter (see :mod:`pycni.invoke`).

No ``from __future__ import annotations`` here nor in the protocol module: it imports the
``__future__`` module at run time, ~0.2 ms of every forwarded call (annotations below are
valid at run time on Python 3.11).
"""

import os
import sys

# Set in the environment of an in-process (one-shot) run: pycni.invoke then runs a delegate
# that is one of our shims through skel.dispatch in this process rather than exec'ing it.
INPROC_DELEGATE_ENV = "PYCNI_INPROC_DELEGATE"


def _read_stdin() -> bytes:
    if sys.stdin is None or sys.stdin.isatty():
        return b""
    return sys.stdin.buffer.read()


def _forward(sock_path: str, plugin_type: str, stdin: bytes) -> tuple[int, bytes, bytes] | None:
    """Serve through the daemon; None when no daemon is listening (nothing was sent)."""
    import _socket

    from pycni.daemon import protocol

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            s.connect(sock_path)
        except OSError:
            # missing socket, nobody listening, not ours to use: run the plugin here instead
            return None
        try:
            s.sendall(protocol.encode_request(plugin_type, stdin, dict(os.environb)))
            return protocol.decode_reply(protocol.recv_frame(s))
        except (OSError, ValueError) as e:
            # The request may have been partly served: retrying here could double an ADD.
            msg = (f"{type(e).__name__}: {e}; retry, or set PYCNI_SOCKET=off to run without the daemon"
                   .replace("\\", "\\\\").replace('"', '\\"'))
            err = f'{{"code": 11, "msg": "pycni daemon failed while serving the request", "details": "{msg}"}}\n'
            return 1, err.encode(), b""
    finally:
        s.close()


class _LeanPyroute2:
    """Meta-path finder that makes ``import pyroute2`` lean (see :func:`lean_pyroute2`).

    Installing it costs nothing; the work (importlib.util, the package's spec) happens only if
    the plugin really imports pyroute2 — most one-shot calls no longer do.
    """

    @classmethod
    def find_spec(cls, name: str, path: object = None, target: object = None) -> object:
        if name != "pyroute2":
            return None
        sys.meta_path.remove(cls)  # type: ignore[arg-type]
        import importlib
        import importlib.machinery
        import importlib.util

        real = importlib.util.find_spec("pyroute2")
        if real is None or real.loader is None:
            return real
        fast = {"IPRoute": "pyroute2.iproute.linux", "AsyncIPRoute": "pyroute2.iproute.linux",
                "NetlinkError": "pyroute2.netlink.exceptions"}

        class Loader:
            """Creates the package module without running its body; names resolve on first use."""

            @staticmethod
            def create_module(spec: object) -> None:
                return None

            @staticmethod
            def exec_module(mod: object) -> None:
                def __getattr__(attr: str) -> object:  # PEP 562: only called for names not yet bound
                    if attr in fast:
                        value = getattr(importlib.import_module(fast[attr]), attr)
                        setattr(mod, attr, value)
                        return value
                    sub = None
                    if not attr.startswith("__"):
                        try:
                            sub = importlib.util.find_spec(f"pyroute2.{attr}")
                        except (ImportError, ValueError):
                            sub = None
                    if sub is not None:
                        return importlib.import_module(f"pyroute2.{attr}")
                    # Something else from the package's namespace: run the real body once.
                    vars(mod).pop("__getattr__", None)
                    vars(mod).pop("__pycni_lean__", None)
                    real.loader.exec_module(mod)  # type: ignore[union-attr, arg-type]
                    try:
                        return vars(mod)[attr]
                    except KeyError:
                        raise AttributeError(f"module 'pyroute2' has no attribute {attr!r}") from None

                mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
                mod.__pycni_lean__ = True  # type: ignore[attr-defined]  # the body has not run (tests look)

        spec = importlib.machinery.ModuleSpec("pyroute2", Loader(), origin=real.origin, is_package=True)  # type: ignore[arg-type]
        spec.submodule_search_locations = real.submodule_search_locations
        spec.has_location = real.has_location
        return spec


def lean_pyroute2() -> None:
    """Make ``import pyroute2`` cheap: load only the submodules actually used.

    ``pyroute2/__init__`` imports every subsystem (NDB, IPDB, conntrack, nl80211, ipset,
    plan9, multiprocessing, ...) — about 80 ms of CPU of the ~180 ms its import costs,
    measured with ``python -X importtime``. Here ``pyroute2`` becomes its own package module
    without the body run; ``pyroute2.IPRoute`` resolves straight to
    ``pyroute2.iproute.linux.IPRoute`` (what the body binds on Linux), submodules import as
    usual, and any other top-level name runs the real body once, so nothing breaks. Used only
    in one-shot plugin processes (never in the daemon or a library user's process), and only
    for what pycni.net.nl does not speak (tc, policy rules, VLAN filtering).
    """
    if "pyroute2" in sys.modules or _LeanPyroute2 in sys.meta_path:
        return
    sys.meta_path.insert(0, _LeanPyroute2)  # type: ignore[arg-type]


def _run_here(module: str, stdin: bytes) -> tuple[int, bytes, bytes]:
    from pycni.skel import dispatch

    if os.environ.get("CNI_COMMAND") != "VERSION" and os.environ.get("PYCNI_LEAN_IMPORTS", "1") != "0":
        lean_pyroute2()
    # The __import__ builtin rather than importlib.import_module: importing the importlib
    # package (and warnings with it) would cost this process ~0.4 ms for nothing else.
    __import__(module)
    plugin = sys.modules[module].PLUGIN
    env = dict(os.environ)
    env.setdefault(INPROC_DELEGATE_ENV, "1")
    outcome = dispatch(plugin, env, stdin)
    return outcome.exit_code, outcome.stdout, outcome.stderr


def main(plugin_type: str, module: str, socket: str | None = None) -> None:
    """Serve one invocation of ``plugin_type``; ``socket`` is the daemon's, baked in at install."""
    command = os.environ.get("CNI_COMMAND", "")
    if len(sys.argv) > 1 or (not command and (sys.stdin is None or sys.stdin.isatty())):
        import importlib

        # run by hand (let the plugin describe itself), or with arguments (`dhcp daemon ...`)
        importlib.import_module(module).main()
        return
    stdin = _read_stdin()
    sock_path = os.environ.get("PYCNI_SOCKET") or socket or "/run/pycni/pycni.sock"  # protocol.DEFAULT_SOCKET
    answer = None
    if sock_path != "off" and command != "VERSION":
        answer = _forward(sock_path, plugin_type, stdin)
    if answer is None:
        answer = _run_here(module, stdin)
    code, out, err = answer
    if out:
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    if err:
        sys.stderr.buffer.write(err)
        sys.stderr.flush()
    sys.exit(code)
