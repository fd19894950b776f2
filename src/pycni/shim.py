"""What an installed plugin executable runs: forward to the daemon if one listens, else run here.

The executables written by ``pycni install-plugins`` call :func:`main` with their CNI type.
With a daemon on ``PYCNI_SOCKET`` (default /run/pycni/pycni.sock) the request — environment,
stdin, and implicitly this process's network namespace, which the daemon learns from the
socket's peer credentials — is served there with warm imports, and stdout, stderr and the exit
code are relayed byte for byte. With no daemon listening the plugin runs in this process.
``PYCNI_SOCKET=off`` disables forwarding. Stdlib only; imports stay minimal on purpose.
"""

from __future__ import annotations

import os
import sys


def _read_stdin() -> bytes:
    if sys.stdin is None or sys.stdin.isatty():
        return b""
    return sys.stdin.buffer.read()


def _forward(sock_path: str, plugin_type: str, stdin: bytes) -> tuple[int, bytes, bytes] | None:
    """Serve through the daemon; None when no daemon is listening (nothing was sent)."""
    import socket

    from pycni.daemon import protocol

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            s.connect(sock_path)
        except (FileNotFoundError, ConnectionRefusedError, PermissionError):
            return None
        try:
            protocol.send_frame(s, {"plugin": plugin_type, "env": dict(os.environ), "stdin": protocol.b64(stdin)})
            reply = protocol.recv_frame(s)
            return int(reply["exit"]), protocol.unb64(reply["stdout"]), protocol.unb64(reply["stderr"])
        except (OSError, ValueError, KeyError) as e:
            # The request may have been partly served: retrying here could double an ADD.
            import json

            err = {"code": 11, "msg": "pycni daemon failed while serving the request",
                   "details": f"{type(e).__name__}: {e}; retry, or set PYCNI_SOCKET=off to run without the daemon"}
            return 1, (json.dumps(err) + "\n").encode(), b""
    finally:
        s.close()


def _run_here(module: str, stdin: bytes) -> tuple[int, bytes, bytes]:
    import importlib

    from pycni.skel import dispatch

    plugin = importlib.import_module(module).PLUGIN
    outcome = dispatch(plugin, os.environ, stdin)
    return outcome.exit_code, outcome.stdout, outcome.stderr


def main(plugin_type: str, module: str) -> None:
    command = os.environ.get("CNI_COMMAND", "")
    if len(sys.argv) > 1 or (not command and (sys.stdin is None or sys.stdin.isatty())):
        import importlib

        # run by hand (let the plugin describe itself), or with arguments (`dhcp daemon ...`)
        importlib.import_module(module).main()
        return
    stdin = _read_stdin()
    sock_path = os.environ.get("PYCNI_SOCKET") or "/run/pycni/pycni.sock"
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
