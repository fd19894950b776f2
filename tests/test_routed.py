"""routed: Calico's per-pod dataplane on one host — pods reach each other and the host over
host routes and proxy ARP, IPv4 and IPv6; CHECK; idempotent DEL; rollback of a failed ADD."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netns_util import Namespace
from plugin_util import err, ok, run

from pycni.plugins.main import routed


def conf(tmp_path: Path, *, v6: bool = False, **extra: Any) -> dict[str, Any]:
    ranges: list[list[dict[str, str]]] = [[{"subnet": "10.88.0.0/24"}]]
    if v6:
        ranges.append([{"subnet": "fd88::/64"}])
    c: dict[str, Any] = {"cniVersion": "1.1.0", "name": "rtnet", "type": "routed", "mtu": 1400,
                         "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"), "ranges": ranges}}
    c.update(extra)
    return c


def reservations(tmp_path: Path) -> list[str]:
    d = tmp_path / "ipam" / "rtnet"
    return [f.name for f in d.iterdir() if f.name[0].isdigit() or ":" in f.name] if d.exists() else []


def host_links(host: Namespace) -> list[str]:
    return [ln["ifname"] for ln in json.loads(host.run(["ip", "-j", "link"]).stdout)
            if ln["ifname"].startswith(routed.HOST_PREFIX)]


def addr_of(result: dict[str, Any], version: int) -> str:
    return next(i["address"].split("/")[0] for i in result["ips"] if (":" in i["address"]) == (version == 6))


def test_host_end_names_are_stable_short_and_distinct() -> None:
    a = routed.host_names("c" * 64, "eth0")
    assert a == routed.host_names("c" * 64, "eth0") and len(set(a)) == routed.NAME_TRIES
    assert all(len(n) <= 15 for n in a)
    assert a[0] != routed.host_names("c" * 64, "eth1")[0] != routed.host_names("d" * 64, "eth0")[0]


def test_pods_reach_each_other_and_the_host_v4_v6(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                  tmp_path: Path) -> None:
    host, p1, p2 = netns_factory(), netns_factory(), netns_factory()
    host.run(["ip", "addr", "add", "192.0.2.1/32", "dev", "lo"])  # a host address to reach
    host.run(["ip", "addr", "add", "2001:db8::1/128", "dev", "lo"])
    cfg = conf(tmp_path, v6=True)
    r1 = ok(run("routed", "ADD", cfg, host=host, netns=p1, cni_path=plugin_dir, container_id="pod1"))
    r2 = ok(run("routed", "ADD", cfg, host=host, netns=p2, cni_path=plugin_dir, container_id="pod2"))
    host_if, cont_if = r1["interfaces"]
    assert host_if == {"name": routed.host_names("pod1", "eth0")[0], "mac": routed.HOST_MAC}
    assert cont_if["sandbox"] == p1.path and cont_if["name"] == "eth0"
    a4, a6 = addr_of(r1, 4), addr_of(r1, 6)
    assert {i["address"] for i in r1["ips"]} == {f"{a4}/32", f"{a6}/128"}
    assert {"dst": "0.0.0.0/0", "gw": "169.254.1.1"} in r1["routes"]
    assert {"dst": "::/0", "gw": "fe80::ecee:eeff:feee:eeee"} in r1["routes"]

    # pod: /32 (/128) only, a link route to 169.254.1.1, defaults via the fixed next hops
    assert f"{a4}/32" in p1.run(["ip", "-4", "addr", "show", "eth0"]).stdout
    v4 = p1.run(["ip", "-4", "route"]).stdout
    assert "169.254.1.1 dev eth0 scope link" in v4 and "default via 169.254.1.1 dev eth0" in v4
    assert "default via fe80::ecee:eeff:feee:eeee dev eth0" in p1.run(["ip", "-6", "route"]).stdout
    assert json.loads(p1.run(["ip", "-j", "link", "show", "eth0"]).stdout)[0]["mtu"] == 1400
    # host end: fixed MAC, no global address, proxy ARP/NDP, a route per pod address
    h = host_if["name"]
    info = json.loads(host.run(["ip", "-j", "addr", "show", h]).stdout)[0]
    assert info["address"] == routed.HOST_MAC
    assert [a for a in info["addr_info"] if a.get("scope") != "link"] == []
    assert host.run(["cat", f"/proc/sys/net/ipv4/conf/{h}/proxy_arp"]).stdout.strip() == "1"
    assert host.run(["cat", f"/proc/sys/net/ipv6/conf/{h}/proxy_ndp"]).stdout.strip() == "1"
    assert host.run(["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "1"
    assert f"{a4} dev {h} scope link" in host.run(["ip", "-4", "route"]).stdout
    assert f"{a6} dev {h}" in host.run(["ip", "-6", "route"]).stdout

    b4, b6 = addr_of(r2, 4), addr_of(r2, 6)
    p1.run(["ping", "-c", "2", "-W", "2", b4])
    p2.run(["ping", "-c", "2", "-W", "2", a4])
    p1.run(["ping", "-c", "1", "-W", "2", "192.0.2.1"])
    host.run(["ping", "-c", "1", "-W", "2", a4])
    p1.run(["ping", "-6", "-c", "2", "-W", "2", b6])
    p2.run(["ping", "-6", "-c", "1", "-W", "2", "2001:db8::1"])

    ok(run("routed", "CHECK", dict(cfg, prevResult=r1), host=host, netns=p1, cni_path=plugin_dir, container_id="pod1"))
    host.run(["ip", "route", "del", f"{a4}/32"])
    e = err(run("routed", "CHECK", dict(cfg, prevResult=r1), host=host, netns=p1, cni_path=plugin_dir,
                container_id="pod1"))
    assert "host route" in e["msg"]
    p2.run(["ip", "route", "del", "default"])
    e = err(run("routed", "CHECK", dict(cfg, prevResult=r2), host=host, netns=p2, cni_path=plugin_dir,
                container_id="pod2"))
    assert "not found" in e["msg"]

    for cid, p in (("pod1", p1), ("pod2", p2)):
        ok(run("routed", "DEL", cfg, host=host, netns=p, cni_path=plugin_dir, container_id=cid))
        ok(run("routed", "DEL", cfg, host=host, netns=p, cni_path=plugin_dir, container_id=cid))
        assert p.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
    assert host_links(host) == [] and reservations(tmp_path) == []
    assert a4 not in host.run(["ip", "-4", "route"]).stdout


def test_del_with_netns_gone_and_stale_host_end(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                tmp_path: Path) -> None:
    host, p1 = netns_factory(), netns_factory()
    cfg = conf(tmp_path)
    ok(run("routed", "ADD", cfg, host=host, netns=p1, cni_path=plugin_dir, container_id="gone"))
    p1.delete()
    ok(run("routed", "DEL", cfg, host=host, netns=p1, cni_path=plugin_dir, container_id="gone"))
    ok(run("routed", "DEL", cfg, host=host, netns=p1, cni_path=plugin_dir, container_id="gone"))
    assert host_links(host) == [] and reservations(tmp_path) == []

    # A host end left by a crashed ADD of the same attachment is taken over; one owned by
    # another attachment (a hash collision) makes ADD use the next name.
    p2 = netns_factory()
    first, second = routed.host_names("again", "eth0")[:2]
    host.run(["ip", "link", "add", first, "type", "dummy"], check=False)
    if host.run(["ip", "link", "show", first], check=False).returncode != 0:
        host.run(["ip", "link", "add", first, "type", "veth", "peer", "name", "tmppeer0"])
    host.run(["ip", "link", "set", first, "alias", "pycni-routed:someone/eth0"])
    r = ok(run("routed", "ADD", cfg, host=host, netns=p2, cni_path=plugin_dir, container_id="again"))
    assert r["interfaces"][0]["name"] == second
    ok(run("routed", "DEL", cfg, host=host, netns=p2, cni_path=plugin_dir, container_id="again"))
    assert host.run(["ip", "link", "show", first], check=False).returncode == 0  # not ours: left alone
    assert host.run(["ip", "link", "show", second], check=False).returncode != 0


def test_failed_add_rolls_back(netns_factory: Callable[[], Namespace], plugin_dir: str, tmp_path: Path) -> None:
    host, p1 = netns_factory(), netns_factory()
    cfg = conf(tmp_path)
    assert err(run("routed", "ADD", {k: v for k, v in cfg.items() if k != "ipam"}, host=host, netns=p1,
                   cni_path=plugin_dir))["code"] == 7
    assert err(run("routed", "ADD", conf(tmp_path, mtu=20), host=host, netns=p1, cni_path=plugin_dir))["code"] == 7
    # the container interface name is taken: refused before IPAM runs
    p1.run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "x0"])
    e = err(run("routed", "ADD", cfg, host=host, netns=p1, cni_path=plugin_dir))
    assert "already exists" in e["msg"]
    p1.run(["ip", "link", "del", "eth0"])
    # an IPAM route the pod cannot take (it clashes with the next hop's own) fails the ADD
    # half-way, after the veth, the sysctls and the addresses: everything made is undone
    bad = conf(tmp_path)
    bad["ipam"]["routes"] = [{"dst": "169.254.1.1/32"}]
    e = err(run("routed", "ADD", bad, host=host, netns=p1, cni_path=plugin_dir, container_id="bad"))
    assert "169.254.1.1" in e["msg"]
    assert host_links(host) == [] and reservations(tmp_path) == []
    assert p1.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
    assert "10.88.0" not in host.run(["ip", "-4", "route"]).stdout


def test_gc_and_status_reach_ipam(netns_factory: Callable[[], Namespace], plugin_dir: str, tmp_path: Path) -> None:
    host, p1, p2 = netns_factory(), netns_factory(), netns_factory()
    cfg = conf(tmp_path)
    ok(run("routed", "ADD", cfg, host=host, netns=p1, cni_path=plugin_dir, container_id="keep"))
    ok(run("routed", "ADD", cfg, host=host, netns=p2, cni_path=plugin_dir, container_id="forget"))
    assert len(reservations(tmp_path)) == 2
    gc = dict(cfg, **{"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]})
    ok(run("routed", "GC", gc, host=host, cni_path=plugin_dir))
    assert len(reservations(tmp_path)) == 1
    ok(run("routed", "STATUS", cfg, host=host, cni_path=plugin_dir))
    ok(run("routed", "DEL", cfg, host=host, netns=p1, cni_path=plugin_dir, container_id="keep"))
    ok(run("routed", "DEL", cfg, host=host, netns=p2, cni_path=plugin_dir, container_id="forget"))


def test_through_the_daemon(netns_factory: Callable[[], Namespace], tmp_path: Path) -> None:
    """The executable forwarding to a pycni daemon: the handler runs in-process in the caller's
    namespace, with the same outcome (re-entrant: no module state, nothing read from os.environ)."""
    import plugin_util
    from plugin_util import daemon_in_thread

    from pycni.install_plugins import install

    host, p1, p2 = netns_factory(), netns_factory(), netns_factory()
    shims = tmp_path / "bin"
    install(str(shims), daemon=True)
    sock = str(tmp_path / "d.sock")
    cfg = conf(tmp_path, v6=True)
    with daemon_in_thread(sock):
        def run(command: str, pod: Namespace, cid: str) -> dict[str, Any]:
            return plugin_util.ok(plugin_util.run("routed", command, cfg, via="exec", host=host, cni_path=str(shims),
                                                  container_id=cid, netns=pod, PYCNI_SOCKET=sock))

        r1, r2 = run("ADD", p1, "dm1"), run("ADD", p2, "dm2")
        p1.run(["ping", "-c", "1", "-W", "2", addr_of(r2, 4)])
        p2.run(["ping", "-6", "-c", "1", "-W", "2", addr_of(r1, 6)])
        for cid, p in (("dm1", p1), ("dm2", p2)):
            run("DEL", p, cid)
            run("DEL", p, cid)
    assert host_links(host) == [] and reservations(tmp_path) == []
