"""Node names are claimed exclusively (issue 23, item 2).

A second ``pycni node`` with a live node's name (a cloned VM keeps its host name, the default
name) used to overwrite the registration with its own underlay address: the other nodes routed
the first node's blocks to the clone. Now registration is a create-if-absent bound to the
agent's lease: the clone refuses to start naming the holder's underlay address, ``pycni node
status`` shows the conflict, and an agent restarted on the same node (same underlay addresses)
takes its own registration back within its TTL.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_util import EtcdCluster, etcd_available

from pycni.cluster.memkv import MemKV
from pycni.cluster.model import Keys, NodeInfo
from pycni.cluster.node import Agent, AgentOptions, NameTaken, claim_name
from pycni.cluster.settings import EtcdSettings


def _agent(name: str, ips: list[str], prefix: str = "/pycni") -> Agent:
    return Agent(AgentOptions(etcd=EtcdSettings(endpoints=["http://mem"], prefix=prefix), name=name,
                              underlay_ips=ips, ttl=30), out=io.StringIO())


def test_claim_is_create_if_absent_with_identity() -> None:
    kv = MemKV()
    key = Keys("/pycni").node("node1")
    first = _agent("node1", ["10.0.0.1"])
    first.register(kv)
    reg = kv.get(key)
    assert reg is not None and reg.lease == first.lease
    clone = _agent("node1", ["10.0.0.9"])
    with pytest.raises(NameTaken) as e:
        clone.register(kv)
    assert "10.0.0.1" in str(e.value) and clone.lease == 0
    assert kv.get(key) == reg and len(kv.leases) == 1  # untouched; the clone's lease given back
    # the same node again (a restart within the TTL): takes its registration over
    again = _agent("node1", ["10.0.0.1"])
    again.register(kv)
    now = kv.get(key)
    assert now is not None and now.lease == again.lease != first.lease
    assert "took over this node's earlier registration" in again.out.getvalue()  # type: ignore[attr-defined]
    # once the holder's lease is gone, the name is free for anyone
    kv.expire(again.lease)
    kv.expire(first.lease)
    clone.register(kv)
    info = NodeInfo.from_json("node1", kv.get(key).value)  # type: ignore[union-attr]
    assert info is not None and info.underlay_ips == ["10.0.0.9"]
    # claim_name itself: a foreign registration is never replaced
    with pytest.raises(NameTaken):
        claim_name(kv, key, NodeInfo(name="node1", underlay_ips=["10.0.0.1"]), kv.lease_grant(30))


def test_running_agent_logs_a_conflict_and_keeps_out() -> None:
    """An agent whose lease lapsed finds its name taken meanwhile: it logs the conflict once and
    does not overwrite the holder."""
    kv = MemKV()
    a = _agent("node1", ["10.0.0.1"])
    a.register(kv)
    kv.expire(a.lease)
    b = _agent("node1", ["10.0.0.2"])
    b.register(kv)
    a.keepalive(kv)
    a.keepalive(kv)
    log = a.out.getvalue()  # type: ignore[attr-defined]
    assert log.count("CONFLICT: node name node1 is held by another agent (underlay 10.0.0.2") == 1, log
    info = NodeInfo.from_json("node1", kv.get(Keys("/pycni").node("node1")).value)  # type: ignore[union-attr]
    assert info is not None and info.underlay_ips == ["10.0.0.2"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    if not etcd_available():
        pytest.skip("needs root and etcd (Debian's etcd-server)")
    with EtcdCluster(size=3, subnet="10.244.0.0/24", prefix="sf-nc") as c:
        yield c


def test_second_agent_with_a_live_name_refuses_to_start(cluster: EtcdCluster, tmp_path: Path) -> None:
    prefix = f"/sf-claim-{time.monotonic_ns()}"
    n1, n2, _ = cluster.nodes
    eps = ",".join(cluster.endpoints)

    def agent(node: object, name: str, ip: str) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"{ip}.log", "ab")
        try:
            return subprocess.Popen(["ip", "netns", "exec", node.ns.name, sys.executable, "-m", "pycni", "node",  # type: ignore[attr-defined]
                                     "--etcd-endpoints", eps, "--etcd-prefix", prefix, "--node-name", name,
                                     "--underlay-ip", ip, "--ttl", "20", "--flows-socket", ""],
                                    stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    def log(ip: str) -> str:
        return (tmp_path / f"{ip}.log").read_text()

    def wait(cond: object, what: str) -> None:
        deadline = time.monotonic() + 30
        while not cond():  # type: ignore[operator]
            assert time.monotonic() < deadline, what
            time.sleep(0.1)

    first = agent(n1, "node1", n1.ip)
    procs = [first]
    try:
        wait(lambda: f"registered {prefix}/nodes/node1" in log(n1.ip), "node1 registered")
        with cluster.client() as etcd:
            before = etcd.get(f"{prefix}/nodes/node1")
        clone = agent(n2, "node1", n2.ip)  # node2's machine, cloned with node1's name
        procs.append(clone)
        assert clone.wait(30) != 0
        out = log(n2.ip)
        assert "refusing to start: node name node1 is held by another agent" in out and n1.ip in out, out
        assert "--node-name" in out
        with cluster.client() as etcd:
            assert etcd.get(f"{prefix}/nodes/node1") == before  # untouched
        # status, run on the clone's machine, shows the conflict
        st = n2.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints", eps, "--etcd-prefix",
                        prefix, "--node-name", "node1"], check=False)
        assert st.returncode == 3 and "CONFLICT: node1 is registered from " + n1.ip in st.stdout, st.stdout
        st = n1.ns.run([sys.executable, "-m", "pycni", "node", "status", "--etcd-endpoints", eps, "--etcd-prefix",
                        prefix, "--node-name", "node1"], check=False)
        assert "CONFLICT" not in st.stdout, st.stdout
        # node1's agent killed and restarted at once: its own registration, taken back
        first.kill()
        first.wait()
        procs.append(agent(n1, "node1", n1.ip))
        wait(lambda: "took over this node's earlier registration" in log(n1.ip), "node1 took its name back")
        with cluster.client() as etcd:
            now = etcd.get(f"{prefix}/nodes/node1")
            assert now is not None and now.lease != before.lease  # type: ignore[union-attr]
            assert json.loads(now.value)["underlayIP"] == n1.ip
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        with cluster.client() as etcd:
            etcd.delete_prefix(prefix + "/")
