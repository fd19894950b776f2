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


class PacketWatch:
    """Every TCP and UDP packet that arrives in the given pods, seen by an AF_PACKET socket in each
    pod's namespace (one thread): ``crossed`` lists those of a pair ``denied(src key, dst key)``
    says must not pass — a packet that reached its destination pod, whether or not an answer came
    back. A probe's outcome says whether an exchange succeeded; this says whether a single packet
    got through."""

    ETH_P_ALL = 0x0003
    PACKET_OUTGOING = 4

    def __init__(self, pods: dict[str, tuple[Namespace, dict[int, str]]],
                 denied: Callable[[str, str], bool]) -> None:
        self.owner = {addr: key for key, (_, addrs) in pods.items() for addr in addrs.values()}
        self.denied = denied
        self.crossed: list[tuple[float, str, str, int]] = []  # (time, src, dst, IP protocol)
        self.seen = 0  # TCP/UDP packets between pods, allowed or not
        self.sel = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        for _, (ns, _) in pods.items():
            with ns.enter():
                s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(self.ETH_P_ALL))
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ)
            self.socks.append(s)
        self.stopping = False
        self.thread = threading.Thread(target=self._watch, daemon=True, name="po-watch")
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping:
            for key, _ in self.sel.select(0.2):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                while True:
                    try:
                        data, addr = s.recvfrom(128)
                    except BlockingIOError:
                        break
                    if addr[0] == "lo" or addr[2] == self.PACKET_OUTGOING:
                        continue
                    self._packet(data, addr[1])

    def _packet(self, data: bytes, ethertype: int) -> None:
        if ethertype == 0x0800 and len(data) >= 20:
            proto, src, dst = data[9], socket.inet_ntop(socket.AF_INET, data[12:16]), \
                socket.inet_ntop(socket.AF_INET, data[16:20])
        elif ethertype == 0x86DD and len(data) >= 40:
            proto, src, dst = data[6], socket.inet_ntop(socket.AF_INET6, data[8:24]), \
                socket.inet_ntop(socket.AF_INET6, data[24:40])
        else:
            return
        s, d = self.owner.get(src), self.owner.get(dst)
        if proto not in (6, 17) or s is None or d is None:
            return
        self.seen += 1
        if self.denied(s, d):
            self.crossed.append((time.time(), s, d, proto))

    def close(self) -> None:
        self.stopping = True
        self.thread.join(5)
        for s in self.socks:
            s.close()
