"""tuning: sysctls and interface attributes in a container namespace, saved and restored.

Every test builds its own namespaces (one plays the host the plugin runs in, others the
containers) with a veth inside the container, and checks the kernel's view with ``ip -d -j
link`` and /proc/sys read from inside. Runs in-process (dispatch), through the installed shim,
and side by side with the Go reference (/usr/lib/cni/tuning, v1.1.1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import plugin_util
import pytest
from netns_util import Namespace

from pycni.plugins.meta import tuning
from pycni.spec.errors import DECODE_FAILURE, INVALID_CONFIG, IO_FAILURE, CNIError

GO_TUNING = "/usr/lib/cni/tuning"
ORIG_MAC = "0a:00:00:00:00:01"


# ---- helpers -----------------------------------------------------------------------------------

def make_iface(ns: Namespace, name: str = "eth0", mac: str = ORIG_MAC) -> None:
    """A veth in the container namespace (its peer stays there too), up, with a known MAC."""
    ns.run(["ip", "link", "add", name, "type", "veth", "peer", "name", "peer0"])
    ns.run(["ip", "link", "set", name, "address", mac, "up"])


def link_state(ns: Namespace, name: str = "eth0") -> dict[str, Any]:
    info = json.loads(ns.run(["ip", "-d", "-j", "link", "show", name]).stdout)[0]
    return {"mac": info["address"], "mtu": info["mtu"], "promisc": info.get("promiscuity", 0) > 0,
            "allmulti": "ALLMULTI" in info["flags"], "txqlen": info.get("txqlen", 0)}


def sysctl_in(ns: Namespace, key: str) -> str:
    return ns.run(["cat", "/proc/sys/" + key]).stdout.strip()


def make_conf(ns: Namespace, data_dir: str, version: str = "1.0.0", ifname: str = "eth0",
              **keys: Any) -> dict[str, Any]:
    prev: dict[str, Any] = {"cniVersion": version, "dns": {}}
    if version in ("0.1.0", "0.2.0"):
        prev["ip4"] = {"ip": "10.1.0.2/24"}
    else:
        prev["interfaces"] = [{"name": ifname, "mac": ORIG_MAC, "sandbox": ns.path}]
        prev["ips"] = [{"address": "10.1.0.2/24", "interface": 0}]
        if version in ("0.3.0", "0.3.1"):
            prev["ips"][0]["version"] = "4"
    return {"cniVersion": version, "name": "tune", "type": "tuning", "dataDir": data_dir, **keys,
            "prevResult": prev}


def make_env(cmd: str, ns: Namespace | None, ifname: str = "eth0", cid: str = "c1", args: str = "") -> dict[str, str]:
    return plugin_util.env(cmd, cid, ns, ifname, "/usr/lib/cni", args)


def run_inproc(host: Namespace, env: dict[str, str], conf: dict[str, Any] | bytes) -> tuple[int, Any]:
    """Dispatch in this thread, which sits in the host namespace for the call."""
    out = plugin_util.run("tuning", env["CNI_COMMAND"], conf, host=host, environ=env)
    return out.exit_code, json.loads(out.stdout) if out.stdout.strip() else None


def run_exec(host: Namespace, binary: str, env: dict[str, str], conf: dict[str, Any]) -> tuple[int, Any]:
    """``binary`` (ours or Go's) run in the host namespace; CNI_PATH its directory (tuning delegates nothing)."""
    environ = {**env, "CNI_PATH": os.path.dirname(binary)}
    out = plugin_util.run("tuning", env["CNI_COMMAND"], conf, via="exec", host=host, environ=environ)
    return out.exit_code, json.loads(out.stdout) if out.stdout.strip() else None


@pytest.fixture
def setup(netns_factory, tmp_path):  # type: ignore[no-untyped-def]
    host, ctr = netns_factory(), netns_factory()
    make_iface(ctr)
    return host, ctr, str(tmp_path / "tuning")


FULL = {"mac": "0a:11:22:33:44:55", "mtu": 1400, "promisc": True, "allmulti": True, "txQLen": 50,
        "sysctl": {"net.core.somaxconn": "500", "net.ipv4.conf.IFNAME.rp_filter": "2"}}


# ---- ADD / CHECK / DEL -------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["1.0.0", "0.4.0", "0.3.1", "1.1.0"])
def test_add_check_del_in_process(setup, version: str) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    before = link_state(ctr)
    conf = make_conf(ctr, data_dir, version, **FULL)

    rc, res = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 0, res
    assert res["cniVersion"] == version
    assert res["interfaces"][0]["mac"] == "0a:11:22:33:44:55"
    assert res["ips"][0]["address"] == "10.1.0.2/24"
    assert link_state(ctr) == {"mac": "0a:11:22:33:44:55", "mtu": 1400, "promisc": True, "allmulti": True,
                               "txqlen": 50}
    assert sysctl_in(ctr, "net/core/somaxconn") == "500"
    assert sysctl_in(ctr, "net/ipv4/conf/eth0/rp_filter") == "2"
    saved = os.path.join(data_dir, "c1_eth0.json")
    with open(saved) as f:  # the reference's file: one-space indent, its key order
        assert f.read() == ('{\n "mac": "0a:00:00:00:00:01",\n "promisc": false,\n "mtu": 1500,\n'
                            ' "allmulti": false,\n "txQLen": 1000\n}')
    assert oct(os.stat(saved).st_mode & 0o777) == "0o600"

    if version != "0.3.1":  # CHECK exists from 0.4.0
        conf_check = dict(conf, prevResult=res)
        assert run_inproc(host, make_env("CHECK", ctr), conf_check) == (0, None)

    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)
    assert link_state(ctr) == before
    assert not os.path.exists(saved)
    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)  # idempotent


def test_shim_add_check_del(setup, plugin_dir: str) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    shim = os.path.join(plugin_dir, "tuning")
    before = link_state(ctr)
    conf = make_conf(ctr, data_dir, **FULL)
    rc, res = run_exec(host, shim, make_env("ADD", ctr), conf)
    assert rc == 0, res
    assert res["interfaces"][0]["mac"] == "0a:11:22:33:44:55"
    assert link_state(ctr)["mtu"] == 1400 and sysctl_in(ctr, "net/core/somaxconn") == "500"
    assert run_exec(host, shim, make_env("CHECK", ctr), dict(conf, prevResult=res)) == (0, None)
    assert run_exec(host, shim, make_env("DEL", ctr), conf) == (0, None)
    assert link_state(ctr) == before
    rc, err = run_exec(host, shim, make_env("ADD", ctr), make_conf(ctr, data_dir, mtu=1400,
                                                                   sysctl={"kernel.hostname": "x"}))
    assert rc == 1 and err["code"] == INVALID_CONFIG and "invalid net sysctl key" in err["msg"]
    assert link_state(ctr) == before and not os.listdir(data_dir)


def test_check_detects_drift(setup) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    conf = make_conf(ctr, data_dir, **FULL)
    rc, res = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 0
    conf = dict(conf, prevResult=res)
    ctr.run(["ip", "link", "set", "eth0", "mtu", "1300"])
    rc, err = run_inproc(host, make_env("CHECK", ctr), conf)
    assert rc == 1 and "MTU of eth0 is 1400, current value is 1300" in err["msg"]
    ctr.run(["ip", "link", "set", "eth0", "mtu", "1400"])
    ctr.run(["sh", "-c", "echo 128 > /proc/sys/net/core/somaxconn"])
    rc, err = run_inproc(host, make_env("CHECK", ctr), conf)
    assert rc == 1 and "current value is 128" in err["msg"]
    ctr.run(["sh", "-c", "echo 500 > /proc/sys/net/core/somaxconn"])
    ctr.run(["ip", "link", "set", "eth0", "promisc", "off"])
    rc, err = run_inproc(host, make_env("CHECK", ctr), conf)
    assert rc == 1 and "promisc" in err["msg"]
    ctr.run(["ip", "link", "set", "eth0", "promisc", "on"])
    assert run_inproc(host, make_env("CHECK", ctr), conf) == (0, None)
    ctr.run(["ip", "link", "del", "eth0"])
    rc, err = run_inproc(host, make_env("CHECK", ctr), conf)
    assert rc == 1 and "eth0/rp_filter' does not exist" in err["msg"]
    conf["sysctl"] = {"net.core.somaxconn": "500"}
    rc, err = run_inproc(host, make_env("CHECK", ctr), conf)
    assert rc == 1 and "Cannot find container link eth0" in err["msg"]


def test_multi_value_sysctl_check_ignores_whitespace(setup) -> None:  # type: ignore[no-untyped-def]
    """The kernel prints tcp_rmem with tabs; a config with spaces still passes CHECK."""
    host, ctr, data_dir = setup
    conf = make_conf(ctr, data_dir, sysctl={"net.ipv4.tcp_rmem": "4096 87380 6291456"})
    rc, res = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 0, res
    assert sysctl_in(ctr, "net/ipv4/tcp_rmem").split() == ["4096", "87380", "6291456"]
    assert run_inproc(host, make_env("CHECK", ctr), dict(conf, prevResult=res)) == (0, None)
    assert not os.path.exists(data_dir)  # no link attributes: nothing saved, as in the reference


# ---- refusals: code 7, nothing changed ----------------------------------------------------------

@pytest.mark.parametrize("key", [
    "kernel.hostname", "kernel/hostname", "net/../kernel/hostname", "net.core.somaxconn/..",
    "/proc/sys/net/core/somaxconn", "/etc/passwd", "net", "net..core.somaxconn", "vm.swappiness",
    "net.core.rmem_max", "net.core.netdev_max_backlog", "net.ipv4.tcp_mem", "net.netfilter.nf_conntrack_max",
])
def test_bad_sysctl_key_refused(setup, key: str) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    before = link_state(ctr)
    conf = make_conf(ctr, data_dir, mtu=1400, sysctl={"net.core.somaxconn": "500", key: "1"})
    rc, err = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 1 and err["code"] == INVALID_CONFIG, err
    assert err["msg"]
    assert sysctl_in(ctr, "net/core/somaxconn") != "500"
    assert link_state(ctr) == before
    assert not os.path.exists(data_dir)


@pytest.mark.parametrize("keys,needle", [
    ({"mac": "zz:11:22:33:44:55"}, "MAC addr"),
    ({"mac": "0a:11:22:33:44"}, "MAC addr"),
    ({"mtu": "1400"}, "'mtu' must be an integer"),
    ({"mtu": 1400.5}, "'mtu' must be an integer"),
    ({"mtu": -1}, "'mtu' must be an integer from 0 to 65535"),
    ({"args": "x"}, "'args' must be a JSON object"),
    ({"runtimeConfig": "x"}, "'runtimeConfig' must be a JSON object"),
    ({"txQLen": -5}, "txQLen"),
    ({"promisc": "yes"}, "'promisc' must be true or false"),
    ({"allmulti": 1}, "'allmulti' must be true or false"),
    ({"sysctl": {"net.core.somaxconn": 500}}, "must be a string"),
    ({"sysctl": ["net.core.somaxconn"]}, "'sysctl' must be"),
    ({"sysctl": {"net.core.somaxconn": "500", "net/core/somaxconn": "600"}}, "conflicting"),
    ({"sysctl": {"net.core.nosuchkey": "1"}}, "does not exist"),
    ({"args": {"cni": {"mtu": "big"}}}, "args.cni.mtu"),
    ({"runtimeConfig": {"mac": 5}}, "runtimeConfig.mac"),
    ({"dataDir": 3}, "dataDir"),
])
def test_bad_config_refused(setup, keys: dict[str, Any], needle: str) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    before = link_state(ctr)
    conf = make_conf(ctr, data_dir, **{"sysctl": {"net.ipv4.conf.eth0.rp_filter": "2"}, **keys})
    rc, err = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 1 and err["code"] == INVALID_CONFIG, err
    assert needle in err["msg"] + err.get("details", "")
    assert link_state(ctr) == before
    assert sysctl_in(ctr, "net/ipv4/conf/eth0/rp_filter") != "2"
    assert not os.path.exists(data_dir)


def test_duplicate_sysctl_keys_and_decode_errors(setup) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    text = json.dumps(make_conf(ctr, data_dir, sysctl={"net.core.somaxconn": "500"}))
    dup = text.replace('"net.core.somaxconn": "500"', '"net.core.somaxconn": "500", "net.core.somaxconn": "600"')
    rc, err = run_inproc(host, make_env("ADD", ctr), dup.encode())
    assert rc == 1 and err["code"] == INVALID_CONFIG and "duplicated sysctl keys" in err["msg"]
    rc, err = run_inproc(host, make_env("ADD", ctr), b'{"cniVersion": "1.0.0", "name": ')
    assert rc == 1 and err["code"] == DECODE_FAILURE
    conf = make_conf(ctr, data_dir, mtu=1400)
    del conf["prevResult"]
    rc, err = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 1 and err["code"] == INVALID_CONFIG and "prevResult" in err["msg"]
    rc, err = run_inproc(host, make_env("ADD", ctr, args="FOO=1"), make_conf(ctr, data_dir, mtu=1400))
    assert rc == 1 and err["code"] == 4  # unknown CNI_ARGS without IgnoreUnknown, as the reference
    assert link_state(ctr)["mtu"] == 1500 and sysctl_in(ctr, "net/core/somaxconn") != "500"


def test_missing_netns_and_interface(setup, netns_factory) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    env = make_env("ADD", ctr)
    env["CNI_NETNS"] = "/var/run/netns/pycni-t-does-not-exist"
    rc, err = run_inproc(host, env, make_conf(ctr, data_dir, mtu=1400))
    assert rc == 1 and err["code"] == 4
    rc, err = run_inproc(host, make_env("ADD", ctr, ifname="eth9"), make_conf(ctr, data_dir, mtu=1400))
    assert rc == 1 and "eth9" in err["msg"]
    assert not os.path.exists(data_dir)


# ---- undo on failure part-way ------------------------------------------------------------------

def test_rejected_sysctl_value_rolls_back(setup) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    old = sysctl_in(ctr, "net/core/somaxconn")
    conf = make_conf(ctr, data_dir, mtu=1400,
                     sysctl={"net.core.somaxconn": "500", "net.ipv4.conf.all.rp_filter": "not-a-number"})
    rc, err = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 1 and err["code"] == IO_FAILURE and "rp_filter" in err["msg"]
    assert sysctl_in(ctr, "net/core/somaxconn") == old
    assert link_state(ctr)["mtu"] == 1500
    assert not os.path.exists(data_dir)


def test_rejected_link_change_rolls_back(setup) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    before = link_state(ctr)
    old = sysctl_in(ctr, "net/core/somaxconn")
    conf = make_conf(ctr, data_dir, mac="0a:11:22:33:44:55", mtu=70000, sysctl={"net.core.somaxconn": "500"})
    rc, err = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc == 1, err  # veth allows at most 65535
    assert link_state(ctr) == before
    assert sysctl_in(ctr, "net/core/somaxconn") == old
    assert not os.path.exists(os.path.join(data_dir, "c1_eth0.json"))


# ---- where values come from ---------------------------------------------------------------------

def test_mac_precedence_and_args_overrides(setup) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    env = make_env("ADD", ctr, args="IgnoreUnknown=1;K8S_POD_NAME=p;MAC=0a:00:00:00:00:aa")
    rc, res = run_inproc(host, env, make_conf(ctr, data_dir, mac="0a:00:00:00:00:99"))
    assert rc == 0 and link_state(ctr)["mac"] == "0a:00:00:00:00:aa"  # CNI_ARGS beats the config
    assert run_inproc(host, make_env("DEL", ctr), make_conf(ctr, data_dir)) == (0, None)
    assert link_state(ctr)["mac"] == ORIG_MAC

    conf = make_conf(ctr, data_dir, mac="0a:00:00:00:00:99", runtimeConfig={"mac": "0a:00:00:00:00:bb"})
    rc, res = run_inproc(host, env, conf)
    assert rc == 0 and link_state(ctr)["mac"] == "0a:00:00:00:00:bb"  # runtimeConfig beats CNI_ARGS
    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)

    conf = make_conf(ctr, data_dir, mtu=1400, sysctl={"net.core.somaxconn": "500"},
                     runtimeConfig={"mac": "0a:00:00:00:00:bb"},
                     args={"cni": {"mac": "0a:00:00:00:00:cc", "mtu": 1300, "promisc": True, "txQLen": 0,
                                   "sysctl": {"net.core.somaxconn": "600"}}})
    rc, res = run_inproc(host, env, conf)
    assert rc == 0, res
    assert res["interfaces"][0]["mac"] == "0a:00:00:00:00:cc"
    assert link_state(ctr) == {"mac": "0a:00:00:00:00:cc", "mtu": 1300, "promisc": True, "allmulti": False,
                               "txqlen": 0}
    assert sysctl_in(ctr, "net/core/somaxconn") == "600"
    assert run_inproc(host, make_env("CHECK", ctr), dict(conf, prevResult=res)) == (0, None)
    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)
    assert link_state(ctr) == {"mac": ORIG_MAC, "mtu": 1500, "promisc": False, "allmulti": False, "txqlen": 1000}


def test_interface_name_with_dot(netns_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    host, ctr = netns_factory(), netns_factory()
    make_iface(ctr, "eth0.100")
    conf = make_conf(ctr, str(tmp_path), ifname="eth0.100",
                     sysctl={"net.ipv4.conf.IFNAME.rp_filter": "2", "net/ipv6/conf/eth0.100/accept_ra": "0"},
                     mtu=1400)
    rc, res = run_inproc(host, make_env("ADD", ctr, ifname="eth0.100"), conf)
    assert rc == 0, res
    assert sysctl_in(ctr, "net/ipv4/conf/eth0.100/rp_filter") == "2"
    assert sysctl_in(ctr, "net/ipv6/conf/eth0.100/accept_ra") == "0"
    assert run_inproc(host, make_env("CHECK", ctr, ifname="eth0.100"), dict(conf, prevResult=res)) == (0, None)
    assert os.path.exists(tmp_path / "c1_eth0.100.json")


def test_allowlist(tmp_path) -> None:  # type: ignore[no-untyped-def]
    allow = tmp_path / "allowlist.conf"
    tuning.check_allowlist(["kernel.anything"], str(allow))  # no file: no restriction
    allow.write_text("^net\\.core\\.somaxconn$\n\n  ^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]+$  \n")
    tuning.check_allowlist(["net.core.somaxconn", "net.ipv4.conf.IFNAME.rp_filter"], str(allow))
    with pytest.raises(CNIError) as ei:
        tuning.check_allowlist(["net.core.somaxconn", "net.ipv4.ip_forward"], str(allow))
    assert ei.value.code == INVALID_CONFIG and "net.ipv4.ip_forward is not allowed" in ei.value.msg
    allow.write_text("([\n")
    with pytest.raises(CNIError) as ei:
        tuning.check_allowlist(["net.core.somaxconn"], str(allow))
    assert ei.value.code == INVALID_CONFIG


# ---- DEL is idempotent ----------------------------------------------------------------------------

def test_del_when_nothing_there(setup) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    conf = make_conf(ctr, data_dir, mtu=1400)
    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)  # no saved file
    assert run_inproc(host, make_env("DEL", None), conf) == (0, None)  # no netns given
    assert link_state(ctr)["mtu"] == 1500


def test_del_after_interface_or_netns_gone(setup, netns_factory) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    saved = os.path.join(data_dir, "c1_eth0.json")
    conf = make_conf(ctr, data_dir, mtu=1400)
    assert run_inproc(host, make_env("ADD", ctr), conf)[0] == 0
    ctr.run(["ip", "link", "del", "eth0"])
    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)
    assert not os.path.exists(saved)

    other = netns_factory()
    make_iface(other)
    conf = make_conf(other, data_dir, mtu=1400)
    assert run_inproc(host, make_env("ADD", other, cid="c2"), conf)[0] == 0
    assert os.path.exists(os.path.join(data_dir, "c2_eth0.json"))
    env = make_env("DEL", other, cid="c2")
    other.delete()
    assert run_inproc(host, env, conf) == (0, None)
    assert not os.path.exists(os.path.join(data_dir, "c2_eth0.json"))
    assert run_inproc(host, env, conf) == (0, None)


def test_repeated_add_keeps_first_originals(setup) -> None:  # type: ignore[no-untyped-def]
    host, ctr, data_dir = setup
    conf = make_conf(ctr, data_dir, mtu=1400, mac="0a:11:22:33:44:55")
    before = link_state(ctr)
    assert run_inproc(host, make_env("ADD", ctr), conf)[0] == 0
    assert run_inproc(host, make_env("ADD", ctr), conf)[0] == 0
    # a later ADD touching something else adds to what is saved, and keeps the rest
    assert run_inproc(host, make_env("ADD", ctr), make_conf(ctr, data_dir, allmulti=True, mtu=1300))[0] == 0
    with open(os.path.join(data_dir, "c1_eth0.json")) as f:
        assert json.load(f) == {"mac": ORIG_MAC, "mtu": 1500, "allmulti": False}
    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)
    assert link_state(ctr) == before


def test_concurrent_handlers_stay_in_their_namespaces(netns_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Handlers are re-entrant: two threads tune two containers at once, each its own."""
    host = netns_factory()
    ctrs = [netns_factory() for _ in range(2)]
    for c in ctrs:
        make_iface(c)
    outcomes: list[Any] = [None, None]

    def work(i: int) -> None:
        conf = make_conf(ctrs[i], str(tmp_path), mtu=1400 + i, sysctl={"net.core.somaxconn": str(500 + i)})
        outcomes[i] = run_inproc(host, make_env("ADD", ctrs[i], cid=f"c{i}"), conf)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, c in enumerate(ctrs):
        assert outcomes[i][0] == 0, outcomes[i]
        assert link_state(c)["mtu"] == 1400 + i
        assert sysctl_in(c, "net/core/somaxconn") == str(500 + i)
    assert sysctl_in(host, "net/core/somaxconn") not in ("500", "501")


# ---- against the Go reference ----------------------------------------------------------------------

needs_go = pytest.mark.skipif(not os.access(GO_TUNING, os.X_OK), reason="Go reference tuning not installed")

# What v1.1.1 supports (it predates txQLen; its CHECK does not expand IFNAME).
GO_COMMON = {"mac": "0a:11:22:33:44:55", "mtu": 1400, "promisc": True, "allmulti": True,
             "sysctl": {"net.core.somaxconn": "500", "net.ipv4.conf.eth0.rp_filter": "2"}}


@needs_go
@pytest.mark.parametrize("version", ["1.0.0", "0.4.0", "0.3.1", "0.2.0"])
def test_same_as_go_reference(netns_factory, tmp_path, version: str) -> None:  # type: ignore[no-untyped-def]
    host = netns_factory()
    ours, theirs = netns_factory(), netns_factory()
    for c in (ours, theirs):
        make_iface(c)
    d_ours, d_go = str(tmp_path / "ours"), str(tmp_path / "go")

    def both(cmd: str, **keys: Any) -> tuple[tuple[int, Any], tuple[int, Any]]:
        a = run_inproc(host, make_env(cmd, ours), make_conf(ours, d_ours, version, **keys))
        b = run_exec(host, GO_TUNING, make_env(cmd, theirs), make_conf(theirs, d_go, version, **keys))
        return a, b

    a, b = both("ADD", **GO_COMMON)
    assert a[0] == b[0] == 0, (a, b)
    for r in (a[1], b[1]):
        for i in r.get("interfaces", []):
            i.pop("sandbox", None)  # names each side's own namespace
        if r.get("dns") == {} and r["cniVersion"].startswith("1."):
            del r["dns"]  # Go libcni 1.1 printed an empty dns for 1.x; newer (and pycni) omit it
    assert a[1] == b[1]
    assert link_state(ours) == link_state(theirs)
    for key in ("net/core/somaxconn", "net/ipv4/conf/eth0/rp_filter"):
        assert sysctl_in(ours, key) == sysctl_in(theirs, key)
    with open(os.path.join(d_ours, "c1_eth0.json")) as f1, open(os.path.join(d_go, "c1_eth0.json")) as f2:
        assert f1.read() == f2.read()

    if version not in ("0.3.1", "0.2.0"):  # CHECK exists from 0.4.0
        a, b = both("CHECK", **GO_COMMON)
        assert a == b == (0, None)
        for c in (ours, theirs):
            c.run(["ip", "link", "set", "eth0", "mtu", "1300"])
        a, b = both("CHECK", **GO_COMMON)
        assert a[0] == b[0] == 1 and a[1]["msg"] == b[1]["msg"]

    a, b = both("DEL", **GO_COMMON)
    assert a == b == (0, None)
    assert link_state(ours) == link_state(theirs)
    assert os.listdir(d_ours) == os.listdir(d_go) == []


@needs_go
def test_go_reads_our_saved_file_and_we_read_its(netns_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The on-disk format is shared: each side's DEL restores what the other's ADD saved."""
    host, ctr = netns_factory(), netns_factory()
    make_iface(ctr)
    before = link_state(ctr)
    conf = make_conf(ctr, str(tmp_path), **GO_COMMON)
    assert run_inproc(host, make_env("ADD", ctr), conf)[0] == 0
    assert run_exec(host, GO_TUNING, make_env("DEL", ctr), conf) == (0, None)
    assert link_state(ctr) == before
    assert run_exec(host, GO_TUNING, make_env("ADD", ctr), conf)[0] == 0
    assert run_inproc(host, make_env("DEL", ctr), conf) == (0, None)
    assert link_state(ctr) == before


@needs_go
@pytest.mark.parametrize("key", ["kernel.hostname", "net.core.nosuchkey"])
def test_bad_keys_fail_like_go(netns_factory, tmp_path, key: str) -> None:  # type: ignore[no-untyped-def]
    """Both refuse; we with code 7 and before touching anything (Go: 999)."""
    host, ctr = netns_factory(), netns_factory()
    make_iface(ctr)
    conf = make_conf(ctr, str(tmp_path), sysctl={key: "1"})
    rc_go, err_go = run_exec(host, GO_TUNING, make_env("ADD", ctr), conf)
    rc, err = run_inproc(host, make_env("ADD", ctr), conf)
    assert rc_go == rc == 1
    assert err["code"] == INVALID_CONFIG and err_go["code"] == 999


def test_version_and_startup_imports() -> None:
    """VERSION answers without netlink; the plugin module does not import pyroute2 at start-up."""
    code = ("import sys; from pycni.plugins.meta import tuning; "
            "print(any(m.startswith('pyroute2') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    res = plugin_util.run("tuning", "VERSION", b'{"cniVersion": "1.0.0"}')
    assert res.exit_code == 0 and "1.1.0" in json.loads(res.stdout)["supportedVersions"]


@pytest.mark.parametrize("attachments,code", [("absent", 7), (None, 7), ([{}], 7), ([{"containerID": 1}], 7),
                                              ([], 0), ([{"containerID": "c1", "ifname": "eth0"}], 0)])
def test_gc_checks_the_valid_list_and_status_is_ready(attachments: Any, code: int) -> None:
    """Nothing to collect, but GC refuses a missing or malformed list as every plugin does; STATUS answers."""
    conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": "gcnet", "type": "tuning", "mtu": 1400}
    if attachments != "absent":
        conf["cni.dev/valid-attachments"] = attachments
    out = plugin_util.run("tuning", "GC", conf, cni_path="/nonexistent")
    assert out.exit_code == (1 if code else 0), out.stdout
    if code:
        assert json.loads(out.stdout)["code"] == code
    out = plugin_util.run("tuning", "STATUS", conf, cni_path="/nonexistent")
    assert out.exit_code == 0, out.stdout


def test_global_sysctls_match_as_the_regular_expression_did() -> None:
    """is_global_sysctl (no re on the start path) decides as ``re.match(globs joined by | + \\Z)`` did,
    for every entry, its neighbours and random names."""
    import random
    import re

    pattern = "|".join(re.escape(g).replace(r"\*", "[^/]*") for g in tuning.GLOBAL_SYSCTLS) + r"\Z"
    rng = random.Random(7)
    names = ["net/ipv4/conf/eth0/arp_notify", "net/core/somaxconn", "net/", "", "net/core/bpf_jit_/x"]
    for g in tuning.GLOBAL_SYSCTLS:
        base = g.replace("*", "")
        names += [base, base + "x", base + "x/y", base + "/", base[:-1], g, "x" + base, base + "_max"]
        for _ in range(20):
            names.append(base + "".join(rng.choice("ab/_*") for _ in range(rng.randrange(6))))
    for name in names:
        assert tuning.is_global_sysctl(name) == bool(re.match(pattern, name)), name
