"""A real 3-member etcd cluster for tests, one member inside each "node" network namespace.

Layout (nothing in the machine's own namespace)::

    underlay ns:  bridge br0 (10.231.0.254/24 by default) -- veth -- node1 ns: ul0 10.231.0.1/24, etcd member
                                                          -- veth -- node2 ns: ul0 10.231.0.2/24, etcd member
                                                          -- veth -- node3 ns: ul0 10.231.0.3/24, etcd member

Each member listens on its node's underlay address (client :2379, peer :2380); data
directories live in a temporary directory (on tmpfs when there is one: fsync-bound writes are
not what the tests measure). The underlay namespace plays the operator's machine: it reaches
every member, and :meth:`EtcdCluster.client` returns a :class:`pycni.cluster.etcd.Etcd` whose
sockets are opened there, so test code in the root namespace can talk to the cluster.

API::

    with EtcdCluster(size=3, subnet="10.231.0.0/24", tls=False) as cluster:   # starts, waits for a leader
        cluster.endpoints            # ["http://10.231.0.1:2379", ...]
        cluster.nodes                # [EtcdNode(name="node1", ns=Namespace, ip="10.231.0.1", ifname="ul0"), ...]
        cluster.underlay             # Namespace holding the bridge (br0)
        etcd = cluster.client(timeout=5)   # an Etcd reachable from the root namespace
        cluster.kill(0)              # SIGKILL node1's member (its namespace and address stay)
        cluster.restart(0)           # start it again on its data dir
        cluster.kill_all(); cluster.restart_all(); cluster.wait_ready()
        cluster.connect              # the connect(host, port, timeout) factory client() uses
        cluster.ca_cert, cluster.client_cert, cluster.client_key   # with tls=True: https, client certs required
    # on exit: members killed, namespaces deleted, data removed (also when the body raised)

``node.ns.run([...])`` runs a command in a node (e.g. a plugin, which then reaches etcd over the
underlay). Members use short heartbeat/election timeouts so a killed leader is replaced in
about a second, and ``--pre-vote`` (as docs/cluster.md advises) so a member that rejoins after a
partition does not depose the leader. Namespaces are named ``<prefix>-...`` (default ``pycni-t``) like netns_util's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from netns_util import Namespace, new_namespace

from pycni import ipaddr
from pycni.cluster.etcd import Etcd, EtcdError

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def etcd_available() -> bool:
    return os.path.exists(ETCD) and os.geteuid() == 0


@dataclass
class EtcdNode:
    """One node: its namespace, underlay address and interface, and its etcd member."""

    name: str
    ns: Namespace
    ip: str
    ifname: str
    data_dir: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    tls: bool = False

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.ip}:2379"

    @property
    def peer_url(self) -> str:
        return f"http://{self.ip}:2380"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    def __init__(self, size: int = 3, subnet: str = "10.231.0.0/24", prefix: str = "pycni-t",
                 ifname: str = "ul0", tls: bool = False) -> None:
        self.size = size
        self.tls = tls  # https client URLs, client certificates required (see make_certs)
        self.ca_cert = self.client_cert = self.client_key = ""
        self.net = ipaddr.ip_network(subnet)
        self.prefix = prefix
        self.ifname = ifname
        self.nodes: list[EtcdNode] = []
        self.underlay: Namespace | None = None
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.tmp = tempfile.mkdtemp(prefix="pycni-etcd-", dir=base)
        self.token = f"pycni-{os.getpid()}-{int(time.time() * 1000)}"

    # -- lifecycle --

    def __enter__(self) -> EtcdCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        hosts = list(self.net.hosts())
        self.underlay = new_namespace(self.prefix)
        ul = self.underlay
        ul.run(["ip", "link", "add", "br0", "type", "bridge"])
        ul.run(["ip", "addr", "add", f"{hosts[-1]}/{self.net.prefixlen}", "dev", "br0"])
        ul.run(["ip", "link", "set", "br0", "up"])
        for i in range(self.size):
            ns = new_namespace(self.prefix)
            name = f"node{i + 1}"
            node = EtcdNode(name=name, ns=ns, ip=str(hosts[i]), ifname=self.ifname, tls=self.tls,
                            data_dir=os.path.join(self.tmp, name), log_path=os.path.join(self.tmp, f"{name}.log"))
            self.nodes.append(node)
            ul.run(["ip", "link", "add", f"v{name}", "type", "veth", "peer", "name", self.ifname, "netns", ns.name])
            ul.run(["ip", "link", "set", f"v{name}", "master", "br0", "up"])
            ns.run(["ip", "addr", "add", f"{node.ip}/{self.net.prefixlen}", "dev", self.ifname])
            ns.run(["ip", "link", "set", self.ifname, "up"])
        if self.tls:
            self.make_certs()
        for i in range(self.size):
            self._spawn(i)
        self.wait_ready()

    def make_certs(self) -> None:
        """A throwaway CA, one server certificate for every member's address, one client certificate."""
        d = os.path.join(self.tmp, "pki")
        os.makedirs(d)

        def ssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        ssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=pycni-test-ca")
        sans = ",".join(f"IP:{n.ip}" for n in self.nodes)
        for name, ext in (("server", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n"),
                          ("client", "extendedKeyUsage=clientAuth\n")):
            with open(os.path.join(d, f"{name}.ext"), "w") as f:
                f.write(ext)
            ssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=pycni-{name}")
            ssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext")
        self.ca_cert = os.path.join(d, "ca.crt")
        self.client_cert, self.client_key = os.path.join(d, "client.crt"), os.path.join(d, "client.key")

    def _spawn(self, i: int) -> None:
        node = self.nodes[i]
        initial = ",".join(f"{n.name}={n.peer_url}" for n in self.nodes)
        cmd = ["ip", "netns", "exec", node.ns.name, ETCD, "--name", node.name, "--data-dir", node.data_dir,
               "--listen-client-urls", node.client_url, "--advertise-client-urls", node.client_url,
               "--listen-peer-urls", node.peer_url, "--initial-advertise-peer-urls", node.peer_url,
               "--initial-cluster", initial, "--initial-cluster-state", "new",
               "--initial-cluster-token", self.token, "--heartbeat-interval", "50",
               "--election-timeout", "500", "--pre-vote", "--logger", "zap", "--log-level", "warn"]
        if self.tls:
            pki = os.path.join(self.tmp, "pki")
            cmd += ["--cert-file", os.path.join(pki, "server.crt"), "--key-file", os.path.join(pki, "server.key"),
                    "--trusted-ca-file", self.ca_cert, "--client-cert-auth"]
        log = open(node.log_path, "ab")
        try:
            node.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def close(self) -> None:
        for node in self.nodes:
            self._stop(node, signal.SIGKILL)
        for node in self.nodes:
            node.ns.delete()
        if self.underlay is not None:
            self.underlay.delete()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @staticmethod
    def _stop(node: EtcdNode, sig: int) -> None:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(sig)
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
        node.proc = None

    # -- faults --

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its node and address stay: clients get "connection refused")."""
        self._stop(self.nodes[i], signal.SIGKILL)

    def restart(self, i: int) -> None:
        """Start member ``i`` again on its data directory (no wait: see :meth:`wait_ready`)."""
        if not self.nodes[i].running:
            self._spawn(i)

    def kill_all(self) -> None:
        for i in range(self.size):
            self.kill(i)

    def restart_all(self) -> None:
        for i in range(self.size):
            self.restart(i)
        self.wait_ready()

    # -- clients --

    @property
    def endpoints(self) -> list[str]:
        return [n.client_url for n in self.nodes]

    def connect(self, host: str, port: int, timeout: float) -> socket.socket:
        """A TCP connection opened inside the underlay namespace (usable from any thread)."""
        assert self.underlay is not None
        with self.underlay.enter():
            return socket.create_connection((host, port), timeout=timeout)

    def client(self, endpoints: list[str] | None = None, **kw: Any) -> Etcd:
        if self.tls:
            kw = {"ca_cert": self.ca_cert, "cert": self.client_cert, "key": self.client_key, **kw}
        return Etcd(endpoints or self.endpoints, connect=self.connect, **kw)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running member serves a linearizable read (a leader is elected and known)."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            if not node.running:
                continue
            with self.client([node.client_url], timeout=2, attempt_timeout=1) as c:
                while True:
                    try:
                        c.range("/pycni-ready")
                        break
                    except EtcdError as e:
                        if time.monotonic() > deadline or not node.running:
                            with open(node.log_path, "rb") as f:
                                tail = f.read()[-2000:].decode(errors="replace")
                            raise RuntimeError(f"etcd member {node.name} not ready: {e}\n{tail}") from None
                        time.sleep(0.1)


def spawn_agent(ns_name: str, log: str | os.PathLike[str], args: list[str]) -> subprocess.Popen[bytes]:
    """``pycni node ARGS`` in the namespace ``ns_name``, its output appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(["ip", "netns", "exec", ns_name, sys.executable, "-m", "pycni", "node", *args],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop_agent(agent: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Signal a running agent and wait for it to end."""
    if agent is not None and agent.poll() is None:
        agent.send_signal(sig)
        agent.wait(timeout=20)
