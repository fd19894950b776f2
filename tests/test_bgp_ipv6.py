"""BGP mode, dual stack: nodes with an IPv6 underlay address hold one session per family with
each other and with the router (FRR, over IPv6 too); IPv6 pod blocks are announced and routed
like the IPv4 ones: pod to pod across nodes and the external host to a pod, over IPv6."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bgp_util import EXT_IP6, EXT_NET6, ROUTER_AS, Lab, frr_available, running_lab, wait
from etcd_util import etcd_available

pytestmark = pytest.mark.skipif(not (etcd_available() and frr_available()),
                                reason="needs root, etcd, bird2 and frr (scripts/setup --test)")


@pytest.fixture
def lab(tmp_path: Path, plugin_dir: str) -> Iterator[Lab]:
    with running_lab(tmp_path, plugin_dir, "10.236.0.0/24", "/pb35v6", dual=True) as lab:
        yield lab


def test_dual_stack(lab: Lab) -> None:
    lab.pycni("bgp", "peer", "add", "tor", "--peer-ip", lab.tor.ip, "--as-number", str(ROUTER_AS))
    lab.pycni("bgp", "peer", "add", "tor6", "--peer-ip", lab.tor.ip6, "--as-number", str(ROUTER_AS))
    for n in lab.nodes:
        n.start_agent()
    for n in lab.nodes:
        n.add_pod(f"{n.name}-a")
    for n in lab.nodes:
        # node peers: one session per family each; the router: tor (IPv4) and tor6 (IPv6)
        wait(lambda n=n: len([r for r in n.status() if r["state"] == "Established"]) == 6,
             f"{n.name}: six sessions established", timeout=60)
        wait(lambda n=n: n.bird_routes6().count("fd90::") == 2 and EXT_NET6 in n.bird_routes6(),
             f"{n.name}: the other nodes' IPv6 blocks and {EXT_NET6}")
    by_address = {r["address"]: r for r in lab.nodes[0].status()}
    assert by_address[lab.tor.ip6]["name"] == "tor6" and by_address["fd32::2"]["kind"] == "mesh"
    assert "via fd32::2" in lab.nodes[0].bird_routes6()
    pods = [(n, n.pods[f"{n.name}-a"][0], n.pods6[f"{n.name}-a"]) for n in lab.nodes]
    assert all(ip6 for _, _, ip6 in pods)
    for n, ns, _ in pods:
        for m, _, ip6 in pods:
            if m is not n:
                ns.run(["ping", "-6", "-c", "1", "-W", "3", ip6])
    for _, ns, ip6 in pods:
        wait(lambda ip6=ip6: lab.tor.ext.run(["ping", "-6", "-c", "1", "-W", "1", ip6], check=False).returncode == 0,
             f"external host -> pod {ip6}", timeout=15)
        ns.run(["ping", "-6", "-c", "1", "-W", "3", EXT_IP6])
