"""ptp: routed veth pairs — traffic through the host, masquerade, dual stack, CHECK, idempotent DEL."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import err, ok, run


def conf(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"cniVersion": "1.0.0", "name": "ptpnet", "type": "ptp", "mtu": 1400,
                         "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                                  "ranges": [[{"subnet": "10.77.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}
    c.update(extra)
    return c


def reservations(tmp_path: Path) -> list[str]:
    d = tmp_path / "ipam" / "ptpnet"
    return [f.name for f in d.iterdir() if f.name[0].isdigit() or ":" in f.name] if d.exists() else []


def test_two_containers_route_through_host(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                           tmp_path: Path) -> None:
    host, c1, c2 = netns_factory(), netns_factory(), netns_factory()
    cfg = conf(tmp_path)
    r1 = ok(run("ptp", "ADD", cfg, host=host, netns=c1, cni_path=plugin_dir, container_id="c1"))
    r2 = ok(run("ptp", "ADD", cfg, host=host, netns=c2, cni_path=plugin_dir, container_id="c2"))
    host_if, cont_if = r1["interfaces"]
    assert host_if["name"].startswith("veth") and "sandbox" not in host_if
    assert cont_if == {"name": "eth0", "mac": cont_if["mac"], "sandbox": c1.path}
    assert r1["ips"] == [{"interface": 1, "address": r1["ips"][0]["address"], "gateway": "10.77.0.1"}]
    # container routing: gateway /32 on link, subnet via the gateway, no plain subnet route
    routes = c1.run(["ip", "-4", "route"]).stdout
    assert "10.77.0.1 dev eth0 scope link" in routes and "10.77.0.0/24 via 10.77.0.1 dev eth0" in routes
    assert "default via 10.77.0.1" in routes
    # host end: gateway /32 and a host route to the container
    assert "10.77.0.1/32" in host.run(["ip", "-4", "addr", "show", host_if["name"]]).stdout
    ip1 = r1["ips"][0]["address"].split("/")[0]
    assert f"{ip1} dev {host_if['name']}" in host.run(["ip", "-4", "route"]).stdout
    assert json.loads(c1.run(["ip", "-j", "link", "show", "eth0"]).stdout)[0]["mtu"] == 1400
    c2.run(["ping", "-c", "2", "-W", "2", ip1])

    ok(run("ptp", "CHECK", dict(cfg, prevResult=r1), host=host, netns=c1, cni_path=plugin_dir, container_id="c1"))
    c1.run(["ip", "route", "del", "default"])
    e = err(run("ptp", "CHECK", dict(cfg, prevResult=r1), host=host, netns=c1, cni_path=plugin_dir, container_id="c1"))
    assert "not found" in e["msg"]

    for cid, c, r in (("c1", c1, r1), ("c2", c2, r2)):
        ok(run("ptp", "DEL", cfg, host=host, netns=c, cni_path=plugin_dir, container_id=cid))
        ok(run("ptp", "DEL", cfg, host=host, netns=c, cni_path=plugin_dir, container_id=cid))
        assert host.run(["ip", "link", "show", r["interfaces"][0]["name"]], check=False).returncode != 0
    assert reservations(tmp_path) == []


def test_ipmasq_hides_container_address(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                        tmp_path: Path) -> None:
    host, ctr, world = netns_factory(), netns_factory(), netns_factory()
    subprocess.run(["ip", "link", "add", "up0", "netns", host.name, "type", "veth", "peer", "name", "eth0",
                    "netns", world.name], check=True)
    host.run(["ip", "addr", "add", "198.18.5.1/24", "dev", "up0"])
    host.run(["ip", "link", "set", "up0", "up"])
    world.run(["ip", "addr", "add", "198.18.5.2/24", "dev", "eth0"])
    world.run(["ip", "link", "set", "eth0", "up"])
    cfg = conf(tmp_path, ipMasq=True)
    ok(run("ptp", "ADD", cfg, host=host, netns=ctr, cni_path=plugin_dir, container_id="masq1"))
    assert "CNI-" in host.run(["iptables-save", "-t", "nat"]).stdout
    # the world has no route back to 10.77.0.0/24: the ping only works when masqueraded
    ctr.run(["ping", "-c", "2", "-W", "2", "198.18.5.2"])
    ok(run("ptp", "DEL", cfg, host=host, netns=ctr, cni_path=plugin_dir, container_id="masq1"))
    assert "masq1" not in host.run(["iptables-save", "-t", "nat"]).stdout


def test_del_with_netns_gone_removes_masquerade(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                tmp_path: Path) -> None:
    host, ctr = netns_factory(), netns_factory()
    cfg = conf(tmp_path, ipMasq=True)
    r = ok(run("ptp", "ADD", cfg, host=host, netns=ctr, cni_path=plugin_dir, container_id="gone1"))
    ctr.delete()
    ok(run("ptp", "DEL", cfg, host=host, netns=ctr, cni_path=plugin_dir, container_id="gone1"))
    assert "gone1" not in host.run(["iptables-save", "-t", "nat"]).stdout  # the reference leaks this chain
    host.wait_link_gone(r["interfaces"][0]["name"])  # the kernel removes it with the namespace
    assert reservations(tmp_path) == []


def test_dual_stack(netns_factory: Callable[[], Namespace], plugin_dir: str, tmp_path: Path) -> None:
    host, c1, c2 = netns_factory(), netns_factory(), netns_factory()
    cfg = conf(tmp_path)
    cfg["ipam"]["ranges"].append([{"subnet": "fd77::/64"}])
    cfg["ipam"]["routes"].append({"dst": "::/0"})
    r1 = ok(run("ptp", "ADD", cfg, host=host, netns=c1, cni_path=plugin_dir, container_id="d1"))
    r2 = ok(run("ptp", "ADD", cfg, host=host, netns=c2, cni_path=plugin_dir, container_id="d2"))
    v6 = [i["address"].split("/")[0] for i in r2["ips"] if ":" in i["address"]]
    assert v6 and len(r1["ips"]) == 2
    # The host ends' gateway and link-local addresses are still in DAD right after ADD (as with the Go
    # plugin): until it ends the host cannot resolve the neighbour, so wait for it before pinging.
    host.wait_dad()
    c1.run(["ping", "-6", "-c", "2", "-W", "3", v6[0]])
    for cid, c in (("d1", c1), ("d2", c2)):
        ok(run("ptp", "DEL", cfg, host=host, netns=c, cni_path=plugin_dir, container_id=cid))
    assert reservations(tmp_path) == []


def test_missing_ipam_is_config_error_and_rollback_on_clash(netns_factory: Callable[[], Namespace],
                                                            plugin_dir: str, tmp_path: Path) -> None:
    host, ctr = netns_factory(), netns_factory()
    cfg = conf(tmp_path)
    no_ipam = {k: v for k, v in cfg.items() if k != "ipam"}
    assert err(run("ptp", "ADD", no_ipam, host=host, netns=ctr, cni_path=plugin_dir))["code"] == 7
    ctr.run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "x0"])
    e = err(run("ptp", "ADD", cfg, host=host, netns=ctr, cni_path=plugin_dir))
    assert "already exists" in e["msg"]
    assert reservations(tmp_path) == []
    assert [ln for ln in host.run(["ip", "-o", "link"]).stdout.splitlines() if "veth" in ln] == []


def test_unknown_masq_backend_refused_before_anything(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                     tmp_path: Path) -> None:
    host, ctr = netns_factory(), netns_factory()
    cfg = conf(tmp_path, ipMasq=True, ipMasqBackend="pf")
    e = err(run("ptp", "ADD", cfg, host=host, netns=ctr, cni_path=plugin_dir))
    assert e["code"] == 7 and "unknown ipMasq backend" in e["msg"]
    assert reservations(tmp_path) == [] and ctr.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
    ok(run("ptp", "DEL", cfg, host=host, netns=ctr, cni_path=plugin_dir))  # and DEL of such a config still succeeds


def test_gc_removes_masquerade_of_forgotten_attachments(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                        tmp_path: Path) -> None:
    """GC (through ptp, spec 1.1) releases the forgotten attachment's address and its masquerade rules,
    and keeps the listed one's."""
    host, c1, c2 = netns_factory(), netns_factory(), netns_factory()
    cfg = conf(tmp_path, ipMasq=True, cniVersion="1.1.0")
    ok(run("ptp", "ADD", cfg, host=host, netns=c1, cni_path=plugin_dir, container_id="keep1"))
    ok(run("ptp", "ADD", cfg, host=host, netns=c2, cni_path=plugin_dir, container_id="lost1"))
    gc = {**cfg, "cni.dev/valid-attachments": [{"containerID": "keep1", "ifname": "eth0"}]}
    ok(run("ptp", "GC", gc, host=host, cni_path=plugin_dir))
    nat = host.run(["iptables-save", "-t", "nat"]).stdout + host.run(["nft", "list", "ruleset"]).stdout
    assert "lost1" not in nat and "keep1" in nat
    assert len(reservations(tmp_path)) == 1
    assert err(run("ptp", "GC", cfg, host=host, cni_path=plugin_dir))["code"] == 7  # no list: nothing freed
    assert len(reservations(tmp_path)) == 1


GO_PTP = "/usr/lib/cni/ptp"
IPAM_DNS = {"nameservers": ["10.1.2.123"], "domain": "some.domain.test", "search": ["search.test"],
            "options": ["option1:foo"]}


@pytest.mark.parametrize("dns,want", [
    (None, IPAM_DNS),                                                    # IPAM's stays
    ({}, IPAM_DNS),                                                      # nothing set: IPAM's stays
    ({"nameservers": ["10.1.2.234"]}, {"nameservers": ["10.1.2.234"]}),  # any key set replaces all
    ({"domain": "someother.domain.test"}, {"domain": "someother.domain.test"}),
    ({"nameservers": [], "search": [], "options": []}, {}),             # empty lists clear IPAM's
    ({"options": []}, {}),
])
def test_dns_override_as_go(dns: dict[str, Any] | None, want: dict[str, Any],
                            netns_factory: Callable[[], Namespace], plugin_dir: str, tmp_path: Path) -> None:
    """The reference's rule (dnsConfSet): the plugin's `dns` replaces IPAM's as soon as any of its
    lists is given — even empty — or its domain; the reference's own test inputs, Go run alongside."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.1.2.123\ndomain some.domain.test\nsearch search.test\noptions option1:foo\n")
    results = {}
    for who in ("py", "go"):
        if who == "go" and not os.access(GO_PTP, os.X_OK):
            continue
        host, ctr = netns_factory(), netns_factory()
        cfg = conf(tmp_path / who)
        cfg["ipam"]["resolvConf"] = str(resolv)
        if dns is not None:
            cfg["dns"] = dns
        if who == "py":
            results[who] = ok(run("ptp", "ADD", cfg, host=host, netns=ctr, cni_path=plugin_dir)).get("dns", {})
            continue
        results[who] = ok(run("ptp", "ADD", cfg, via="exec", host=host, netns=ctr)).get("dns", {})
    assert results["py"] == want
    if "go" in results:
        assert results["go"] == want
