"""Go's encoding/json key matching (pycni.spec.gokeys), checked against Go itself.

Runtimes rely on Go decoding object keys into struct fields without regard to case: containerd's
CRI sends ``{"HostPort": 8080, "ContainerPort": 80}`` and ``{"IngressRate": ..., "IngressBurst":
4294967295}``; the reference's own tests write ``"RuntimeConfig"`` and ``"bandWidth"``. Here:

* the matcher against Go's decoder on the same objects (tests/interop/gokeys, built here);
* each capability a runtime sends (portMappings, bandwidth, ipRanges, ips, mac, deviceID), and the
  top-level keys, read the same in Go's and in camel spelling by every plugin that takes it;
* the same inputs run through the Go plugin (/usr/lib/cni) and ours in throwaway namespaces,
  results and kernel state compared (iptables for portmap, tbf/ifb for bandwidth, the MAC for
  tuning/bridge/macvlan, addresses for static/host-local);
* the capabilities no reference plugin reads (dns, aliases, infinibandGUID, cgroupPath,
  io.kubernetes.cri.pod-annotations, ...) reach the plugin exactly as Go's libcni passes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from plugin_util import run

from pycni.skel import CmdArgs
from pycni.spec.gokeys import fold, has, lookup

GO = "/usr/lib/cni"
NO_NETNS = "/var/run/netns/none"  # IPAM and config-only calls enter no namespace
KELVIN, LONG_S = "\u212a", "\u017f"


def need_go(*types: str) -> None:
    missing = [t for t in types if not os.access(os.path.join(GO, t), os.X_OK)]
    if missing:
        pytest.skip(f"Go reference plugins missing from {GO}: {missing}")


# ---- the matcher -----------------------------------------------------------------------------
@pytest.mark.parametrize("obj,name,want", [
    ({"mac": "a"}, "mac", "a"),
    ({"MAC": "a"}, "mac", "a"),
    ({"Mac": "a"}, "mac", "a"),
    ({"HostPort": 1}, "hostPort", 1),
    ({"host_port": 1}, "hostPort", None),            # punctuation must match
    ({"hostport ": 1}, "hostPort", None),
    ({"mac": "a", "MAC": "b"}, "mac", "b"),           # every key naming the field is decoded: last wins
    ({"MAC": "b", "mac": "a"}, "mac", "a"),           # an exact key has no priority over a later folded one
    ({"hostport": 5, "hostPort": 6, "HOSTPORT": 7}, "hostPort", 7),
    ({"mac": "a", "MAC": None}, "mac", "a"),          # null leaves the field as it was
    ({"mac": None}, "mac", None),
    ({"rc": {"a": 1}, "RC": {"b": 2}}, "rc", {"a": 1, "b": 2}),  # two objects: merged into one field
    ({"ips": [1], "IPS": [2, 3]}, "ips", [2, 3]),     # two lists: the last replaces
    ({f"ma{KELVIN.lower()}": 1}, "mak", 1),
    ({f"mas{KELVIN}": "kelvin"}, "mask", "kelvin"),   # U+212A KELVIN SIGN folds to k
    ({f"ip{LONG_S}": ["x"]}, "ips", ["x"]),           # U+017F LONG S folds to s
    ({"ma\u0131": "x"}, "mai", None),                 # dotless i does not fold to i in Go
    ({"m\u0130c": "x"}, "mic", None),                 # nor dotted capital I
    ({"cni.dev/Valid-Attachments": []}, "cni.dev/valid-attachments", []),
    ({"IO.Kubernetes.CRI.Pod-Annotations": {"a": "b"}}, "io.kubernetes.cri.pod-annotations", {"a": "b"}),
    ([["mac", "a"]], "mac", None),                    # not an object
    ("mac", "mac", None),
])
def test_lookup(obj: Any, name: str, want: Any) -> None:
    assert lookup(obj, name) == want


def test_lookup_default_and_has() -> None:
    assert lookup({}, "mtu", 1500) == 1500 and lookup({"MTU": None}, "mtu", 1500) == 1500
    assert has({"IngressRate": None}, "ingressRate")  # Go allocates an embedded entry even for null
    assert not has({"ingress_rate": 1}, "ingressRate") and not has(None, "x")
    assert fold(f"Ip{LONG_S}") == fold("IPS") == "ips" and fold(f"{KELVIN}ey") == "key"


def test_output_spelling_stays_canonical() -> None:
    """Read in any case, written as the spec spells it."""
    from pycni.spec.types import Result

    r = Result.from_dict({"CNIVersion": "1.0.0", "IPs": [{"Address": "10.1.0.5/24", "GateWay": "10.1.0.1",
                                                          "Interface": 0}],
                          "Interfaces": [{"Name": "eth0", "MAC": "0a:00:00:00:00:01", "Sandbox": "/x"}],
                          "Routes": [{"Dst": "0.0.0.0/0", "GW": "10.1.0.1"}], "DNS": {"Nameservers": ["10.1.0.1"]}})
    assert r.to_dict() == {"cniVersion": "1.0.0",
                           "interfaces": [{"name": "eth0", "mac": "0a:00:00:00:00:01", "sandbox": "/x"}],
                           "ips": [{"interface": 0, "address": "10.1.0.5/24", "gateway": "10.1.0.1"}],
                           "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}], "dns": {"nameservers": ["10.1.0.1"]}}
    legacy = Result.from_dict({"IP4": {"IP": "10.1.0.5/24", "Gateway": "10.1.0.1"}}, "0.2.0")
    assert legacy.to_dict("0.2.0")["ip4"] == {"ip": "10.1.0.5/24", "gateway": "10.1.0.1"}


# What tests/interop/gokeys decodes: its struct's field names, types and zero values.
GO_FIELDS: dict[str, Any] = {"mac": "", "mask": "", "ips": None, "hostPort": 0, "inner": None, "labels": None,
                             "io.kubernetes.cri.pod-annotations": None, "cni.dev/valid-attachments": "",
                             "infinibandGUID": ""}
GO_CASES: list[dict[str, Any]] = [
    {"mac": "a"}, {"MAC": "a"}, {"mAc": "a", "Mac": "b"}, {"MAC": "b", "mac": "a"}, {"mac": "a", "MAC": None},
    {"MASK": "m"}, {f"mas{KELVIN}": "kelvin"}, {f"MA{LONG_S}K": "longs"}, {f"Ip{LONG_S}": ["x"]},
    {"ips": ["1"], "IPS": ["2", "3"]}, {"IPs": None}, {"HostPort": 5}, {"host_port": 5}, {"hostport": 5, "HOSTPORT": 7},
    {"inner": {"a": "1"}, "Inner": {"b": "2"}}, {"INNER": {"A": "x", "a": "y"}}, {"inner": {"a": "1"}, "inner ": {}},
    {"labels": {"x": "1"}, "Labels": {"y": "2", "x": "3"}}, {"Labels": {"X": "1"}},
    {"IO.KUBERNETES.CRI.POD-ANNOTATIONS": {"k": "v"}}, {"io.kubernetes.cri.pod_annotations": {"k": "v"}},
    {"CNI.dev/valid-attachments": "v"}, {"InfiniBandGuid": "g"}, {"ma\u0131": "x"}, {"m\u0130c": "y"},
    {"mac": "a", "unknown": 1, "MAC ": "b"},
]


def _as_go(obj: dict[str, Any]) -> dict[str, Any]:
    """The struct tests/interop/gokeys decodes ``obj`` into, computed with our matcher."""
    out = {}
    for name, zero in GO_FIELDS.items():
        value = lookup(obj, name)
        if name == "inner":
            value = {"a": lookup(value, "a") or "", "b": lookup(value, "b") or ""}
        out[name] = zero if value is None else value
    return out


def test_matcher_agrees_with_go_decoder(tmp_path_factory: pytest.TempPathFactory) -> None:
    import subprocess

    from interop.gobuild import GoUnavailable, build

    try:
        tool = build("gokeys", str(tmp_path_factory.mktemp("gokeys")))
    except GoUnavailable as e:
        pytest.skip(str(e))
    proc = subprocess.run([tool], input=json.dumps(GO_CASES), capture_output=True, text=True, timeout=60, check=True)
    go = json.loads(proc.stdout)
    for case, theirs in zip(GO_CASES, go, strict=True):
        theirs["inner"] = {k.lower(): v for k, v in theirs.pop("Inner", theirs.get("inner", {})).items()} \
            if "Inner" in theirs else theirs["inner"]
        assert _as_go(case) == theirs, case


# ---- each capability and top-level key, parsed the same in both spellings ----------------------
def _args(conf: dict[str, Any], command: str = "ADD", cni_args: str = "") -> CmdArgs:
    return CmdArgs(command, container_id="c1", netns="/var/run/netns/none", ifname="eth0", args=cni_args,
                   path=GO, stdin_data=json.dumps(conf).encode())


PREV = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
        "ips": [{"address": "10.1.0.5/24", "interface": 0}]}


def test_portmap_mappings_in_go_spelling() -> None:
    from pycni.plugins.meta.portmap.plugin import parse_conf

    camel = {"cniVersion": "1.0.0", "name": "n", "type": "portmap", "prevResult": PREV,
             "runtimeConfig": {"portMappings": [{"hostPort": 18081, "containerPort": 8080, "protocol": "udp",
                                                 "hostIP": "10.0.0.1"}]}}
    # containerd 1.6's CRI: Go field names, and an empty HostIP.
    cri = {"CNIVersion": "1.0.0", "Name": "n", "Type": "portmap", "PrevResult": PREV,
           "RuntimeConfig": {"PortMappings": [{"HostPort": 18081, "ContainerPort": 8080, "Protocol": "UDP",
                                               "HostIP": "10.0.0.1"}]}}
    a, b = parse_conf(_args(camel)), parse_conf(_args(cri))
    assert a.mappings == b.mappings and len(a.mappings) == 1
    assert (a.mappings[0].host_port, a.mappings[0].container_port) == (18081, 8080)
    assert a.prev == b.prev and a.name == b.name == "n"
    assert parse_conf(_args({**cri, "RuntimeConfig": {"portMappings": [
        {"HostPort": 1, "ContainerPort": 2, "Protocol": "tcp", "HostIP": ""}]}})).mappings[0].host_ip == ""


@pytest.mark.parametrize("spelling", [
    {"runtimeConfig": {"bandwidth": {"ingressRate": 8000, "ingressBurst": 800, "egressRate": 16000,
                                     "egressBurst": 1600}}},
    {"runtimeConfig": {"bandwidth": {"IngressRate": 8000, "IngressBurst": 800, "EgressRate": 16000,
                                     "EgressBurst": 1600}}},
    {"RuntimeConfig": {"bandWidth": {"ingressRate": 8000, "ingressBurst": 800, "egressRate": 16000,
                                     "egressBurst": 1600}}},
    {"IngressRate": 8000, "INGRESSBURST": 800, "egressrate": 16000, "egressBurst": 1600},
])
def test_bandwidth_in_any_spelling(spelling: dict[str, Any]) -> None:
    from pycni.plugins.meta import bandwidth as bw

    c = bw.parse_conf(_args({"cniVersion": "1.0.0", "name": "n", "type": "bandwidth", "prevResult": PREV,
                             **spelling}))
    assert c.ingress == bw.Limits(1000, 100) and c.egress == bw.Limits(2000, 200)


def test_bandwidth_top_level_entry_wins_in_any_spelling() -> None:
    """Go embeds the entry: any of its keys at the top level, in any case, replaces runtimeConfig's."""
    from pycni.plugins.meta import bandwidth as bw

    conf = {"cniVersion": "1.0.0", "name": "n", "type": "bandwidth", "prevResult": PREV, "EgressRate": None,
            "runtimeConfig": {"bandwidth": {"ingressRate": 8000, "ingressBurst": 800}}}
    assert bw.parse_conf(_args(conf)).is_zero


def test_host_local_ip_ranges_and_ips(tmp_path: Path) -> None:
    from pycni.plugins.ipam import host_local

    def conf(rc: dict[str, Any], **top: Any) -> dict[str, Any]:
        return {"cniVersion": "1.0.0", "name": "n", "type": "bridge", **top,
                "ipam": {"type": "host-local", "dataDir": str(tmp_path)}, "runtimeConfig": rc}

    camel = host_local.parse_conf(_args(conf({"ipRanges": [[{"subnet": "10.5.0.0/24", "rangeStart": "10.5.0.10"}]],
                                               "ips": ["10.5.0.20"]})))
    go = host_local.parse_conf(_args(conf({"IPRanges": [[{"Subnet": "10.5.0.0/24", "RangeStart": "10.5.0.10"}]],
                                            "IPs": ["10.5.0.20"]})))
    assert camel.range_sets == go.range_sets and camel.requested == go.requested and camel.requested
    # The legacy single range, routes and args in Go's spelling too.
    legacy = {"cniVersion": "1.0.0", "name": "n", "IPAM": {"Type": "host-local", "DataDir": str(tmp_path),
                                                           "Subnet": "10.6.0.0/24", "Routes": [{"Dst": "0.0.0.0/0"}]},
              "Args": {"CNI": {"IPs": ["10.6.0.7"]}}}
    c = host_local.parse_conf(_args(legacy))
    assert [str(r.dst) for r in c.routes] == ["0.0.0.0/0"] and [str(ip) for ip in c.requested] == ["10.6.0.7"]


def test_static_ips_and_dns_capability_spelling() -> None:
    from pycni.plugins.ipam import static

    base = {"cniVersion": "1.0.0", "name": "n", "type": "static", "ipam": {"type": "static"}}
    camel = static.parse_conf(_args({**base, "runtimeConfig": {"ips": ["10.9.0.5/24"]}}))
    go = static.parse_conf(_args({**base, "RuntimeConfig": {"IPs": ["10.9.0.5/24"]}}))
    args = static.parse_conf(_args({**base, "args": {"cni": {"Ips": ["10.9.0.5/24"]}}}))
    assert camel.addresses == go.addresses == args.addresses and camel.addresses
    dns = static.parse_conf(_args({**base, "ipam": {"type": "static", "Addresses": [{"Address": "10.9.0.6/24"}],
                                                    "DNS": {"Nameservers": ["10.9.0.1"]}}}))
    assert dns.dns.nameservers == ["10.9.0.1"] and str(dns.addresses[0].address) == "10.9.0.6/24"


@pytest.mark.parametrize("rc_key,mac_key", [("runtimeConfig", "mac"), ("RuntimeConfig", "mac"),
                                            ("runtimeConfig", "MAC"), ("RUNTIMECONFIG", "Mac")])
def test_mac_capability_in_every_plugin_that_takes_it(rc_key: str, mac_key: str) -> None:
    from pycni.plugins.main import bridge, macvlan, tap
    from pycni.plugins.meta import tuning

    mac = "0a:58:0a:f4:00:05"
    base = {"cniVersion": "1.0.0", "name": "n", rc_key: {mac_key: mac}}
    assert tuning.parse_conf(_args({**base, "type": "tuning", "prevResult": PREV})).mac == mac
    assert bridge.parse_conf(_args({**base, "type": "bridge", "ipam": {"type": "host-local"}})).mac == mac
    assert macvlan.parse_conf(_args({**base, "type": "macvlan", "master": "eth0",
                                     "ipam": {"type": "host-local"}})).mac == mac
    assert tap.parse_conf(_args({**base, "type": "tap"})).mac == mac


def test_device_id_capability() -> None:
    from pycni.plugins.main import host_device

    for rc in ({"runtimeConfig": {"deviceID": "0000:00:01.0"}}, {"RuntimeConfig": {"DeviceID": "0000:00:01.0"}}):
        c = host_device.parse_conf(_args({"cniVersion": "1.0.0", "name": "n", "type": "host-device", **rc}))
        assert c.pci_bus_id == "0000:00:01.0"


def test_top_level_keys_in_go_spelling() -> None:
    """cniVersion, name, prevResult (and what is inside it) as skel and the readers see them."""
    from pycni.skel import config_version, prev_result

    conf = {"CNIVersion": "0.4.0", "NAME": "n", "Type": "bandwidth",
            "PrevResult": {"Interfaces": [{"Name": "eth0"}], "IPs": [{"Version": "4", "Address": "10.1.0.5/24"}]}}
    assert config_version(conf) == "0.4.0"
    prev = prev_result(conf)
    assert prev is not None and prev.cni_version == "0.4.0" and str(prev.ips[0].address) == "10.1.0.5/24"
    out = run("bandwidth", "ADD", conf, container_id="c1", netns=NO_NETNS)
    assert out.exit_code == 0, out.stdout
    assert json.loads(out.stdout)["cniVersion"] == "0.4.0" and "ips" in json.loads(out.stdout)


def test_valid_attachments_in_go_spelling() -> None:
    from pycni import netconf

    conf = {"cni.dev/Valid-Attachments": [{"ContainerID": "c1", "IfName": "eth0"}]}
    assert netconf.valid_attachments(conf) == [("c1", "eth0")]


def test_maps_keep_exact_keys() -> None:
    """What Go reads as a map keeps its keys as written: tuning's sysctl names, a conflist's
    capabilities (only the exact capability name enables it)."""
    from pycni.plugins.meta import tuning
    from pycni.runtime.conf import conf_from_bytes

    c = tuning.parse_conf(_args({"cniVersion": "1.0.0", "name": "n", "type": "tuning",
                                 "prevResult": PREV, "SysCtl": {"net.ipv4.conf.IFNAME.arp_filter": "1"}}))

    assert [(s.key, s.path) for s in c.sysctls] == [("net.ipv4.conf.IFNAME.arp_filter",
                                                     "/proc/sys/net/ipv4/conf/eth0/arp_filter")]
    p = conf_from_bytes(json.dumps({"Type": "portmap", "Capabilities": {"PortMappings": True, "bandwidth": True}}))
    assert p.type == "portmap" and p.capabilities == {"PortMappings": True, "bandwidth": True}



# ---- the same inputs through the Go plugins and ours, in namespaces ------------------------------
def _go(host: Namespace, plugin: str, command: str, conf: dict[str, Any], cid: str, netns: str) -> tuple[int, Any]:
    out = run(plugin, command, conf, via="exec", host=host, cni_path=GO, container_id=cid, netns=netns)
    return out.exit_code, (json.loads(out.stdout) if out.stdout.strip() else None)


def _ours(host: Namespace, module: Any, command: str, conf: dict[str, Any], cid: str, netns: str) -> tuple[int, Any]:
    out = run(module.PLUGIN, command, conf, host=host, container_id=cid, netns=netns)
    return out.exit_code, (json.loads(out.stdout) if out.stdout.strip() else None)


def _go_ipam(plugin: str, conf: dict[str, Any]) -> tuple[int, Any]:
    """An ADD by the Go IPAM plugin, which touches no namespace (run directly)."""
    p = run(plugin, "ADD", conf, via="exec", cni_path=GO, container_id="c1", netns=NO_NETNS)
    out = json.loads(p.stdout) if p.stdout.strip() else None
    if isinstance(out, dict) and out.get("dns") == {} and str(out.get("cniVersion")).startswith("1."):
        out.pop("dns")  # Go 1.1.1 prints an empty "dns" at 1.x; the current reference and ours omit it
    return p.exit_code, out


def _mac(ns: Namespace, dev: str = "eth0") -> str:
    return str(json.loads(ns.run(["ip", "-j", "link", "show", dev]).stdout)[0]["address"])


@pytest.mark.parametrize("version", ["1.0.0", "0.3.1", "0.2.0", "0.1.0"])
@pytest.mark.parametrize("spelling", ["RuntimeConfig", "IPs", "args"])
def test_static_same_result_as_go(version: str, spelling: str) -> None:
    """The reference's static tests write "RuntimeConfig"; at 0.1.0/0.2.0 the result must still convert."""
    need_go("static")
    from pycni.plugins.ipam import static

    ips = ["10.10.0.1/24", "3ffe:ffff:0:1ff::1/64"]  # the reference's spec: one address of each family

    extra = {"RuntimeConfig": {"ips": ips}} if spelling == "RuntimeConfig" else \
        {"runtimeConfig": {"IPs": ips}} if spelling == "IPs" else {"Args": {"cni": {"IPs": ips}}}
    conf = {"cniVersion": version, "name": "mynet", "type": "ipvlan", "master": "foo0",
            "capabilities": {"ips": True}, "ipam": {"type": "static", "routes": [{"dst": "0.0.0.0/0"}]}, **extra}
    go_rc, go_out = _go_ipam("static", conf)
    out = run(static.PLUGIN, "ADD", conf, container_id="c1", netns=NO_NETNS)
    assert (out.exit_code, json.loads(out.stdout)) == (go_rc, go_out)
    assert go_rc == 0 and ("ips" in go_out or "ip4" in go_out)


def test_host_local_same_address_as_go(tmp_path: Path) -> None:
    need_go("host-local")
    from pycni.plugins.ipam import host_local

    def conf(data: str) -> dict[str, Any]:
        return {"cniVersion": "1.0.0", "name": "n", "type": "bridge",
                "IPAM": {"Type": "host-local", "DataDir": str(tmp_path / data)},
                "RuntimeConfig": {"IPRanges": [[{"Subnet": "10.5.0.0/24", "RangeStart": "10.5.0.10"}],
                                               [{"Subnet": "fd05::/64"}]],
                                  "IPs": ["10.5.0.20"]}}

    go_rc, go_out = _go_ipam("host-local", conf("go"))
    assert go_rc == 0, go_out
    ours = run(host_local.PLUGIN, "ADD", conf("ours"), container_id="c1", netns=NO_NETNS)
    assert ours.exit_code == 0, ours.stdout
    assert json.loads(ours.stdout) == go_out
    assert [ip["address"] for ip in go_out["ips"]] == ["10.5.0.20/24", "fd05::2/64"]


@pytest.mark.parametrize("rc", [{"RuntimeConfig": {"mac": "0a:58:0a:f4:00:05"}},
                                {"runtimeConfig": {"Mac": "0a:58:0a:f4:00:05"}}])
def test_tuning_mac_as_go(rc: dict[str, Any], netns_factory: Callable[[], Namespace], tmp_path: Path) -> None:
    need_go("tuning")
    from pycni.plugins.meta import tuning

    host = netns_factory()
    macs = {}
    for who in ("go", "ours"):
        cont = netns_factory()
        cont.run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "gdp0"])
        conf = {"cniVersion": "1.0.0", "name": "n", "type": "tuning", "dataDir": str(tmp_path / who),
                "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": cont.path}]}, **rc}
        run = _go if who == "go" else _ours
        target: Any = "tuning" if who == "go" else tuning
        code, res = run(host, target, "ADD", conf, "c1", cont.path)  # type: ignore[operator]
        assert code == 0, res
        macs[who] = (_mac(cont), res["interfaces"][0].get("mac"))
    assert macs["go"] == macs["ours"] == ("0a:58:0a:f4:00:05", "0a:58:0a:f4:00:05")


@pytest.mark.parametrize("plugin", ["bridge", "macvlan"])
def test_interface_plugin_mac_as_go(plugin: str, netns_factory: Callable[[], Namespace], tmp_path: Path) -> None:
    """The reference's bridge and macvlan tests pass the MAC as "RuntimeConfig": {"mac": ...}."""
    need_go(plugin, "host-local")
    from pycni.plugins.main import bridge, macvlan

    module = {"bridge": bridge, "macvlan": macvlan}[plugin]
    mac = "c2:11:22:33:44:55"
    got = {}
    for who in ("go", "ours"):
        host, cont = netns_factory(), netns_factory()
        conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": "n", "type": plugin, "RuntimeConfig": {"mac": mac},
                                "ipam": {"type": "host-local", "subnet": "10.44.0.0/24",
                                         "dataDir": str(tmp_path / who)}}
        if plugin == "bridge":
            conf["bridge"] = "gdbr0"
        else:
            host.run(["ip", "link", "add", "gdm0", "type", "veth", "peer", "name", "gdm1"])

            host.run(["ip", "link", "set", "gdm0", "up"])
            conf["master"] = "gdm0"
        code, res = (_go(host, plugin, "ADD", conf, "c1", cont.path) if who == "go"
                     else _ours(host, module, "ADD", conf, "c1", cont.path))
        assert code == 0, res
        got[who] = (_mac(cont), [i["mac"] for i in res["interfaces"] if i.get("sandbox")])
    assert got["go"] == got["ours"] == (mac, [mac])


def _portmap_host(netns_factory: Callable[[], Namespace]) -> tuple[Namespace, Namespace, dict[str, Any]]:
    host, cont = netns_factory(), netns_factory()
    for cmd in ("ip link add gdbr0 type bridge", "ip addr add 10.88.0.1/24 dev gdbr0", "ip link set gdbr0 up",
                f"ip link add gdv0 type veth peer name eth0 netns {cont.name}", "ip link set gdv0 master gdbr0",
                "ip link set gdv0 up"):
        host.run(cmd.split())
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "gdbr0"}, {"name": "gdv0"},
                                                  {"name": "eth0", "sandbox": cont.path}],
            "ips": [{"address": "10.88.0.10/24", "gateway": "10.88.0.1", "interface": 2}]}
    return host, cont, prev


def _nat(host: Namespace) -> list[str]:
    save = host.run(["iptables-save", "-t", "nat"]).stdout
    return sorted(line for line in save.splitlines() if line.startswith(("-A", ":CNI")))


def test_portmap_cri_spelling_same_rules_as_go(netns_factory: Callable[[], Namespace]) -> None:
    """containerd 1.6 sends {"HostPort", "ContainerPort", "Protocol", "HostIP": ""}: the Go plugin
    and ours (given that, or the camelCase spelling) make the same nat rules; DEL removes them."""
    need_go("portmap")
    from pycni.plugins.meta import portmap

    cri = [{"HostPort": 18081, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""},
           {"HostPort": 15353, "ContainerPort": 53, "Protocol": "udp", "HostIP": ""}]
    camel = [{"hostPort": 18081, "containerPort": 8080, "protocol": "tcp"},
             {"hostPort": 15353, "containerPort": 53, "protocol": "udp"}]
    rules = {}
    for who, maps in (("go", cri), ("ours-cri", cri), ("ours-camel", camel)):
        host, cont, prev = _portmap_host(netns_factory)
        conf = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "portmap",
                "capabilities": {"portMappings": True}, "prevResult": prev, "runtimeConfig": {"portMappings": maps}}
        if who != "go":
            conf["backend"] = "iptables"
        code, res = (_go(host, "portmap", "ADD", conf, "sandbox1", cont.path) if who == "go"
                     else _ours(host, portmap, "ADD", conf, "sandbox1", cont.path))
        assert code == 0, res
        rules[who] = _nat(host)
        assert any("--dport 18081" in r for r in rules[who]) and any("--dport 15353" in r for r in rules[who])
        code, res = (_go(host, "portmap", "DEL", conf, "sandbox1", cont.path) if who == "go"
                     else _ours(host, portmap, "DEL", conf, "sandbox1", cont.path))
        assert code == 0, res
        assert not any("18081" in r for r in _nat(host))
    assert rules["go"] == rules["ours-cri"] == rules["ours-camel"]


@pytest.mark.parametrize("spelling", ["cri", "reference"])
def test_bandwidth_go_spelling_same_qdiscs_as_go(spelling: str, netns_factory: Callable[[], Namespace],
                                                tmp_path: Path) -> None:
    """Go-cased bandwidth entries (containerd) and "RuntimeConfig"/"bandWidth" (the reference's
    tests) shape as the Go plugin shapes: same tbf on the veth and on the ifb."""
    need_go("bandwidth", "bridge", "host-local")
    from pycni.net import tc
    from pycni.plugins.meta import bandwidth as bw

    host = netns_factory()
    limits = {"IngressRate": 3_000_000, "IngressBurst": 200_000, "EgressRate": 5_000_000, "EgressBurst": 300_000}
    rc: dict[str, Any] = ({"runtimeConfig": {"bandwidth": limits}} if spelling == "cri" else
                          {"RuntimeConfig": {"bandWidth": {k[0].lower() + k[1:]: v for k, v in limits.items()}}})
    state = {}
    for who in ("go", "ours"):
        cont, cid = netns_factory(), f"c-{who}"
        br = {"cniVersion": "1.0.0", "name": "bwnet", "type": "bridge", "bridge": "gdbw0",
              "ipam": {"type": "host-local", "subnet": "10.77.0.0/24", "dataDir": str(tmp_path)}}
        code, prev = _go(host, "bridge", "ADD", br, cid, cont.path)
        assert code == 0, prev
        conf = {"cniVersion": "1.0.0", "name": "bwnet", "type": "bandwidth", "prevResult": prev, **rc}
        code, res = (_go(host, "bandwidth", "ADD", conf, cid, cont.path) if who == "go"
                     else _ours(host, bw, "ADD", conf, cid, cont.path))
        assert code == 0, res
        veth = [i["name"] for i in prev["interfaces"] if "sandbox" not in i and i["name"] != "gdbw0"][0]
        with host.enter():
            state[who] = ([(q.kind, q.params) for q in tc.qdiscs(veth) or []],
                          [(q.kind, q.params) for q in tc.qdiscs(bw.ifb_name("bwnet", cid)) or []])
        assert res["interfaces"][-1]["name"] == bw.ifb_name("bwnet", cid)
    assert state["go"] == state["ours"]
    assert [k for k, _ in state["ours"][0]] == ["tbf", "ingress"] and [k for k, _ in state["ours"][1]] == ["tbf"]


# ---- capabilities no reference plugin reads: passed on as Go's libcni passes them ---------------
RECORDER = """#!/bin/sh
d=$(dirname "$0")
if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}'; exit 0
fi
cat > "$d/$CNI_COMMAND.$(basename "$0").json"
[ "$CNI_COMMAND" = ADD ] && echo '{"cniVersion":"1.0.0"}'
exit 0
"""

CAPS = {"portMappings": [{"HostPort": 18081, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""}],
        "bandwidth": {"IngressRate": 10_000_000, "IngressBurst": 4294967295, "EgressRate": 10_000_000,
                      "EgressBurst": 4294967295},
        "ipRanges": [[{"subnet": "10.5.0.0/24"}]], "ips": ["10.5.0.20/24"], "mac": "0a:58:0a:f4:00:05",
        "dns": {"Servers": ["10.96.0.10"], "Searches": ["svc.cluster.local"], "Options": ["ndots:5"]},
        "aliases": {"mynet": ["web", "www"]}, "infinibandGUID": "c2:11:22:33:44:55:66:77",
        "deviceID": "0000:00:01.0", "cgroupPath": "/kubepods/burstable/pod1234",
        "io.kubernetes.cri.pod-annotations": {"kubernetes.io/ingress-bandwidth": "10M"}}


def test_capabilities_reach_the_plugin_as_go_libcni_sends_them(go_libcni_tool: str, host_ns: Namespace,
                                                               container_ns: Namespace, tmp_path: Path) -> None:
    """Every capability containerd, CRI-O and Podman send, with Go-cased entries, given to a
    recorder by Go's libcni and by ours: the same runtimeConfig (values untouched, capability
    names exact: a "Capabilities" key is read as Go reads it, "PortMappings" enables nothing)."""
    import subprocess

    from pycni.runtime import CNI

    caps = {name: True for name in CAPS}
    conflist = {"cniVersion": "1.0.0", "name": "gdcaps",
                "plugins": [{"type": "gd-rec-a", "capabilities": caps},
                            {"Type": "gd-rec-b", "Capabilities": {"PortMappings": True, "dns": True}}]}
    stdins = {}
    for who in ("go", "ours"):
        d = tmp_path / who
        (d / "net.d").mkdir(parents=True)
        (d / "bin").mkdir()
        (d / "net.d" / "10-gdcaps.conflist").write_text(json.dumps(conflist))
        for name in ("gd-rec-a", "gd-rec-b"):
            (d / "bin" / name).write_text(RECORDER)
            (d / "bin" / name).chmod(0o755)
        if who == "go":
            proc = subprocess.run([go_libcni_tool, "-confdir", str(d / "net.d"), "-net", "gdcaps", "-path",
                                   str(d / "bin"), "-cachedir", str(d / "cache"), "-cid", "c1", "-netns",
                                   container_ns.path, "-ifname", "eth0", "-cap", json.dumps(CAPS), "add"],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        else:
            rt = CNI(conf_dir=str(d / "net.d"), plugin_path=[str(d / "bin")], cache_dir=str(d / "cache"))
            with host_ns.enter():
                rt.add(rt.load_network("gdcaps"), "c1", container_ns.path, "eth0", capability_args=CAPS)
        stdins[who] = {n: json.loads((d / "bin" / f"ADD.{n}.json").read_text()) for n in ("gd-rec-a", "gd-rec-b")}
    go, ours = stdins["go"], stdins["ours"]
    assert go["gd-rec-a"]["runtimeConfig"] == CAPS
    assert ours["gd-rec-a"]["runtimeConfig"] == go["gd-rec-a"]["runtimeConfig"]
    assert ours["gd-rec-b"].get("runtimeConfig") == go["gd-rec-b"].get("runtimeConfig") == {"dns": CAPS["dns"]}


@pytest.mark.parametrize("where", ["RuntimeConfig", "args"])
def test_static_invalid_cidr_from_ips_has_go_message(where: str) -> None:
    """The reference's static test "errors when passed an invalid CIDR via RuntimeConfig"."""
    need_go("static")
    from pycni.plugins.ipam import static

    extra = {"RuntimeConfig": {"ips": ["10.10.0.1"]}} if where == "RuntimeConfig" else \
        {"args": {"cni": {"ips": ["10.10.0.1"]}}}
    conf = {"cniVersion": "1.0.0", "name": "mynet", "type": "bridge",
            "ipam": {"type": "static", "routes": [{"dst": "0.0.0.0/0"}]}, **extra}
    go_rc, go_out = _go_ipam("static", conf)
    out = run(static.PLUGIN, "ADD", conf, container_id="c1", netns=NO_NETNS)
    ours = json.loads(out.stdout)
    assert go_rc == out.exit_code == 1
    assert ours["msg"] == go_out["msg"] == "an entry in the 'ips' field is NOT in CIDR notation, got: '10.10.0.1'"
    assert ours["code"] == 7


# ---- the Kubernetes path without kubelet: Go's libcni, CRI's capability args, our executables ----
SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(4); print("ready", flush=True)
while True:
    c, peer = s.accept(); c.sendall(b"pod\\n"); c.close()
"""


def test_cri_pod_with_host_port_and_bandwidth_under_go_libcni(go_libcni_tool: str, host_ns: Namespace,
                                                             container_ns: Namespace, plugin_dir: str,
                                                             tmp_path: Path) -> None:
    """What containerd 1.6's CRI does for a pod with a hostPort and bandwidth annotations: go-cni
    calls libcni with Go-cased portMappings and bandwidth (burst MaxUint32). Our bridge,
    host-local, portmap and bandwidth executables start the pod (hostPort answers, tbf on the
    veth and the ifb), and the DEL that repeats the same runtimeConfig removes everything."""
    import subprocess
    import sys

    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    conflist = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [
        {"type": "bridge", "bridge": "gdcni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.86.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}],
                  "dataDir": str(tmp_path / "ipam")}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}}]}
    (conf_dir / "10-k8s.conflist").write_text(json.dumps(conflist))
    caps = {"portMappings": [{"HostPort": 18081, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""}],
            "bandwidth": {"IngressRate": 10_000_000, "IngressBurst": 4294967295, "EgressRate": 10_000_000,
                          "EgressBurst": 4294967295}}

    def libcni(command: str) -> Any:
        argv = [go_libcni_tool, "-confdir", str(conf_dir), "-net", "k8s-pod-network", "-path", plugin_dir,
                "-cachedir", str(tmp_path / "cache"), "-cid", "sandbox1", "-netns", container_ns.path,
                "-ifname", "eth0", "-args", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web",
                "-cap", json.dumps(caps), command]
        p = host_ns.run(argv, check=False, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                "PYCNI_SOCKET": "off"})
        assert p.returncode == 0, f"libcni {command}: {p.stdout} {p.stderr}"
        return json.loads(p.stdout) if p.stdout.strip() else None

    res = libcni("add")
    pod_ip = res["ips"][0]["address"].split("/")[0]
    host_veth = [i["name"] for i in res["interfaces"] if not i.get("sandbox") and i["name"] != "gdcni0"
                 and not i["name"].startswith("bwp")][0]
    assert any(i["name"].startswith("bwp") for i in res["interfaces"])
    server = subprocess.Popen(["ip", "netns", "exec", container_ns.name, sys.executable, "-c", SERVER],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        got = host_ns.run([sys.executable, "-c", "import socket; c = socket.create_connection(('10.86.0.1', 18081),"
                                                 " timeout=5); print(c.recv(16).decode().strip())"], timeout=20)
        assert got.stdout.strip() == "pod"
    finally:
        server.kill()
        server.wait()
    nat = host_ns.run(["iptables-save", "-t", "nat"]).stdout
    assert f"--dport 18081 -j DNAT --to-destination {pod_ip}:8080" in nat
    tbf = host_ns.run(["tc", "qdisc", "show", "dev", host_veth]).stdout
    assert "tbf" in tbf and "rate 10Mbit" in tbf
    libcni("check")
    libcni("del")
    libcni("del")  # StopPodSandbox repeats it
    assert "18081" not in host_ns.run(["iptables-save", "-t", "nat"]).stdout
    assert "bwp" not in host_ns.run(["ip", "-o", "link"]).stdout


def test_delegate_answers_in_go_spelling(tmp_path: Path) -> None:
    """What a plugin prints is read as libcni reads it: version info, errors and results whose
    keys are in another case (Go's structs) mean the same."""
    from pycni import invoke
    from pycni.spec.errors import CNIError

    plugin = tmp_path / "gd-go-cased"
    plugin.write_text("#!/bin/sh\n"
                      "case $CNI_COMMAND in\n"
                      "VERSION) echo '{\"CNIVersion\":\"1.0.0\",\"SupportedVersions\":[\"0.4.0\",\"1.0.0\"]}';;\n"
                      "ADD) echo '{\"CNIVersion\":\"1.0.0\",\"IPs\":[{\"Address\":\"10.3.0.2/24\"}]}';;\n"
                      "*) echo '{\"Code\":7,\"Msg\":\"bad config\",\"Details\":\"why\"}'; exit 1;;\n"
                      "esac\n")
    plugin.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "CNI_COMMAND": "ADD"}
    want = {"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}
    assert invoke.get_version_info(str(plugin), env) == want
    res = invoke.exec_with_result(str(plugin), b'{"cniVersion": "1.0.0"}', env)
    assert [str(ip.address) for ip in res.ips] == ["10.3.0.2/24"]
    with pytest.raises(CNIError) as ei:
        invoke.exec_plugin(str(plugin), b'{"cniVersion": "1.0.0"}', {**env, "CNI_COMMAND": "DEL"})
    assert (ei.value.code, ei.value.msg, ei.value.details) == (7, "bad config", "why")
