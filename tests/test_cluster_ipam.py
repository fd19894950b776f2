"""cluster-ipam against a real 3-member etcd cluster, with macvlan pods on the nodes' shared L2.

Three node namespaces on an underlay bridge (tests/etcd_util.py), one etcd member in each;
the plugins run as executables inside a node namespace, as a runtime on that node would run
them, and reach etcd over the underlay. Pods are throwaway namespaces with a macvlan link on
the node's underlay interface.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import plugin_util
import pytest
from etcd_util import EtcdCluster, EtcdNode, etcd_available
from netns_util import Namespace

from pycni.cluster.ipam import ClusterStore
from pycni.install_plugins import install

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")

TIMEOUT = 5  # etcdTimeout in the configs: the bound on a command when etcd does not answer
LOCK_DIR = ""  # lockDir in the configs: a temporary directory (set by the module fixture below)


@pytest.fixture(scope="module", autouse=True)
def lock_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    global LOCK_DIR
    LOCK_DIR = str(tmp_path_factory.mktemp("cluster-ipam-locks"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(subnet="10.231.3.0/24") as c:
        yield c


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("cni-bin")
    install(str(d))
    return str(d)


@pytest.fixture
def up(cluster: EtcdCluster) -> EtcdCluster:
    """The cluster with every member running (a test before may have killed some)."""
    cluster.restart_all()
    return cluster


def ipam_conf(cluster: EtcdCluster, node: EtcdNode, **kw: Any) -> dict[str, Any]:
    c = {"type": "cluster-ipam", "etcdEndpoints": cluster.endpoints, "nodeName": node.name, "etcdTimeout": TIMEOUT,
         "lockDir": LOCK_DIR, "ranges": [[{"subnet": "10.90.0.0/16"}]]}
    c.update(kw)
    return c


def net_conf(name: str, ipam: dict[str, Any], plugin: str = "cluster-ipam", **kw: Any) -> dict[str, Any]:
    if plugin == "cluster-ipam":  # run as an IPAM plugin is: the whole network config, settings in "ipam"
        return {"cniVersion": "1.1.0", "name": name, "ipam": ipam, **kw}
    return {"cniVersion": "1.1.0", "name": name, "type": plugin, "ipam": ipam, **kw}


def run(bin_dir: str, node: EtcdNode, plugin: str, command: str, conf: dict[str, Any], cid: str,
        pod: Namespace | None = None, args: str = "") -> tuple[int, dict[str, Any]]:
    """Run our ``plugin`` executable inside ``node``'s namespace; (exit status, decoded stdout)."""
    netns: Namespace | str | None = pod
    if pod is None and command in ("ADD", "CHECK"):
        netns = "/var/run/netns/none"  # IPAM alone never enters it
    return plugin_util.answer(plugin_util.run(plugin, command, conf, via="exec", host=node.ns, cni_path=bin_dir,
                                              container_id=cid, netns=netns, args=args))


def ok(res: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    assert res[0] == 0, res[1]
    return res[1]


def store(cluster: EtcdCluster, network: str, node: str = "node1") -> ClusterStore:
    return ClusterStore(cluster.client(timeout=10), network, node)


def cli(cluster: EtcdCluster, conf_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``pycni ARGV`` as an operator runs it, from the underlay namespace (it reaches every member)."""
    assert cluster.underlay is not None
    return cluster.underlay.run([sys.executable, "-m", "pycni", *argv, "--conf-dir", str(conf_dir)], check=False)


def write_conflist(conf_dir: Path, conf: dict[str, Any]) -> None:
    conf_dir.mkdir(exist_ok=True)
    plugin = {k: v for k, v in conf.items() if k not in ("cniVersion", "name")}
    plugin.setdefault("type", "macvlan")
    (conf_dir / f"{conf['name']}.conflist").write_text(json.dumps(
        {"cniVersion": conf["cniVersion"], "name": conf["name"], "plugins": [plugin]}))


def addresses(result: dict[str, Any]) -> list[str]:
    return [ip["address"].split("/")[0] for ip in result["ips"]]


def listed(cluster: EtcdCluster, conf_dir: Path, network: str) -> set[tuple[str, str, str]]:
    proc = cli(cluster, conf_dir, "ipam", "list", network, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return {(o["ip"], o["containerID"], o["node"]) for o in json.loads(proc.stdout)}


def assert_consistent(cluster: EtcdCluster, conf_dir: Path, network: str) -> None:
    proc = cli(cluster, conf_dir, "ipam", "check", network)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "" and f"network {network}: consistent (" in proc.stderr, proc.stderr


# ---- the whereabouts scenario: macvlan pods on three nodes, faults on the way ---------------------


def test_pods_on_three_nodes_through_member_failures(up: EtcdCluster, bin_dir: str, tmp_path: Path,
                                                     netns_factory: Callable[[], Namespace]) -> None:
    cluster = up
    network = "pods"
    conf_dir = tmp_path / "net.d"
    write_conflist(conf_dir, net_conf(network, ipam_conf(cluster, cluster.nodes[0]), "macvlan", master="ul0",
                                      mode="bridge"))
    pods = {(n, i): netns_factory() for n in range(3) for i in range(20)}

    def add(key: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, dict[str, Any]]]:
        node = cluster.nodes[key[0]]
        conf = net_conf(network, ipam_conf(cluster, node), "macvlan", master="ul0", mode="bridge")
        return key, run(bin_dir, node, "macvlan", "ADD", conf, f"pod-{key[0]}-{key[1]}", pods[key])

    with ThreadPoolExecutor(max_workers=60) as pool:  # 3 nodes x 20 ADDs at once
        results = {key: ok(res) for key, res in pool.map(add, list(pods))}
    ips = {key: addresses(r)[0] for key, r in results.items()}
    assert len(set(ips.values())) == 60, "duplicate addresses handed out"

    # pods on different nodes reach each other over the shared L2
    for src, dst in (((0, 0), (1, 0)), ((1, 5), (2, 7)), ((2, 19), (0, 19))):
        pods[src].run(["ping", "-c", "1", "-W", "3", ips[dst]])

    # one member down: ADDs go on (node1's own member is the one killed)
    cluster.kill(0)
    extra = netns_factory()
    conf0 = net_conf(network, ipam_conf(cluster, cluster.nodes[0]), "macvlan", master="ul0", mode="bridge")
    extra_ip = addresses(ok(run(bin_dir, cluster.nodes[0], "macvlan", "ADD", conf0, "pod-extra", extra)))[0]
    assert extra_ip not in ips.values()
    ok(run(bin_dir, cluster.nodes[0], "macvlan", "DEL", conf0, "pod-extra", extra))

    # every member down: code 11 within the bound, naming the endpoints; nothing left in the pod
    cluster.kill_all()
    lost = netns_factory()
    start = time.monotonic()
    code, out = run(bin_dir, cluster.nodes[1], "macvlan", "ADD", conf0, "pod-lost", lost)
    elapsed = time.monotonic() - start
    assert code != 0 and out["code"] == 11, out
    assert all(ep in out["msg"] for ep in cluster.endpoints), out
    assert elapsed < TIMEOUT + 15, f"ADD took {elapsed:.1f}s with etcd down"  # the bound, with a wide margin
    links = lost.run(["ip", "-o", "link", "show"]).stdout.splitlines()
    assert len(links) == 1 and ": lo:" in links[0], links
    status, out = run(bin_dir, cluster.nodes[1], "macvlan", "STATUS", conf0, "")  # the main plugin asks its IPAM
    assert status != 0 and out["code"] == 50 and cluster.endpoints[0] in out["msg"], out

    # members back: the allocations are exactly the pods, consistent
    cluster.restart_all()
    expected = {(ips[(n, i)], f"pod-{n}-{i}", f"node{n + 1}") for n, i in pods}
    assert listed(cluster, conf_dir, network) == expected
    assert_consistent(cluster, conf_dir, network)

    # DEL everything (in parallel again): nothing left
    def delete(key: tuple[int, int]) -> tuple[int, dict[str, Any]]:
        node = cluster.nodes[key[0]]
        conf = net_conf(network, ipam_conf(cluster, node), "macvlan", master="ul0", mode="bridge")
        return run(bin_dir, node, "macvlan", "DEL", conf, f"pod-{key[0]}-{key[1]}", pods[key])

    with ThreadPoolExecutor(max_workers=30) as pool:
        for res in pool.map(delete, list(pods)):
            ok(res)
    assert listed(cluster, conf_dir, network) == set()
    assert_consistent(cluster, conf_dir, network)


# ---- crashes, GC ----------------------------------------------------------------------------------


def test_kill9_during_add_then_del_or_gc_leaves_nothing(up: EtcdCluster, bin_dir: str, tmp_path: Path) -> None:
    cluster = up
    network = "crash"
    node = cluster.nodes[0]
    conf = net_conf(network, ipam_conf(cluster, node, ranges=[[{"subnet": "10.91.0.0/24"}],
                                                            [{"subnet": "fd91::/64"}]]))
    rng = random.Random(14)
    finished = 0
    for i in range(16):
        env = plugin_util.env("ADD", f"crash-{i}", "/var/run/netns/none", cni_path=bin_dir)
        proc = subprocess.Popen(["ip", "netns", "exec", node.ns.name, os.path.join(bin_dir, "cluster-ipam")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
        time.sleep(rng.uniform(0.02, 0.12))  # somewhere in start-up, the reads, the txn, or after
        proc.kill()
        proc.wait()
        finished += proc.returncode == 0
        if i % 2 == 0:  # the runtime's DEL after a failed ADD
            ok(run(bin_dir, node, "cluster-ipam", "DEL", conf, f"crash-{i}"))
    print(f"{finished} of 16 ADDs completed before SIGKILL")
    # the odd ones were forgotten by the runtime: GC with an empty valid list releases them
    ok(run(bin_dir, node, "cluster-ipam", "GC", dict(conf, **{"cni.dev/valid-attachments": []}), ""))
    s = store(cluster, network, node.name)
    assert s.handles() == []
    assert all(not b.allocations for b in s.blocks())
    assert s.inconsistencies() == []


def test_gc_releases_exactly_the_forgotten(up: EtcdCluster, bin_dir: str) -> None:
    cluster = up
    network = "gcnet"
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    c1 = net_conf(network, ipam_conf(cluster, n1, ranges=[[{"subnet": "10.92.0.0/24"}]]))
    c2 = net_conf(network, ipam_conf(cluster, n2, ranges=[[{"subnet": "10.92.0.0/24"}]]))
    held = {f"a{i}": addresses(ok(run(bin_dir, n1, "cluster-ipam", "ADD", c1, f"a{i}")))[0] for i in range(5)}
    other = {f"b{i}": addresses(ok(run(bin_dir, n2, "cluster-ipam", "ADD", c2, f"b{i}")))[0] for i in range(2)}
    valid = [{"containerID": "a0", "ifname": "eth0"}, {"containerID": "a3", "ifname": "eth0"}]
    # GC reaches cluster-ipam through the main plugin, as a runtime sends it
    main = net_conf(network, c1["ipam"], "macvlan", master="ul0", **{"cni.dev/valid-attachments": valid})
    ok(run(bin_dir, n1, "macvlan", "GC", main, ""))
    s = store(cluster, network)
    left = {(h["containerID"], h["ips"][0].split("/")[0]) for h in s.handles()}
    assert left == {("a0", held["a0"]), ("a3", held["a3"])} | set(other.items())  # node2's untouched
    # a bad list is refused before anything is released
    code, out = run(bin_dir, n1, "macvlan", "GC", dict(main, **{"cni.dev/valid-attachments": [{}]}), "")
    assert code != 0 and out["code"] == 7, out
    assert len(s.handles()) == 4


# ---- allocation rules -----------------------------------------------------------------------------


def test_dual_stack_repeat_check_requested_del(up: EtcdCluster, bin_dir: str) -> None:
    cluster = up
    network = "dual"
    node = cluster.nodes[2]
    conf = net_conf(network, ipam_conf(cluster, node, ranges=[[{"subnet": "10.93.0.0/24"}],
                                                            [{"subnet": "fd93::/64"}]],
                                       routes=[{"dst": "0.0.0.0/0"}]))
    r = ok(run(bin_dir, node, "cluster-ipam", "ADD", conf, "d1"))
    v4, v6 = r["ips"]
    assert v4["address"].endswith("/24") and v4["gateway"] == "10.93.0.1"
    assert v6["address"].startswith("fd93::") and v6["address"].endswith("/64")
    assert r["routes"] == [{"dst": "0.0.0.0/0"}]
    assert ok(run(bin_dir, node, "cluster-ipam", "ADD", conf, "d1"))["ips"] == r["ips"]  # same handle, same answer
    ok(run(bin_dir, node, "cluster-ipam", "CHECK", dict(conf, prevResult=r), "d1"))
    forged = dict(r, ips=[dict(v4, address="10.93.0.200/24")])
    code, out = run(bin_dir, node, "cluster-ipam", "CHECK", dict(conf, prevResult=forged), "d1")
    assert code != 0 and "10.93.0.200" in out["msg"]
    # requested addresses: CNI_ARGS IP= and args.cni.ips; taken ones are refused, nothing kept
    got = ok(run(bin_dir, node, "cluster-ipam", "ADD", conf, "d2", args="IP=10.93.0.77"))
    assert addresses(got)[0] == "10.93.0.77"
    # (and without a usable lockDir: the node lock is an optimisation, the transactions stay right)
    unlocked = dict(conf, ipam=dict(conf["ipam"], lockDir="/proc/no-such-dir"), args={"cni": {"ips": ["fd93::99"]}})
    got = ok(run(bin_dir, node, "cluster-ipam", "ADD", unlocked, "d3"))
    assert "fd93::99" in addresses(got)
    code, out = run(bin_dir, node, "cluster-ipam", "ADD", conf, "d4", args="IP=10.93.0.77")
    assert code != 0 and "10.93.0.77" in out["msg"] and "d2/eth0" in out["details"]
    s = store(cluster, network, node.name)
    assert s.handle("d4", "eth0") is None
    for cid in ("d1", "d2", "d3", "d4"):
        ok(run(bin_dir, node, "cluster-ipam", "DEL", conf, cid))
        ok(run(bin_dir, node, "cluster-ipam", "DEL", conf, cid))  # idempotent
    assert s.handles() == [] and all(not b.allocations for b in s.blocks()) and s.inconsistencies() == []


def test_exhaustion_borrows_unless_strict(up: EtcdCluster, bin_dir: str) -> None:
    cluster = up
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    rng = [[{"subnet": "10.94.0.0/28"}]]  # two /29 blocks: .0-.7 (.0 network, .1 gateway) and .8-.15 (.15 broadcast)

    def conf(node: EtcdNode, network: str, **kw: Any) -> dict[str, Any]:
        return net_conf(network, ipam_conf(cluster, node, ranges=rng, blockSize=29, **kw))

    for network, strict in (("borrow", False), ("strict", True)):
        first = addresses(ok(run(bin_dir, n2, "cluster-ipam", "ADD", conf(n2, network, strictAffinity=strict), "x")))
        assert first == ["10.94.0.2"]  # node2 claimed the first block
        mine = [addresses(ok(run(bin_dir, n1, "cluster-ipam", "ADD", conf(n1, network, strictAffinity=strict),
                                 f"y{i}")))[0] for i in range(7)]
        assert mine == [f"10.94.0.{i}" for i in range(8, 15)]  # node1 claimed the second and filled it
        code, out = run(bin_dir, n1, "cluster-ipam", "ADD", conf(n1, network, strictAffinity=strict), "z")
        s = store(cluster, network)
        if strict:
            assert code != 0 and "strictAffinity" in out["msg"], out
            assert s.handle("z", "eth0") is None
        else:
            assert code == 0, out
            assert addresses(out) == ["10.94.0.3"]  # borrowed from node2's block
            b = next(b for b in s.blocks() if b.cidr.network_address.packed[-1] == 0)
            assert b.node == "node2" and b.allocations[3] == "z/eth0"
            assert s.handle("z", "eth0")["node"] == "node1"  # type: ignore[index]
        assert s.inconsistencies() == []


def test_bad_config_is_code_7(up: EtcdCluster, bin_dir: str) -> None:
    node = up.nodes[0]
    base = ipam_conf(up, node)
    for bad, what in (({"etcdEndpoints": []}, "etcdEndpoints"), ({"etcdEndpoints": ["10.0.0.1:2379"]}, "http"),
                      ({"blockSize": 40, "blockSizeV6": 120}, ""), ({"blockSize": "26"}, "blockSize"),
                      ({"strictAffinity": "yes"}, "strictAffinity"), ({"ranges": []}, "ranges"),
                      ({"etcdTimeout": 0}, "etcdTimeout")):
        code, out = run(bin_dir, node, "cluster-ipam", "ADD", net_conf("badnet", dict(base, **bad)), "c")
        assert code != 0 and out["code"] == 7 and what in out["msg"] + out.get("details", ""), (bad, out)


def test_cli_release_and_check(up: EtcdCluster, bin_dir: str, tmp_path: Path) -> None:
    cluster = up
    network = "clinet"
    node = cluster.nodes[0]
    conf = net_conf(network, ipam_conf(cluster, node, ranges=[[{"subnet": "10.95.0.0/24"}]]))
    conf_dir = tmp_path / "net.d"
    write_conflist(conf_dir, conf)
    a = addresses(ok(run(bin_dir, node, "cluster-ipam", "ADD", conf, "r1")))[0]
    b = addresses(ok(run(bin_dir, node, "cluster-ipam", "ADD", conf, "r2")))[0]
    assert listed(cluster, conf_dir, network) == {(a, "r1", "node1"), (b, "r2", "node1")}
    proc = cli(cluster, conf_dir, "ipam", "release", network, "--ip", a)
    assert proc.returncode == 0 and "r1/eth0" in proc.stdout, proc.stderr
    assert listed(cluster, conf_dir, network) == {(b, "r2", "node1")}
    proc = cli(cluster, conf_dir, "ipam", "release", network, "--ip", a)
    assert proc.returncode == 1 and "not allocated" in proc.stderr
    assert_consistent(cluster, conf_dir, network)
    # a node gone for good: everything it held goes, its emptied blocks and affinities too
    n2 = cluster.nodes[1]
    conf2 = net_conf(network, ipam_conf(cluster, n2, ranges=[[{"subnet": "10.95.0.0/24"}]]))
    dead = {addresses(ok(run(bin_dir, n2, "cluster-ipam", "ADD", conf2, f"z{i}")))[0] for i in range(2)}
    assert {ip for ip, _c, node in listed(cluster, conf_dir, network) if node == "node2"} == dead
    proc = cli(cluster, conf_dir, "ipam", "release", network, "--node", "node2")
    assert proc.returncode == 0 and "2 attachment(s) and 1 block(s)" in proc.stdout, proc.stdout + proc.stderr
    assert listed(cluster, conf_dir, network) == {(b, "r2", "node1")}
    s = store(cluster, network)
    assert s.kv.get_prefix(f"/pycni/ipam/affinity/node2/{network}/")[0] == []
    assert_consistent(cluster, conf_dir, network)
    # an orphan (written behind the plugin's back) is reported, and the exit status says so
    blk = s.blocks()[0]
    blk.allocations[200] = "ghost/eth0"
    s.kv.put(s.block_key(blk.cidr), blk.to_json())
    proc = cli(cluster, conf_dir, "ipam", "check", network)
    assert proc.returncode == 3  # the answer is no (1 is an error)
    problems = [json.loads(line) for line in proc.stdout.splitlines()]
    assert problems == [{"problem": "orphan allocation", "ip": str(blk.ip(200)), "block": str(blk.cidr),
                         "handle": "ghost/eth0"}]


def test_tls_endpoints(bin_dir: str) -> None:
    """etcdCACert/etcdCert/etcdKey: https endpoints that require a client certificate."""
    with EtcdCluster(size=1, subnet="10.231.4.0/24", tls=True) as tls:
        node = tls.nodes[0]
        conf = net_conf("tlsnet", ipam_conf(tls, node, etcdCACert=tls.ca_cert, etcdCert=tls.client_cert,
                                            etcdKey=tls.client_key, ranges=[[{"subnet": "10.96.0.0/24"}]]))
        assert addresses(ok(run(bin_dir, node, "cluster-ipam", "ADD", conf, "t1"))) == ["10.96.0.2"]
        ok(run(bin_dir, node, "cluster-ipam", "DEL", conf, "t1"))
        # without the client certificate the member refuses the handshake: unavailable, code 11
        bare = net_conf("tlsnet", ipam_conf(tls, node, etcdCACert=tls.ca_cert, etcdTimeout=1,
                                            ranges=[[{"subnet": "10.96.0.0/24"}]]))
        code, out = run(bin_dir, node, "cluster-ipam", "ADD", bare, "t2")
        assert code != 0 and out["code"] == 11 and tls.endpoints[0] in out["msg"], out
        # a CA file that does not exist is a config error
        missing_ca = dict(conf, ipam=dict(conf["ipam"], etcdCACert="/nonexistent"))
        code, out = run(bin_dir, node, "cluster-ipam", "ADD", missing_ca, "t3")
        assert code != 0 and out["code"] == 7, out
        # ... that names the key and the path (it was "cannot set up the etcd client")
        for key in ("etcdCACert", "etcdCert", "etcdKey"):
            missing = dict(conf, ipam=dict(conf["ipam"], **{key: "/nonexistent/x.pem"}))
            code, out = run(bin_dir, node, "cluster-ipam", "ADD", missing, "t3")
            assert (code, out["code"], out["msg"]) == (1, 7, f"invalid ipam.{key}"), out
            assert out["details"] == "/nonexistent/x.pem: no such file", out


def test_through_the_daemon(up: EtcdCluster, tmp_path: Path, netns_factory: Callable[[], Namespace]) -> None:
    """The same plugins served by a pycni daemon (handlers in-process, in the caller's namespace)."""
    from plugin_util import daemon_in_thread

    cluster = up
    shims = tmp_path / "bin"
    install(str(shims), daemon=True)
    sock = str(tmp_path / "d.sock")
    node = cluster.nodes[2]
    conf = net_conf("dmn", ipam_conf(cluster, node, ranges=[[{"subnet": "10.97.0.0/24"}]]), "macvlan",
                    master="ul0", mode="bridge")
    pod = netns_factory()
    with daemon_in_thread(sock):
        def call(command: str, cid: str) -> tuple[int, dict[str, Any]]:
            return plugin_util.answer(plugin_util.run("macvlan", command, conf, via="exec", host=node.ns,
                                                      netns=pod, cni_path=str(shims), container_id=cid,
                                                      PYCNI_SOCKET=sock))

        first = ok(call("ADD", "dm1"))
        assert addresses(first) == ["10.97.0.2"]
        ok(call("DEL", "dm1"))
        ok(call("DEL", "dm1"))
    s = store(cluster, "dmn", node.name)
    assert s.handles() == [] and all(not b.allocations for b in s.blocks())


def test_stale_or_garbage_hint_is_harmless(up: EtcdCluster, bin_dir: str) -> None:
    """The node-local hint of recent blocks is read with the handle, never trusted."""
    cluster = up
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    rng = [[{"subnet": "10.98.0.0/24"}]]
    c1 = net_conf("hint", ipam_conf(cluster, n1, ranges=rng, blockSize=28))
    c2 = net_conf("hint", ipam_conf(cluster, n2, ranges=rng, blockSize=28))
    assert addresses(ok(run(bin_dir, n1, "cluster-ipam", "ADD", c1, "h1"))) == ["10.98.0.2"]
    assert addresses(ok(run(bin_dir, n2, "cluster-ipam", "ADD", c2, "h2"))) == ["10.98.0.16"]
    hint = Path(LOCK_DIR) / "hint.node1.blocks"
    assert hint.read_text().split() == ["10.98.0.0/28"]
    hint.write_text("10.98.0.16/28\n")  # node2's block: not node1's to allocate in
    assert addresses(ok(run(bin_dir, n1, "cluster-ipam", "ADD", c1, "h3"))) == ["10.98.0.3"]
    hint.write_text("garbage\n")
    assert addresses(ok(run(bin_dir, n1, "cluster-ipam", "ADD", c1, "h4"))) == ["10.98.0.4"]
    hint.write_text("10.98.0.16/28\n")
    for cid in ("h1", "h3", "h4"):
        ok(run(bin_dir, n1, "cluster-ipam", "DEL", c1, cid))
    s = store(cluster, "hint")
    assert [h["containerID"] for h in s.handles()] == ["h2"] and s.inconsistencies() == []


def test_add_and_del_import_only_the_stdlib(up: EtcdCluster, bin_dir: str, tmp_path: Path) -> None:
    """A one-shot cluster-ipam ADD/DEL against the real cluster loads no netlink, subprocess, runtime,
    dataclasses, ssl (plain http endpoints), http.client, nor socket.py and the IDNA codec (the C
    socket module does), nor json and re (pycni.jsonlite does)."""
    from test_import_set import HEAVY, NO_JSON_NO_RE, _heavy, _modules

    empty = tmp_path / "empty.py"
    empty.write_text("pass\n")
    baseline = _modules(str(empty), {}, b"", tmp_path)
    node = up.nodes[0]
    conf = json.dumps(net_conf("imports", ipam_conf(up, node, ranges=[[{"subnet": "10.99.0.0/24"}]]))).encode()
    for command in ("ADD", "DEL"):
        env = plugin_util.env(command, "imp", "/var/run/netns/none", cni_path=bin_dir)
        mods = _modules(os.path.join(bin_dir, "cluster-ipam"), env, conf, tmp_path, node.ns)
        assert "pycni.cluster.etcd" in mods
        assert _heavy(mods - baseline, (*HEAVY, *NO_JSON_NO_RE, "ssl", "http", "email", "random", "socket",
                                        "selectors", "unicodedata", "encodings.idna")) == [], command


def test_no_quorum_is_code_11_and_del_leaves_nothing(up: EtcdCluster, bin_dir: str) -> None:
    """Two members of three down: the one left answers reads but cannot commit; code 11 within the bound.
    Whatever a write that lost its answer may still commit later, the runtime's DEL releases."""
    cluster = up
    node = cluster.nodes[2]
    conf = net_conf("quorum", ipam_conf(cluster, node, ranges=[[{"subnet": "10.89.0.0/24"}]]))
    cluster.kill(0)
    cluster.kill(1)
    try:
        start = time.monotonic()
        code, out = run(bin_dir, node, "cluster-ipam", "ADD", conf, "q1")
        elapsed = time.monotonic() - start
        assert code != 0 and out["code"] == 11, out
        assert elapsed < 2 * TIMEOUT + 15, f"ADD took {elapsed:.1f}s without quorum"
    finally:
        cluster.restart_all()
    ok(run(bin_dir, node, "cluster-ipam", "DEL", conf, "q1"))
    s = store(cluster, "quorum", node.name)
    assert s.handles() == [] and all(not b.allocations for b in s.blocks())


def test_node_remove_says_what_it_did(up: EtcdCluster, tmp_path: Path) -> None:
    """An unknown node is an error; a removed one may come back while its agent runs: it says so."""
    prefix = "/pycni-t-remove"
    flags = ["--etcd-endpoints", ",".join(up.endpoints), "--etcd-prefix", prefix]
    assert up.underlay is not None
    gone = up.underlay.run([sys.executable, "-m", "pycni", "node", "remove", "nosuchnode", *flags], check=False)
    assert gone.returncode == 1 and "node nosuchnode is not registered" in gone.stderr, gone
    with up.client() as etcd:
        etcd.put(f"{prefix}/nodes/n1", json.dumps({"name": "n1", "underlayIP": "192.0.2.1"}),
                 lease=etcd.lease_grant(30))
    done = up.underlay.run([sys.executable, "-m", "pycni", "node", "remove", "n1", *flags], check=False)
    assert done.returncode == 0 and "node n1: removed" in done.stdout and "registers the node again" in done.stdout
    with up.client() as etcd:
        assert etcd.get(f"{prefix}/nodes/n1") is None
