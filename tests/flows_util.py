"""A routed namespace trio for the flow tests and bench: client A — router R — server B.

R forwards between A (10.36.1.2, fd36:1::2 on R's ``fa0``) and B (10.36.2.2, fd36:2::2 on R's
``fb0``) and holds the nftables table whose rules ``log group N`` and accept or drop, on the
forward hook as pycni's policy table does. Every namespace is a throwaway ``pf36-…`` one.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from netns_util import Namespace, new_namespace

A4, B4, A6, B6 = "10.36.1.2", "10.36.2.2", "fd36:1::2", "fd36:2::2"
TABLE = "pf36_flows"


@dataclass
class Trio:
    a: Namespace
    r: Namespace
    b: Namespace

    def nft(self, script: str) -> None:
        self.r.run(["nft", "-f", "-"], input=script)

    def send(self, ns: Namespace, code: str, timeout: float = 30) -> str:
        """Run ``code`` (Python, with socket imported) in ``ns``; its stdout."""
        return ns.run([sys.executable, "-c", "import socket, time\n" + code], timeout=timeout).stdout


    def warm(self) -> None:
        """Ping B from A in both families until they answer: neighbours resolved, so the test's
        packets are neither delayed nor retransmitted (a retransmitted SYN is logged again)."""
        for dst in (B4, B6):
            self.a.run(["sh", "-c", f"for i in $(seq 50); do ping -c1 -W1 {dst} >/dev/null && exit 0; "
                                    "sleep 0.1; done; exit 1"])


def _link(r: Namespace, peer: Namespace, rdev: str, net4: str, net6: str) -> None:
    r.run(["ip", "link", "add", rdev, "type", "veth", "peer", "name", "eth0", "netns", peer.name])
    r.run(["ip", "addr", "add", f"{net4}.1/24", "dev", rdev])
    r.run(["ip", "addr", "add", f"{net6}::1/64", "dev", rdev, "nodad"])
    r.run(["ip", "link", "set", rdev, "up"])
    peer.run(["ip", "addr", "add", f"{net4}.2/24", "dev", "eth0"])
    peer.run(["ip", "addr", "add", f"{net6}::2/64", "dev", "eth0", "nodad"])
    peer.run(["ip", "link", "set", "eth0", "up"])
    peer.run(["ip", "route", "add", "default", "via", f"{net4}.1"])
    peer.run(["ip", "-6", "route", "add", "default", "via", f"{net6}::1"])


@contextmanager
def trio() -> Iterator[Trio]:
    """A, R and B wired and forwarding; all three deleted at the end, whatever happened."""
    made: list[Namespace] = []
    try:
        for _ in range(3):
            made.append(new_namespace(prefix="pf36"))
        a, r, b = made
        for ns in made:  # no duplicate address detection: addresses usable at once
            ns.run(["sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0"])
        r.run(["sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"])
        _link(r, a, "fa0", "10.36.1", "fd36:1")
        _link(r, b, "fb0", "10.36.2", "fd36:2")
        t = Trio(a, r, b)
        t.warm()
        yield t
    finally:
        for ns in made:
            ns.delete()


def log_table(group: int, rate: str = "1000/second") -> str:
    """The test's policy stand-in: TCP 8080 logged and accepted, UDP 5353 logged and dropped,
    echo requests logged and accepted, each with the prefix the convention gives it."""
    lim = f"limit rate {rate} burst 1000 packets"
    return f"""
table inet {TABLE} {{
  chain flows {{
    type filter hook forward priority filter; policy accept;
    ct state established,related accept
    tcp dport 8080 {lim} log group {group} prefix "pycni:A:p_0123456789_in"
    tcp dport 8080 accept
    udp dport 5353 {lim} log group {group} prefix "pycni:D:v_fb0_in"
    udp dport 5353 drop
    icmp type echo-request {lim} log group {group} prefix "pycni:A:na_in"
    icmpv6 type echo-request {lim} log group {group} prefix "pycni:A:na_in"
    sctp dport 9 {lim} log group {group} prefix "pycni:D:dd_in"
    sctp dport 9 drop
  }}
}}
"""


def serve_tcp(ns: Namespace, port: int = 8080) -> subprocess.Popen[str]:
    """A dual-stack TCP listener on ``port`` in ``ns`` that accepts forever (the caller kills it)."""
    code = ("import socket\ns = socket.socket(socket.AF_INET6)\n"
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
            f"s.bind(('::', {port}))\ns.listen(128)\nprint('up', flush=True)\n"
            "while True:\n    c, _ = s.accept(); c.close()\n")
    proc = subprocess.Popen(["ip", "netns", "exec", ns.name, sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc
