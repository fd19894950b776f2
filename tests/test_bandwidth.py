"""bandwidth: config validation, and real shaping chained after a bridge in throwaway namespaces."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

import plugin_util
import pytest
from plugin_util import each_plugin_way, ok, run

from pycni.plugins.meta import bandwidth as bw
from pycni.skel import Outcome

# For tests that stop at the config: a CNI_NETNS that is not the test's own namespace (skel
# refuses that before any config check) and that no plugin could act in by mistake.
NO_NETNS = "/var/run/netns/pycni-test-no-such-netns"
NET = "bwnet"


# ---- helpers ---------------------------------------------------------------------------------
def bridge_conf(tmp: Any, subnet: str = "10.77.0.0/24") -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": NET, "type": "bridge", "bridge": "cni-bw0", "isGateway": True,
            "ipam": {"type": "host-local", "subnet": subnet, "dataDir": str(tmp / "ipam")}}


def bridge_add(host: Any, tmp: Any, cont: Any, cid: str) -> dict[str, Any]:
    return ok(run("bridge", "ADD", bridge_conf(tmp), via="exec", host=host, container_id=cid, netns=cont))


def bridge_del(host: Any, tmp: Any, cont: Any, cid: str) -> None:
    ok(run("bridge", "DEL", bridge_conf(tmp), via="exec", host=host, container_id=cid, netns=cont))


def bw_conf(prev: dict[str, Any] | None, **limits: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"cniVersion": "1.0.0", "name": NET, "type": "bandwidth", **limits}
    if prev is not None:
        c["prevResult"] = prev
    return c


def run_bw(host: Any, cmd: str, conf: dict[str, Any], cid: str, cont: Any) -> tuple[int, dict[str, Any]]:
    out = run("bandwidth", cmd, conf, host=host, container_id=cid, netns=cont)
    assert not out.stderr, out.stderr
    return out.exit_code, (json.loads(out.stdout) if out.stdout.strip() else {})


def host_veth(prev: dict[str, Any]) -> str:
    return [i["name"] for i in prev["interfaces"] if "sandbox" not in i and i["name"] != "cni-bw0"][0]


def container_ip(prev: dict[str, Any]) -> str:
    return prev["ips"][0]["address"].split("/")[0]


def in_ns(ns: Any, fn: Any) -> Any:
    with ns.enter():
        return fn()


def throughput(sender_ns: Any, receiver_ns: Any, dst_ip: str, seconds: float = 2.0) -> float:
    """Bytes/s a TCP stream achieves from sender_ns to dst_ip (a listener in receiver_ns)."""
    got = [0]
    ready = threading.Event()
    port = 5201

    def serve() -> None:
        with receiver_ns.enter():
            srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((dst_ip, port))
        srv.listen(1)
        srv.settimeout(10)
        ready.set()
        try:
            conn, _ = srv.accept()
            conn.settimeout(seconds + 5)
            start = None
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                if start is None:
                    start = time.monotonic()
                got[0] += len(data)
            conn.close()
        finally:
            srv.close()

    t = threading.Thread(target=serve)
    t.start()
    assert ready.wait(10)
    with sender_ns.enter():
        s = socket.create_connection((dst_ip, port), timeout=10)
    chunk = b"x" * 65536
    start = time.monotonic()
    s.settimeout(0.5)
    while time.monotonic() - start < seconds:
        try:
            s.send(chunk)
        except TimeoutError:
            continue
    elapsed = time.monotonic() - start
    s.close()
    t.join(15)
    return got[0] / elapsed


# ---- configuration (no namespaces needed) ----------------------------------------------------
def _err(conf: dict[str, Any], cmd: str = "ADD") -> dict[str, Any]:
    out = run("bandwidth", cmd, conf, container_id="c1", netns=NO_NETNS)
    assert out.exit_code == 1 and not out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("limits,code,text", [
    ({"ingressRate": 1000000, "ingressBurst": 0}, 7, "burst must also be set"),
    ({"egressRate": 0, "egressBurst": 1000}, 7, "rate must also be set"),
    ({"ingressRate": 1000000, "ingressBurst": 8 * 0xFFFFFFFF}, 7, "4GB"),

    ({"ingressRate": 4, "ingressBurst": 800}, 7, "too small"),
    ({"ingressRate": -5, "ingressBurst": 800}, 7, "'ingressRate' must be an integer from 0 to 18446744073709551615"),
    ({"ingressRate": "fast", "ingressBurst": 800}, 7, "'ingressRate' must be an integer"),
    ({"ingressRate": 8000, "ingressBurst": True}, 7, "'ingressBurst' must be an integer"),
    ({"runtimeConfig": {"bandwidth": {"egressRate": 1.5}}}, 7, "'runtimeConfig.bandwidth.egressRate' must be"),
    ({"runtimeConfig": {"bandwidth": []}}, 7, "'runtimeConfig.bandwidth' must be a JSON object"),
    ({"ingressRate": 8000, "ingressBurst": 800, "shapedSubnets": "10.0.0.0/8"}, 7, "'shapedSubnets' must be a list"),
    ({"ingressRate": 8000, "ingressBurst": 800, "shapedSubnets": [8]}, 7, "'shapedSubnets' must be a list of CIDR"),
    ({"ingressRate": 8000, "ingressBurst": 800, "shapedSubnets": ["10.0.0.0/8"],
      "unshapedSubnets": ["10.1.0.0/16"]}, 7, "cannot be both"),
    ({"ingressRate": 8000, "ingressBurst": 800, "shapedSubnets": ["10.0.0.300/8"]}, 7, "bad subnet"),
])
def test_bad_values_refused(limits: dict[str, Any], code: int, text: str) -> None:
    e = _err(bw_conf(None, **limits))
    assert e["code"] == code
    assert text in e["msg"] + e.get("details", "")


def test_runtime_config_and_precedence() -> None:
    rc = {"runtimeConfig": {"bandwidth": {"ingressRate": 8000, "ingressBurst": 80}}}
    args = bw.CmdArgs("DEL", stdin_data=json.dumps(bw_conf(None, **rc)).encode())  # ADD needs a prevResult
    c = bw.parse_conf(args)
    assert c.ingress == bw.Limits(1000, 10) and c.egress is None
    # Top-level keys win over the capability's values entirely, as in the reference.
    args = bw.CmdArgs("DEL", stdin_data=json.dumps(bw_conf(None, egressRate=16000, egressBurst=160, **rc)).encode())
    c = bw.parse_conf(args)
    assert c.ingress is None and c.egress == bw.Limits(2000, 20)


def test_zero_limits_pass_prev_result_through(container_ns: Any) -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}], "dns": {}}
    out = run("bandwidth", "ADD", bw_conf(prev), container_id="c1", netns=container_ns)
    assert out.exit_code == 0
    assert json.loads(out.stdout)["ips"] == [{"address": "10.1.2.3/24"}]


def test_missing_prev_result_with_limits() -> None:
    e = _err(bw_conf(None, ingressRate=8000, ingressBurst=800))
    assert e["code"] == 7 and "chained" in e["msg"]


def test_ifb_name_derivation() -> None:
    name = bw.ifb_name("mynet", "abc123")
    assert name.startswith("bwp") and len(name) == 15
    assert name == bw.ifb_name("mynet", "abc123") != bw.ifb_name("mynet", "abc124")


# ---- integration -----------------------------------------------------------------------------
RATE = 8_000_000  # 1 MB/s
BURST = 8 * 64 * 1024


def test_shaping_both_directions(host_ns: Any, netns_factory: Any, tmp_path: Any) -> None:
    from pycni.net import tc

    c1, c2 = netns_factory(), netns_factory()
    prev1 = bridge_add(host_ns, tmp_path, c1, "c1")
    prev2 = bridge_add(host_ns, tmp_path, c2, "c2")
    limits = {"ingressRate": RATE, "ingressBurst": BURST, "egressRate": RATE, "egressBurst": BURST}
    rc, res = run_bw(host_ns, "ADD", bw_conf(prev1, **limits), "c1", c1)
    assert rc == 0, res
    ifb = bw.ifb_name(NET, "c1")
    assert res["interfaces"][-1]["name"] == ifb and res["interfaces"][-1]["mac"]
    assert res["ips"] == prev1["ips"]
    veth = host_veth(prev1)

    def read() -> tuple[Any, Any, Any]:
        return tc.qdiscs(veth), tc.qdiscs(ifb), tc.filters(veth, "ffff:")

    qv, qi, fv = in_ns(host_ns, read)
    root = [q for q in qv if q.parent == 0xFFFFFFFF][0]
    assert root.kind == "tbf" and root.params["rate"] == RATE // 8
    assert root.params["limit"] == tc.tbf_limit(RATE // 8, BURST // 8)
    assert any(q.kind == "ingress" for q in qv)
    assert [q.kind for q in qi if q.parent == 0xFFFFFFFF] == ["tbf"]
    assert fv and fv[0]["options"]["actions"][0]["to_dev"] == ifb

    assert run_bw(host_ns, "CHECK", bw_conf(res, **limits), "c1", c1)[0] == 0
    # CHECK notices a different configuration.
    rc, e = run_bw(host_ns, "CHECK", bw_conf(res, **{**limits, "ingressRate": 2 * RATE}), "c1", c1)
    assert rc == 1 and "Rate" in e["msg"]

    # Real packets: c2 -> c1 crosses c1's host veth egress (ingress shaping), c1 -> c2 its ifb.
    ip1, ip2 = container_ip(prev1), container_ip(prev2)
    into = throughput(c2, c1, ip1)
    out_of = throughput(c1, c2, ip2)
    assert 0.4 * RATE / 8 < into < 1.6 * RATE / 8, into
    assert 0.4 * RATE / 8 < out_of < 1.6 * RATE / 8, out_of
    free = throughput(c2, host_ns, "10.77.0.1", seconds=1.0)  # c2 is not shaped
    assert free > 5 * RATE / 8, free

    assert run_bw(host_ns, "DEL", bw_conf(res, **limits), "c1", c1)[0] == 0
    qv, qi, fv = in_ns(host_ns, read)
    assert qi is None and not fv and not [q for q in qv if q.parent == 0xFFFFFFFF or q.kind == "ingress"]
    assert run_bw(host_ns, "DEL", bw_conf(res, **limits), "c1", c1)[0] == 0  # idempotent
    assert run_bw(host_ns, "DEL", bw_conf(None, **limits), "c1", c1)[0] == 0
    bridge_del(host_ns, tmp_path, c1, "c1")
    bridge_del(host_ns, tmp_path, c2, "c2")


def test_del_of_one_container_leaves_the_other(host_ns: Any, netns_factory: Any, tmp_path: Any) -> None:
    from pycni.net import tc

    c1, c2 = netns_factory(), netns_factory()
    limits = {"ingressRate": RATE, "ingressBurst": BURST, "egressRate": RATE, "egressBurst": BURST}
    res = {}
    for cid, c in (("c1", c1), ("c2", c2)):
        prev = bridge_add(host_ns, tmp_path, c, cid)
        rc, res[cid] = run_bw(host_ns, "ADD", bw_conf(prev, **limits), cid, c)
        assert rc == 0, res[cid]
    assert run_bw(host_ns, "DEL", bw_conf(res["c1"], **limits), "c1", c1)[0] == 0
    assert in_ns(host_ns, lambda: tc.qdiscs(bw.ifb_name(NET, "c1"))) is None
    assert run_bw(host_ns, "CHECK", bw_conf(res["c2"], **limits), "c2", c2)[0] == 0
    assert in_ns(host_ns, lambda: tc.qdiscs(bw.ifb_name(NET, "c2")))


def test_shaped_subnets_use_htb(host_ns: Any, netns_factory: Any, tmp_path: Any) -> None:
    from pycni.net import tc

    c1, c2 = netns_factory(), netns_factory()
    prev1 = bridge_add(host_ns, tmp_path, c1, "c1")
    prev2 = bridge_add(host_ns, tmp_path, c2, "c2")
    ip2 = container_ip(prev2)
    # Only traffic towards c2 is shaped; towards the gateway (host) it is not.
    limits = {"egressRate": RATE, "egressBurst": BURST, "ingressRate": RATE, "ingressBurst": BURST,
              "shapedSubnets": [f"{ip2}/32", "fd00::/64"]}
    rc, res = run_bw(host_ns, "ADD", bw_conf(prev1, **limits), "c1", c1)
    assert rc == 0, res
    ifb = bw.ifb_name(NET, "c1")
    classes = in_ns(host_ns, lambda: tc.htb_classes(ifb))
    assert sorted(c.handle & 0xFFFF for c in classes) == [tc.UNSHAPED_MINOR, tc.SHAPED_MINOR]
    assert len(in_ns(host_ns, lambda: tc.filters(ifb, "1:"))) == 2
    assert run_bw(host_ns, "CHECK", bw_conf(res, **limits), "c1", c1)[0] == 0
    shaped = throughput(c1, c2, ip2)
    assert 0.4 * RATE / 8 < shaped < 1.6 * RATE / 8, shaped
    free = throughput(c1, host_ns, "10.77.0.1", seconds=1.0)
    assert free > 5 * RATE / 8, free
    assert run_bw(host_ns, "DEL", bw_conf(res, **limits), "c1", c1)[0] == 0
    assert in_ns(host_ns, lambda: tc.qdiscs(ifb)) is None


def test_failed_add_rolls_back(host_ns: Any, container_ns: Any, tmp_path: Any) -> None:
    from pycni.net import tc

    prev = bridge_add(host_ns, tmp_path, container_ns, "c1")
    # Something already holds the ifb's name: ADD must fail and undo its ingress shaping.
    host_ns.run(["ip", "link", "add", bw.ifb_name(NET, "c1"), "type", "ifb"])
    limits = {"ingressRate": RATE, "ingressBurst": BURST, "egressRate": RATE, "egressBurst": BURST}
    rc, e = run_bw(host_ns, "ADD", bw_conf(prev, **limits), "c1", container_ns)
    assert rc == 1 and "ifb" in e["msg"]
    qv = in_ns(host_ns, lambda: tc.qdiscs(host_veth(prev)))
    assert not [q for q in qv if q.kind in ("tbf", "htb", "ingress")]


def test_same_qdiscs_as_go_reference(host_ns: Any, netns_factory: Any, tmp_path: Any) -> None:
    """Go bandwidth on one container, ours on another, same config: same kernel state; and our
    DEL cleans up the ifb the Go plugin made (same name derivation)."""
    from pycni.net import tc

    c1, c2 = netns_factory(), netns_factory()
    limits = {"ingressRate": 3_000_000, "ingressBurst": 200_000, "egressRate": 5_000_000, "egressBurst": 300_000}
    prev1 = bridge_add(host_ns, tmp_path, c1, "c1")
    prev2 = bridge_add(host_ns, tmp_path, c2, "c2")
    go_res = ok(run("bandwidth", "ADD", bw_conf(prev1, **limits), via="exec", host=host_ns, container_id="c1",
                    netns=c1))
    rc, ours = run_bw(host_ns, "ADD", bw_conf(prev2, **limits), "c2", c2)
    assert rc == 0
    assert go_res["interfaces"][-1]["name"] == bw.ifb_name(NET, "c1")

    def state(prev: dict[str, Any], cid: str) -> Any:
        return ([(q.kind, q.handle, q.params) for q in tc.qdiscs(host_veth(prev)) or []],
                [(q.kind, q.handle, q.params) for q in tc.qdiscs(bw.ifb_name(NET, cid)) or []])

    assert in_ns(host_ns, lambda: state(prev1, "c1")) == in_ns(host_ns, lambda: state(prev2, "c2"))
    # Each CHECKs the other's work.
    assert run_bw(host_ns, "CHECK", bw_conf(go_res, **limits), "c1", c1)[0] == 0
    ok(run("bandwidth", "CHECK", bw_conf(ours, **limits), via="exec", host=host_ns, container_id="c2", netns=c2))
    assert run_bw(host_ns, "DEL", bw_conf(go_res, **limits), "c1", c1)[0] == 0
    assert in_ns(host_ns, lambda: tc.qdiscs(bw.ifb_name(NET, "c1"))) is None
    ok(run("bandwidth", "DEL", bw_conf(ours, **limits), via="exec", host=host_ns, container_id="c2", netns=c2))
    assert in_ns(host_ns, lambda: tc.qdiscs(bw.ifb_name(NET, "c2"))) is None


def test_chain_of_our_plugins_via_shims(host_ns: Any, container_ns: Any, tmp_path: Any, plugin_dir: str) -> None:
    """bridge (ours, if written) -> bandwidth -> firewall as executables; CHECK the chain; DEL in reverse."""
    from pycni.net import tc

    ours = f"{plugin_dir}:/usr/lib/cni"
    # the executable run is the first on its CNI_PATH: Go's bridge until ours is written
    bridge_path = ours if os.path.exists(os.path.join(plugin_dir, "bridge")) else f"/usr/lib/cni:{plugin_dir}"
    bconf = bridge_conf(tmp_path)
    limits = {"ingressRate": RATE, "ingressBurst": BURST, "egressRate": RATE, "egressBurst": BURST}
    confs = [(("bridge", bridge_path), bconf),
             (("bandwidth", ours), {**bw_conf(None), "runtimeConfig": {"bandwidth": limits}}),
             (("firewall", ours), {"cniVersion": "1.0.0", "name": NET, "type": "firewall"})]

    def call(cmd: str, path: tuple[str, str], conf: dict[str, Any], prev: dict[str, Any] | None) -> Outcome:
        c = dict(conf, prevResult=prev) if prev is not None else conf
        return run(path[0], cmd, c, via="exec", host=host_ns, cni_path=path[1], container_id="c1",
                   netns=container_ns)

    prev: dict[str, Any] | None = None
    for path, conf in confs:
        p = call("ADD", path, conf, prev)
        assert p.exit_code == 0, p.stdout + p.stderr
        prev = json.loads(p.stdout)
    assert prev is not None and prev["interfaces"][-1]["name"] == bw.ifb_name(NET, "c1")
    for path, conf in confs:
        p = call("CHECK", path, conf, prev)
        assert p.exit_code == 0, f"{path} CHECK: {p.stdout!r}{p.stderr!r}"
    rules = host_ns.run(["iptables", "-S", "CNI-FORWARD"]).stdout
    assert f"-s {container_ip(prev)}/32 -j ACCEPT" in rules
    for path, conf in reversed(confs):
        for _ in range(2):  # DEL twice: idempotent
            p = call("DEL", path, conf, prev)
            assert p.exit_code == 0, f"{path} DEL: {p.stdout!r}{p.stderr!r}"
    assert in_ns(host_ns, lambda: tc.qdiscs(bw.ifb_name(NET, "c1"))) is None
    assert f"-s {container_ip(prev)}/32" not in host_ns.run(["iptables", "-S", "CNI-FORWARD"]).stdout


def test_rates_beyond_32_bits(host_ns: Any, container_ns: Any, tmp_path: Any) -> None:
    """40 Gbit/s needs the kernel's 64-bit rate attribute; ADD and CHECK must still agree."""
    from pycni.net import tc

    prev = bridge_add(host_ns, tmp_path, container_ns, "c1")
    limits = {"ingressRate": 40_000_000_000, "ingressBurst": 80_000_000,
              "egressRate": 40_000_000_000, "egressBurst": 80_000_000}
    rc, res = run_bw(host_ns, "ADD", bw_conf(prev, **limits), "c1", container_ns)
    assert rc == 0, res
    root = [q for q in in_ns(host_ns, lambda: tc.qdiscs(host_veth(prev))) if q.parent == 0xFFFFFFFF][0]
    assert root.params["rate"] == 5_000_000_000
    assert run_bw(host_ns, "CHECK", bw_conf(res, **limits), "c1", container_ns)[0] == 0
    assert run_bw(host_ns, "DEL", bw_conf(res, **limits), "c1", container_ns)[0] == 0


@pytest.mark.parametrize("attachments,code", [("absent", 7), (None, 7), ([{}], 7), ([{"containerID": 1}], 7),
                                              ([], 0), ([{"containerID": "c1", "ifname": "eth0"}], 0)])
@each_plugin_way
def test_gc_checks_the_valid_list_and_status_is_ready(attachments: Any, code: int, via: str, plugin_dir: str) -> None:
    """Nothing to collect, but GC refuses a missing or malformed list as every plugin does; STATUS answers."""
    conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": "gcnet", "type": "bandwidth", "ingressRate": 8000,
                            "ingressBurst": 800}
    if attachments != "absent":
        conf["cni.dev/valid-attachments"] = attachments
    out = plugin_util.run("bandwidth", "GC", conf, via=via, cni_path=plugin_dir)
    assert out.exit_code == (1 if code else 0), out.stdout
    if code:
        assert json.loads(out.stdout)["code"] == code
    out = plugin_util.run("bandwidth", "STATUS", conf, via=via, cni_path=plugin_dir)
    assert out.exit_code == 0, out.stdout


# ---- bursts a runtime sends, and the smallest rates ------------------------------------------
MAX_U32_BITS = 0xFFFFFFFF  # containerd's burst when the pod asked for none: "no particular burst"


@pytest.mark.parametrize("rate_bits", [8, 1000, 10_000_000, 15_000_000, 1_000_000_000, 40_000_000_000])
def test_max_uint32_burst_takes_the_largest_bucket(rate_bits: int) -> None:
    """Never refused: the burst becomes the largest bucket the kernel's 32-bit fields hold."""
    from pycni.net import tc

    rc = {"runtimeConfig": {"bandwidth": {"IngressRate": rate_bits, "IngressBurst": MAX_U32_BITS,
                                          "EgressRate": rate_bits, "EgressBurst": MAX_U32_BITS}}}
    c = bw.parse_conf(bw.CmdArgs("DEL", stdin_data=json.dumps(bw_conf(None, **rc)).encode()))
    assert c.ingress == c.egress and c.ingress is not None
    rate, burst = c.ingress.rate, c.ingress.burst
    assert rate == rate_bits // 8 and 0 < burst <= MAX_U32_BITS // 8
    for ticks in (tc.xmittime(rate, burst), tc.tc_xmittime(rate, burst)):
        assert ticks <= tc.MAX_U32
    assert tc.tbf_limit(rate, burst) <= tc.MAX_U32
    if burst < MAX_U32_BITS // 8:  # clamped: one byte more would not fit
        assert max(tc.xmittime(rate, burst + 1), tc.tc_xmittime(rate, burst + 1)) > tc.MAX_U32 \
            or tc.tbf_limit(rate, burst + 1) > tc.MAX_U32
    assert all(0 <= v <= tc.MAX_U32 for v in tc.rate_table(rate))


def test_max_uint32_burst_at_10mbit_gives_a_working_tbf(host_ns: Any, netns_factory: Any, tmp_path: Any) -> None:
    """What containerd sends for a pod annotated kubernetes.io/ingress-bandwidth: 10M: ADD shapes
    both directions with the largest bucket, CHECK agrees, packets pass, DEL clears."""
    from pycni.net import tc

    c1, c2 = netns_factory(), netns_factory()
    prev1 = bridge_add(host_ns, tmp_path, c1, "c1")
    prev2 = bridge_add(host_ns, tmp_path, c2, "c2")
    rc = {"runtimeConfig": {"bandwidth": {"IngressRate": 10_000_000, "IngressBurst": MAX_U32_BITS,
                                          "EgressRate": 10_000_000, "EgressBurst": MAX_U32_BITS}}}
    code, res = run_bw(host_ns, "ADD", bw_conf(prev1, **rc), "c1", c1)
    assert code == 0, res
    rate = 1_250_000
    burst = tc.largest_burst(rate, MAX_U32_BITS // 8)
    want = {"rate": rate, "limit": tc.tbf_limit(rate, burst), "buffer": tc.xmittime(rate, burst)}
    for dev in (host_veth(prev1), bw.ifb_name(NET, "c1")):
        roots = [q for q in in_ns(host_ns, lambda d=dev: tc.qdiscs(d)) if q.parent == 0xFFFFFFFF]
        assert [(q.kind, q.params) for q in roots] == [("tbf", want)]
    assert want["buffer"] > 0.9999 * tc.MAX_U32  # the whole 32-bit bucket: ~275 s of traffic

    assert run_bw(host_ns, "CHECK", bw_conf(res, **rc), "c1", c1)[0] == 0
    assert throughput(c2, c1, container_ip(prev1), seconds=0.5) > 0
    assert throughput(c1, c2, container_ip(prev2), seconds=0.5) > 0
    assert run_bw(host_ns, "DEL", bw_conf(res, **rc), "c1", c1)[0] == 0
    assert in_ns(host_ns, lambda: tc.qdiscs(bw.ifb_name(NET, "c1"))) is None
    bridge_del(host_ns, tmp_path, c1, "c1")
    bridge_del(host_ns, tmp_path, c2, "c2")


def test_smallest_rates_as_go_reference(host_ns: Any, netns_factory: Any, tmp_path: Any) -> None:
    """The reference's tests use ingressRate 8, ingressBurst 8, egressRate 16, egressBurst 8 (1 and
    2 bytes/s): Go accepts them; so do we, with the same qdiscs, and each CHECKs the other's."""
    from pycni.net import tc

    c1, c2 = netns_factory(), netns_factory()
    limits = {"ingressRate": 8, "ingressBurst": 8, "egressRate": 16, "egressBurst": 8}
    prev1 = bridge_add(host_ns, tmp_path, c1, "c1")
    prev2 = bridge_add(host_ns, tmp_path, c2, "c2")
    go_res = ok(run("bandwidth", "ADD", bw_conf(prev1, **limits), via="exec", host=host_ns, container_id="c1",
                    netns=c1))
    code, ours = run_bw(host_ns, "ADD", bw_conf(prev2, **limits), "c2", c2)
    assert code == 0, ours

    def state(prev: dict[str, Any], cid: str) -> Any:
        return ([(q.kind, q.params) for q in tc.qdiscs(host_veth(prev)) or []],
                [(q.kind, q.params) for q in tc.qdiscs(bw.ifb_name(NET, cid)) or []])

    go_state, our_state = in_ns(host_ns, lambda: state(prev1, "c1")), in_ns(host_ns, lambda: state(prev2, "c2"))
    assert go_state == our_state
    assert our_state[0][0] == ("tbf", {"rate": 1, "limit": 1, "buffer": tc.xmittime(1, 1)})
    assert our_state[1][0] == ("tbf", {"rate": 2, "limit": 1, "buffer": tc.xmittime(2, 1)})
    assert run_bw(host_ns, "CHECK", bw_conf(go_res, **limits), "c1", c1)[0] == 0
    ok(run("bandwidth", "CHECK", bw_conf(ours, **limits), via="exec", host=host_ns, container_id="c2", netns=c2))
    assert run_bw(host_ns, "DEL", bw_conf(go_res, **limits), "c1", c1)[0] == 0
    assert run_bw(host_ns, "DEL", bw_conf(ours, **limits), "c2", c2)[0] == 0
    ifbs = in_ns(host_ns, lambda: (tc.qdiscs(bw.ifb_name(NET, "c1")), tc.qdiscs(bw.ifb_name(NET, "c2"))))
    assert ifbs == (None, None)



def test_max_uint32_burst_with_shaped_subnets(host_ns: Any, container_ns: Any, tmp_path: Any) -> None:
    """The clamp holds for htb classes too (tc computes their buckets): ADD and CHECK agree."""
    from pycni.net import tc

    prev = bridge_add(host_ns, tmp_path, container_ns, "c1")
    limits = {"IngressRate": 10_000_000, "IngressBurst": MAX_U32_BITS, "EgressRate": 10_000_000,
              "EgressBurst": MAX_U32_BITS, "ShapedSubnets": ["10.0.0.0/8"]}
    code, res = run_bw(host_ns, "ADD", bw_conf(prev, runtimeConfig={"bandwidth": limits}), "c1", container_ns)
    assert code == 0, res
    shaped = [c for c in in_ns(host_ns, lambda: tc.htb_classes(host_veth(prev))) if c.handle & 0xFFFF == 0x30]
    assert shaped and shaped[0].rate == 1_250_000 and 0.999 * tc.MAX_U32 < shaped[0].buffer <= tc.MAX_U32
    code, e = run_bw(host_ns, "CHECK", bw_conf(res, runtimeConfig={"bandwidth": limits}), "c1", container_ns)
    assert code == 0, e

    assert run_bw(host_ns, "DEL", bw_conf(res, runtimeConfig={"bandwidth": limits}), "c1", container_ns)[0] == 0
