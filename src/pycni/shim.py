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
injects :func:`run_delegate`, so our own IPAM delegates run in this process instead of
starting another interpreter.

The executables' file format, and installing them, are :mod:`pycni.install_plugins`'s (it imports
this module, never the other way round); what recognises one at run time is here, for the
in-process runner: :data:`SHIM_HEADER`, :func:`shim_type` and :func:`plugin_of`.

No ``from __future__ import annotations`` here nor in the protocol module: it imports the
``__future__`` module at run time, ~0.2 ms of every forwarded call (annotations below are
valid at run time on Python 3.11).
"""

import os
import sys

TYPE_CHECKING = False  # not typing's: this module is on every plugin call's start path
if TYPE_CHECKING:
    from collections.abc import Mapping

# ``PYCNI_INPROC_DELEGATE=0`` in a one-shot shim's environment: exec our delegates instead of
# running them in this process (read once, in main's in-process path).
INPROC_DELEGATE_ENV = "PYCNI_INPROC_DELEGATE"


# The line that names the plugin in an executable pycni.install_plugins writes: the in-process
# runner (run_delegate) and the installers recognise our executables by it (shim_type).
SHIM_HEADER = "# pycni plugin "


def shim_type(path: str) -> str | None:
    """The CNI type an executable written by ``pycni install-plugins`` runs; None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(512).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if len(head) < 2 or not head[0].startswith("#!") or not head[1].startswith(SHIM_HEADER):
        return None
    return head[1][len(SHIM_HEADER):].split(":", 1)[0].strip().strip("'\"")


def plugin_of(path: str) -> str | None:
    """The CNI type ``path`` runs when it is one of our executables for a plugin pycni ships."""
    name = shim_type(path)
    if not name:
        return None
    from pycni.plugins.registry import PLUGIN_MODULES

    return name if name in PLUGIN_MODULES else None


def run_delegate(path: str, stdin: bytes, env: "Mapping[str, str]") -> bytes:
    """The in-process runner (a :data:`pycni.invoke.Runner`) that the shim and the daemon inject.

    A delegate that is one of our executables runs through ``skel.dispatch`` in this process,
    with this runner for its own delegates; the result is the one exec'ing it would give, the
    start-up is not paid. Anything else (say Go's host-local) is exec'd.
    """
    from pycni import invoke

    plugin_type = plugin_of(path)
    if plugin_type is None:
        return invoke.exec_plugin(path, stdin, env)
    from pycni.plugins.registry import load
    from pycni.skel import dispatch

    outcome = dispatch(load(plugin_type), env, stdin, runner=run_delegate)
    if outcome.exit_code != 0:
        raise invoke.error_from_output(path, outcome.exit_code, outcome.stdout, outcome.stderr)
    return outcome.stdout


# ---- serving one call -----------------------------------------------------------------------------


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
            # The request may have been partly served: retrying here could double an ADD. The
            # error type is imported here only: the forwarding path stays _socket + protocol.
            from pycni.spec.errors import TRY_AGAIN, CNIError

            err = CNIError(TRY_AGAIN, "pycni daemon failed while serving the request",
                           f"{type(e).__name__}: {e}; retry, or set PYCNI_SOCKET=off to run without the daemon")
            return 1, (err.to_json() + "\n").encode(), b""
    finally:
        s.close()


def _run_here(plugin_type: str, stdin: bytes) -> tuple[int, bytes, bytes]:
    # One call, then the process ends and the kernel frees its memory (see _exit): the cyclic
    # collector's passes over the imports' objects cost it ~0.3-0.8 ms of CPU here. (Only this
    # path: the dhcp daemon, long-lived, runs through run_main.)
    import gc

    gc.disable()
    from pycni.plugins.registry import load
    from pycni.skel import dispatch

    plugin = load(plugin_type)
    inproc = os.environ.get(INPROC_DELEGATE_ENV, "1") == "1"
    outcome = dispatch(plugin, dict(os.environ), stdin, runner=run_delegate if inproc else None)
    return outcome.exit_code, outcome.stdout, outcome.stderr


def main(plugin_type: str, module: str = "", socket: str | None = None) -> None:
    """Serve one invocation of ``plugin_type``; ``socket`` is the daemon's, baked in at install.

    ``module`` is what the executable names (its format); the plugin is found by its type, through
    :func:`pycni.plugins.registry.load` as everywhere else."""
    command = os.environ.get("CNI_COMMAND", "")
    if len(sys.argv) > 1 or (not command and (sys.stdin is None or sys.stdin.isatty())):
        from pycni.plugins.registry import run_main

        run_main(plugin_type)  # run by hand (the plugin describes itself), or with arguments (`dhcp daemon`)
        return
    stdin = _read_stdin()
    sock_path = os.environ.get("PYCNI_SOCKET") or socket or "/run/pycni/pycni.sock"  # protocol.DEFAULT_SOCKET
    answer = None
    if sock_path != "off" and command != "VERSION":
        answer = _forward(sock_path, plugin_type, stdin)
    if answer is None:
        answer = _run_here(plugin_type, stdin)
    code, out, err = answer
    if out:
        sys.stdout.buffer.write(out)
    if err:
        sys.stderr.buffer.write(err)
    _exit(code)


def _exit(code: int) -> None:
    """End the process once its output is out, without the interpreter's teardown.

    Tearing down a one-shot plugin's modules (dicts cleared, every object freed, a last garbage
    collection) took ~1.2 ms of CPU a call here, for memory the kernel frees anyway; a pod cycle
    makes twelve calls. What teardown would do that anyone can see still happens: the standard
    streams are flushed (an error doing so is raised here, as before) and ``atexit`` functions
    run. Nothing else is left to it on this path: the plugins start no threads in a one-shot
    process, and their files and sockets are closed by the kernel either way.
    """
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: started without that descriptor (nothing was written to it)
            stream.flush()
    import atexit

    atexit._run_exitfuncs()
    os._exit(code & 0xFF)
