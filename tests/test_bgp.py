"""BGP mode, full mesh: three nodes running ``pycni node --mode bgp`` (each its own BIRD), a
top-of-rack router running FRR and an external host behind it (tests/bgp_util.py). Pod to pod
across nodes and external host to pod by the pod's own address; ``pycni bgp status`` against
FRR's own view; an agent SIGKILL and a BIRD crash under a continuous ping (at most one packet
lost at 5/s); the router peer removed and added live; a node dying (its routes withdrawn by the
others within the hold time)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bgp_util import EXT_IP, EXT_NET, HOLD, ROUTER_AS, Lab, Pinger, frr_available, running_lab, wait
from etcd_util import etcd_available

pytestmark = pytest.mark.skipif(not (etcd_available() and frr_available()),
                                reason="needs root, etcd, bird2 and frr (scripts/setup --test)")


@pytest.fixture
def lab(tmp_path: Path, plugin_dir: str) -> Iterator[Lab]:
    with running_lab(tmp_path, plugin_dir, "10.232.0.0/24", "/pb35") as lab:
        yield lab


def test_mesh_external_peer_and_faults(lab: Lab) -> None:
    n1, n2, n3 = lab.nodes
    lab.pycni("bgp", "peer", "add", "tor", "--peer-ip", lab.tor.ip, "--as-number", str(ROUTER_AS))
    peers = json.loads(lab.pycni("bgp", "peer", "list", "-o", "json").stdout)
    assert peers == [{"name": "tor", "peerIP": lab.tor.ip, "asNumber": ROUTER_AS, "node": "(all)"}]
    for n in lab.nodes:
        n.start_agent()
    for n in lab.nodes:
        n.add_pod(f"{n.name}-a")
    # every node: two mesh sessions and the router, Established
    for n in lab.nodes:
        wait(lambda n=n: len(n.established()) == 3, f"{n.name}: 3 sessions established", timeout=40)
    # each node learned the two other nodes' blocks over BGP (installed by BIRD, proto bird), and
    # the external network from the router
    for n in lab.nodes:
        wait(lambda n=n: n.bird_routes().count("10.90.") == 2 and EXT_NET in n.bird_routes(),
             f"{n.name}: other blocks and {EXT_NET} in the kernel")
    # FRR's own view: three nodes, each announcing one block
    summary = lab.tor.summary()
    assert sorted(summary) == [n.etcd.ip for n in lab.nodes], summary
    assert all(p["state"] == "Established" and p["pfxRcd"] == 1 for p in summary.values()), summary
    assert lab.tor.routes().count("10.90.") == 3

    status = {r["name"]: r for r in n1.status()}
    assert status["tor"]["kind"] == "external" and status["tor"]["asNumber"] == ROUTER_AS
    assert status["tor"]["address"] == lab.tor.ip and status["tor"]["routesExported"] == 1
    assert status["tor"]["routesImported"] >= 1 and status["tor"]["since"]
    assert status["node2"]["kind"] == "mesh" and status["node2"]["routesImported"] == 1
    table = n1.pycni("bgp", "status", "--node", "node1", "--bgp-state-dir", str(lab.tmp / "bgp")).stdout
    assert table.splitlines()[0].split()[:5] == ["PEER", "KIND", "ADDRESS", "AS", "STATE"], table

    # traffic: pod <-> pod across nodes, external host <-> pod by the pod's own address (no NAT:
    # the pod sees the external host's address)
    assert lab.ping_pods() == 6
    for _, _, pns, ip in lab.pods():
        assert lab.ext_ping(ip), f"external host -> pod {ip}"
        pns.run(["ping", "-c", "1", "-W", "2", EXT_IP])

    # no masquerade anywhere on the way: the external host sees the pod's own address
    pod_ns, target = n1.pods["node1-a"]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", lab.tor.ext.name, sys.executable, "-c",
         "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 9999)); "
         "s.settimeout(10); print(s.recvfrom(100)[1][0])"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    pod_ns.run([sys.executable, "-c", "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                f".sendto(b'hi', ('{EXT_IP}', 9999))"])
    seen, _ = listener.communicate(timeout=15)
    assert seen.strip() == target, f"the external host saw {seen.strip()!r}, the pod is {target}"
    # An agent SIGKILLed, then started again, under a continuous ping from outside: BIRD goes on.
    pinger = Pinger(lab, target)
    time.sleep(1)
    n1.stop_agent(signal.SIGKILL)
    time.sleep(1)
    n1.start_agent()
    time.sleep(1.5)
    sent, got = pinger.stop()
    assert sent - got <= 1, f"agent restart: {sent - got} of {sent} lost"
    assert "birdc configure" not in n1.log_text().split("starting:")[-1]  # same config: no reload
    print(f"\nagent SIGKILL + restart: {sent - got} of {sent} pings lost")

    # BIRD killed: the agent starts it again with graceful restart recovery; the peers keep its
    # routes meanwhile and the kernel keeps the routes BIRD had installed.
    old = n1.bird_pid()
    pinger = Pinger(lab, target)
    time.sleep(1)
    n1.kill_bird()
    wait(lambda: n1.bird_pid() not in (0, old), "the agent restarts BIRD")
    wait(lambda: len(n1.established()) == 3, "node1's sessions back", timeout=30)
    time.sleep(1)
    sent, got = pinger.stop()
    assert "graceful restart recovery" in n1.log_text()
    # the agent held the old BIRD's routes (proto 95, metric 33) while the new one recovered, and
    # drops the copies once every session has been back for a hold time
    assert "bgp: holding" in n1.log_text()
    wait(lambda: "bgp: released" in n1.log_text(), "held routes released", timeout=20)
    assert n1.ns.run(["ip", "route", "show", "proto", "95"]).stdout == ""
    assert sent - got <= 1, f"BIRD restart: {sent - got} of {sent} lost"
    print(f"BIRD SIGKILL + restart (graceful restart): {sent - got} of {sent} pings lost")
    assert lab.ping_pods() == 6

    # The router peer removed live: every node closes its session; the router loses the pods' routes.
    lab.pycni("bgp", "peer", "delete", "tor")
    for n in lab.nodes:
        wait(lambda n=n: "tor" not in {r["name"] for r in n.status()}, f"{n.name} drops its tor session")
    wait(lambda: "10.90." not in lab.tor.routes(), "the router withdraws the pods' blocks")
    assert not lab.ext_ping(target)
    assert lab.ping_pods() == 6  # the mesh is untouched
    # ... and added back (this time for node1 only: a per-node peer, a top-of-rack of one rack)
    lab.pycni("bgp", "peer", "add", "tor", "--peer-ip", lab.tor.ip, "--as-number", str(ROUTER_AS),
              "--node", "node1")
    wait(lambda: "tor" in n1.established(), "node1 peers with tor again", timeout=30)
    assert "tor" not in {r["name"] for r in n2.status()}
    wait(lambda: lab.ext_ping(target), "external host reaches node1's pod again")
    assert lab.pycni("bgp", "peer", "delete", "nope", check=False).returncode == 1

    # A node dying (its link gone, its BIRD dead): the others withdraw its routes within the hold time.
    _, dead_ip = n3.pods["node3-a"]
    dead_block = next(line.split()[0] for line in n1.bird_routes().splitlines() if "via " + n3.etcd.ip in line)
    n3.stop_agent(signal.SIGKILL)
    n3.ns.run(["ip", "link", "set", n3.etcd.ifname, "down"])
    n3.kill_bird()
    took = wait(lambda: dead_block not in n1.bird_routes() and dead_block not in n2.bird_routes(),
                f"node3's block {dead_block} withdrawn", timeout=HOLD * 4, step=0.05)
    print(f"node dying: its block withdrawn by both peers {took:.2f} s after (hold time {HOLD} s)")
    assert took <= HOLD + 1.5, f"withdrawn after {took:.2f} s, hold time {HOLD} s"
    assert not n1.pods["node1-a"][0].run(["ping", "-c", "1", "-W", "1", dead_ip], check=False).returncode == 0
