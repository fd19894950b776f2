"""Real packets for the policy tests: echo servers in every pod and a prober that measures a
whole reachability matrix at once.

Everything runs in this test process: a socket made while the thread is inside a namespace
stays in that namespace, so one selector thread serves every pod (TCP and UDP on ports 80 and
81, dual stack) and the prober opens all probes of a matrix together, then waits once. A TCP
probe passes when its handshake completes, a UDP probe when its echo comes back. Each probe
uses a source port never used before in the run, so conntrack state of an earlier (allowed)
probe can never carry a later one. A probe that gets no answer is retried (``retries``) before
it counts as denied: on a loaded machine an allowed answer may be late, while a denied probe
can never be answered — so retries only remove false denials, never hide a leak.
"""

from __future__ import annotations

import errno
import itertools
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from netns_util import Namespace

_source_ports = itertools.count(20000)


class EchoServers:
    """TCP listeners (accept, close) and UDP echo on ``ports`` in each namespace, one thread."""

    def __init__(self, namespaces: Iterable[Namespace], ports: Sequence[int] = (80, 81)) -> None:
        self.sel = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        for ns in namespaces:
            with ns.enter():
                for port in ports:
                    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                        s = socket.socket(socket.AF_INET6, kind)
                        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        s.bind(("::", port))
                        if kind == socket.SOCK_STREAM:
                            s.listen(1024)
                        s.setblocking(False)
                        self.sel.register(s, selectors.EVENT_READ, kind)
                        self.socks.append(s)
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True, name="po-echo")
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping:
            for key, _ in self.sel.select(0.2):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    if key.data == socket.SOCK_STREAM:
                        conn, _ = s.accept()
                        conn.close()
                    else:
                        data, peer = s.recvfrom(512)
                        s.sendto(data, peer)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopping = True
        self.thread.join(5)
        for s in self.socks:
            s.close()


class Probe:
    def __init__(self, key: tuple[str, str, int, str], ns: Namespace, src_ip: str, dst_ip: str, port: int,
                 proto: str) -> None:
        self.key = key
        fam = socket.AF_INET6 if ":" in dst_ip else socket.AF_INET
        with ns.enter():
            self.sock = socket.socket(fam, socket.SOCK_STREAM if proto == "TCP" else socket.SOCK_DGRAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((src_ip, next(_source_ports)))
            self.sock.setblocking(False)
            if proto == "TCP":
                err = self.sock.connect_ex((dst_ip, port))
                if err not in (0, errno.EINPROGRESS):
                    raise OSError(err, f"connect {dst_ip}:{port}")
            else:
                self.sock.sendto(b"po-probe", (dst_ip, port))
        self.proto = proto
        self.passed = False


def probe(pods: dict[str, tuple[Namespace, dict[int, str]]], flows: Iterable[tuple[str, str, int, str]],
          version: int = 4, window: float = 1.5, retries: int = 2,
          expect: Callable[[tuple[str, str, int, str]], bool] | None = None) -> dict[tuple[str, str, int, str], bool]:
    """Whether each flow (src pod key, dst pod key, port, proto) gets through; ``pods`` maps a
    key to (its namespace, its address per IP version). With ``expect``, only flows expected to
    pass are retried (a retry cannot turn a denial into anything else)."""
    result: dict[tuple[str, str, int, str], bool] = {}
    todo = list(flows)
    for _ in range(retries + 1):
        if not todo:
            break
        sel = selectors.DefaultSelector()
        probes = []
        for flow in todo:
            src, dst, port, proto = flow
            p = Probe(flow, pods[src][0], pods[src][1][version], pods[dst][1][version], port, proto)
            probes.append(p)
            sel.register(p.sock, selectors.EVENT_WRITE if proto == "TCP" else selectors.EVENT_READ, p)
        pending = len(probes)
        end = time.monotonic() + window
        while pending and time.monotonic() < end:
            for key, _ in sel.select(max(0.0, end - time.monotonic())):
                p = key.data
                if p.proto == "TCP":
                    ok = p.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                else:
                    try:
                        ok = p.sock.recv(512) == b"po-probe"
                    except OSError:
                        ok = False
                p.passed = ok
                sel.unregister(p.sock)
                pending -= 1
        for p in probes:
            result[p.key] = p.passed
            p.sock.close()
        sel.close()
        todo = [f for f in todo if not result[f] and (expect is None or expect(f))]
    return result
