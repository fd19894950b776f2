"""IP masquerading (net.masq): traffic from a container leaves with the host's address.

Uses the portmap tests' topology: containers on br0 in a host namespace, a client namespace
on the far side (here it runs the server and reports the source address it sees).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from netns_util import Namespace
from plugin_util import ok, run
from test_portmap import HOST_IP, HOST_IP6, Topo, connect, topo_factory  # noqa: F401

from pycni import ipaddr
from pycni.net import masq
from pycni.spec.errors import CNIError

BACKENDS = ["iptables", "nftables"]
FAR = "192.168.77.2"
FAR6 = "fd77::2"


def addrs(t: Topo, i: int) -> list[ipaddr.IPv4Interface | ipaddr.IPv6Interface]:
    return [ipaddr.ip_interface(f"{t.cip(i)}/24"), ipaddr.ip_interface(f"{t.cip(i, True)}/64")]


def routed_back(t: Topo) -> None:
    """Let the far side route to the container subnets, so unmasqueraded traffic still works."""
    t.client.run(["ip", "route", "add", "10.88.0.0/24", "via", HOST_IP])
    t.client.run(["ip", "-6", "route", "add", "fd88::/64", "via", HOST_IP6])


def sources(t: Topo, i: int) -> tuple[str, str]:
    return connect(t.containers[i], FAR, 7000), connect(t.containers[i], FAR6, 7000)


def test_setup_names_match_go_reference() -> None:
    # Values computed by the Go reference's utils.FormatChainName / FormatComment and
    # pkg/ip's nftables hash for the same inputs.
    assert masq.chain_name("mynet", "cid1") == "CNI-a631aa8e1549a3b129110fd2"
    assert len(masq.chain_name("x" * 300, "y")) == 28
    assert masq.iptables_comment("mynet", "cid1") == 'name: "mynet" id: "cid1"'
    c = masq.nft_comment("mynet", "eth0", "cid1")
    assert c.startswith(masq.nft_instance_hash("mynet", "eth0", "cid1") + ", net: mynet, if: eth0, id: cid1")
    assert len(masq.nft_comment("n" * 200, "eth0", "c" * 64)) == 128


@pytest.mark.parametrize("backend", BACKENDS)
def test_masquerade_traffic(topo_factory: Callable[[int], Topo], backend: str) -> None:  # noqa: F811
    t = topo_factory(2)
    routed_back(t)
    t.serve(t.client, 7000, "far")
    t.serve(1, 7000, "c1")
    assert sources(t, 0) == ("far 10.88.0.10", "far fd88::10")
    with t.host.enter():
        masq.setup_ip_masq(backend, "testnet", "ctr-0", "eth0", addrs(t, 0))
        masq.setup_ip_masq(backend, "testnet", "ctr-0", "eth0", addrs(t, 0))  # idempotent
        masq.check_ip_masq(backend, "testnet", "ctr-0", "eth0", addrs(t, 0))
    # Leaving the subnet: the far side sees the host's address.
    assert sources(t, 0) == (f"far {HOST_IP}", f"far {HOST_IP6}")
    # Inside the subnet: untouched (a neighbour sees the container's own address).
    assert connect(t.containers[0], t.cip(1), 7000) == "c1 10.88.0.10"
    # Another container without masquerading is not affected.
    assert sources(t, 1) == ("far 10.88.0.11", "far fd88::11")
    with t.host.enter():
        masq.teardown_ip_masq(backend, "testnet", "ctr-0", "eth0", addrs(t, 0))
        masq.teardown_ip_masq(backend, "testnet", "ctr-0", "eth0", addrs(t, 0))  # idempotent
        with pytest.raises(CNIError):
            masq.check_ip_masq(backend, "testnet", "ctr-0", "eth0", addrs(t, 0))
    assert sources(t, 0) == ("far 10.88.0.10", "far fd88::10")


@pytest.mark.parametrize("backend", BACKENDS)
def test_teardown_without_addresses_keeps_others(topo_factory: Callable[[int], Topo],  # noqa: F811
                                                 backend: str) -> None:
    t = topo_factory(2)
    routed_back(t)
    t.serve(t.client, 7000, "far")
    with t.host.enter():
        for i in (0, 1):
            masq.setup_ip_masq(backend, "testnet", f"ctr-{i}", "eth0", addrs(t, i))
        masq.teardown_ip_masq(backend, "testnet", "ctr-0", "eth0", None)
        with pytest.raises(CNIError):
            masq.check_ip_masq(backend, "testnet", "ctr-0", "eth0", addrs(t, 0))
        masq.check_ip_masq(backend, "testnet", "ctr-1", "eth0", addrs(t, 1))
    assert sources(t, 0) == ("far 10.88.0.10", "far fd88::10")
    assert sources(t, 1) == (f"far {HOST_IP}", f"far {HOST_IP6}")
    rules = t.host.run(["iptables-save", "-t", "nat"]).stdout + t.host.run(["nft", "list", "ruleset"]).stdout
    assert "ctr-0" not in rules and "ctr-1" in rules
    with t.host.enter():
        masq.teardown_ip_masq(None, "testnet", "ctr-1", "eth0", None)  # both backends
    rules = t.host.run(["iptables-save", "-t", "nat"]).stdout + t.host.run(["nft", "list", "ruleset"]).stdout
    assert "ctr-1" not in rules and "10.88.0.1" not in rules.replace("10.88.0.0/24", "")


def test_nft_layout(host_ns: Namespace) -> None:
    a = [ipaddr.ip_interface("10.1.0.5/24")]
    with host_ns.enter():
        masq.setup_ip_masq("nftables", "net", "cid", "eth0", a)
    text = host_ns.run(["nft", "list", "table", "inet", masq.NFT_TABLE]).stdout
    assert "type nat hook postrouting priority srcnat" in text
    assert "ip daddr 224.0.0.0/4 return" in text and "ip6 daddr ff00::/8 return" in text
    assert "goto masq_checks" in text
    assert "ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade" in text


def test_iptables_layout(host_ns: Namespace) -> None:
    a = [ipaddr.ip_interface("10.1.0.5/24")]
    with host_ns.enter():
        masq.setup_ip_masq("iptables", "net", "cid", "eth0", a)
    text = host_ns.run(["iptables-save", "-t", "nat"]).stdout
    chain = masq.chain_name("net", "cid")
    assert f'-A POSTROUTING -s 10.1.0.5/32 -m comment --comment "name: \\"net\\" id: \\"cid\\"" -j {chain}' in text
    assert f"-A {chain} -d 10.1.0.0/24" in text and "-j ACCEPT" in text
    assert f"-A {chain} ! -d 224.0.0.0/4" in text and "-j MASQUERADE" in text


def test_unknown_backend() -> None:
    with pytest.raises(CNIError) as e:
        masq.setup_ip_masq("pf", "n", "c", "eth0", [ipaddr.ip_interface("10.0.0.1/24")])
    assert e.value.code == 7


GO_BRIDGE = "/usr/lib/cni/bridge"


@pytest.mark.skipif(not os.path.exists(GO_BRIDGE), reason="Go reference plugins not installed")
def test_interop_with_go_bridge_ipmasq(netns_factory: Callable[[], Namespace], tmp_path: Path) -> None:
    """The Go bridge's ipMasq rules are the ones we check for, and our teardown removes them."""
    host, ctr = netns_factory(), netns_factory()
    netconf = {"cniVersion": "0.4.0", "name": "gonet", "type": "bridge", "bridge": "cni0", "isGateway": True,
               "ipMasq": True, "ipam": {"type": "host-local", "subnet": "10.22.0.0/24",
                                         "dataDir": str(tmp_path / "ipam")}}
    out = ok(run("bridge", "ADD", netconf, via="exec", host=host, container_id="go-ctr", netns=ctr))
    ip = ipaddr.ip_interface(out["ips"][0]["address"])
    with host.enter():
        masq.check_ip_masq("iptables", "gonet", "go-ctr", "eth0", [ip])
        masq.teardown_ip_masq("iptables", "gonet", "go-ctr", "eth0", None)
        with pytest.raises(CNIError):
            masq.check_ip_masq("iptables", "gonet", "go-ctr", "eth0", [ip])
    nat = host.run(["iptables-save", "-t", "nat"]).stdout
    assert "CNI-" not in nat and str(ip.ip) not in nat


def test_iptables_teardown_with_other_addresses_still_cleans_up(host_ns: Namespace) -> None:
    """DEL's fast path removes exactly what ADD made; when the addresses differ it falls back
    to finding the jumps by their target, and a second teardown finds nothing to do."""
    made = [ipaddr.ip_interface("10.1.0.5/24"), ipaddr.ip_interface("10.1.0.6/24")]
    with host_ns.enter():
        masq.setup_ip_masq("iptables", "net", "cid-x", "eth0", made)
        masq.setup_ip_masq("iptables", "net", "cid-x", "eth0", made)  # a repeated ADD adds no second jump
    saved = host_ns.run(["iptables-save", "-t", "nat"]).stdout
    assert saved.count("-j CNI-") == 2
    with host_ns.enter():
        masq.teardown_ip_masq("iptables", "net", "cid-x", "eth0", [ipaddr.ip_interface("10.1.0.9/24")])
        masq.teardown_ip_masq(None, "net", "cid-x", "eth0", made)
    assert "CNI-" not in host_ns.run(["iptables-save", "-t", "nat"]).stdout


def test_iptables_setup_over_an_existing_chain(host_ns: Namespace) -> None:
    """The one-restore ADD fails as a whole when the chain exists (a repeated ADD, a Go-made or
    half-made chain); the fallback then rewrites the chain and adds each missing jump once."""
    a = [ipaddr.ip_interface("10.1.0.5/24")]
    chain = masq.chain_name("net", "cid-y")
    comment = masq.iptables_comment("net", "cid-y")
    host_ns.run(["iptables", "-t", "nat", "-N", chain])
    host_ns.run(["iptables", "-t", "nat", "-A", chain, "-d", "10.9.9.0/24", "-j", "ACCEPT"])  # stale
    with host_ns.enter():
        masq.setup_ip_masq("iptables", "net", "cid-y", "eth0", a)
        masq.check_ip_masq("iptables", "net", "cid-y", "eth0", a)
    saved = host_ns.run(["iptables-save", "-t", "nat"]).stdout
    assert "10.9.9.0/24" not in saved and saved.count(f"-j {chain}") == 1
    host_ns.run(["iptables", "-t", "nat", "-D", "POSTROUTING", "-s", "10.1.0.5/32", "-m", "comment",
                 "--comment", comment, "-j", chain])  # a jump lost: the next ADD puts it back
    with host_ns.enter():
        masq.setup_ip_masq("iptables", "net", "cid-y", "eth0", a)
        masq.check_ip_masq("iptables", "net", "cid-y", "eth0", a)
        masq.teardown_ip_masq(None, "net", "cid-y", "eth0", a)
    saved = host_ns.run(["iptables-save", "-t", "nat"]).stdout
    assert "CNI-" not in saved


def test_teardown_of_both_backends_creates_nothing(host_ns: Namespace) -> None:
    """A DEL for both backends where neither was used: no error, and no nft table appears."""
    with host_ns.enter():
        masq.teardown_ip_masq(None, "net", "never-added", "eth0", None)
        masq.teardown_ip_masq(None, "net", "never-added", "eth0", [ipaddr.ip_interface("10.1.0.5/24")])
    assert masq.NFT_TABLE not in host_ns.run(["nft", "list", "ruleset"]).stdout
    assert "CNI-" not in host_ns.run(["iptables-save", "-t", "nat"]).stdout


def test_gc_removes_stale_attachments_from_both_layouts(host_ns: Namespace) -> None:
    """GC keeps the valid attachments' rules and removes the others of the network, in both
    layouts, whichever backend made them; another network's rules stay."""
    a = {cid: [ipaddr.ip_interface(f"10.3.0.{i}/24")] for i, cid in enumerate(("c1", "c2", "c3", "c4"), 5)}
    with host_ns.enter():
        masq.setup_ip_masq("iptables", "net", "c1", "eth0", a["c1"])
        masq.setup_ip_masq("nftables", "net", "c2", "eth0", a["c2"])
        masq.setup_ip_masq("iptables", "net", "c3", "eth0", a["c3"])
        masq.setup_ip_masq("nftables", "net", "c4", "eth0", a["c4"])
        masq.setup_ip_masq("iptables", "other", "c1", "eth0", a["c1"])
        masq.gc_ip_masq("net", [("c3", "eth0"), ("c4", "eth0")])
        for cid in ("c1", "c2"):
            for backend in masq.BACKENDS:
                with pytest.raises(CNIError):
                    masq.check_ip_masq(backend, "net", cid, "eth0", a[cid])
        masq.check_ip_masq("iptables", "net", "c3", "eth0", a["c3"])
        masq.check_ip_masq("nftables", "net", "c4", "eth0", a["c4"])
        masq.check_ip_masq("iptables", "other", "c1", "eth0", a["c1"])
        masq.gc_ip_masq("net", [])
        masq.gc_ip_masq("other", [])
    state = host_ns.run(["iptables-save", "-t", "nat"]).stdout + host_ns.run(["nft", "list", "ruleset"]).stdout
    assert "10.3.0." not in state and "-j CNI-" not in state
