"""One container on two networks: each network's default route lives beside the other's.

Runtimes (podman's ``--network a,b``, Multus) attach a container to several networks, each
with its own ``routes: [{"dst": "0.0.0.0/0"}]``. The Go plugins add IPAM routes without
NLM_F_EXCL, so the kernel keeps both: two IPv4 default routes, one IPv6 multipath default
route. Ours must do the same for every main plugin, and deleting one network must leave the
other's routes working. Everything runs in throwaway namespaces; the "host" namespace holds
an address on lo (outside both subnets) that the container can only reach by a default route.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import ok, run

from pycni.plugins.main import bridge, ptp
from pycni.skel import Plugin

GO_PLUGINS = "/usr/lib/cni"
FAR = {4: "198.51.100.1", 6: "2001:db8:ff::1"}  # on the host's lo: reachable only by a default route


def net_conf(tmp_path: Path, plugin: str, n: int, family: int, **extra: Any) -> dict[str, Any]:
    subnet = f"10.8{n}.0.0/24" if family == 4 else f"fd8{n}::/64"
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0", "name": f"mnet{n}", "type": plugin,
        "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": subnet}]],
                 "routes": [{"dst": "0.0.0.0/0" if family == 4 else "::/0"}]}}
    if plugin == "bridge":
        conf.update(bridge=f"mnbr{n}", isGateway=True)
    conf.update(extra)
    return conf


def default_hops(ns: Namespace, family: int) -> list[tuple[str, str]]:
    """(gateway, dev) of every default route of ``family``, multipath hops included, sorted."""
    out = json.loads(ns.run(["ip", "-j", f"-{family}", "route", "show", "default"]).stdout or "[]")
    hops = []
    for r in out:
        for hop in r.get("nexthops") or [r]:
            hops.append((hop["gateway"], hop["dev"]))
    return sorted(hops)


def far_reachable(host: Namespace, ctr: Namespace, family: int) -> None:
    if family == 6:
        host.wait_dad()
        ctr.wait_dad()
    ctr.run(["ping", f"-{family}", "-c", "1", "-W", "3", FAR[family]])


def host_with_far_address(host: Namespace) -> None:
    host.run(["ip", "addr", "add", f"{FAR[4]}/32", "dev", "lo"])
    host.run(["ip", "addr", "add", f"{FAR[6]}/128", "dev", "lo"])


def gateway(result: dict[str, Any]) -> str:
    return str(result["ips"][0]["gateway"])


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("plugin", [bridge.PLUGIN, ptp.PLUGIN], ids=["bridge", "ptp"])
def test_two_networks_keep_both_default_routes(plugin: Plugin, family: int, host_ns: Namespace,
                                               container_ns: Namespace, plugin_dir: str, tmp_path: Path) -> None:
    host, ctr = host_ns, container_ns
    host_with_far_address(host)
    kind = "bridge" if plugin is bridge.PLUGIN else "ptp"
    net1, net2 = (net_conf(tmp_path, kind, n, family) for n in (1, 2))

    def add(conf: dict[str, Any], ifname: str) -> dict[str, Any]:
        return ok(run(plugin, "ADD", conf, host=host, netns=ctr, cni_path=plugin_dir, ifname=ifname,
                      container_id="multi"))

    def delete(conf: dict[str, Any], ifname: str) -> None:
        ok(run(plugin, "DEL", conf, host=host, netns=ctr, cni_path=plugin_dir, ifname=ifname, container_id="multi"))

    def check(conf: dict[str, Any], ifname: str, result: dict[str, Any]) -> None:
        ok(run(plugin, "CHECK", dict(conf, prevResult=result), host=host, netns=ctr, cni_path=plugin_dir,
               ifname=ifname, container_id="multi"))

    r1 = add(net1, "eth0")
    r2 = add(net2, "eth1")  # the second default route used to fail with EEXIST
    assert default_hops(ctr, family) == sorted([(gateway(r1), "eth0"), (gateway(r2), "eth1")])
    if family == 6:  # the kernel joins IPv6 routes of one destination and metric into one multipath route
        assert len(json.loads(ctr.run(["ip", "-j", "-6", "route", "show", "default"]).stdout)) == 1
    check(net1, "eth0", r1)
    check(net2, "eth1", r2)
    far_reachable(host, ctr, family)

    # DEL of the first network leaves the second's default route, working
    delete(net1, "eth0")
    assert default_hops(ctr, family) == [(gateway(r2), "eth1")]
    check(net2, "eth1", r2)
    far_reachable(host, ctr, family)

    # and the other way round: attach the first again, delete the second
    r1 = add(net1, "eth0")
    assert default_hops(ctr, family) == sorted([(gateway(r1), "eth0"), (gateway(r2), "eth1")])
    delete(net2, "eth1")
    assert default_hops(ctr, family) == [(gateway(r1), "eth0")]
    check(net1, "eth0", r1)
    far_reachable(host, ctr, family)
    delete(net1, "eth0")
    assert default_hops(ctr, family) == []
    assert not [f for f in (tmp_path / "ipam").rglob("*") if f.is_file() and f.name[0] in "1f"]


def test_dual_stack_on_two_networks_bridge_and_ptp(host_ns: Namespace, container_ns: Namespace,
                                                    plugin_dir: str, tmp_path: Path) -> None:
    """Different main plugins on one container, each dual stack: both families keep both routes."""
    host, ctr = host_ns, container_ns
    host_with_far_address(host)
    net1 = net_conf(tmp_path, "bridge", 1, 4)
    net2 = net_conf(tmp_path, "ptp", 2, 4)
    for n, conf in ((1, net1), (2, net2)):
        conf["ipam"]["ranges"].append([{"subnet": f"fd8{n}::/64"}])
        conf["ipam"]["routes"].append({"dst": "::/0"})
    r1 = ok(run("bridge", "ADD", net1, host=host, netns=ctr, cni_path=plugin_dir, ifname="eth0", container_id="ds"))
    r2 = ok(run("ptp", "ADD", net2, host=host, netns=ctr, cni_path=plugin_dir, ifname="eth1", container_id="ds"))
    for fam, i in ((4, 0), (6, 1)):
        assert default_hops(ctr, fam) == sorted([(r1["ips"][i]["gateway"], "eth0"), (r2["ips"][i]["gateway"], "eth1")])
    ok(run("bridge", "DEL", net1, host=host, netns=ctr, cni_path=plugin_dir, ifname="eth0", container_id="ds"))
    for fam, i in ((4, 0), (6, 1)):
        assert default_hops(ctr, fam) == [(r2["ips"][i]["gateway"], "eth1")]
        far_reachable(host, ctr, fam)
    ok(run("ptp", "DEL", net2, host=host, netns=ctr, cni_path=plugin_dir, ifname="eth1", container_id="ds"))


def test_two_macvlan_networks(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                              tmp_path: Path) -> None:
    """The sub-interface plugins (macvlan here; ipvlan and vlan share the code) configure through the
    same helper: two networks on two parents give two default routes."""
    host, ctr = host_ns, container_ns
    for n in (1, 2):
        host.run(["ip", "link", "add", f"mvp{n}", "type", "veth", "peer", "name", f"mvq{n}"])
        host.run(["ip", "link", "set", f"mvp{n}", "up"])
    results = []
    for n, ifname in ((1, "eth0"), (2, "eth1")):
        conf = net_conf(tmp_path, "macvlan", n, 4, master=f"mvp{n}")
        conf["ipam"]["ranges"][0][0]["gateway"] = f"10.8{n}.0.1"
        results.append(ok(run("macvlan", "ADD", conf, host=host, netns=ctr, cni_path=plugin_dir, ifname=ifname,
                              container_id="mv")))
    assert default_hops(ctr, 4) == [("10.81.0.1", "eth0"), ("10.82.0.1", "eth1")]
    ok(run("macvlan", "DEL", net_conf(tmp_path, "macvlan", 1, 4, master="mvp1"), host=host, netns=ctr,
           cni_path=plugin_dir, ifname="eth0", container_id="mv"))
    assert default_hops(ctr, 4) == [("10.82.0.1", "eth1")]


# ---- the reproduction, through our runtime, beside the Go plugins ------------------------------

def write_conflists(tmp_path: Path, family: int) -> Path:
    d = tmp_path / "net.d"
    d.mkdir()
    for n in (1, 2):
        plugin = net_conf(tmp_path, "bridge", n, family, ipMasq=False)
        del plugin["cniVersion"], plugin["name"]
        (d / f"1{n}-mnet{n}.conflist").write_text(json.dumps(
            {"cniVersion": "1.0.0", "name": f"mnet{n}", "plugins": [plugin]}))
    return d


def container_routes(ns: Namespace, family: int) -> list[dict[str, Any]]:
    """The container's routes in the kernel's order (for IPv4 the first default route is the one used),
    without what differs between two runs (link-local routes)."""
    routes = json.loads(ns.run(["ip", "-j", f"-{family}", "route", "show", "table", "main"]).stdout)
    return [r for r in routes if not str(r.get("dst", "")).startswith("fe80")]


@pytest.mark.parametrize("family", [4, 6])
def test_runtime_two_networks_same_routes_as_go(family: int, netns_factory: Callable[[], Namespace],
                                                tmp_path: Path) -> None:
    """``pycni add net1``, then ``CNI_IFNAME=eth1 pycni add net2``: the container ends with the same routes
    under our plugins as under the Go plugins (each in its own host namespace), and DEL of net1 leaves net2's."""
    if not os.access(f"{GO_PLUGINS}/bridge", os.X_OK):
        pytest.skip("needs containernetworking-plugins (the Go bridge) to compare with")
    from pycni.install_plugins import install

    ours = tmp_path / "bin"
    install(str(ours), ["bridge", "host-local"], daemon=True)
    seen = {}
    for side, cni_path in (("go", GO_PLUGINS), ("ours", str(ours))):
        host, ctr = netns_factory(), netns_factory()
        state = tmp_path / side
        state.mkdir()
        env = {"PATH": os.environ["PATH"], "NETCONFPATH": str(write_conflists(state, family)),
               "CNI_PATH": cni_path, "PYCNI_SOCKET": "off"}
        pycni = [sys.executable, "-m", "pycni"]
        cache = ["--cache-dir", str(state / "cache")]
        host.run([*pycni, "add", "mnet1", ctr.path, *cache], env=env)
        host.run([*pycni, "add", "mnet2", ctr.path, *cache], env=dict(env, CNI_IFNAME="eth1"))
        both = container_routes(ctr, family)
        host.run([*pycni, "del", "mnet1", ctr.path, *cache], env=env)
        one = container_routes(ctr, family)
        host.run([*pycni, "del", "mnet2", ctr.path, *cache], env=dict(env, CNI_IFNAME="eth1"))
        seen[side] = (both, one)
        assert subprocess.run(["ip", "netns", "exec", ctr.name, "ip", "link", "show", "eth1"],
                              capture_output=True).returncode != 0
    assert seen["ours"] == seen["go"]
    both, one = seen["ours"]
    defaults = [r for r in both if r["dst"] == "default"]
    assert len(defaults) == (2 if family == 4 else 1)
    assert [r for r in one if r["dst"] == "default"] != []
