"""The systemd units ``pycni install-cni --systemd`` writes: the daemon (socket-activated) and the node agent.

Socket activation is sound here: the daemon serves a socket systemd passes as is (never re-binds,
chmods or removes it, :mod:`pycni.unixsock`), so the socket exists from boot, before any runtime
calls a plugin, and stays open across a daemon restart (calls wait in its queue instead of falling
back to one-shot). The texts are docs/daemon.md's and docs/cluster.md's, with this installation's
interpreter and flags.
"""

from __future__ import annotations

import os
import shlex

from pycni.daemon.protocol import DEFAULT_SOCKET

TYPE_CHECKING = False  # not typing's (see pycni.record)
if TYPE_CHECKING:
    import argparse

SOCKET, DAEMON, NODE = "pycni.socket", "pycni.service", "pycni-node.service"
# The target each unit is enabled into (its [Install] WantedBy=): the .wants symlink install-cni makes.
WANTED_BY = {SOCKET: "sockets.target", DAEMON: "multi-user.target", NODE: "multi-user.target"}

_SOCKET_UNIT = """\
# Written by pycni install-cni; `pycni install-cni --uninstall` removes it.
[Unit]
Description=pycni CNI plugin daemon socket
Before=containerd.service crio.service kubelet.service

[Socket]
ListenStream={socket}
SocketMode=0600
SocketUser=root
SocketGroup=root
DirectoryMode=0755
Accept=no
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"""

_DAEMON_UNIT = """\
# Written by pycni install-cni; `pycni install-cni --uninstall` removes it.
[Unit]
Description=pycni CNI plugin daemon (warm plugins for the executables in the CNI bin dir)
Requires=pycni.socket
After=pycni.socket network-pre.target

[Service]
Type=simple
# The daemon serves the socket systemd passes (LISTEN_FDS).
ExecStart={exec_start}
# SIGTERM to the main process only: it stops its workers, which finish requests in flight.
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec=30
Restart=on-failure
RestartSec=1
# 3: refused to start (the socket is served by another daemon, or no privileges); do not retry.
RestartPreventExitStatus=3
User=root

[Install]
WantedBy=multi-user.target
Also=pycni.socket
"""

_NODE_UNIT = """\
# Written by pycni install-cni; `pycni install-cni --uninstall` removes it.
[Unit]
Description=pycni node agent (routes pod blocks between nodes, enforces network policy)
Wants=network-online.target
After=network-online.target

[Service]
ExecStart={exec_start}
# SIGTERM stops it cleanly; routes stay, so a restart disturbs no traffic.
KillSignal=SIGTERM
Restart=always
RestartSec=2
User=root

[Install]
WantedBy=multi-user.target
"""


def _command(words: list[str]) -> str:
    """An ExecStart= line: systemd splits words as a shell does for plain quoting, and expands ``%``."""
    return " ".join(shlex.quote(w) for w in words).replace("%", "%%")


def node_command(python: str, ns: argparse.Namespace) -> list[str] | None:
    """``pycni node`` with install-cni's etcd flags, node name and underlay; None without endpoints
    or an underlay address (the agent needs both)."""
    endpoints = ns.etcd_endpoints or os.environ.get("ETCD_ENDPOINTS", "")
    if not endpoints or not ns.underlay_ip:
        return None
    words = [python, "-m", "pycni", "node", "--etcd-endpoints", endpoints, "--underlay-ip", ns.underlay_ip]
    if ns.node_name:
        words += ["--node-name", ns.node_name]
    for flag, value in (("--etcd-prefix", ns.etcd_prefix), ("--etcd-ca-cert", ns.etcd_ca_cert),
                        ("--etcd-cert", ns.etcd_cert), ("--etcd-key", ns.etcd_key)):
        if value:
            words += [flag, value]
    return words


def daemon_command(python: str, socket: str) -> list[str]:
    words = [python, "-m", "pycni", "daemon"]
    if socket and socket != DEFAULT_SOCKET:
        words += ["--socket", socket]
    return words


def units(python: str, ns: argparse.Namespace, socket: str = "") -> dict[str, str]:
    """Unit file name -> text; the node agent's only when :func:`node_command` has what it needs."""
    out = {SOCKET: _SOCKET_UNIT.format(socket=socket or DEFAULT_SOCKET),
           DAEMON: _DAEMON_UNIT.format(exec_start=_command(daemon_command(python, socket)))}
    node = node_command(python, ns)
    if node is not None:
        out[NODE] = _NODE_UNIT.format(exec_start=_command(node))
    return out


def running() -> bool:
    """Whether systemd manages this machine (sd_booted(3)'s test): only then is systemctl asked."""
    return os.path.isdir("/run/systemd/system")


def systemctl(*args: str) -> None:
    """``systemctl ARGS``; a failure is reported, not raised (the files are in place either way)."""
    import subprocess
    import sys

    proc = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        sys.stderr.write(f"pycni: warning: systemctl {' '.join(args)}: {proc.stderr.strip()}\n")
