"""BGP mode with the mesh off and node1 reflecting routes (tests/bgp_util.py's lab: three nodes
with BIRD, FRR as the top-of-rack, an external host): node2 and node3 peer only with node1 and
still reach each other's pods (node1 reflects their blocks, next hop the originating node);
the mesh turned back on live; node3's BIRD run by the operator (``--bird external``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from bgp_util import EXT_NET, ROUTER_AS, Lab, frr_available, running_lab, wait
from etcd_util import etcd_available

pytestmark = pytest.mark.skipif(not (etcd_available() and frr_available()),
                                reason="needs root, etcd, bird2 and frr (scripts/setup --test)")


@pytest.fixture
def lab(tmp_path: Path, plugin_dir: str) -> Iterator[Lab]:
    with running_lab(tmp_path, plugin_dir, "10.233.0.0/24", "/pb35rr") as lab:
        yield lab


def _kinds(rows: list[dict[str, object]]) -> dict[str, object]:
    return {str(r["name"]): r["kind"] for r in rows}


def test_route_reflector_topology(lab: Lab) -> None:
    n1, n2, n3 = lab.nodes
    out = lab.pycni("bgp", "config", "--mesh", "off", "--route-reflectors", "node1", "-o", "json")
    assert json.loads(out.stdout) == [{"asNumber": 64512, "nodeToNodeMesh": False, "routeReflectors": ["node1"]}]
    lab.pycni("bgp", "peer", "add", "tor", "--peer-ip", lab.tor.ip, "--as-number", str(ROUTER_AS))
    n1.start_agent()
    n2.start_agent()
    # node3's BIRD is the operator's: its agent only writes the configuration and reloads it
    n3.start_agent("bgp", "--bird", "external")
    conf = n3.state / "bird.conf"
    wait(conf.exists, "node3's agent writes BIRD's configuration")
    assert n3.bird_pid() == 0 and "bgp: BIRD started" not in n3.log_text()
    n3.ns.run(["bird", "-c", str(conf), "-s", str(n3.state / "bird.ctl"), "-P", str(n3.state / "bird.pid")])
    for n in lab.nodes:
        n.add_pod(f"{n.name}-a")
    wait(lambda: len(n1.established()) == 3, "node1: two clients and the router", timeout=40)
    for n in (n2, n3):
        wait(lambda n=n: len(n.established()) == 2, f"{n.name}: the reflector and the router", timeout=40)
    assert _kinds(n1.status()) == {"node2": "client", "node3": "client", "tor": "external"}
    assert _kinds(n2.status()) == {"node1": "reflector", "tor": "external"}
    # node3's block reaches node2 through node1, with node3 as the next hop (not node1)
    for n, other in ((n2, n3), (n3, n2)):
        wait(lambda n=n, other=other: f"via {other.etcd.ip}" in n.bird_routes(),
             f"{n.name} routes {other.name}'s block to {other.name}")
    wait(lambda: all(n.bird_routes().count("10.90.") == 2 for n in lab.nodes), "every node: both other blocks")
    assert lab.ping_pods() == 6
    wait(lambda: lab.tor.routes().count("10.90.") == 3, "the router learned every node's block")
    wait(lambda: all(EXT_NET in n.bird_routes() for n in lab.nodes), f"every node learned {EXT_NET}")
    for _, _, _, ip in lab.pods():
        assert lab.ext_ping(ip), f"external host -> pod {ip}"

    assert "bgp: birdc configure: Reconfigured" in n3.log_text()  # the operator's BIRD, reloaded

    # A borrowed address: a pool of two blocks, one claimed by node1 and one by node2; node3 gets
    # an address of one of theirs and announces that /32 alone — reflected to node2 by node1.
    lab.nodes[0].add_pod("small-1", block=30, network="small", subnet="10.91.0.0/29")
    n2.add_pod("small-2", block=30, network="small", subnet="10.91.0.0/29")
    borrowed = n3.add_pod("small-3", block=30, network="small", subnet="10.91.0.0/29")
    wait(lambda: f"{borrowed} via {n3.etcd.ip}" in n2.bird_routes() and
         f"{borrowed} via {n3.etcd.ip}" in n1.bird_routes(), f"node1 and node2 route {borrowed}/32 to node3")
    wait(lambda: f"via {n3.etcd.ip} " in lab.tor.ns.run(["ip", "route", "get", borrowed], check=False).stdout,
         f"the router routes {borrowed} to node3")
    assert lab.ext_ping(borrowed), f"external host -> borrowed address {borrowed}"
    small2_ns = n2.pods["small-2"][0]
    small2_ns.run(["ping", "-c", "1", "-W", "2", borrowed])

    for name in ("small-1", "small-2", "small-3"):  # (the pod-to-pod checks below are podnet's)
        next(n for n in lab.nodes if name in n.pods).pods.pop(name)

    # the mesh back on, live: node2 and node3 now peer directly, node1 is an ordinary peer
    lab.pycni("bgp", "config", "--mesh", "on", "--route-reflectors", "")
    wait(lambda: _kinds(n2.status()) == {"node1": "mesh", "node3": "mesh", "tor": "external"}, "node2 meshed")
    wait(lambda: len(n2.established()) == 3 and len(n3.established()) == 3, "mesh sessions up", timeout=40)
    wait(lambda: all(n.bird_routes().count("10.90.") == 2 for n in lab.nodes), "every node: both other blocks")
    assert lab.ping_pods() == 6
