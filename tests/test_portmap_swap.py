"""Swapping implementations under live containers: the Go reference and pycni take turns.

A podman-style network (bridge with ipMasq and hairpinMode, portmap with the portMappings
capability and NO backend key, firewall), one host port published by container after
container, each added by one implementation (runtime + plugins) and deleted by the other:
the Go libcni tool (tests/interop/gocnitool) over the Go plugins, and pycni.runtime over
ours, sharing one cache directory as a node swapping /opt/cni/bin would. After every DEL no
rule, chain, set or map element of that container is left, and the host port works (TCP from
another namespace, from the host, and hairpin) for the next container.

Everything runs in throwaway namespaces with state in the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from test_portmap import CLIENT, SERVER

from pycni.net.masq import chain_name
from pycni.plugins.meta.portmap import iptables as pm_ipt
from pycni.spec.types import Result

GO_PLUGIN_DIR = "/usr/lib/cni"
HOST_IP = "192.168.78.1"
HOST_PORT = 8080


def _need_go() -> None:
    missing = [t for t in ("bridge", "host-local", "portmap", "firewall")
               if not os.access(os.path.join(GO_PLUGIN_DIR, t), os.X_OK)]
    if missing:
        pytest.skip(f"Go reference plugins missing from {GO_PLUGIN_DIR}: {missing}")


class Node:
    """A host namespace with a client namespace beside it and one podman-style network."""

    def __init__(self, host: Namespace, client: Namespace, tmp: Path, tool: str, ours: str) -> None:
        self.host, self.client, self.tool, self.ours = host, client, tool, ours
        tag = uuid.uuid4().hex[:6]
        self.name = f"podman-{tag}"
        self.conf_dir, self.cache_dir = tmp / "net.d", tmp / "cache"
        self.conf_dir.mkdir()
        third = int(tag[:2], 16) % 200 + 20
        self.subnet = f"10.{third}.7.0/24"
        conf = {"cniVersion": "1.0.0", "name": self.name, "plugins": [
            {"type": "bridge", "bridge": f"cni-{tag}", "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(tmp / "ipam"),
                      "ranges": [[{"subnet": self.subnet, "gateway": f"10.{third}.7.1"}]]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "firewall", "backend": ""},
        ]}
        (self.conf_dir / f"{self.name}.conflist").write_text(json.dumps(conf))
        for cmd in (f"ip link add ext0 type veth peer name eth0 netns {client.name}",
                    f"ip addr add {HOST_IP}/24 dev ext0", "ip link set ext0 up"):
            host.run(cmd.split())
        for cmd in ("ip addr add 192.168.78.2/24 dev eth0", "ip link set eth0 up",
                    f"ip route add default via {HOST_IP}"):
            client.run(cmd.split())
        self.servers: list[subprocess.Popen[str]] = []
        self.socket: str | None = None  # ours through a `pycni daemon` on this socket (else one-shot)

    def caps(self, container_port: int) -> dict[str, Any]:
        return {"portMappings": [{"hostPort": HOST_PORT, "containerPort": container_port, "protocol": "tcp"}]}

    def go(self, command: str, cid: str, ns: Namespace, container_port: int) -> Any:
        argv = [self.tool, "-confdir", str(self.conf_dir), "-net", self.name, "-path", GO_PLUGIN_DIR,
                "-cachedir", str(self.cache_dir), "-cid", cid, "-netns", ns.path, "-ifname", "eth0",
                "-cap", json.dumps(self.caps(container_port)), command]
        proc = self.host.run(argv, check=False, env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})
        assert proc.returncode == 0, f"Go {command} {cid}: {proc.stdout} {proc.stderr}"
        return json.loads(proc.stdout) if proc.stdout.strip() else None

    def pycni(self, command: str, cid: str, ns: Namespace, container_port: int) -> Any:
        from pycni.runtime import CNI

        env = None if self.socket is None else {"PATH": os.environ.get("PATH", ""), "PYCNI_SOCKET": self.socket}
        rt = CNI(conf_dir=str(self.conf_dir), plugin_path=[self.ours], cache_dir=str(self.cache_dir), env=env)
        network = rt.load_network(self.name)
        with self.host.enter():
            if command == "add":
                return rt.add(network, cid, ns.path, "eth0", capability_args=self.caps(container_port)).to_dict()
            rt.delete(network, cid, ns.path, "eth0", capability_args=self.caps(container_port))
        return None

    def serve(self, ns: Namespace, port: int, tag: str) -> None:
        p = subprocess.Popen(["ip", "netns", "exec", ns.name, sys.executable, "-c", SERVER, str(port), tag, "tcp"],
                             stdout=subprocess.PIPE, text=True)
        self.servers.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"

    def connect(self, ns: Namespace, host: str) -> str:
        return ns.run([sys.executable, "-c", CLIENT, host, str(HOST_PORT), "tcp"], timeout=20).stdout.strip()

    def state(self) -> str:
        """Every rule and set/map element on the host, in both tools' words."""
        return "\n".join(self.host.run(cmd).stdout for cmd in
                         (["iptables-save"], ["ip6tables-save"], ["nft", "list", "ruleset"]))


@pytest.fixture
def node(netns_factory: Callable[[], Namespace], go_libcni_tool: str, plugin_dir: str,
         tmp_path: Path) -> Iterator[Node]:
    _need_go()
    n = Node(netns_factory(), netns_factory(), tmp_path, go_libcni_tool, plugin_dir)
    yield n
    for p in n.servers:
        p.kill()
        p.wait()


def traces(node: Node, cid: str, ip: str) -> list[str]:
    """Lines of host state that belong to this container (its address, ID or chains)."""
    chains = (pm_ipt.dnat_chain_name(node.name, cid), chain_name(node.name, cid))
    addr = re.compile(rf"(?<![\d.]){re.escape(ip)}(?![\d])")
    return [line for line in node.state().splitlines()
            if addr.search(line) or cid in line or any(c in line for c in chains)]


def published(node: Node, ns: Namespace, ip: str, tag: str) -> None:
    """The host port reaches the container from outside, from the host and from itself."""
    gateway = node.subnet.replace(".0/24", ".1")
    assert node.connect(node.client, HOST_IP) == f"{tag} 192.168.78.2"
    reply = node.connect(node.host, HOST_IP)
    assert reply.startswith(f"{tag} "), reply
    hairpin = node.connect(ns, HOST_IP)
    assert hairpin == f"{tag} {gateway}", hairpin  # masqueraded to the bridge's address


@pytest.fixture
def daemon_socket(netns_factory: Callable[[], Namespace], tmp_path: Path) -> Iterator[str]:
    """A `pycni daemon`: its iptables changes go through long-lived iptables-restore sessions."""
    from daemon_proc import DaemonProc, children_of

    sock = str(tmp_path / "pycni.sock")
    d = DaemonProc(sock, tmp_path / "daemon.log", prefix=["ip", "netns", "exec", netns_factory().name]).ready()
    try:
        yield sock
        sessions = [p for w in children_of(d.pid) for p in children_of(w)
                    if Path(f"/proc/{p}/comm").read_text().strip() == "iptables-restor"]
        assert sessions, "the daemon wrote the rules without its restore sessions"
    finally:
        d.terminate()
        d.reap()


@pytest.mark.parametrize("first", ["go", "pycni"])
@pytest.mark.parametrize("ours", ["one-shot", "daemon"])
def test_swap_implementations_under_live_containers(node: Node, netns_factory: Callable[[], Namespace],
                                                    first: str, ours: str, request: pytest.FixtureRequest) -> None:
    """Ours one-shot, and ours through the daemon, whose restores go to long-lived processes."""
    if ours == "daemon":
        from pycni.install_plugins import install

        node.socket = request.getfixturevalue("daemon_socket")
        node.ours = str(request.getfixturevalue("tmp_path") / "bin")
        install(node.ours, daemon=True)  # shims that forward to the daemon
    impls = {"go": node.go, "pycni": node.pycni}
    order = [first, "pycni" if first == "go" else "go"] * 2
    for i, adder in enumerate(order):
        deleter = "pycni" if adder == "go" else "go"
        ns, cid, port = netns_factory(), f"ctr-{i}-{adder}", 80 + i
        node.serve(ns, port, f"c{i}")
        result = Result.from_dict(impls[adder]("add", cid, ns, port))
        ip = str(result.ips[0].address.ip)
        assert traces(node, cid, ip), f"{adder} ADD left no rule for {cid}"
        published(node, ns, ip, f"c{i}")
        impls[deleter]("del", cid, ns, port)
        left = traces(node, cid, ip)
        assert left == [], f"{adder} ADD -> {deleter} DEL left:\n" + "\n".join(left)
        assert node.connect(node.client, HOST_IP).startswith("ERR")
    # The default backend is the reference's: nothing of ours in nftables.
    assert "pycni_hostport" not in node.state()


def test_gc_removes_what_a_lost_cache_entry_leaves(node: Node, netns_factory: Callable[[], Namespace]) -> None:
    """Spec 1.1 GC through our runtime: a container whose cache entry is gone (so the runtime
    cannot DEL it) loses its port mapping, masquerade rule and address to the plugins' GC."""
    from pycni.runtime import CNI

    conf_file = node.conf_dir / f"{node.name}.conflist"
    conf = json.loads(conf_file.read_text())
    conf["cniVersion"] = "1.1.0"
    conf["plugins"] = conf["plugins"][:2]  # bridge + portmap (our firewall has no GC to show)
    conf_file.write_text(json.dumps(conf))
    kept_ns, lost_ns = netns_factory(), netns_factory()
    kept = Result.from_dict(node.pycni("add", "ctr-kept", kept_ns, 80))
    lost = Result.from_dict(node.pycni("add", "ctr-lost", lost_ns, 81))
    lost_ip = str(lost.ips[0].address.ip)
    for f in (node.cache_dir / "results").iterdir():
        if "ctr-lost" in f.name:
            f.unlink()
    rt = CNI(conf_dir=str(node.conf_dir), plugin_path=[node.ours], cache_dir=str(node.cache_dir))
    with node.host.enter():
        rt.gc(rt.load_network(node.name), [("ctr-kept", "eth0")])
    assert traces(node, "ctr-lost", lost_ip) == []
    assert traces(node, "ctr-kept", str(kept.ips[0].address.ip))
    node.pycni("del", "ctr-kept", kept_ns, 80)
