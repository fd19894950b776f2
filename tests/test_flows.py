"""Flows (docs/flows.md): the prefix convention, the bounded rate-limited ring, and the collector,
the query socket and ``pycni flows`` end to end on real logged packets.

The end-to-end tests use a *test resolver standing in for the policy engine*: it names the one
policy chain of tests/flows_util.py's table ``prod/allow-web`` and the addresses of A and B
``client/a`` and ``prod/b``; after the merge the engine provides the real one.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from flows_util import A4, A6, B4, B6, Trio, log_table, serve_tcp, trio
from netns_util import have_root

from pycni.cluster.flows.collector import Collector, FlowMetrics
from pycni.cluster.flows.model import (
    DEFAULT_DENY,
    NETWORK_DEFAULT_DENY,
    NO_POLICY,
    NOT_PROGRAMMED,
    Flow,
    PrefixError,
    Query,
    QueryError,
    Resolver,
    Ring,
    log_prefix,
    parse_prefix,
    parse_query,
    to_flow,
)
from pycni.cluster.flows.server import FlowServer, NoAgent, query
from pycni.net.nflog import LoggedPacket
from pycni.unixsock import AlreadyServing

GROUP = 37
PYCNI = [sys.executable, "-m", "pycni"]
needs_root = pytest.mark.skipif(not have_root(), reason="needs root for network namespaces")


def resolver() -> Resolver:
    pods = {A4: "client/a", A6: "client/a", B4: "prod/b", B6: "prod/b"}
    return Resolver(policy={"p_0123456789_in": "prod/allow-web"}.get, pod=pods.get)


def packet(prefix: str, src: str = A4, dst: str = B4, proto: str = "TCP", sport: int = 40000,
           dport: int = 8080) -> LoggedPacket:
    return LoggedPacket(prefix=prefix, time=1.5, family=6 if ":" in src else 4, src=src, dst=dst,
                        protocol={"TCP": 6, "UDP": 17, "ICMP": 1}[proto], proto=proto, sport=sport, dport=dport)


# ---- the convention and the record ---------------------------------------------------------------

def test_prefix_convention() -> None:
    assert log_prefix("A", "p_0123456789_in") == "pycni:A:p_0123456789_in"
    assert log_prefix("D", "v_0123456789_eg") == "pycni:D:v_0123456789_eg"  # a verdict chain's token
    assert parse_prefix("pycni:D:v_0a1b2c3d4e_in") == ("denied", "v_0a1b2c3d4e_in", "ingress")
    assert parse_prefix("pycni:A:na_eg") == ("allowed", "na_eg", "egress")
    for foreign in ("", "ulogd: x", "pycni:X:p_1_in", "pycni:A:p_1", "pycni:A"):
        assert parse_prefix(foreign) is None
    for verdict, token in (("X", "p_1_in"), ("A", "p_1"), ("A", 'p"1_in'), ("A", "a b_in"), ("A", "x" * 120 + "_in")):
        with pytest.raises(PrefixError):
            log_prefix(verdict, token)


def test_to_flow_names_policy_pods_and_reasons() -> None:
    r = resolver()
    f = to_flow(packet("pycni:A:p_0123456789_in"), r, seq=7)
    assert f == Flow(seq=7, time=1.5, source="client/a", destination="prod/b", src_addr=A4, dst_addr=B4,
                     sport=40000, port=8080, proto="TCP", direction="ingress", verdict="allowed",
                     policy="prod/allow-web", reason="", endpoint="prod/b")
    cases = {"pycni:D:v_0a1b2c3d4e_in": DEFAULT_DENY, "pycni:D:dd_eg": NETWORK_DEFAULT_DENY,
             "pycni:A:na_in": NO_POLICY, "pycni:D:fc_eg": NOT_PROGRAMMED,
             "pycni:A:p_ffffffffff_in": "unknown chain p_ffffffffff_in", "pycni:D:zz_in": "unknown chain zz_in"}
    for prefix, reason in cases.items():
        got = to_flow(packet(prefix), r)
        assert got is not None and (got.policy, got.reason) == ("", reason), prefix
    egress = to_flow(packet("pycni:D:dd_eg", src="10.9.9.9", dst=B4), r)
    assert egress is not None and (egress.direction, egress.endpoint, egress.source) == ("egress", "10.9.9.9",
                                                                                          "10.9.9.9")
    icmp = to_flow(packet("pycni:A:na_in", proto="ICMP", sport=8, dport=0), r)
    assert icmp is not None and (icmp.port, icmp.sport, icmp.icmp_type, icmp.icmp_code) == (None, None, 8, 0)
    assert to_flow(packet("someone-else"), r) is None
    # the engine may name a verdict chain's meaning itself
    names = {"v_0a1b2c3d4e_in": "default deny (prod/x)"}
    named = to_flow(packet("pycni:D:v_0a1b2c3d4e_in"), Resolver(policy=names.get))
    assert named is not None and named.reason == "default deny (prod/x)"


def test_query_filters_and_refusals() -> None:
    f = to_flow(packet("pycni:A:p_0123456789_in"), resolver())
    assert f is not None
    assert Query().matches(f) and Query(namespace="client").matches(f) and Query(namespace="prod").matches(f)
    assert not Query(namespace="other").matches(f) and not Query(namespace="pro").matches(f)
    assert Query(pod="prod/b").matches(f) and not Query(pod="prod/c").matches(f)
    assert Query(verdict="allowed").matches(f) and not Query(verdict="denied").matches(f)
    assert parse_query({"pod": "a/b", "verdict": "denied", "follow": True}) == Query(pod="a/b", verdict="denied",
                                                                                     follow=True)
    for bad, why in (([], "one JSON object"), ({"x": 1}, "unknown request field"), ({"verdict": "maybe"}, "verdict"),
                     ({"pod": "nopod"}, "NS/POD"), ({"follow": "yes"}, "follow"), ({"namespace": 3}, "string"),
                     ({"namespace": "a/b"}, "namespace")):
        with pytest.raises(QueryError, match=why):
            parse_query(bad)


# ---- the ring ------------------------------------------------------------------------------------

def _flow(seq: int) -> Flow:
    f = to_flow(packet("pycni:D:v_x_in", sport=seq % 65536), Resolver(), seq)
    assert f is not None
    return f


def test_ring_keeps_the_newest_and_counts_the_dropped() -> None:
    ring = Ring(capacity=5, rate=1e9)
    for _ in range(12):
        seq = ring.admit()
        assert seq is not None
        ring.add(_flow(seq))
    assert len(ring) == 5 and ring.dropped == 7 and ring.rate_limited == 0
    assert [f.seq for f in ring.since(0)] == [7, 8, 9, 10, 11]
    assert [f.seq for f in ring.since(10)] == [10, 11]
    assert list(ring.follow(Query(), stop=lambda: True)) == ring.since(0)


def test_ring_rate_limit_per_second() -> None:
    now = [100.0]
    ring = Ring(capacity=10_000, rate=50, clock=lambda: now[0])
    kept = sum(ring.admit() is not None for _ in range(500))  # a burst: one second's worth passes
    assert kept == 50 and ring.rate_limited == 450
    now[0] += 0.5  # half a second refills half the bucket
    assert sum(ring.admit() is not None for _ in range(500)) == 25
    now[0] += 10  # never more than a second's worth saved up
    assert sum(ring.admit() is not None for _ in range(500)) == 50


def test_ring_memory_is_bounded() -> None:
    """100,000 flows through a ring of 1,000 hold the memory of 1,000."""
    ring = Ring(capacity=1_000, rate=1e12)
    tracemalloc.start()
    try:
        def feed(n: int) -> None:
            for _ in range(n):
                seq = ring.admit()
                assert seq is not None
                ring.add(_flow(seq))
        feed(1_000)
        full = tracemalloc.get_traced_memory()[0]
        feed(99_000)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(ring) == 1_000 and ring.dropped == 99_000
    assert after < full * 1.1 + 65536, (full, after)


def test_follow_wakes_on_new_flows_and_ends_on_close() -> None:
    ring = Ring(capacity=10, rate=1e9)
    got: list[int] = []
    import threading

    t = threading.Thread(target=lambda: got.extend(f.seq for f in ring.follow(Query(follow=True), lambda: False,
                                                                               poll=0.05)))
    t.start()
    for _ in range(3):
        seq = ring.admit()
        assert seq is not None
        ring.add(_flow(seq))
        time.sleep(0.05)
    ring.close()
    t.join(5)
    assert not t.is_alive() and got == [0, 1, 2]


# ---- the collector, the socket and `pycni flows`, on real packets -------------------------------------

class Agent:
    """The pieces the node agent will run: a ring, a collector on R's NFLOG group, a server."""

    def __init__(self, net: Trio, path: str, capacity: int = 1000, rate: float = 1000.0) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()
        self.ring = Ring(capacity, rate)
        self.collector = Collector(self.ring, resolver(), GROUP, netns=net.r.path, metrics=FlowMetrics(self.registry))
        self.server = FlowServer(path, self.ring)
        self.path = path

    def __enter__(self) -> Agent:
        self.collector.start()
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.collector.stop()
        self.server.stop()

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def wait_for(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ring) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.ring) >= n, self.ring.since(0)


@pytest.fixture
def net() -> Iterator[Trio]:
    with trio() as t:
        t.nft(log_table(GROUP))
        yield t


@pytest.fixture
def sock(tmp_path: Path) -> str:
    return str(tmp_path / "flows.sock")


def _traffic(net: Trio) -> None:
    """One allowed TCP connection A -> B:8080 per family, one denied UDP datagram A -> B:5353 (IPv4)."""
    net.send(net.a, f"""
for dst in ("{B4}", "{B6}"):
    t = socket.create_connection((dst, 8080), timeout=5); t.close()
u = socket.socket(); u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b"x", ("{B4}", 5353))
""")


def pycni(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PYCNI, *args], capture_output=True, text=True, timeout=timeout)


@needs_root
def test_flows_end_to_end_table_json_and_filters(net: Trio, sock: str) -> None:
    server = serve_tcp(net.b)
    try:
        with Agent(net, sock) as agent:
            _traffic(net)
            agent.wait_for(3)
            out = pycni("flows", "--socket", sock)
            assert out.returncode == 0, out.stderr
            lines = out.stdout.splitlines()
            assert lines[0].split() == ["TIME", "SOURCE", "DESTINATION", "PORT", "PROTO", "DIRECTION", "VERDICT",
                                        "POLICY"]
            rows = [line.split(None, 7) for line in lines[1:]]
            assert [r[1:] for r in rows] == [
                ["client/a", "prod/b", "8080", "TCP", "ingress", "allowed", "prod/allow-web"],
                ["client/a", "prod/b", "8080", "TCP", "ingress", "allowed", "prod/allow-web"],
                ["client/a", "prod/b", "5353", "UDP", "ingress", "denied", "default deny"]], out.stdout
            assert all(r[0].endswith("Z") and r[0][:4].isdigit() for r in rows)

            js = pycni("flows", "--socket", sock, "-o", "json")
            flows = json.loads(js.stdout)
            assert [(f["src_addr"], f["dst_addr"], f["port"], f["proto"], f["verdict"], f["policy"], f["reason"])
                    for f in flows] == [(A4, B4, 8080, "TCP", "allowed", "prod/allow-web", ""),
                                        (A6, B6, 8080, "TCP", "allowed", "prod/allow-web", ""),
                                        (A4, B4, 5353, "UDP", "denied", "", "default deny")]
            assert all(f["endpoint"] == "prod/b" and f["direction"] == "ingress" for f in flows)

            wide = pycni("flows", "--socket", sock, "-o", "wide").stdout.splitlines()
            assert wide[0].split()[-4:] == ["SRC-ADDR", "SPORT", "DST-ADDR", "ENDPOINT"]
            assert wide[3].split()[-4:-2] == [A4, wide[3].split()[-4:-2][1]] and wide[3].split()[-2:] == [B4, "prod/b"]

            def count(*flags: str) -> int:
                res = pycni("flows", "--socket", sock, "-o", "json", *flags)
                assert res.returncode == 0, res.stderr
                return len(json.loads(res.stdout))

            assert count("--verdict", "denied") == 1
            assert count("--verdict", "allowed") == 2
            assert count("-n", "prod") == 3 and count("-n", "client") == 3 and count("-n", "kube-system") == 0
            assert count("--pod", "prod/b") == 3 and count("--pod", "prod/c") == 0
            assert count("--pod", "client/a", "--verdict", "denied") == 1
            assert count("-n", "prod", "--verdict", "denied", "--pod", "prod/x") == 0

            # the metrics the collector keeps (the agent serves them on --metrics-address after the merge)
            assert agent.metric("pycni_flows_logged_total") == 3
            assert agent.metric("pycni_flows_rate_limited_total") == 0
            assert agent.metric("pycni_policy_dropped_packets_total", namespace="prod", pod="b",
                                policy="default deny") == 1
    finally:
        server.kill()
        server.wait()


@needs_root
def test_follow_streams_new_flows(net: Trio, sock: str) -> None:
    with Agent(net, sock) as agent:
        net.send(net.a, f'socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("{B4}", 5353))')
        agent.wait_for(1)
        follower = subprocess.Popen([*PYCNI, "flows", "--socket", sock, "--follow", "-o", "json", "--verdict",
                                     "denied"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert follower.stdout is not None
            first = json.loads(follower.stdout.readline())  # the recent one
            assert (first["verdict"], first["port"]) == ("denied", 5353)
            net.a.run(["ping", "-c1", "-W2", B4])  # allowed: filtered out of this stream
            net.send(net.a, f'socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"x", ("{B6}", 5353))')
            second = json.loads(follower.stdout.readline())  # the new one, as it came
            assert (second["dst_addr"], second["verdict"], second["reason"]) == (B6, "denied", "default deny")
            table = subprocess.Popen([*PYCNI, "flows", "--socket", sock, "-f"], stdout=subprocess.PIPE, text=True)
            try:
                assert table.stdout is not None
                assert table.stdout.readline().split()[:2] == ["TIME", "SOURCE"]
                assert len([table.stdout.readline() for _ in range(3)]) == 3  # both denied, the ping
            finally:
                table.terminate()
                table.wait(10)
        finally:
            follower.terminate()
            follower.wait(10)
        assert len(agent.ring) == 3


@needs_root
def test_socket_serves_requests_and_refuses_the_rest(net: Trio, sock: str, tmp_path: Path) -> None:
    with Agent(net, sock):
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert list(query(sock, {})) == []  # nothing logged yet: an empty answer, not an error

        def raw(data: bytes) -> list[dict[str, object]]:
            c = socket.socket(socket.AF_UNIX)
            c.settimeout(10)
            c.connect(sock)
            c.sendall(data)
            got = b""
            while chunk := c.recv(65536):
                got += chunk
            c.close()
            return [json.loads(x) for x in got.splitlines()]

        assert raw(b"{}\n") == [{"end": 0}]
        assert raw(b'{"verdict": "denied", "namespace": "prod"}\n') == [{"end": 0}]
        for bad, why in ((b"not json\n", "bad request"), (b'{"path": "/etc/shadow"}\n', "unknown request field"),
                         (b'{"verdict": "all"}\n', "verdict"), (b"[1]\n", "one JSON object"),
                         (b"{" + b" " * 5000 + b"}\n", "at most 4096 bytes"), (b"\xff\xfe\n", "bad request")):
            answer = raw(bad)
            assert len(answer) == 1 and why in str(answer[0].get("error")), (bad[:20], answer)
        with pytest.raises(QueryError, match="verdict"):
            list(query(sock, {"verdict": "maybe"}))
        # 16 followers at once at most; one that leaves frees its place
        followers = []
        for _ in range(16):
            c = socket.socket(socket.AF_UNIX)
            c.connect(sock)
            c.sendall(b'{"follow": true}\n')
            followers.append(c)
        time.sleep(0.3)
        assert "busy" in str(raw(b"{}\n")[0].get("error"))
        followers.pop().close()
        deadline = time.monotonic() + 5
        while (answer := raw(b"{}\n")) != [{"end": 0}] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer == [{"end": 0}]
        for c in followers:
            c.close()
        # a second agent on the same path is refused; on its own path it serves
        with pytest.raises(AlreadyServing):
            FlowServer(sock, Ring()).start()
        other = FlowServer(str(tmp_path / "other.sock"), Ring())
        other.start()
        try:
            assert list(query(other.path, {})) == []
        finally:
            other.stop()
        assert not os.path.exists(other.path)
    assert not os.path.exists(sock)  # removed at stop
    with pytest.raises(NoAgent, match=sock):
        list(query(sock, {}))


def test_cli_without_an_agent_is_one_line_exit_1(tmp_path: Path) -> None:
    path = str(tmp_path / "none.sock")
    res = pycni("flows", "--socket", path)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("pycni: no flows agent answers on " + path)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # a socket nobody listens on: refused
    res = pycni("flows", "--socket", str(stale), "--follow")
    assert res.returncode == 1 and res.stderr.startswith(f"pycni: no flows agent answers on {stale}")
    for args in (["--verdict", "maybe"], ["--pod", "nopod"], ["-n", "a/b"]):
        res = pycni("flows", "--socket", path, *args)
        assert res.returncode == 2 and "Traceback" not in res.stderr


@needs_root
def test_flood_stays_within_the_bounds(net: Trio, sock: str) -> None:
    """20,000 denied datagrams in a burst: the kernel's limit, the ring's rate and its capacity hold."""
    net.nft(f"""
table inet pf36_flood {{
  chain flood {{
    type filter hook forward priority filter - 10; policy accept;
    udp dport 9999 limit rate 100000/second burst 100000 packets log group {GROUP} prefix "pycni:D:v_fb0_in"
    udp dport 9999 drop
  }}
}}
""")
    with Agent(net, sock, capacity=300, rate=2000) as agent:
        net.send(net.a, f"""
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20000):
    s.sendto(b"x", ("{B4}", 9999))
""", timeout=120)
        deadline = time.monotonic() + 20
        while agent.collector.packets + 0 < 20000 and time.monotonic() < deadline:
            before = agent.collector.packets
            time.sleep(0.5)
            if agent.collector.packets == before and before:
                break  # the reader has caught up with what the kernel delivered
        read = agent.collector.packets
        assert read > 2300  # most of the burst reached the reader (some may be lost to a full socket buffer)
        assert len(agent.ring) == 300  # never more than the capacity
        logged = agent.metric("pycni_flows_logged_total")
        limited = agent.metric("pycni_flows_rate_limited_total")
        assert logged + limited == read and limited == agent.ring.rate_limited > 0
        assert logged <= 2000 + 2000 * 25 and agent.ring.dropped == logged - 300
        assert agent.metric("pycni_policy_dropped_packets_total", namespace="prod", pod="b",
                            policy="default deny") == read  # every denied packet read is counted
        assert len(list(query(sock, {"verdict": "denied"}))) == 300


@needs_root
def test_the_documented_rule_layout_logs_without_changing_verdicts(net: Trio, sock: str) -> None:
    """docs/flows.md's layout for the engine, with prefixes from log_prefix: a policy chain's accept
    goes through a chain that logs under a `limit rate` then accepts, an endpoint chain logs then
    drops, and pods no policy selects fall through the vmap to an `na` log rule. Past the limits
    nothing is logged, yet every connection is still accepted and every datagram still dropped."""
    allow, deny, na = log_prefix("A", "p_0123456789_in"), log_prefix("D", "v_fb0_in"), log_prefix("A", "na_in")
    lim = "limit rate 1/minute burst 2 packets"
    net.r.run(["nft", "delete", "table", "inet", "pf36_flows"])
    net.nft(f"""
table inet pf36_layout {{
  map ingress {{ type inet_service : verdict; elements = {{ 8080 : jump v_fb0_in, 5353 : jump v_fb0_in }} }}
  chain wl_ingress {{
    type filter hook forward priority filter - 1; policy accept;
    ct state established,related accept
    oifname "fb0" th dport vmap @ingress
    oifname "fb0" {lim} log group {GROUP} prefix "{na}"
  }}
  chain v_fb0_in {{
    jump p_0123456789_in
    {lim} log group {GROUP} prefix "{deny}"
    drop
  }}
  chain p_0123456789_in {{
    tcp dport 8080 goto a_0123456789_in
  }}
  chain a_0123456789_in {{
    {lim} log group {GROUP} prefix "{allow}"
    accept
  }}
}}
""")
    server = serve_tcp(net.b)
    udp = subprocess.Popen(["ip", "netns", "exec", net.b.name, sys.executable, "-c",
                            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('', 5353))\n"
                            "s.settimeout(3)\nn = 0\nprint('up', flush=True)\ntry:\n    while True:\n"
                            "        s.recv(10); n += 1\nexcept OSError:\n    print(n)\n"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert udp.stdout is not None and udp.stdout.readline().strip() == "up"
        with Agent(net, sock) as agent:
            net.send(net.a, f"""
for i in range(5):
    socket.create_connection(("{B4}", 8080), timeout=5).close()   # all accepted (or this raises)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(5):
    u.sendto(b"x", ("{B4}", 5353))
""")
            for _ in range(3):  # not in the map: falls through, allowed (three pings: three ICMP ids, three flows)
                net.a.run(["ping", "-c1", "-W2", B4])
            agent.wait_for(6)
            time.sleep(0.5)
            flows = list(query(sock, {}))
        assert udp.wait(10) == 0 and udp.stdout.read().strip() == "0"  # every datagram dropped
    finally:
        server.kill()
        server.wait()
        udp.kill()
        udp.wait()
    seen = sorted((f["verdict"], f["policy"] or f["reason"], f["proto"]) for f in flows)
    assert seen == [("allowed", "no policy selects this pod", "ICMP")] * 2 + [
        ("allowed", "prod/allow-web", "TCP")] * 2 + [("denied", "default deny", "UDP")] * 2  # the bursts of 2


@needs_root
def test_the_agents_plug_in_path(net: Trio, sock: str) -> None:
    """What `pycni node` will call (docs/flows.md, "For the policy engine"): its flags, from_args, start, stop."""
    import argparse

    from prometheus_client import CollectorRegistry

    from pycni.cluster.flows.collector import FlowMetrics
    from pycni.cluster.flows.service import FlowService, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert FlowService.from_args(parser.parse_args(["--flows-socket", ""]), resolver()) is None
    args = parser.parse_args(["--flows-socket", sock, "--flows-group", str(GROUP), "--flows-capacity", "2",
                              "--flows-rate", "100"])
    registry = CollectorRegistry()
    svc = FlowService.from_args(args, resolver(), FlowMetrics(registry))
    assert svc is not None and svc.ring.capacity == 2 and svc.ring.rate == 100
    svc.collector.netns = net.r.path  # the test's router namespace stands in for the node's own
    svc.start()
    try:
        send = f'u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nu.sendto(b"x", ("{B4}", 5353))'
        net.send(net.a, send)
        follower = subprocess.Popen([*PYCNI, "flows", "--socket", sock, "-f", "-o", "json"],
                                    stdout=subprocess.PIPE, text=True)
        assert follower.stdout is not None and json.loads(follower.stdout.readline())["seq"] == 0  # streaming now
        net.send(net.a, send)
        net.send(net.a, send)
        deadline = time.monotonic() + 10
        while svc.ring.dropped < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(svc.ring) == 2 and svc.ring.dropped == 1  # capacity 2: the oldest went
        assert registry.get_sample_value("pycni_flows_logged_total") == 3
    finally:
        svc.stop()
    assert follower.wait(10) == 0  # the agent stopping ends a follower's stream: exit 0
    assert [json.loads(x)["seq"] for x in follower.stdout.read().splitlines()] == [1, 2]
    assert not os.path.exists(sock)


@pytest.mark.parametrize("flag", [["--flows-group", "70000"], ["--flows-capacity", "0"], ["--flows-rate", "0"]])
def test_the_agent_refuses_bad_flows_flags_in_one_line(flag: list[str]) -> None:
    """A group the kernel cannot take would make every policy update fail: refused at start (code 7)."""
    out = subprocess.run([*PYCNI, "node", "--underlay-ip", "192.0.2.1", "--etcd-endpoints", "http://127.0.0.1:1",
                          *flag], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == ["pycni: invalid flows settings: --flows-group 0..65535, --flows-capacity at "
                                       "least 1, --flows-rate above 0 (code 7)"], out.stderr
