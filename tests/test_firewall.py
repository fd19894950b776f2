"""firewall: config errors, and real forwarding through iptables/nftables in throwaway namespaces."""

from __future__ import annotations

import json
import threading
from typing import Any

import plugin_util
import pytest
from plugin_util import each_plugin_way, ok

from pycni.plugins.meta import firewall as fw

NET = "fwnet"
OUTSIDE_IP = "10.99.0.2"
# For tests that stop at the config: a CNI_NETNS that is not the test's own namespace (skel
# refuses that before any config check) and that no plugin could act in by mistake.
NO_NETNS = "/var/run/netns/pycni-test-no-such-netns"


def fw_conf(prev: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"cniVersion": "1.0.0", "name": NET, "type": "firewall", **extra}
    if prev is not None:
        c["prevResult"] = prev
    return c


def run_fw(host: Any, cmd: str, conf: dict[str, Any], cid: str, netns: str) -> tuple[int, dict[str, Any]]:
    out = plugin_util.run("firewall", cmd, conf, host=host, container_id=cid, netns=netns)
    assert not out.stderr, out.stderr
    return out.exit_code, (json.loads(out.stdout) if out.stdout.strip() else {})


def synthetic_prev(*addrs: str) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "interfaces": [{"name": "cni0"}, {"name": "veth1"},
                                                  {"name": "eth0", "sandbox": "/x"}],
            "ips": [{"address": a, "interface": 2} for a in addrs], "dns": {}}


def ipt_state(ns: Any, v6: bool = False) -> str:
    return ns.run(["ip6tables" if v6 else "iptables", "-w", "-t", "filter", "-S"]).stdout


# ---- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize("extra,code,text", [
    ({"backend": "firewalld"}, 7, "firewalld"),
    ({"backend": "pf"}, 7, "unknown firewall backend"),
    ({"ingressPolicy": "closed"}, 7, "unknown ingress policy"),
    ({"iptablesAdminChainName": "bad chain"}, 7, "iptablesAdminChainName"),
    ({"backend": 3}, 7, "must be a string"),
    ({"firewalldZone": []}, 7, "'firewalldZone' must be a string"),
])
def test_bad_config_refused(extra: dict[str, Any], code: int, text: str) -> None:
    out = plugin_util.run("firewall", "ADD", fw_conf(synthetic_prev("10.1.0.2/24"), **extra), container_id="c1",
                          netns=NO_NETNS)
    e = json.loads(out.stdout)
    assert out.exit_code == 1 and e["code"] == code and text in e["msg"] + e.get("details", "")


def test_missing_prev_result() -> None:
    out = plugin_util.run("firewall", "ADD", fw_conf(None), container_id="c1", netns=NO_NETNS)
    assert json.loads(out.stdout)["code"] == 7
    assert plugin_util.run("firewall", "DEL", fw_conf(None), container_id="c1").exit_code == 0


def nft_state(ns: Any) -> str:
    return ns.run(["nft", "list", "ruleset"]).stdout


@pytest.mark.parametrize("backend,admin", [
    ("iptables", "INPUT"), ("iptables", "FORWARD"), ("iptables", "OUTPUT"), ("iptables", "CNI-FORWARD"),
    ("iptables", "ACCEPT"), ("iptables", "LOG"), ("iptables", "MASQUERADE"),
    ("nftables", "forward"), ("nftables", "1admin"), ("nftables", "drop"), ("nftables", "INPUT"),
])
def test_unusable_admin_chain_is_refused_and_changes_nothing(host_ns: Any, container_ns: Any, backend: str,
                                                              admin: str) -> None:
    """Built-in chains, verdicts, target names and our own chains: code 7, no chain or rule left."""
    before = (ipt_state(host_ns), ipt_state(host_ns, v6=True), nft_state(host_ns))
    conf = fw_conf(synthetic_prev("10.1.0.2/24", "fd00:1::2/64"), backend=backend, iptablesAdminChainName=admin)
    rc, e = run_fw(host_ns, "ADD", conf, "c1", container_ns.path)
    if backend == "nftables" and admin == "INPUT":  # a plain name there: nothing to refuse
        assert rc == 0, e
        return
    assert rc == 1 and e["code"] == 7 and f"invalid iptablesAdminChainName '{admin}'" in e["msg"], e
    assert (ipt_state(host_ns), ipt_state(host_ns, v6=True), nft_state(host_ns)) == before


def test_failed_iptables_step_takes_back_what_add_made(netns_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the n-th iptables change fails (for every n); the tables end as they began."""
    from pycni.net import iptables as ipt

    scratch, host, cont = netns_factory(), netns_factory(), netns_factory()
    conf = fw_conf(synthetic_prev("10.1.0.2/24", "fd00:1::2/64"), ingressPolicy="same-bridge")
    real_run = ipt.run
    changes: list[list[str]] = []
    fail_at = 0

    def counting_run(args: list[str], ipv6: bool = False, **kw: Any) -> str:
        if any(op in args for op in ("-N", "-I", "-A")):
            changes.append(list(args))
            if len(changes) == fail_at:
                raise ipt.IptablesError(5, "injected failure", "", 1)
        return real_run(args, ipv6, **kw)

    monkeypatch.setattr(ipt, "run", counting_run)
    assert run_fw(scratch, "ADD", conf, "c1", cont.path)[0] == 0  # how many changes a whole ADD makes
    total = len(changes)
    assert total > 10
    before = (ipt_state(host), ipt_state(host, v6=True))
    for fail_at in range(1, total + 1):
        changes.clear()
        rc, e = run_fw(host, "ADD", conf, "c1", cont.path)
        assert rc == 1 and e["msg"] == "injected failure", (fail_at, e)
        assert (ipt_state(host), ipt_state(host, v6=True)) == before, f"left state after failing step {fail_at}"


# ---- integration: real forwarding ------------------------------------------------------------
@pytest.fixture
def lab(host_ns: Any, netns_factory: Any, tmp_path: Any) -> dict[str, Any]:
    """A host with a bridge network (Go bridge + host-local) and a routed 'outside' namespace."""
    outside = netns_factory()
    host_ns.run(["ip", "link", "add", "up0", "type", "veth", "peer", "name", "out0"])
    host_ns.run(["ip", "link", "set", "out0", "netns", outside.name])
    host_ns.run(["ip", "addr", "add", "10.99.0.1/24", "dev", "up0"])
    host_ns.run(["ip", "link", "set", "up0", "up"])
    outside.run(["ip", "addr", "add", f"{OUTSIDE_IP}/24", "dev", "out0"])
    outside.run(["ip", "link", "set", "out0", "up"])
    outside.run(["ip", "route", "add", "10.78.0.0/24", "via", "10.99.0.1"])
    host_ns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    bconf = {"cniVersion": "1.0.0", "name": NET, "type": "bridge", "bridge": "cni-fw0", "isGateway": True,
             "ipam": {"type": "host-local", "subnet": "10.78.0.0/24", "dataDir": str(tmp_path / "ipam"),
                      "routes": [{"dst": "0.0.0.0/0"}]}}
    conts: dict[str, Any] = {}
    for cid in ("c1", "c2"):
        ns = netns_factory()
        conts[cid] = (ns, ok(plugin_util.run("bridge", "ADD", bconf, via="exec", host=host_ns, container_id=cid,
                                             netns=ns)))
    return {"host": host_ns, "outside": outside, "conts": conts}


def reaches_outside(ns: Any) -> bool:
    return ns.run(["ping", "-c2", "-i0.3", "-W2", OUTSIDE_IP], check=False).returncode == 0  # any reply


def test_iptables_backend_forwarding(lab: dict[str, Any]) -> None:
    host = lab["host"]
    (n1, p1), (n2, p2) = lab["conts"]["c1"], lab["conts"]["c2"]
    host.run(["iptables", "-w", "-P", "FORWARD", "DROP"])
    assert not reaches_outside(n1)
    for cid, prev, ns in (("c1", p1, n1), ("c2", p2, n2)):
        rc, res = run_fw(host, "ADD", fw_conf(prev), cid, ns.path)
        assert rc == 0 and res["ips"] == prev["ips"], res
    assert reaches_outside(n1) and reaches_outside(n2)
    rules = ipt_state(host)
    ip1 = p1["ips"][0]["address"].split("/")[0]
    assert f"-A CNI-FORWARD -s {ip1}/32 -j ACCEPT" in rules
    fwd = [line for line in rules.splitlines() if line.startswith("-A FORWARD")]
    assert "-j CNI-FORWARD" in fwd[0]
    assert run_fw(host, "CHECK", fw_conf(p1), "c1", n1.path)[0] == 0

    assert run_fw(host, "DEL", fw_conf(p1), "c1", n1.path)[0] == 0
    assert not reaches_outside(n1)
    assert reaches_outside(n2)
    assert run_fw(host, "CHECK", fw_conf(p2), "c2", n2.path)[0] == 0
    rc, e = run_fw(host, "CHECK", fw_conf(p1), "c1", n1.path)
    assert rc == 1 and "not found" in e["msg"]
    assert run_fw(host, "DEL", fw_conf(p1), "c1", n1.path)[0] == 0  # idempotent
    assert run_fw(host, "DEL", fw_conf(p2), "c2", n2.path)[0] == 0
    assert not reaches_outside(n2)


def test_nftables_backend_forwarding(lab: dict[str, Any]) -> None:
    from pycni.net import nft

    host = lab["host"]
    (n1, p1), (n2, p2) = lab["conts"]["c1"], lab["conts"]["c2"]
    conf = {"backend": "nftables", "iptablesAdminChainName": "MY-ADMIN"}
    for cid, prev, ns in (("c1", p1, n1), ("c2", p2, n2)):
        assert run_fw(host, "ADD", fw_conf(prev, **conf), cid, ns.path)[0] == 0
    assert run_fw(host, "ADD", fw_conf(p2, **conf), "c2", n2.path)[0] == 0  # re-ADD: no duplicate rules
    assert reaches_outside(n1)

    def listing() -> dict[str, Any]:
        with host.enter():
            return nft.list_json("table", "inet", fw.NFT_TABLE)

    lst = listing()
    fwd = [r for r in nft.rules(lst) if r["chain"] == "forward"]
    assert len(fwd) == 5
    # The ping was counted by this table's per-address accept rule: real packets, real rule.
    counted = sum(e["counter"]["packets"] for r in fwd for e in r["expr"] if "counter" in e)
    assert counted >= 2
    ips = {p["ips"][0]["address"].split("/")[0] for p in (p1, p2)}
    assert fw._nft_set_members(lst, "allowed4") == ips
    assert run_fw(host, "CHECK", fw_conf(p1, **conf), "c1", n1.path)[0] == 0
    assert run_fw(host, "DEL", fw_conf(p1, **conf), "c1", n1.path)[0] == 0
    assert fw._nft_set_members(listing(), "allowed4") == {p2["ips"][0]["address"].split("/")[0]}
    assert run_fw(host, "CHECK", fw_conf(p2, **conf), "c2", n2.path)[0] == 0
    assert run_fw(host, "CHECK", fw_conf(p1, **conf), "c1", n1.path)[0] == 1
    assert run_fw(host, "DEL", fw_conf(p1, **conf), "c1", n1.path)[0] == 0  # idempotent
    assert run_fw(host, "DEL", fw_conf(p2, **conf), "c2", n2.path)[0] == 0
    assert fw._nft_set_members(listing(), "allowed4") == set()


def test_concurrent_adds_do_not_duplicate_shared_rules(host_ns: Any, container_ns: Any) -> None:
    prevs = [synthetic_prev(f"10.5.0.{i}/24") for i in range(2, 8)]
    codes: list[int] = []

    def one(i: int) -> None:
        codes.append(run_fw(host_ns, "ADD", fw_conf(prevs[i]), f"c{i}", container_ns.path)[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prevs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == [0] * len(prevs)
    rules = ipt_state(host_ns)
    assert sum("-j CNI-FORWARD" in line for line in rules.splitlines() if line.startswith("-A FORWARD")) == 1
    assert sum("-j CNI-ADMIN" in line for line in rules.splitlines()) == 1
    assert sum(" -s 10.5.0." in line for line in rules.splitlines()) == len(prevs)


# ---- differential: same iptables state as the Go reference -----------------------------------
def go_comparable(rules: str) -> str:
    """Newer references say "same-bridge|isolated" where v1.1.1 (installed here) says "same-bridge"."""
    return rules.replace("(ingressPolicy: same-bridge|isolated)", "(ingressPolicy: same-bridge)")


@pytest.mark.parametrize("extra", [{}, {"iptablesAdminChainName": "ADMIN-X"}, {"ingressPolicy": "same-bridge"}])
def test_same_rules_as_go_reference(netns_factory: Any, extra: dict[str, Any]) -> None:
    ours_ns, go_ns, cont = netns_factory(), netns_factory(), netns_factory()
    prev = synthetic_prev("10.1.0.2/24", "fd00:1::2/64")
    conf = fw_conf(prev, backend="iptables", **extra)
    assert run_fw(ours_ns, "ADD", conf, "c1", cont.path)[0] == 0
    ok(plugin_util.run("firewall", "ADD", conf, via="exec", host=go_ns, container_id="c1", netns=cont))
    for v6 in (False, True):
        assert go_comparable(ipt_state(ours_ns, v6)) == ipt_state(go_ns, v6)
    # Each side CHECKs and DELs the other's rules identically.
    assert run_fw(go_ns, "CHECK", conf, "c1", cont.path)[0] == 0
    ok(plugin_util.run("firewall", "CHECK", conf, via="exec", host=ours_ns, container_id="c1", netns=cont))
    assert run_fw(go_ns, "DEL", conf, "c1", cont.path)[0] == 0
    ok(plugin_util.run("firewall", "DEL", conf, via="exec", host=ours_ns, container_id="c1", netns=cont))
    for v6 in (False, True):
        assert go_comparable(ipt_state(ours_ns, v6)) == ipt_state(go_ns, v6)
        assert "-s 10.1.0.2" not in ipt_state(ours_ns, v6) and "fd00:1::2" not in ipt_state(ours_ns, v6)


def test_isolated_policy_drops_intra_bridge(netns_factory: Any) -> None:
    """isolated (newer reference only): the same-bridge chains plus a DROP for bridge-to-bridge."""
    host, cont = netns_factory(), netns_factory()
    conf = fw_conf(synthetic_prev("10.1.0.2/24"), ingressPolicy="isolated")
    assert run_fw(host, "ADD", conf, "c1", cont.path)[0] == 0
    rules = ipt_state(host).splitlines()
    stage1 = [r for r in rules if r.startswith("-A CNI-ISOLATION-STAGE-1")]
    assert stage1[0].startswith("-A CNI-ISOLATION-STAGE-1 -i cni0 -o cni0") and stage1[0].endswith("-j DROP")
    assert stage1[-1].endswith("-j RETURN")
    assert any(r.startswith("-A CNI-ISOLATION-STAGE-2 -o cni0") and r.endswith("-j DROP") for r in rules)
    assert rules.index([r for r in rules if "-j CNI-ISOLATION-STAGE-1" in r][0]) < rules.index(
        [r for r in rules if "-j CNI-FORWARD" in r][0])
    assert run_fw(host, "ADD", conf, "c1", cont.path)[0] == 0  # repeatable: no duplicates
    assert ipt_state(host).splitlines() == rules
    assert run_fw(host, "CHECK", conf, "c1", cont.path)[0] == 0
    host.run(["iptables", "-w", "-D", "CNI-ISOLATION-STAGE-1", "1"])
    rc, e = run_fw(host, "CHECK", conf, "c1", cont.path)
    assert rc == 1 and "CNI-ISOLATION-STAGE-1" in e["msg"]


@pytest.mark.parametrize("attachments,code", [("absent", 7), (None, 7), ([{}], 7), ([{"containerID": 1}], 7),
                                              ([], 0), ([{"containerID": "c1", "ifname": "eth0"}], 0)])
@each_plugin_way
def test_gc_checks_the_valid_list_and_status_is_ready(attachments: Any, code: int, via: str, plugin_dir: str) -> None:
    """Nothing to collect, but GC refuses a missing or malformed list as every plugin does; STATUS answers."""
    conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": "gcnet", "type": "firewall"}
    if attachments != "absent":
        conf["cni.dev/valid-attachments"] = attachments
    out = plugin_util.run("firewall", "GC", conf, via=via, cni_path=plugin_dir)
    assert out.exit_code == (1 if code else 0), out.stdout
    if code:
        assert json.loads(out.stdout)["code"] == code
    out = plugin_util.run("firewall", "STATUS", conf, via=via, cni_path=plugin_dir)
    assert out.exit_code == 0, out.stdout


@pytest.mark.parametrize("added, deleted", [("iptables", "nftables"), ("nftables", "iptables")])
def test_del_cleans_the_other_backends_rules(host_ns: Any, container_ns: Any, added: str, deleted: str) -> None:
    """A config switched between ADD and DEL (or a swap of implementations) leaves no rule behind."""
    prev = synthetic_prev("10.93.0.5/24")
    code, _ = run_fw(host_ns, "ADD", fw_conf(prev, backend=added), "c1", container_ns.path)
    assert code == 0
    assert "10.93.0.5" in (ipt_state(host_ns) if added == "iptables" else nft_state(host_ns))
    code, _ = run_fw(host_ns, "DEL", fw_conf(prev, backend=deleted), "c1", container_ns.path)
    assert code == 0
    assert "10.93.0.5" not in ipt_state(host_ns) and "10.93.0.5" not in nft_state(host_ns)
