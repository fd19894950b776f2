"""pycni.net link/addr/route/veth/bridge/iface, each call made inside throwaway namespaces."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable

import pytest
from netns_util import Namespace

from pycni import ipaddr
from pycni.net import addr, bridge, iface, link, route, veth
from pycni.spec.errors import CNIError
from pycni.spec.types import Result


def ip_json(ns: Namespace, *args: str) -> list[dict]:  # type: ignore[type-arg]
    return json.loads(ns.run(["ip", "-j", *args]).stdout or "[]")


def test_calls_act_in_the_calling_threads_namespace(netns_factory: Callable[[], Namespace]) -> None:
    """Two threads, each inside its own namespace, see only their own links — at the same time."""
    a, b = netns_factory(), netns_factory()
    a.run(["ip", "link", "add", "only-a", "type", "veth", "peer", "name", "only-a2"])
    b.run(["ip", "link", "add", "only-b", "type", "bridge"])
    seen: dict[str, set[str]] = {}
    barrier = threading.Barrier(2)

    def look(ns: Namespace) -> None:
        with ns.enter():
            barrier.wait()
            for _ in range(20):
                seen[ns.name] = {lk.name for lk in link.list_links()}

    threads = [threading.Thread(target=look, args=(ns,)) for ns in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[a.name] == {"lo", "only-a", "only-a2"}
    assert seen[b.name] == {"lo", "only-b"}
    # and the main thread, back outside, never saw either
    with a.enter():
        assert link.get_link("only-b") is None


def test_get_set_delete_link(host_ns: Namespace) -> None:
    host_ns.run(["ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1"])
    host_ns.run(["ip", "link", "add", "br9", "type", "bridge"])
    with host_ns.enter():
        got = link.get_link("t0")
        assert got is not None and got.kind == "veth" and not got.up and got.peer_index == link.get_link("t1").index
        assert link.get_link("nope") is None and link.get_link(got.index).name == "t0"
        after = link.set_link("t0", up=True, mtu=1400, mac="0A:00:00:00:00:01", promisc=True, allmulti=True,
                              txqlen=77, master="br9")
        assert (after.up, after.mtu, after.mac, after.promisc, after.allmulti, after.txqlen) == (
            True, 1400, "0a:00:00:00:00:01", True, True, 77)
        assert after.master == link.get_link("br9").index
        after = link.set_link("t0", up=False, promisc=False, master=None, new_name="t0-renamed")
        assert after.name == "t0-renamed" and after.master is None and not after.promisc and not after.up
        with pytest.raises(CNIError) as e:
            link.set_link("nope", up=True)
        assert "nope" in str(e.value)
        with pytest.raises(CNIError):
            link.set_link("t0-renamed", master="no-such-master")
        assert link.delete_link("t0-renamed") is True
        assert link.delete_link("t0-renamed") is False     # idempotent
        assert link.get_link("t1") is None                 # the peer died with it
    # the kernel's view agrees
    names = {x["ifname"] for x in ip_json(host_ns, "link", "show")}
    assert names == {"lo", "br9"}


def test_addresses(host_ns: Namespace) -> None:
    host_ns.run(["ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1"])
    with host_ns.enter():
        link.set_link("t0", up=True)
        link.set_link("t1", up=True)
        addr.add_addr("t0", "10.1.2.3/24")
        addr.add_addr("t0", ipaddr.ip_interface("fd00::3/64"))
        addr.add_addr("t0", "10.1.2.3/24", exist_ok=True)
        with pytest.raises(CNIError) as e:
            addr.add_addr("t0", "10.1.2.3/24")
        assert e.value.code == 999 and "10.1.2.3/24" in e.value.msg
        with pytest.raises(CNIError):
            addr.add_addr("missing", "10.1.2.3/24")
        v4 = addr.list_addrs("t0", 4)
        assert [a.address for a in v4] == [ipaddr.ip_interface("10.1.2.3/24")]
        assert {str(a.address) for a in addr.list_addrs("t0", 6)} >= {"fd00::3/64"}
        addr.settle_addresses("t0", timeout=5)  # DAD over: nothing tentative any more
        assert not any(a.tentative for a in addr.list_addrs("t0", 6))
        assert addr.del_addr("t0", "10.1.2.3/24") is True
        assert addr.del_addr("t0", "10.1.2.3/24") is False
        assert addr.del_addr("missing", "10.1.2.3/24") is False
    info = ip_json(host_ns, "addr", "show", "dev", "t0")[0]["addr_info"]
    assert "10.1.2.3" not in [a["local"] for a in info] and "fd00::3" in [a["local"] for a in info]


def test_routes_in_any_table(host_ns: Namespace) -> None:
    host_ns.run(["ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1"])
    with host_ns.enter():
        link.set_link("t0", up=True)
        link.set_link("t1", up=True)
        addr.add_addr("t0", "10.1.2.3/24")
        addr.add_addr("t0", "fd00::3/64")
        addr.settle_addresses("t0")
        route.add_route("0.0.0.0/0", gw="10.1.2.1", dev="t0")
        route.add_route("::/0", gw="fd00::1", dev="t0")
        route.add_route("10.9.0.0/16", dev="t0", scope=route.RT_SCOPE_LINK)
        route.add_route("192.168.0.0/16", gw="10.1.2.1", dev="t0", table=100, priority=5)
        with pytest.raises(CNIError):
            route.add_route("10.9.0.0/16", dev="t0", scope=route.RT_SCOPE_LINK)
        route.add_route("10.9.0.0/16", dev="t0", scope=route.RT_SCOPE_LINK, exist_ok=True)
        route.replace_route("10.9.0.0/16", gw="10.1.2.254", dev="t0")
        main = route.list_routes(4)
        assert any(r.dst.prefixlen == 0 and str(r.gw) == "10.1.2.1" for r in main)
        assert not any(r.table == 100 for r in main)
        every = route.list_routes(table=None)
        t100 = [r for r in every if r.table == 100]
        assert len(t100) == 1 and str(t100[0].dst) == "192.168.0.0/16" and t100[0].priority == 5
        assert any(str(r.dst) == "::/0" and str(r.gw) == "fd00::1" for r in every)
        replaced = [r for r in main if str(r.dst) == "10.9.0.0/16"]
        assert len(replaced) == 1 and str(replaced[0].gw) == "10.1.2.254"
        assert route.del_route("192.168.0.0/16", gw="10.1.2.1", table=100, priority=5) is True
        assert route.del_route("192.168.0.0/16", gw="10.1.2.1", table=100, priority=5) is False
        assert route.del_route("10.0.0.0/8", dev="missing") is False
    assert "default via 10.1.2.1 dev t0" in host_ns.run(["ip", "route"]).stdout
    assert host_ns.run(["ip", "route", "show", "table", "100"]).stdout == ""


def test_veth_into_container(host_ns: Namespace, container_ns: Namespace) -> None:
    with host_ns.enter():
        pair = veth.setup_veth(container_ns.path, "eth0", mtu=1400, mac="0a:58:00:00:00:09")
    assert re.fullmatch(r"veth[0-9a-f]{8}", pair.host.name) and pair.host.up and pair.host.mtu == 1400
    assert pair.container.name == "eth0" and pair.container.mac == "0a:58:00:00:00:09"
    assert not pair.container.up and pair.container.mtu == 1400
    # each side is where it should be, and they are each other's peer
    assert "eth0" not in {x["ifname"] for x in ip_json(host_ns, "link", "show")}
    assert pair.container.peer_index == pair.host.index and pair.host.peer_index == pair.container.index
    assert host_ns.run(["cat", f"/proc/sys/net/ipv6/conf/{pair.host.name}/accept_ra"]).stdout.strip() == "0"
    with host_ns.enter():
        # a clash on the container side is an error, and leaves no stray host veth
        with pytest.raises(CNIError) as e:
            veth.setup_veth(container_ns.path, "eth0")
        assert "already exists" in e.value.msg
        assert [lk.name for lk in link.list_links() if lk.kind == "veth"] == [pair.host.name]
        # an explicit host name that is taken is an error too
        with pytest.raises(CNIError):
            veth.setup_veth(container_ns.path, "eth1", host_name=pair.host.name)
        with pytest.raises(CNIError) as e:
            veth.setup_veth(container_ns.path, "eth1", mac="not-a-mac")
        assert e.value.code == 7
        with pytest.raises(CNIError) as e:
            veth.setup_veth("/var/run/netns/pycni-t-missing", "eth1")
        assert e.value.code == 4


def test_veth_retries_a_taken_random_name(host_ns: Namespace, container_ns: Namespace,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    host_ns.run(["ip", "link", "add", "vethdeadbeef", "type", "bridge"])
    names = iter(["vethdeadbeef", "vethdeadbeef", "veth00c0ffee"])
    monkeypatch.setattr(veth, "random_veth_name", lambda: next(names))
    with host_ns.enter():
        pair = veth.setup_veth(container_ns.path, "eth0")
    assert pair.host.name == "veth00c0ffee"


def test_bridge_create_reuse_and_ports(host_ns: Namespace, container_ns: Namespace) -> None:
    with host_ns.enter():
        br = bridge.ensure_bridge("br0", mtu=1450, promisc=True)
        assert br.kind == "bridge" and br.up and br.mtu == 1450 and br.promisc
        again = bridge.ensure_bridge("br0")
        assert again.index == br.index
        assert bridge.bridge_vlan_filtering("br0") is False
        pair = veth.setup_veth(container_ns.path, "eth0")
        link.set_link(pair.host.name, master="br0")
        bridge.set_port(pair.host.name, hairpin=True, isolated=True)
        port = bridge.get_port(pair.host.name)
        assert port is not None and port.hairpin and port.isolated
        bridge.set_port(pair.host.name, hairpin=False)
        port = bridge.get_port(pair.host.name)
        assert port is not None and not port.hairpin and port.isolated
        assert bridge.get_port("br0") is None
    info = ip_json(host_ns, "-d", "link", "show", "dev", pair.host.name)[0]["linkinfo"]["info_slave_data"]
    assert info["isolated"] is True and info["hairpin"] is False
    host_ns.run(["ip", "link", "add", "notbr", "type", "veth", "peer", "name", "notbr2"])
    with host_ns.enter(), pytest.raises(CNIError) as e:
        bridge.ensure_bridge("notbr")
    assert "already exists but is not a bridge" in e.value.msg


def test_bridge_vlan_filtering(host_ns: Namespace, container_ns: Namespace) -> None:
    with host_ns.enter():
        try:
            bridge.ensure_bridge("brv", vlan_filtering=True)
        except CNIError as e:
            if "Operation not supported" in str(e):
                pytest.skip("kernel lacks bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)")
            raise
        assert bridge.bridge_vlan_filtering("brv") is True
        pair = veth.setup_veth(container_ns.path, "eth0")
        link.set_link(pair.host.name, master="brv")
        bridge.remove_all_port_vlans(pair.host.name)
        bridge.add_port_vlan(pair.host.name, 100, pvid=True, untagged=True)
        bridge.add_port_vlan(pair.host.name, 200)
        port = bridge.get_port(pair.host.name)
        assert port is not None and port.pvid == 100 and set(port.vlans) == {100, 200}


def test_configure_iface(host_ns: Namespace, container_ns: Namespace) -> None:
    with host_ns.enter():
        pair = veth.setup_veth(container_ns.path, "eth0")
        link.set_link(pair.host.name, up=True)
        addr.add_addr(pair.host.name, "10.20.0.1/24")
        addr.add_addr(pair.host.name, "fd20::1/64")
    result = Result.from_dict({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": container_ns.path}],
        "ips": [{"interface": 0, "address": "10.20.0.2/24", "gateway": "10.20.0.1"},
                {"interface": 0, "address": "fd20::2/64", "gateway": "fd20::1"},
                {"address": "10.99.0.2/24"}],  # no interface index: not ours to add
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "172.16.0.0/12", "gw": "10.20.0.254"},
                   {"dst": "192.168.7.0/24", "table": 7}]}, "1.0.0")
    container_ns.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
    with container_ns.enter():
        iface.configure_iface("eth0", result)
    assert container_ns.run(["cat", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"]).stdout.strip() == "0"
    assert container_ns.run(["cat", "/proc/sys/net/ipv6/conf/eth0/keep_addr_on_down"]).stdout.strip() == "1"
    info = ip_json(container_ns, "addr", "show", "dev", "eth0")[0]
    assert "UP" in info["flags"]
    have = {f"{a['local']}/{a['prefixlen']}" for a in info["addr_info"]}
    assert {"10.20.0.2/24", "fd20::2/64"} <= have and "10.99.0.2/24" not in have
    rt = container_ns.run(["ip", "route"]).stdout + container_ns.run(["ip", "-6", "route"]).stdout
    assert "default via 10.20.0.1 dev eth0" in rt and "default via fd20::1 dev eth0" in rt
    assert "172.16.0.0/12 via 10.20.0.254 dev eth0" in rt
    assert "192.168.7.0/24 via 10.20.0.1 dev eth0" in container_ns.run(["ip", "route", "show", "table", "7"]).stdout
    # real packets over the configured interface, both families
    container_ns.run(["ping", "-c1", "-W2", "10.20.0.1"])
    container_ns.run(["ping", "-c1", "-W3", "fd20::1"])


def test_configure_iface_rejects_a_foreign_interface_index(container_ns: Namespace) -> None:
    container_ns.run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"])
    bad = Result.from_dict({"cniVersion": "1.0.0", "interfaces": [{"name": "other"}],
                            "ips": [{"interface": 0, "address": "10.20.0.2/24"}]}, "1.0.0")
    with container_ns.enter():
        with pytest.raises(CNIError) as e:
            iface.configure_iface("eth0", bad)
        assert "invalid interface index" in e.value.msg
        with pytest.raises(CNIError):
            iface.configure_iface("eth0", Result.from_dict({"cniVersion": "1.0.0"}, "1.0.0"))
        with pytest.raises(CNIError):
            iface.configure_iface("missing", Result.from_dict(
                {"cniVersion": "1.0.0", "interfaces": [{"name": "missing"}]}, "1.0.0"))
