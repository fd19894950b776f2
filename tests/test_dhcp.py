"""dhcp IPAM: our plugin and daemon against a real dnsmasq, all inside throwaway namespaces.

Layout per test: a "host" namespace with bridge br0 (10.77.0.254/24, so the host routes to the
server as a real host would); a "server" namespace running dnsmasq on a veth into br0; one
namespace per container, attached to br0 by a veth (made by the test, or by a bridge plugin).
The dhcp daemon runs in the host namespace on a socket in the test's tmp dir. Nothing runs in
the machine's own namespace; dnsmasq and the daemon are killed in teardown.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import run

from pycni import ipaddr
from pycni.plugins.ipam.dhcp import message as M
from pycni.plugins.ipam.dhcp.daemon import client_options, parse_duration
from pycni.plugins.ipam.dhcp.lease import Lease, Timing
from pycni.spec.errors import CNIError

SERVER_IP = "10.77.0.1"
HOST_IP = "10.77.0.254"
RANGE = (ipaddr.IPv4Address("10.77.0.100"), ipaddr.IPv4Address("10.77.0.150"))
T1 = 3  # dnsmasq's minimum lease is 2 minutes; T1/T2 options make it ask for renewal early
T2 = 6
DAEMON_TIMEOUT = "3s"
DAEMON_RESEND_TIMEOUT = "5s"
GO_BRIDGE = "/usr/lib/cni/bridge"


# ---- fixtures --------------------------------------------------------------------------------
@dataclass
class DHCPNet:
    host: Namespace
    server: Namespace
    tmp: Path
    dnsmasq: subprocess.Popen[bytes]

    @property
    def lease_file(self) -> Path:
        return self.tmp / "dnsmasq.leases"

    @property
    def log_file(self) -> Path:
        return self.tmp / "dnsmasq.log"

    def leases(self) -> dict[str, str]:
        """MAC -> IP of the leases dnsmasq holds now (its lease file)."""
        text = self.lease_file.read_text() if self.lease_file.exists() else ""
        return {f[1]: f[2] for f in (line.split() for line in text.splitlines()) if len(f) >= 3}

    def lease_lines(self) -> list[str]:
        return self.lease_file.read_text().splitlines() if self.lease_file.exists() else []

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""


# Waits return as soon as the condition holds; the bound only decides when to give up, so it is
# generous: protocol timers slip when the machine is busy (CI runs everything at once).
WAIT_SLACK = 4


def _wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    timeout *= WAIT_SLACK
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def dhcp_net(netns_factory: Callable[[], Namespace], host_ns: Namespace, tmp_path: Path) -> Iterator[DHCPNet]:
    server = netns_factory()
    host_ns.run(["ip", "link", "add", "br0", "type", "bridge"])
    host_ns.run(["ip", "link", "set", "br0", "address", "02:00:0a:4d:00:fe"])  # fixed, as ports come and go
    host_ns.run(["ip", "addr", "add", f"{HOST_IP}/24", "dev", "br0"])
    host_ns.run(["ip", "link", "set", "br0", "up"])
    host_ns.run(["ip", "link", "add", "vsrv", "type", "veth", "peer", "name", "eth0", "netns", server.name])
    host_ns.run(["ip", "link", "set", "vsrv", "master", "br0", "up"])
    server.run(["ip", "addr", "add", f"{SERVER_IP}/24", "dev", "eth0"])
    server.run(["ip", "link", "set", "eth0", "up"])
    args = ["ip", "netns", "exec", server.name, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
            "--port=0", "--interface=eth0", "--bind-interfaces", "--user=root", "--no-ping", "--log-dhcp",
            f"--dhcp-range={RANGE[0]},{RANGE[1]},255.255.255.0,2m",
            f"--dhcp-option=option:router,{SERVER_IP}", "--dhcp-option=option:dns-server,10.77.0.53",
            "--dhcp-option=option:domain-name,pods.example.org",
            "--dhcp-option=option:domain-search,a.example.org,b.example.org",
            f"--dhcp-option=option:T1,{T1}", f"--dhcp-option=option:T2,{T2}",
            f"--dhcp-leasefile={tmp_path / 'dnsmasq.leases'}", f"--pid-file={tmp_path / 'dnsmasq.pid'}",
            f"--log-facility={tmp_path / 'dnsmasq.log'}"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        net = DHCPNet(host_ns, server, tmp_path, proc)
        _wait_for(lambda: "DHCP, sockets bound" in net.log() or proc.poll() is not None, 10, "dnsmasq")
        assert proc.poll() is None, f"dnsmasq exited: {net.log()}"
        yield net
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def cni_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """CNI_PATH with our dhcp and our bridge."""
    from pycni.install_plugins import install

    d = tmp_path_factory.mktemp("dhcp-bin")
    install(str(d), ["dhcp", "bridge"])
    return str(d)


@pytest.fixture(scope="module")
def go_bridge_bin(tmp_path_factory: pytest.TempPathFactory, cni_bin: str) -> str:
    """CNI_PATH with our dhcp and the Go reference bridge."""
    if not os.access(GO_BRIDGE, os.X_OK):
        pytest.skip("Go reference bridge not installed")
    d = tmp_path_factory.mktemp("go-bridge-bin")
    os.symlink(GO_BRIDGE, d / "bridge")
    os.symlink(os.path.join(cni_bin, "dhcp"), d / "dhcp")
    return str(d)


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    socket: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


def _start_daemon(host: Namespace, bin_dir: str, tmp: Path, *extra: str, go: bool = False) -> Daemon:
    sock = str(tmp / "dhcp.sock")
    log_path = tmp / "daemon.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", host.name, os.path.join(bin_dir, "dhcp"), "daemon",
                                 "-socketpath", sock, "-pidfile", str(tmp / "daemon.pid"),
                                 "-timeout", DAEMON_TIMEOUT,
                                 # Go 1.1.1 has no -resendtimeout
                                 *([] if go else ["-resendtimeout", DAEMON_RESEND_TIMEOUT]), *extra],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    d = Daemon(proc, sock, log_path)
    try:
        _wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, 10, "the dhcp daemon's socket")
    except AssertionError:
        _stop(proc)
        raise
    assert proc.poll() is None, d.log()
    return d


@pytest.fixture
def daemon(dhcp_net: DHCPNet, cni_bin: str) -> Iterator[Daemon]:
    d = _start_daemon(dhcp_net.host, cni_bin, dhcp_net.tmp)
    try:
        yield d
    finally:
        _stop(d.proc)


# ---- helpers ---------------------------------------------------------------------------------
def _conf(socket: str, version: str = "1.0.0", name: str = "dhcpnet", **ipam: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": name, "type": "bridge", "bridge": "br0",
            "ipam": {"type": "dhcp", "daemonSocketPath": socket, **ipam}}


def _invoke(host: Namespace, bin_dir: str, plugin: str, command: str, conf: dict[str, Any], container_id: str,
            netns: str, ifname: str = "eth0", cni_args: str = "") -> tuple[int, Any, str]:
    """``plugin``'s executable in ``bin_dir`` (also CNI_PATH), run in ``host``: the exit code, its JSON (None
    when it printed nothing) and stderr."""
    out = run(plugin, command, conf, via="exec", host=host, cni_path=bin_dir, container_id=container_id, netns=netns,
              ifname=ifname, args=cni_args)
    return out.exit_code, json.loads(out.stdout) if out.stdout.strip() else None, out.stderr.decode()


def _attach(net: DHCPNet, container: Namespace, port: str) -> str:
    """A veth from br0 into ``container`` (as eth0, down); returns its MAC."""
    net.host.run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", container.name])
    net.host.run(["ip", "link", "set", port, "master", "br0", "up"])
    info = json.loads(container.run(["ip", "-j", "link", "show", "eth0"]).stdout)
    return str(info[0]["address"])


def _in_range(addr: str) -> bool:
    ip = ipaddr.IPv4Address(addr.split("/")[0])
    return RANGE[0] <= ip <= RANGE[1]


# ---- the plugin against dnsmasq --------------------------------------------------------------
def test_add_returns_lease_with_gateway_routes_and_dns(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                                                       container_ns: Namespace) -> None:
    mac = _attach(dhcp_net, container_ns, "vc1")
    conf = _conf(daemon.socket, "1.1.0", priority=50)
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, "ctr1", container_ns.path)
    assert rc == 0, (out, err, daemon.log())
    assert out["cniVersion"] == "1.1.0"
    [ip] = out["ips"]
    assert _in_range(ip["address"]) and ip["address"].endswith("/24")
    assert ip["gateway"] == SERVER_IP
    assert out["routes"] == [{"dst": "0.0.0.0/0", "gw": SERVER_IP, "priority": 50}]
    assert out["dns"] == {"nameservers": ["10.77.0.53"], "domain": "pods.example.org",
                          "search": ["a.example.org", "b.example.org"]}
    assert dhcp_net.leases().get(mac) == ip["address"].split("/")[0]
    # the reference's client id (containerID/network/ifname) identifies us to the server
    assert b"ctr1/dhcpnet/eth0".hex(":") in " ".join(dhcp_net.lease_lines())
    # legacy versions get the same lease converted
    rc, old, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", _conf(daemon.socket, "0.2.0"), "ctr1",
                         container_ns.path)
    assert rc == 0 and old["ip4"]["ip"] == ip["address"], old


@pytest.mark.parametrize("bridge", ["pycni", "go"])
def test_two_containers_through_bridge_get_distinct_leases_and_del_releases(
        request: pytest.FixtureRequest, dhcp_net: DHCPNet, daemon: Daemon, bridge: str,
        netns_factory: Callable[[], Namespace]) -> None:
    bin_dir = request.getfixturevalue("cni_bin" if bridge == "pycni" else "go_bridge_bin")
    conf = _conf(daemon.socket)
    containers = [netns_factory(), netns_factory()]
    addrs = []
    results = []
    for i, c in enumerate(containers):
        rc, out, err = _invoke(dhcp_net.host, bin_dir, "bridge", "ADD", conf, f"ctr{i}", c.path)
        assert rc == 0, (out, err, daemon.log())
        results.append(out)
        [ip] = out["ips"]
        assert _in_range(ip["address"]) and ip["gateway"] == SERVER_IP
        addrs.append(ip["address"].split("/")[0])
        # the bridge configured the address: real packets reach the DHCP server's host
        shown = c.run(["ip", "-4", "-o", "addr", "show", "eth0"]).stdout
        assert ip["address"] in shown
        c.run(["ping", "-c", "1", "-W", "2", SERVER_IP])
    assert len(set(addrs)) == 2
    assert sorted(dhcp_net.leases().values()) == sorted(addrs)
    for i, c in enumerate(containers):
        rc, out, err = _invoke(dhcp_net.host, bin_dir, "bridge", "CHECK", {**conf, "prevResult": results[i]},
                               f"ctr{i}", c.path)
        assert rc == 0, (out, err)
    for i, c in enumerate(containers):
        rc, out, err = _invoke(dhcp_net.host, bin_dir, "bridge", "DEL", conf, f"ctr{i}", c.path)
        assert rc == 0, (out, err)
    _wait_for(lambda: not dhcp_net.leases(), 5, f"dnsmasq to drop the leases: {dhcp_net.lease_lines()}\n{daemon.log()}")
    # dnsmasq logs asynchronously: its lease file can be rewritten before the second line is written
    _wait_for(lambda: dhcp_net.log().count("DHCPRELEASE") >= 2, 5, f"dnsmasq to log both releases: {dhcp_net.log()}")
    assert dhcp_net.log().count("DHCPRELEASE") == 2
    # DEL again is fine
    rc, out, err = _invoke(dhcp_net.host, bin_dir, "bridge", "DEL", conf, "ctr0", containers[0].path)
    assert rc == 0, (out, err)


def test_lease_is_renewed_in_background(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                                        container_ns: Namespace) -> None:
    mac = _attach(dhcp_net, container_ns, "vc1")
    conf = _conf(daemon.socket)
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, "ctr1", container_ns.path)
    assert rc == 0, (out, err)
    addr = out["ips"][0]["address"].split("/")[0]
    requests = re.compile(rf"DHCPREQUEST\(eth0\) {re.escape(addr)} {mac}")
    assert len(requests.findall(dhcp_net.log())) == 1
    # the server's T1 is 3 s: two renewals within ~8 s, each answered with an ACK
    _wait_for(lambda: len(requests.findall(dhcp_net.log())) >= 3, 12, "renewing DHCPREQUESTs")
    _wait_for(lambda: daemon.log().count("ctr1/dhcpnet/eth0: lease renewed") >= 2, 5, "the daemon to take the ACKs")
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "CHECK",
                           {**conf, "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": f"{addr}/24"}]}},
                           "ctr1", container_ns.path)
    assert rc == 0, (out, err)
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "CHECK",
                         {**conf, "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.77.0.99/24"}]}},
                         "ctr1", container_ns.path)
    assert rc == 1 and "not in prevResult" in out["msg"]
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "DEL", conf, "ctr1", container_ns.path)
    assert rc == 0
    _wait_for(lambda: mac not in dhcp_net.leases(), 5, "the server to drop the released lease")  # it is async
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "CHECK", conf, "ctr1", container_ns.path)
    assert rc == 1 and "no DHCP lease held" in out["msg"]


def test_lease_rebinds_and_reacquires_after_expiry(dhcp_net: DHCPNet, container_ns: Namespace,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The maintenance state machine, run in-process with its clock moved forward."""
    caplog.set_level(logging.INFO, logger="pycni.dhcp")
    mac = _attach(dhcp_net, container_ns, "vcl")
    key = "ctrl/dhcpnet/eth0"
    lease = Lease(key, "ctrl", "dhcpnet", container_ns.path, "eth0", client_options({}, "", key, False),
                  Timing(timeout=3, resend_max=4, resend_timeout=5))
    lease.acquire()
    assert lease.binding is not None
    addr = str(lease.binding.address)
    discovers = re.compile(rf"DHCPDISCOVER\(eth0\) (?:{re.escape(addr)} )?{mac}")
    assert len(discovers.findall(dhcp_net.log())) == 1
    try:
        now = time.monotonic()
        lease.renew_at = lease.rebind_at = now - 1  # past T2: rebind by broadcast
        lease.start()
        _wait_for(lambda: lease.renewals == 1, 10, "the rebinding REQUEST to be ACKed")
        assert f"{key}: no renewal by T2, rebinding" in caplog.text
        now = time.monotonic()
        lease.renew_at = lease.rebind_at = lease.expire_at = now - 1  # expired: INIT again, same address
        _wait_for(lambda: lease.renewals == 2, T1 + 10, "a new lease after expiry")
        assert "expired, acquiring again" in caplog.text
        assert len(discovers.findall(dhcp_net.log())) == 2
        assert str(lease.binding.address) == addr and lease.held() and lease.alive
    finally:
        lease.stop(release=True)
    _wait_for(lambda: mac not in dhcp_net.leases(), 5, "the release")


def test_renewal_survives_a_server_pause(dhcp_net: DHCPNet, container_ns: Namespace,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """The server stops answering across T1 and T2; the lease is kept once it is back."""
    caplog.set_level(logging.INFO, logger="pycni.dhcp")
    _attach(dhcp_net, container_ns, "vcp")
    key = "ctrp/dhcpnet/eth0"
    lease = Lease(key, "ctrp", "dhcpnet", container_ns.path, "eth0", client_options({}, "", key, False),
                  Timing(timeout=1, resend_max=4, resend_timeout=5))
    lease.acquire()
    lease.start()
    dhcp_net.dnsmasq.send_signal(signal.SIGSTOP)
    try:
        _wait_for(lambda: "no renewal by T2, rebinding" in caplog.text, T2 + 6, "failed renewals to reach T2")
        assert lease.renewals == 0 and lease.alive
    finally:
        dhcp_net.dnsmasq.send_signal(signal.SIGCONT)
    try:
        _wait_for(lambda: lease.renewals >= 1, 10, "the lease to be renewed once the server is back")
        assert lease.held()
    finally:
        lease.stop(release=True)


def test_packet_socket_sees_only_dhcp_client_traffic(dhcp_net: DHCPNet, container_ns: Namespace) -> None:
    """The kernel filter keeps everything but UDP to port 68 away from the client's socket."""
    from pycni.plugins.ipam.dhcp.client import Transport, set_link_up

    _attach(dhcp_net, container_ns, "vcb")
    send = ("import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1); "
            "s.sendto(b'x'*64, ('10.77.0.255', int(sys.argv[1])))")
    with container_ns.enter():
        set_link_up("eth0")
        with Transport("eth0") as t:
            t.sock.settimeout(1.0)
            dhcp_net.server.run([sys.executable, "-c", send, "9999"])
            with pytest.raises(TimeoutError):
                t.sock.recv(2048)
            dhcp_net.server.run([sys.executable, "-c", send, "68"])
            frame = t.sock.recv(2048)
    assert frame[9] == 17 and int.from_bytes(frame[22:24], "big") == 68


def test_many_concurrent_adds(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                              netns_factory: Callable[[], Namespace]) -> None:
    n = 8
    containers = [netns_factory() for _ in range(n)]
    macs = [_attach(dhcp_net, c, f"vc{i}") for i, c in enumerate(containers)]
    conf = _conf(daemon.socket)
    results: dict[int, tuple[int, Any, str]] = {}

    def add(i: int) -> None:
        results[i] = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, f"ctr{i}", containers[i].path)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(n):
        assert results[i][0] == 0, (results[i], daemon.log())
    addrs = [results[i][1]["ips"][0]["address"].split("/")[0] for i in range(n)]
    assert len(set(addrs)) == n
    assert dhcp_net.leases() == dict(zip(macs, addrs, strict=True))
    dels = [threading.Thread(target=_invoke, args=(dhcp_net.host, cni_bin, "dhcp", "DEL", conf, f"ctr{i}",
                                                     containers[i].path)) for i in range(n)]
    for t in dels:
        t.start()
    for t in dels:
        t.join(60)
    _wait_for(lambda: not dhcp_net.leases(), 5, "all leases released")


def test_silent_server_fails_add_within_timeout(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                                               container_ns: Namespace) -> None:
    # a bridge with no DHCP server behind it
    dhcp_net.host.run(["ip", "link", "add", "br1", "type", "bridge"])
    dhcp_net.host.run(["ip", "link", "set", "br1", "up"])
    dhcp_net.host.run(["ip", "link", "add", "vq", "type", "veth", "peer", "name", "eth0", "netns",
                       container_ns.name])
    dhcp_net.host.run(["ip", "link", "set", "vq", "master", "br1", "up"])
    started = time.monotonic()
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", _conf(daemon.socket), "ctrq", container_ns.path)
    elapsed = time.monotonic() - started
    assert rc == 1, (out, err)
    assert out["code"] == 11
    assert "no answer from a DHCP server" in out["msg"] and "retry" in out["details"]
    # It gives up after -resendtimeout (5s), not before, and does not hang: a behaviour bound with
    # generous slack, not a speed measurement.
    assert 4 <= elapsed < 60, elapsed
    assert "Traceback" not in daemon.log()
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "CHECK", _conf(daemon.socket), "ctrq", container_ns.path)
    assert rc == 1 and "no DHCP lease held" in out["msg"]  # nothing half-made


def test_bad_netns_or_interface_is_a_clear_error(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                                                 container_ns: Namespace) -> None:
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", _conf(daemon.socket), "ctrx", container_ns.path,
                         ifname="nosuch0")
    assert rc == 1 and out["code"] == 4 and "nosuch0" in out["msg"], out
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", _conf(daemon.socket), "ctrx",
                         "/var/run/netns/pycni-no-such-ns")
    assert rc == 1 and out["code"] == 4, out
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD",
                         _conf(daemon.socket, provide=[{"option": "no-such-option", "value": "x"}]), "ctrx",
                         container_ns.path)
    assert rc == 1 and out["code"] == 7 and "no-such-option" in out["msg"], out
    assert daemon.proc.poll() is None


def test_provide_hostname_from_cni_args(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                                        container_ns: Namespace) -> None:
    mac = _attach(dhcp_net, container_ns, "vc1")
    conf = _conf(daemon.socket, provide=[{"option": "host-name", "fromArg": "K8S_POD_NAME"}],
                 request=[{"option": "subnet-mask", "skipDefault": True}, {"option": "routers"}])
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, "ctrh", container_ns.path,
                           cni_args="IgnoreUnknown=1;K8S_POD_NAME=web-0")
    assert rc == 0, (out, err)
    assert not out.get("dns")  # skipDefault: only mask and router were asked for
    [line] = [ln for ln in dhcp_net.lease_lines() if mac in ln]
    assert line.split()[3] == "web-0"


def test_daemon_survives_container_netns_disappearing(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                                                      netns_factory: Callable[[], Namespace]) -> None:
    gone, other = netns_factory(), netns_factory()
    _attach(dhcp_net, gone, "vgone")
    conf = _conf(daemon.socket)
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, "ctrgone", gone.path)
    assert rc == 0
    gone.delete()  # the container vanished without DEL
    _wait_for(lambda: "ctrgone/dhcpnet/eth0: " in daemon.log() and "stopping lease maintenance" in daemon.log(),
              T1 + 8, "lease maintenance to notice the namespace is gone")
    assert daemon.proc.poll() is None
    _attach(dhcp_net, other, "vother")
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, "ctrother", other.path)
    assert rc == 0, (out, err)
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "DEL", conf, "ctrgone", gone.path)
    assert rc == 0, (out, err)


def test_gc_releases_leases_not_listed(dhcp_net: DHCPNet, daemon: Daemon, cni_bin: str,
                                       netns_factory: Callable[[], Namespace]) -> None:
    a, b = netns_factory(), netns_factory()
    mac_a, mac_b = _attach(dhcp_net, a, "va"), _attach(dhcp_net, b, "vb")
    conf = _conf(daemon.socket, "1.1.0")
    for cid, ns in (("ctra", a), ("ctrb", b)):
        rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, cid, ns.path)
        assert rc == 0, (out, err)
    for bad in ({}, {"cni.dev/valid-attachments": None}, {"cni.dev/valid-attachments": [{}]}):
        rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "GC", {**conf, **bad}, "", "")
        assert rc == 1 and out["code"] == 7 and "valid-attachments" in out["msg"], (out, err)
    # A client that skips the plugin's check gets the same answer from the daemon.
    from pycni.plugins.ipam.dhcp import protocol

    with pytest.raises(CNIError) as e:
        protocol.call(daemon.socket, {"method": "gc", "containerID": "", "ifname": "", "args": "", "netns": "",
                                      "stdin": json.dumps(conf)})
    assert e.value.code == 7
    assert mac_a in dhcp_net.leases() and mac_b in dhcp_net.leases()
    gc_conf = {**conf, "cni.dev/valid-attachments": [{"containerID": "ctra", "ifname": "eth0"}]}
    rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "GC", gc_conf, "", "")
    assert rc == 0, (out, err)
    _wait_for(lambda: mac_b not in dhcp_net.leases(), 5, "GC to release ctrb's lease")
    assert mac_a in dhcp_net.leases()
    rc, out, _ = _invoke(dhcp_net.host, cni_bin, "dhcp", "STATUS", conf, "", "")
    assert rc == 0, out


@pytest.mark.skipif(not os.access("/usr/lib/cni/dhcp", os.X_OK), reason="Go reference dhcp plugin not installed")
def test_same_lease_result_as_go_reference(dhcp_net: DHCPNet, cni_bin: str, container_ns: Namespace) -> None:
    """The Go daemon and ours, asked for the same attachment, get and report the same lease."""
    mac = _attach(dhcp_net, container_ns, "vcd")
    go_dir = dhcp_net.tmp / "go"
    go_dir.mkdir()
    os.symlink("/usr/lib/cni/dhcp", go_dir / "dhcp")
    go = _start_daemon(dhcp_net.host, str(go_dir), go_dir, go=True)
    try:
        conf = _conf(go.socket)
        rc, go_out, err = _invoke(dhcp_net.host, str(go_dir), "dhcp", "ADD", conf, "ctrd", container_ns.path)
        assert rc == 0, (go_out, err, go.log())
        rc, _, err = _invoke(dhcp_net.host, str(go_dir), "dhcp", "DEL", conf, "ctrd", container_ns.path)
        assert rc == 0, err
    finally:
        _stop(go.proc)
    ours = _start_daemon(dhcp_net.host, cni_bin, dhcp_net.tmp)
    try:
        conf = _conf(ours.socket)
        rc, py_out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", conf, "ctrd", container_ns.path)
        assert rc == 0, (py_out, err, ours.log())
        # same client id and MAC: dnsmasq hands out the same address again (held, or chosen by hash)
        assert py_out["ips"] == go_out["ips"]
        assert py_out["routes"] == go_out["routes"]
        assert py_out["cniVersion"] == go_out["cniVersion"]
        rc, _, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "DEL", conf, "ctrd", container_ns.path)
        assert rc == 0, err
        _wait_for(lambda: mac not in dhcp_net.leases(), 5, "our DEL to release the lease")
    finally:
        _stop(ours.proc)


# ---- the daemon's own life ---------------------------------------------------------------------
def test_daemon_not_running_is_a_clear_error(host_ns: Namespace, cni_bin: str, container_ns: Namespace,
                                             tmp_path: Path) -> None:
    sock = str(tmp_path / "nobody-here.sock")
    rc, out, _ = _invoke(host_ns, cni_bin, "dhcp", "ADD", _conf(sock), "ctr1", container_ns.path)
    assert rc == 1
    assert out["code"] == 11
    assert "not running" in out["msg"] and "dhcp daemon" in out["details"] and "systemd" in out["details"]
    rc, out, _ = _invoke(host_ns, cni_bin, "dhcp", "DEL", _conf(sock), "ctr1", container_ns.path)
    assert rc == 0, out  # nothing is held by a daemon that is not there
    rc, out, _ = _invoke(host_ns, cni_bin, "dhcp", "STATUS", _conf(sock, "1.1.0"), "", "")
    assert rc == 1 and out["code"] == 50
    rc, out, _ = _invoke(host_ns, cni_bin, "dhcp", "ADD", {"cniVersion": "1.0.0", "name": "n", "type": "dhcp"},
                         "ctr1", container_ns.path)
    assert rc == 1 and out["code"] == 7


def test_daemon_flags_pidfile_socket_cleanup(dhcp_net: DHCPNet, cni_bin: str, tmp_path: Path,
                                            container_ns: Namespace) -> None:
    import socket

    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # left behind by a daemon that died
    stale.bind(str(tmp_path / "dhcp.sock"))
    stale.close()
    # -hostprefix "/" makes "//tmp/..." and "//var/run/netns/...": the same files, through the prefix
    d = _start_daemon(dhcp_net.host, cni_bin, tmp_path, "-broadcast=true", "-resendmax", "1m2s",
                      "-hostprefix", "/")
    try:
        pidfile = tmp_path / "daemon.pid"
        _wait_for(pidfile.exists, 5, "pidfile")
        mac = _attach(dhcp_net, container_ns, "vcf")
        rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", _conf(d.socket), "ctrf", container_ns.path)
        assert rc == 0, (out, err, d.log())
        assert dhcp_net.leases()[mac] == out["ips"][0]["address"].split("/")[0]
        assert re.search(rf"DHCPDISCOVER\(eth0\) {mac}", dhcp_net.log())
        second = subprocess.run(["ip", "netns", "exec", dhcp_net.host.name, os.path.join(cni_bin, "dhcp"),
                                 "daemon", "-socketpath", d.socket], capture_output=True, text=True, timeout=20)
        assert second.returncode != 0 and "already listens" in second.stderr
    finally:
        _stop(d.proc)
    assert d.proc.returncode == 0, d.log()
    assert not os.path.exists(d.socket) and not (tmp_path / "daemon.pid").exists()
    bad = subprocess.run(["ip", "netns", "exec", dhcp_net.host.name, os.path.join(cni_bin, "dhcp"), "daemon",
                          "-timeout", "ten"], capture_output=True, text=True, timeout=20)
    assert bad.returncode == 2 and "invalid duration" in bad.stderr


def test_systemd_socket_activation(dhcp_net: DHCPNet, cni_bin: str, tmp_path: Path,
                                   container_ns: Namespace) -> None:
    """Started as cni-dhcp.socket would start it: the listening socket is fd 3, LISTEN_FDS=1."""
    import socket

    path = str(tmp_path / "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    fd = listener.fileno()

    def as_fd3() -> None:
        os.dup2(fd, 3)

    cmd = f"export LISTEN_PID=$$ LISTEN_FDS=1; exec {os.path.join(cni_bin, 'dhcp')} daemon -socketpath /nonexistent/x"
    log_path = tmp_path / "activated.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", dhcp_net.host.name, "sh", "-c", cmd], preexec_fn=as_fd3,
                                pass_fds=(3,), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    listener.close()
    try:
        _attach(dhcp_net, container_ns, "vcs")
        rc, out, err = _invoke(dhcp_net.host, cni_bin, "dhcp", "ADD", _conf(path), "ctrs", container_ns.path)
        assert rc == 0, (out, err, log_path.read_text())
        assert _in_range(out["ips"][0]["address"])
        assert not os.path.exists("/nonexistent/x")
    finally:
        _stop(proc)
    assert proc.returncode == 0, log_path.read_text()
    assert os.path.exists(path)  # systemd's socket: not ours to remove


def test_daemon_starts_from_forwarding_shim(host_ns: Namespace, tmp_path: Path) -> None:
    """`dhcp daemon` from the executables that forward to `pycni daemon`, stdin not a tty (systemd)."""
    from pycni.install_plugins import install

    bin_dir = tmp_path / "bin"
    install(str(bin_dir), ["dhcp"], daemon=True)
    d = _start_daemon(host_ns, str(bin_dir), tmp_path)
    _stop(d.proc)
    assert d.proc.returncode == 0, d.log()
    assert "listening on" in d.log()


# ---- pure units ------------------------------------------------------------------------------
def test_message_roundtrip_and_options() -> None:
    routes121 = bytes([24, 10, 1, 2, 10, 77, 0, 9, 0, 10, 77, 0, 1, 32, 192, 168, 1, 1, 0, 0, 0, 0])
    search = b"\x01a\x07example\x03org\x00\x01b\xc0\x02"
    msg = M.Message(op=M.BOOTREPLY, xid=0x1234, yiaddr=ipaddr.IPv4Address("10.77.0.5"), chaddr=b"\x02" * 6,
                    options={M.OPT_MESSAGE_TYPE: bytes([M.ACK]), M.OPT_SUBNET_MASK: bytes([255, 255, 0, 0]),
                             M.OPT_ROUTER: bytes([10, 77, 0, 1, 10, 77, 0, 2]), M.OPT_CLASSLESS_ROUTE: routes121,
                             M.OPT_DOMAIN_SEARCH: search, M.OPT_LEASE_TIME: (120).to_bytes(4, "big"),
                             M.OPT_HOST_NAME: b"x" * 300})
    back = M.Message.decode(msg.encode())
    assert back.xid == 0x1234 and back.type_name == "ACK" and str(back.yiaddr) == "10.77.0.5"
    assert [str(r) for r in back.routers] == ["10.77.0.1", "10.77.0.2"]
    assert [(str(d), str(g)) for d, g in back.classless_routes()] == [
        ("10.1.2.0/24", "10.77.0.9"), ("0.0.0.0/0", "10.77.0.1"), ("192.168.1.1/32", "0.0.0.0")]
    assert back.domain_search == ["a.example.org", "b.example.org"]
    assert back.options[M.OPT_HOST_NAME] == b"x" * 300  # split and rejoined (RFC 3396)
    with pytest.raises(M.MessageError):
        M.Message.decode(b"\x02" * 100)


def test_result_prefers_classless_routes() -> None:
    from pycni.plugins.ipam.dhcp.client import Binding, ClientOptions

    ack = M.Message(op=M.BOOTREPLY, yiaddr=ipaddr.IPv4Address("10.77.0.5"),
                    options={M.OPT_SUBNET_MASK: bytes([255, 255, 255, 0]), M.OPT_ROUTER: bytes([10, 77, 0, 1]),
                             M.OPT_CLASSLESS_ROUTE: bytes([16, 10, 9, 10, 77, 0, 7, 24, 10, 77, 1, 0, 0, 0, 0])})
    lease = Lease("k", "c", "n", "/nonexistent", "eth0", ClientOptions(client_id=b"\0k"), Timing())
    lease.binding = Binding(ack, ipaddr.IPv4Address(SERVER_IP), b"\0" * 6, b"\1" * 6)
    res = lease.result("1.1.0")
    assert res["ips"] == [{"address": "10.77.0.5/24", "gateway": "10.77.0.1"}]
    assert res["routes"] == [{"dst": "10.9.0.0/16", "gw": "10.77.0.7"}, {"dst": "10.77.1.0/24", "scope": 253}]
    assert lease.result("1.0.0")["routes"][1] == {"dst": "10.77.1.0/24"}


def test_options_and_durations() -> None:
    opts = client_options({"provide": [{"option": "host-name", "value": "fixed"},
                                       {"option": "60", "fromArg": "VENDOR"}]},
                          "VENDOR=acme;IgnoreUnknown=1", "cid/net/eth0", broadcast=True)
    assert opts.provide == {12: b"fixed", 60: b"acme"} and opts.broadcast
    assert opts.client_id == b"\0cid/net/eth0"
    assert opts.request[:2] == [1, 3] and 121 in opts.request
    only = client_options({"request": [{"option": "routers", "skipDefault": True}]}, "", "k", False)
    assert only.request == [3]
    for bad in ({"provide": [{"option": "bogus"}]}, {"provide": [{"option": "12", "value": "x" * 256}]},
                {"request": "routers"}, {"request": ["routers"]}, {"provide": [{"option": "12", "value": 5}]},
                {"provide": [{"option": "12", "fromArg": ["X"]}]}):
        with pytest.raises(CNIError) as e:
            client_options(bad, "", "k", False)
        assert e.value.code == 7
    assert parse_duration("1m30s") == 90 and parse_duration("250ms") == 0.25 and parse_duration("0") == 0
    with pytest.raises(Exception, match="invalid duration"):
        parse_duration("10")


def test_plugin_and_daemon_import_stdlib_only() -> None:
    code = ("import sys; import pycni.plugins.ipam.dhcp, pycni.plugins.ipam.dhcp.daemon; "
            "print([m for m in sys.modules if m.split('.')[0] in ('pyroute2', 'pydantic', 'yaml')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
