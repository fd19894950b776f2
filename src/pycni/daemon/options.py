"""The daemon's command-line options, apart from the server so ``pycni``'s parser stays cheap to build."""

from __future__ import annotations

import argparse
import os

from pycni.daemon.protocol import DEFAULT_SOCKET

# Here rather than in the server so that building ``pycni``'s parser stays cheap.
READ_TIMEOUT = 10.0   # seconds a client has to send its whole request
STOP_TIMEOUT = 10.0   # seconds requests in flight get to finish once a stop is asked for


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 3600]")
    return value


def _socket_path(text: str) -> str:
    """The socket must be where the plugin shims look for it: an absolute path (as install-plugins
    --socket requires), short enough for sun_path."""
    if not os.path.isabs(text) or "\n" in text or "\0" in text or len(text.encode()) > 107:
        raise argparse.ArgumentTypeError(f"{text!r}: the daemon's socket must be an absolute path of at most "
                                         "107 bytes on one line (the plugin shims find it by that path)")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The daemon's options (shared by ``pycni daemon`` and ``python -m pycni.daemon``)."""
    env_socket = os.environ.get("PYCNI_SOCKET", "")
    parser.add_argument("--socket", type=_socket_path,
                        default=env_socket if env_socket not in ("", "off") else DEFAULT_SOCKET,
                        help="unix socket to listen on (default: $PYCNI_SOCKET or %(default)s)")
    parser.add_argument("--log-file", help="log here instead of stderr")
    parser.add_argument("--debug", action="store_true", help="log every request with its duration")
    parser.add_argument("--no-preload", action="store_true",
                        help="import plugins on first use instead of at start-up")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes sharing the socket (default: one per CPU; 1 serves in-process)")
    parser.add_argument("--no-restore-sessions", action="store_true",
                        help="run one iptables-restore per change instead of reusing long-lived ones")
    parser.add_argument("--read-timeout", type=_seconds, default=READ_TIMEOUT, metavar="SECONDS",
                        help="a client must send its whole request within this (default: %(default)g)")
    parser.add_argument("--stop-timeout", type=_seconds, default=STOP_TIMEOUT, metavar="SECONDS",
                        help="on SIGTERM, requests in flight get this long to finish (default: %(default)g)")
    from pycni.metrics import add_argument as add_metrics_argument

    add_metrics_argument(parser)
