"""Interop with the Go reference: its runtime library (libcni) and its plugins.

(a) our plugins driven by Go's libcni (tests/interop/gocnitool);
(b) the Go plugins (/usr/lib/cni) driven by our runtime library (pycni.runtime);
(c) each runtime deletes what the other added, through the other's on-disk cache.

Everything runs in throwaway namespaces: one plays the host (plugins, bridge, rules), the
others are containers that must reach each other over the bridge (ping).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace

from pycni import ipaddr
from pycni.spec.types import Result

GO_PLUGIN_DIR = "/usr/lib/cni"
CACHE_KIND = "cniCacheV1"


# ---- fixtures and helpers ------------------------------------------------------------------

@pytest.fixture(scope="session")
def gocnitool(go_libcni_tool: str) -> str:
    """The Go libcni driver (tests/interop/gocnitool), built once per session by conftest."""
    return go_libcni_tool



def need_go_plugins(*types: str) -> None:
    missing = [t for t in types if not os.access(os.path.join(GO_PLUGIN_DIR, t), os.X_OK)]
    if missing:
        pytest.skip(f"Go reference plugins missing from {GO_PLUGIN_DIR}: {missing} "
                    "(apt-get install containernetworking-plugins)")


def our_runtime() -> Any:
    try:
        from pycni.runtime import CNI
    except ImportError as e:
        pytest.skip(f"pycni.runtime (CNI) is missing: {e}")
    return CNI


@dataclass
class Net:
    """One network: its config dir, cache dir and IPAM store, all in the test's tmp dir."""

    name: str
    version: str
    conf_dir: Path
    cache_dir: Path
    data_dir: Path
    bridge: str
    subnet: ipaddr.IPv4Network

    def cache_file(self, cid: str, ifname: str = "eth0") -> Path:
        return self.cache_dir / "results" / f"{self.name}-{cid}-{ifname}"

    def leased(self) -> list[str]:
        """Addresses host-local holds in its store (file names that are IPs)."""
        store = self.data_dir / self.name
        if not store.is_dir():
            return []
        out = []
        for f in os.listdir(store):
            try:
                out.append(str(ipaddr.ip_address(f)))
            except ValueError:
                continue
        return out


def make_net(tmp_path: Path, version: str, extra_plugins: list[dict[str, Any]] | None = None,
             subnet: str | None = None) -> Net:
    tag = uuid.uuid4().hex[:6]
    octet = int(tag[:2], 16) % 200 + 20
    net = Net(name=f"interop-{tag}", version=version, conf_dir=tmp_path / "net.d", cache_dir=tmp_path / "cache",
              data_dir=tmp_path / "ipam", bridge=f"br-{tag}",
              subnet=ipaddr.ip_network(subnet or f"10.{octet}.{int(tag[2:4], 16)}.0/24"))
    net.conf_dir.mkdir(parents=True, exist_ok=True)
    plugins: list[dict[str, Any]] = [{
        "type": "bridge", "bridge": net.bridge, "isGateway": True, "ipMasq": False,
        "ipam": {"type": "host-local", "subnet": str(net.subnet), "dataDir": str(net.data_dir),
                 "routes": [{"dst": "0.0.0.0/0"}]},
    }]
    plugins += extra_plugins or []
    conf = {"cniVersion": version, "name": net.name, "plugins": plugins}
    (net.conf_dir / f"10-{net.name}.conflist").write_text(json.dumps(conf, indent=2))
    return net


class GoRuntime:
    """Runs tests/interop/gocnitool inside the host namespace."""

    def __init__(self, tool: str, host: Namespace, net: Net, plugin_path: list[str]) -> None:
        self.tool, self.host, self.net, self.plugin_path = tool, host, net, plugin_path

    def run(self, command: str, cid: str, netns: str = "", ifname: str = "eth0",
            cap: dict[str, Any] | None = None, check: bool = True) -> tuple[int, Any]:
        argv = [self.tool, "-confdir", str(self.net.conf_dir), "-net", self.net.name,
                "-path", os.pathsep.join(self.plugin_path), "-cachedir", str(self.net.cache_dir),
                "-cid", cid, "-netns", netns, "-ifname", ifname]
        if cap is not None:
            argv += ["-cap", json.dumps(cap)]
        proc = self.host.run([*argv, command], check=False,
                             env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")})
        body = json.loads(proc.stdout) if proc.stdout.strip() else None
        if check and proc.returncode != 0:
            raise AssertionError(f"Go libcni {command} failed: {proc.stdout} {proc.stderr}")
        return proc.returncode, body


def container_ip(res: Result) -> str:
    return str(res.ips[0].address.ip)


def assert_attached(ns: Namespace, ip: str, ifname: str = "eth0") -> None:
    out = ns.run(["ip", "-o", "-4", "addr", "show", "dev", ifname]).stdout
    assert f"inet {ip}/" in out, out


def assert_detached(ns: Namespace, ifname: str = "eth0") -> None:
    assert ns.run(["ip", "link", "show", ifname], check=False).returncode != 0, f"{ifname} still in {ns.name}"


def ping(src: Namespace, ip: str) -> None:
    proc = src.run(["ping", "-c", "2", "-i", "0.2", "-W", "2", ip], check=False)
    assert proc.returncode == 0, f"{src.name} cannot reach {ip}:\n{proc.stdout}{proc.stderr}"


def host_links(host: Namespace) -> str:
    return host.run(["ip", "-o", "link", "show"]).stdout


def assert_cache_entry(net: Net, cid: str, result: Result) -> None:
    f = net.cache_file(cid)
    assert f.is_file(), f"no cache entry {f}"
    cached = json.loads(f.read_text())
    assert cached["kind"] == CACHE_KIND
    assert (cached["containerId"], cached["ifName"], cached["networkName"]) == (cid, "eth0", net.name)
    assert Result.from_dict(cached["result"]).ips == result.ips


# ---- (a) our plugins under Go's libcni -----------------------------------------------------

@pytest.mark.parametrize("version", ["1.0.0", "0.4.0", "0.3.1"])
def test_our_bridge_host_local_under_go_libcni(version: str, gocnitool: str, host_ns: Namespace,
                                               netns_factory: Callable[[], Namespace], plugin_dir: str,
                                               tmp_path: Path) -> None:
    extra: list[dict[str, Any]] = [{"type": "tuning", "mtu": 1400, "dataDir": str(tmp_path / "tuning")},
                                   {"type": "portmap", "capabilities": {"portMappings": True}}]
    net = make_net(tmp_path, version, extra)
    go = GoRuntime(gocnitool, host_ns, net, [plugin_dir])
    c1, c2 = netns_factory(), netns_factory()
    caps = {cid: {"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]}
            for cid, port in (("ctr-a", 18080), ("ctr-b", 18081))}

    results = {}
    for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
        _, body = go.run("add", cid, ns.path, cap=caps[cid])
        res = Result.from_dict(body)
        assert res.cni_version == version
        assert res.ips[0].address.ip in net.subnet
        results[cid] = res
        assert_attached(ns, container_ip(res))
        assert_cache_entry(net, cid, res)
    assert net.bridge in host_links(host_ns)
    ping(c1, container_ip(results["ctr-b"]))
    ping(c2, container_ip(results["ctr-a"]))
    ping(host_ns, container_ip(results["ctr-a"]))  # the bridge is the gateway
    assert "mtu 1400" in c1.run(["ip", "link", "show", "eth0"]).stdout
    rules = host_ns.run(["nft", "list", "ruleset"]).stdout
    assert "18080" in rules and "18081" in rules

    for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
        if version == "0.3.1":
            rc, err = go.run("check", cid, ns.path, cap=caps[cid], check=False)
            assert rc == 1 and "does not support the CHECK command" in err["msg"], err
        else:
            go.run("check", cid, ns.path, cap=caps[cid])
        _, cached = go.run("cached", cid, ns.path)
        assert Result.from_dict(cached).ips == results[cid].ips

    for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
        go.run("del", cid, ns.path, cap=caps[cid])
        assert_detached(ns)
        assert not net.cache_file(cid).exists()
        go.run("del", cid, ns.path, cap=caps[cid])  # DEL twice is fine
    assert sorted(net.leased()) == []
    rules = host_ns.run(["nft", "list", "ruleset"]).stdout
    assert "18080" not in rules and "18081" not in rules


def test_our_check_failure_reaches_go_libcni(gocnitool: str, host_ns: Namespace, container_ns: Namespace,
                                             plugin_dir: str, tmp_path: Path) -> None:
    net = make_net(tmp_path, "1.0.0")
    go = GoRuntime(gocnitool, host_ns, net, [plugin_dir])
    go.run("add", "ctr-x", container_ns.path)
    container_ns.run(["ip", "link", "del", "eth0"])  # break the attachment behind the runtime's back
    rc, err = go.run("check", "ctr-x", container_ns.path, check=False)
    assert rc == 1 and err["msg"], err
    go.run("del", "ctr-x", container_ns.path)
    assert net.leased() == []


def test_our_loopback_under_go_libcni(gocnitool: str, host_ns: Namespace, container_ns: Namespace,
                                      plugin_dir: str, tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "99-lo.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "lo-net", "plugins": [{"type": "loopback"}]}))
    net = Net("lo-net", "1.0.0", conf_dir, tmp_path / "cache", tmp_path / "ipam", "", ipaddr.ip_network("::/0"))
    go = GoRuntime(gocnitool, host_ns, net, [plugin_dir])
    container_ns.run(["ip", "link", "set", "lo", "down"])
    _, body = go.run("add", "ctr-lo", container_ns.path, ifname="lo")
    assert Result.from_dict(body).interfaces[0].name == "lo"
    assert "UP" in container_ns.run(["ip", "link", "show", "lo"]).stdout.split(">")[0]
    go.run("check", "ctr-lo", container_ns.path, ifname="lo")
    go.run("del", "ctr-lo", container_ns.path, ifname="lo")
    assert ",UP" not in container_ns.run(["ip", "link", "show", "lo"]).stdout.split(">")[0]


# ---- (b) Go's plugins under our runtime ----------------------------------------------------

@pytest.mark.parametrize("version", ["1.0.0", "0.3.1"])
def test_go_plugins_under_our_runtime(version: str, host_ns: Namespace, netns_factory: Callable[[], Namespace],
                                      tmp_path: Path) -> None:
    need_go_plugins("bridge", "host-local")
    CNI = our_runtime()
    from pycni.spec.errors import CNIError

    net = make_net(tmp_path, version)
    c1, c2 = netns_factory(), netns_factory()
    rt = CNI(conf_dir=str(net.conf_dir), plugin_path=[GO_PLUGIN_DIR], cache_dir=str(net.cache_dir))
    network = rt.load_network(net.name)
    results = {}
    with host_ns.enter():
        for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
            results[cid] = rt.add(network, cid, ns.path, "eth0")
    for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
        res = results[cid]
        assert res.cni_version == version
        assert res.ips[0].address.ip in net.subnet
        assert_attached(ns, container_ip(res))
        assert_cache_entry(net, cid, res)
    assert net.bridge in host_links(host_ns)
    ping(c1, container_ip(results["ctr-b"]))
    ping(c2, container_ip(results["ctr-a"]))

    with host_ns.enter():
        for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
            if version == "0.3.1":
                with pytest.raises(CNIError) as ei:  # CHECK does not exist before 0.4.0
                    rt.check(network, cid, ns.path, "eth0")
                assert ei.value.code == 1
            else:
                rt.check(network, cid, ns.path, "eth0")
            assert rt.get_cached_result(network, cid, "eth0").ips == results[cid].ips
        for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
            rt.delete(network, cid, ns.path, "eth0")
            rt.delete(network, cid, ns.path, "eth0")  # twice is fine
    for cid, ns in (("ctr-a", c1), ("ctr-b", c2)):
        assert_detached(ns)
        assert not net.cache_file(cid).exists()
    assert net.leased() == []


def test_go_plugin_error_through_our_runtime(host_ns: Namespace, netns_factory: Callable[[], Namespace],
                                            tmp_path: Path) -> None:
    need_go_plugins("bridge", "host-local")
    CNI = our_runtime()
    from pycni.spec.errors import CNIError

    net = make_net(tmp_path, "1.0.0", subnet=f"10.250.{uuid.uuid4().int % 250}.0/30")  # room for one container
    rt = CNI(conf_dir=str(net.conf_dir), plugin_path=[GO_PLUGIN_DIR], cache_dir=str(net.cache_dir))
    network = rt.load_network(net.name)
    ok, full = netns_factory(), netns_factory()
    with host_ns.enter():
        rt.add(network, "ctr-ok", ok.path, "eth0")
        with pytest.raises(CNIError) as ei:
            rt.add(network, "ctr-full", full.path, "eth0")
    # host-local's complaint travels through bridge (delegation) and our runtime intact.
    assert "no IP addresses available" in str(ei.value), repr(ei.value)
    assert not net.cache_file("ctr-full").exists()
    # Go's bridge leaves its veth behind on a failed ADD; the runtime's DEL cleans up, as CRI runtimes do.
    with host_ns.enter():
        rt.delete(network, "ctr-full", full.path, "eth0")
        rt.delete(network, "ctr-ok", ok.path, "eth0")
    assert_detached(full)
    assert_detached(ok)
    assert net.leased() == []


# ---- (c) one runtime deletes what the other added ----------------------------------------

def bridge_plugin_path(plugins: str, plugin_dir: str) -> list[str]:
    """CNI_PATH holding bridge + host-local: the Go reference's ("go") or ours."""
    if plugins == "go":
        need_go_plugins("bridge", "host-local")
        return [GO_PLUGIN_DIR]
    return [plugin_dir]


@pytest.mark.parametrize("plugins", ["go", "ours"])
def test_go_libcni_deletes_what_our_runtime_added(plugins: str, gocnitool: str, host_ns: Namespace,
                                                   netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                   tmp_path: Path) -> None:
    CNI = our_runtime()
    path = bridge_plugin_path(plugins, plugin_dir)
    net = make_net(tmp_path, "1.0.0")
    c1, c2 = netns_factory(), netns_factory()
    rt = CNI(conf_dir=str(net.conf_dir), plugin_path=path, cache_dir=str(net.cache_dir))
    network = rt.load_network(net.name)
    with host_ns.enter():
        r1 = rt.add(network, "ctr-ours-1", c1.path, "eth0", args={"IgnoreUnknown": "1", "K8S_POD_NAME": "p1"})
        r2 = rt.add(network, "ctr-ours-2", c2.path, "eth0")
    ping(c1, container_ip(r2))
    go = GoRuntime(gocnitool, host_ns, net, path)
    # Go reads our cache entry ...
    _, cached = go.run("cached", "ctr-ours-1", c1.path)
    assert Result.from_dict(cached).to_dict() == r1.to_dict("1.0.0")
    go.run("check", "ctr-ours-1", c1.path)
    # ... and deletes from it.
    go.run("del", "ctr-ours-1", c1.path)
    assert_detached(c1)
    assert not net.cache_file("ctr-ours-1").exists()
    assert net.leased() == [container_ip(r2)]
    assert_attached(c2, container_ip(r2))
    with host_ns.enter():
        rt.delete(network, "ctr-ours-2", c2.path, "eth0")
    assert net.leased() == []


@pytest.mark.parametrize("plugins", ["go", "ours"])
def test_our_runtime_deletes_what_go_libcni_added(plugins: str, gocnitool: str, host_ns: Namespace,
                                                   netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                   tmp_path: Path) -> None:
    CNI = our_runtime()
    path = bridge_plugin_path(plugins, plugin_dir)
    net = make_net(tmp_path, "1.0.0")
    c1, c2 = netns_factory(), netns_factory()
    go = GoRuntime(gocnitool, host_ns, net, path)
    _, b1 = go.run("add", "ctr-go-1", c1.path)
    _, b2 = go.run("add", "ctr-go-2", c2.path)
    r1, r2 = Result.from_dict(b1), Result.from_dict(b2)
    ping(c2, container_ip(r1))
    rt = CNI(conf_dir=str(net.conf_dir), plugin_path=path, cache_dir=str(net.cache_dir))
    network = rt.load_network(net.name)
    cached = rt.get_cached_result(network, "ctr-go-1", "eth0")
    assert cached is not None and cached.to_dict() == r1.to_dict()
    with host_ns.enter():
        rt.check(network, "ctr-go-1", c1.path, "eth0")
        rt.delete(network, "ctr-go-1", c1.path, "eth0")
    assert_detached(c1)
    assert not net.cache_file("ctr-go-1").exists()
    assert net.leased() == [container_ip(r2)]
    go.run("del", "ctr-go-2", c2.path)
    assert_detached(c2)
    assert net.leased() == []
