"""flannel: delegate config building, subnet-file errors, DEL from the saved config, two nodes over VXLAN."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import plugin_util
import pytest
from netns_util import Namespace

from pycni.plugins.meta import flannel
from pycni.skel import CmdArgs
from pycni.spec.errors import CNIError

SUBNET_ENV = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"


def write_env(tmp_path: Path, text: str = SUBNET_ENV, name: str = "subnet.env") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def parse(data: bytes, command: str = "ADD") -> flannel.FlannelConf:
    return flannel.parse_conf(CmdArgs(command=command, stdin_data=data))


def conf_bytes(tmp_path: Path, subnet_file: str, **extra: object) -> bytes:
    conf = {"cniVersion": "1.0.0", "name": "flnet", "type": "flannel", "subnetFile": subnet_file,
            "dataDir": str(tmp_path / "flannel-data"), "ipam": {"dataDir": str(tmp_path / "ipam")}}
    conf.update(extra)
    return json.dumps(conf).encode()


# ---- unit: config merging --------------------------------------------------------------------

def test_delegate_defaults_follow_flannel(tmp_path: Path) -> None:
    env = flannel.load_subnet_env(write_env(tmp_path))
    conf = parse(conf_bytes(tmp_path, "x", runtimeConfig={"portMappings": []}))
    d = flannel.delegate_conf(conf, env)
    assert d["type"] == "bridge" and d["name"] == "flnet" and d["cniVersion"] == "1.0.0"
    assert d["ipMasq"] is False  # flanneld masquerades, so the bridge must not
    assert d["mtu"] == 1450 and d["isGateway"] is True
    assert d["ipam"]["type"] == "host-local"
    assert d["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}]]
    assert d["ipam"]["routes"] == [{"dst": "10.244.0.0/16"}]
    assert d["ipam"]["dataDir"] == str(tmp_path / "ipam")
    assert d["runtimeConfig"] == {"portMappings": []}


def test_explicit_delegate_keys_win_and_routes_append(tmp_path: Path) -> None:
    env = flannel.load_subnet_env(write_env(tmp_path, SUBNET_ENV.replace("true", "false")))
    conf = parse(conf_bytes(tmp_path, "x", delegate={"mtu": 1400, "isGateway": False,
                                                                   "bridge": "fl0"},
                                         ipam={"routes": [{"dst": "192.0.2.0/24"}]}))
    d = flannel.delegate_conf(conf, env)
    assert d["mtu"] == 1400 and d["isGateway"] is False and d["bridge"] == "fl0"
    assert d["ipMasq"] is True
    assert d["ipam"]["routes"] == [{"dst": "192.0.2.0/24"}, {"dst": "10.244.0.0/16"}]


def test_ipam_routes_must_be_a_list(tmp_path: Path) -> None:
    env = flannel.load_subnet_env(write_env(tmp_path))
    conf = parse(conf_bytes(tmp_path, "x", ipam={"routes": "10.0.0.0/8"}))
    with pytest.raises(CNIError) as e:
        flannel.delegate_conf(conf, env)
    assert e.value.code == 7 and "'ipam.routes' must be a list" in e.value.msg


def test_dual_stack_subnet_file(tmp_path: Path) -> None:
    text = SUBNET_ENV + "FLANNEL_IPV6_NETWORK=fd00:10::/56\nFLANNEL_IPV6_SUBNET=fd00:10:0:1::1/64\n"
    d = flannel.delegate_conf(parse(conf_bytes(tmp_path, "x")),
                              flannel.load_subnet_env(write_env(tmp_path, text)))
    assert d["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:0:1::/64"}]]
    assert {"dst": "fd00:10::/56"} in d["ipam"]["routes"]


def test_ipv6_only_subnet_file(tmp_path: Path) -> None:
    text = ("FLANNEL_IPV6_NETWORK=fd00:10::/56\nFLANNEL_IPV6_SUBNET=fd00:10:0:1::1/64\n"
            "FLANNEL_MTU=1400\nFLANNEL_IPMASQ=false\n")
    env = flannel.load_subnet_env(write_env(tmp_path, text))
    assert [str(s) for s in env.subnets] == ["fd00:10:0:1::/64"]


@pytest.mark.parametrize("delegate,msg", [({"name": "x"}, "'name'"), ({"ipam": {}}, "'ipam'"),
                                          ({"type": 5}, "(string) 'type'")])
def test_bad_delegate_is_config_error(tmp_path: Path, delegate: dict, msg: str) -> None:
    with pytest.raises(CNIError) as e:
        parse(conf_bytes(tmp_path, "x", delegate=delegate))
    assert e.value.code == 7 and msg in e.value.msg


@pytest.mark.parametrize("text,what", [
    (None, "failed to read flannel subnet file"),
    ("FLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n", "missing FLANNEL_NETWORK"),
    (SUBNET_ENV.replace("1450", "lots"), "invalid FLANNEL_MTU"),
    (SUBNET_ENV.replace("10.244.1.1/24", "10.244.1.300/24"), "invalid FLANNEL_SUBNET"),
])
def test_subnet_file_errors_change_nothing(tmp_path: Path, container_ns: Namespace, text: str | None,
                                          what: str) -> None:
    path = str(tmp_path / "subnet.env") if text is None else write_env(tmp_path, text)
    out = plugin_util.run("flannel", "ADD", conf_bytes(tmp_path, path), container_id="c1", netns=container_ns,
                          cni_path=str(tmp_path / "nothing-here"))
    err = json.loads(out.stdout)
    assert out.exit_code == 1 and err["code"] == 7 and what in err["msg"], err
    assert not (tmp_path / "flannel-data").exists() or not os.listdir(tmp_path / "flannel-data")
    assert container_ns.run(["ip", "-o", "link"]).stdout.count("\n") == 1  # only lo


def test_del_without_saved_config_succeeds(tmp_path: Path) -> None:
    out = plugin_util.run("flannel", "DEL", conf_bytes(tmp_path, str(tmp_path / "gone.env")),
                          container_id="never-added", cni_path="/nonexistent")
    assert out.exit_code == 0 and out.stdout == b""


def test_status_reports_missing_subnet_file(tmp_path: Path) -> None:
    data = json.loads(conf_bytes(tmp_path, str(tmp_path / "gone.env")))
    data["cniVersion"] = "1.1.0"
    out = plugin_util.run("flannel", "STATUS", data, cni_path="/nonexistent")
    assert out.exit_code == 1 and json.loads(out.stdout)["code"] == 50


# ---- integration: real namespaces ------------------------------------------------------------

def run_flannel(node: Namespace, plugin_dir: str, command: str, container: Namespace | None, cid: str,
                conf: bytes) -> bytes:
    """The installed executable, as a runtime runs it: its stdout, or its error as a CNIError."""
    out = plugin_util.run("flannel", command, conf, via="exec", host=node, container_id=cid, netns=container,
                          cni_path=plugin_dir)
    if out.exit_code != 0:
        raise CNIError.from_dict(json.loads(out.stdout))
    return out.stdout


def test_add_then_del_after_subnet_file_removed(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                 tmp_path: Path) -> None:
    node, ctr = netns_factory(), netns_factory()
    subnet_file = write_env(tmp_path)
    conf = conf_bytes(tmp_path, subnet_file, delegate={"isDefaultGateway": True, "bridge": "cni-fl0"})
    out = json.loads(run_flannel(node, plugin_dir, "ADD", ctr, "ctr-1", conf))
    addr = out["ips"][0]["address"]
    assert addr.startswith("10.244.1.") and addr.endswith("/24"), out
    assert out["ips"][0]["gateway"] == "10.244.1.1"
    link = json.loads(ctr.run(["ip", "-j", "link", "show", "eth0"]).stdout)[0]
    assert link["mtu"] == 1450
    routes = json.loads(ctr.run(["ip", "-j", "route", "show", "default"]).stdout)
    assert routes and routes[0]["gateway"] == "10.244.1.1"
    ctr.run(["ping", "-c", "1", "-W", "2", "10.244.1.1"])
    saved = tmp_path / "flannel-data" / "ctr-1"
    assert json.loads(saved.read_bytes())["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24"}]]
    check_conf = json.dumps(dict(json.loads(conf), prevResult=out)).encode()
    run_flannel(node, plugin_dir, "CHECK", ctr, "ctr-1", check_conf)  # delegated to the bridge
    ctr.run(["ip", "addr", "flush", "dev", "eth0"])
    with pytest.raises(CNIError):
        run_flannel(node, plugin_dir, "CHECK", ctr, "ctr-1", check_conf)

    os.unlink(subnet_file)  # flanneld went away: DEL must still clean up from the saved config
    run_flannel(node, plugin_dir, "DEL", ctr, "ctr-1", conf)
    assert not saved.exists()
    assert ctr.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
    assert not [f for f in os.listdir(tmp_path / "ipam" / "flnet") if f[0].isdigit()]
    run_flannel(node, plugin_dir, "DEL", ctr, "ctr-1", conf)  # and again: idempotent


def _vxlan_node(node: Namespace, underlay_ip: str, vtep_ip: str) -> str:
    node.run(["ip", "link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", underlay_ip,
              "dev", "underlay", "dstport", "8472", "nolearning"])
    node.run(["ip", "link", "set", "flannel.1", "mtu", "1450", "up"])
    node.run(["ip", "addr", "add", f"{vtep_ip}/32", "dev", "flannel.1"])
    node.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    return str(json.loads(node.run(["ip", "-j", "link", "show", "flannel.1"]).stdout)[0]["address"])


def test_two_nodes_over_vxlan(netns_factory: Callable[[], Namespace], plugin_dir: str, tmp_path: Path) -> None:
    """flannel's vxlan backend by hand: a container on node 1 reaches a container on node 2."""
    n1, n2, c1, c2 = (netns_factory() for _ in range(4))
    subprocess.run(["ip", "link", "add", "underlay", "netns", n1.name, "type", "veth", "peer", "name", "underlay",
                    "netns", n2.name], check=True)
    for ns, ip in ((n1, "172.30.0.1"), (n2, "172.30.0.2")):
        ns.run(["ip", "addr", "add", f"{ip}/24", "dev", "underlay"])
        ns.run(["ip", "link", "set", "underlay", "up"])
    mac1 = _vxlan_node(n1, "172.30.0.1", "10.244.1.0")
    mac2 = _vxlan_node(n2, "172.30.0.2", "10.244.2.0")
    for ns, peer_vtep, peer_mac, peer_underlay, peer_subnet in (
            (n1, "10.244.2.0", mac2, "172.30.0.2", "10.244.2.0/24"),
            (n2, "10.244.1.0", mac1, "172.30.0.1", "10.244.1.0/24")):
        ns.run(["ip", "neigh", "add", peer_vtep, "lladdr", peer_mac, "dev", "flannel.1", "nud", "permanent"])
        ns.run(["bridge", "fdb", "append", peer_mac, "dev", "flannel.1", "dst", peer_underlay])
        ns.run(["ip", "route", "add", peer_subnet, "via", peer_vtep, "dev", "flannel.1", "onlink"])

    addrs = []
    for i, (node, ctr) in enumerate(((n1, c1), (n2, c2)), 1):
        d = tmp_path / f"node{i}"
        d.mkdir()
        env_file = write_env(d, SUBNET_ENV.replace("10.244.1.1/24", f"10.244.{i}.1/24"))
        conf = conf_bytes(d, env_file)
        out = json.loads(run_flannel(node, plugin_dir, "ADD", ctr, f"ctr-{i}", conf))
        addrs.append(out["ips"][0]["address"].split("/")[0])
    assert addrs[0].startswith("10.244.1.") and addrs[1].startswith("10.244.2.")
    c1.run(["ping", "-c", "2", "-W", "2", addrs[1]])
    c2.run(["ping", "-c", "2", "-W", "2", addrs[0]])


def test_check_with_corrupt_saved_config_is_a_clear_error(tmp_path: Path, container_ns: Namespace) -> None:
    data = tmp_path / "flannel-data"
    data.mkdir()
    (data / "ctr-x").write_text("{not json")
    out = plugin_util.run("flannel", "CHECK", conf_bytes(tmp_path, write_env(tmp_path)), container_id="ctr-x",
                          netns=container_ns, cni_path="/nonexistent")
    e = json.loads(out.stdout)
    assert out.exit_code == 1 and e["code"] == 5 and "unreadable" in e["msg"]


# ---- refused input changes nothing -----------------------------------------------------------

def _add_error(node: Namespace, plugin_dir: str, ctr: Namespace, conf: bytes, cid: str = "ctr-r",
               ifname: str = "eth0", cni_args: str = "") -> CNIError:
    out = plugin_util.run("flannel", "ADD", conf, via="exec", host=node, container_id=cid, netns=ctr, ifname=ifname,
                          cni_path=plugin_dir, args=cni_args)
    assert out.exit_code != 0, out.stdout
    return CNIError.from_dict(json.loads(out.stdout))


def _links(ns: Namespace) -> set[str]:
    return {link["ifname"] for link in json.loads(ns.run(["ip", "-j", "link", "show"]).stdout)}


@pytest.mark.parametrize("ifname,cni_args,code", [
    ("eth0", "IgnoreUnknown=1;IP=10.244.1.300", 4),  # refused by host-local's config check, before the delegate runs
    ("eth0", "IgnoreUnknown=1;IP=10.244.9.9", 7),  # outside the node's subnet
    ("lo", "", None),  # refused by the delegate after it made the bridge: rolled back
])
def test_refused_add_leaves_no_bridge(netns_factory: Callable[[], Namespace], plugin_dir: str, tmp_path: Path,
                                      ifname: str, cni_args: str, code: int | None) -> None:
    node, ctr = netns_factory(), netns_factory()
    conf = conf_bytes(tmp_path, write_env(tmp_path), delegate={"bridge": "cni-flr"})
    node_links, ctr_links = _links(node), _links(ctr)
    e = _add_error(node, plugin_dir, ctr, conf, ifname=ifname, cni_args=cni_args)
    if code is not None:
        assert e.code == code, e
    assert _links(node) == node_links and _links(ctr) == ctr_links
    assert not os.listdir(tmp_path / "flannel-data") if (tmp_path / "flannel-data").exists() else True
    ipam_dir = tmp_path / "ipam" / "flnet"
    assert not ipam_dir.exists() or not [f for f in os.listdir(ipam_dir) if f[0].isdigit()]


def test_refused_add_keeps_a_bridge_it_did_not_make(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                    tmp_path: Path) -> None:
    node, ctr = netns_factory(), netns_factory()
    node.run(["ip", "link", "add", "cni-flr", "type", "bridge"])
    conf = conf_bytes(tmp_path, write_env(tmp_path), delegate={"bridge": "cni-flr"})
    _add_error(node, plugin_dir, ctr, conf, ifname="lo")
    assert "cni-flr" in _links(node)


def test_container_id_too_long_for_a_file_name(tmp_path: Path, container_ns: Namespace) -> None:
    """The saved config is named by the container ID: skel refuses an ADD with one over 255 bytes
    (code 4) before flannel runs; DEL of such an ID finds nothing saved and succeeds (it may be
    cleaning up after another implementation); CHECK answers with an error, never a traceback."""
    stdin = conf_bytes(tmp_path, write_env(tmp_path))
    kw = {"container_id": "c" * 256, "netns": container_ns, "cni_path": str(tmp_path / "nothing-here")}
    out = plugin_util.run("flannel", "ADD", stdin, **kw)
    assert out.exit_code == 1 and json.loads(out.stdout)["code"] == 4
    out = plugin_util.run("flannel", "DEL", stdin, **kw)
    assert (out.exit_code, out.stdout) == (0, b""), out
    out = plugin_util.run("flannel", "CHECK", stdin, **kw)
    assert out.exit_code == 1 and "code" in json.loads(out.stdout) and b"Traceback" not in out.stderr
    assert not (tmp_path / "flannel-data").exists()


def test_saved_config_for_the_longest_container_id(tmp_path: Path) -> None:
    """A 255-byte ID (the longest skel takes) still names the saved config and its temporary file."""
    from pycni import statefile

    path = flannel._scratch_path(str(tmp_path / "flannel-data"), "c" * 255)
    statefile.write_bytes(path, b"{}")
    assert os.listdir(tmp_path / "flannel-data") == ["c" * 255]


@pytest.mark.parametrize("attachments", [None, "absent", [{"containerID": 1}], [None]])
def test_gc_without_a_valid_list_removes_nothing(tmp_path: Path, attachments: object) -> None:
    data = tmp_path / "flannel-data"
    data.mkdir()
    (data / "ctr-1").write_text(json.dumps({"type": "bridge"}))
    conf = json.loads(conf_bytes(tmp_path, str(tmp_path / "gone.env")))
    conf["cniVersion"] = "1.1.0"
    if attachments != "absent":
        conf["cni.dev/valid-attachments"] = attachments
    out = plugin_util.run("flannel", "GC", conf, cni_path="/nonexistent")
    err = json.loads(out.stdout)
    assert out.exit_code == 1 and err["code"] == 7 and "valid-attachments" in err["msg"], err
    assert os.listdir(data) == ["ctr-1"]
    conf["cni.dev/valid-attachments"] = [{"containerID": "ctr-1", "ifname": "eth0"}]
    assert plugin_util.run("flannel", "GC", conf, cni_path="/nonexistent").exit_code == 0
    assert os.listdir(data) == ["ctr-1"]
    conf["cni.dev/valid-attachments"] = []
    assert plugin_util.run("flannel", "GC", conf, cni_path="/nonexistent").exit_code == 0
    assert os.listdir(data) == []


def test_gc_through_the_delegate_frees_what_is_not_listed(netns_factory: Callable[[], Namespace], plugin_dir: str,
                                                          tmp_path: Path) -> None:
    """GC reaches host-local through the bridge delegate with flannel's list: the attachment not on
    it loses its address and its saved config; without a list nothing changes."""
    node, c1, c2 = netns_factory(), netns_factory(), netns_factory()
    conf = json.loads(conf_bytes(tmp_path, write_env(tmp_path), delegate={"bridge": "cni-flgc"}))
    conf["cniVersion"] = "1.1.0"
    data = json.dumps(conf).encode()
    for cid, ctr in (("ctr-1", c1), ("ctr-2", c2)):
        run_flannel(node, plugin_dir, "ADD", ctr, cid, data)
    ipam_dir = tmp_path / "ipam" / "flnet"

    def state() -> tuple[list[bytes], list[str]]:
        held = sorted(p.read_bytes() for p in ipam_dir.iterdir() if p.name[0].isdigit())
        return held, sorted(os.listdir(tmp_path / "flannel-data"))

    assert state() == ([b"ctr-1\r\neth0", b"ctr-2\r\neth0"], ["ctr-1", "ctr-2"])
    with pytest.raises(CNIError) as e:
        run_flannel(node, plugin_dir, "GC", None, "", data)
    assert e.value.code == 7
    assert state() == ([b"ctr-1\r\neth0", b"ctr-2\r\neth0"], ["ctr-1", "ctr-2"])
    listed = json.dumps({**conf, "cni.dev/valid-attachments": [{"containerID": "ctr-1", "ifname": "eth0"}]})
    run_flannel(node, plugin_dir, "GC", None, "", listed.encode())
    assert state() == ([b"ctr-1\r\neth0"], ["ctr-1"])


SAMPLES: dict[type, object] = {int: 5, bool: False, str: "x", list: ["x"], dict: {"x": 1}, float: 1.5}
WRONG = [(key, value) for key, want in {"delegate": dict, "subnetFile": str, "dataDir": str, "ipam": dict,
                                        "runtimeConfig": dict}.items()
         for have, value in SAMPLES.items() if have is not want]


@pytest.mark.parametrize(("key", "value"), WRONG, ids=[f"{k}-{type(v).__name__}" for k, v in WRONG])
def test_wrong_type_is_refused_before_anything(tmp_path: Path, container_ns: Namespace, key: str,
                                               value: object) -> None:
    conf = json.loads(conf_bytes(tmp_path, write_env(tmp_path)))
    conf[key] = value
    out = plugin_util.run("flannel", "ADD", conf, container_id="c1", netns=container_ns,
                          cni_path=str(tmp_path / "nothing-here"))
    err = json.loads(out.stdout)
    assert out.exit_code == 1 and err["code"] in (6, 7) and key in err["msg"] + err.get("details", ""), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["subnet.env"]
