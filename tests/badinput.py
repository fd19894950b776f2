"""Bad-input generator and sandbox runner for every plugin (tests/test_bad_input.py, bench/badinput_go.py).

Why a module of its own: the same inputs go to our plugins one-shot, through a ``pycni daemon``
and to the Go reference plugins, and the same runner judges all three. For each plugin type it
builds a valid base configuration and mutates it: a wrong JSON type for every key the plugin
reads, huge values, truncated stdin, path escapes (IPAM type, ifname, container ID, sysctl
names, dataDir), CNI_NETNS naming the plugin's own namespace, garbage prevResult, malformed GC
lists, unknown cniVersion, missing or broken environment. Every input must be refused.

The runner (``python badinput.py sandbox JOB``) is started by the test inside
``ip netns exec HOST unshare --mount --pid --fork --mount-proc``: it remounts every file system
read-only except the job's own directory, sets up what the base configurations name (parent
links, a container interface, an existing reservation and port mapping for GC to keep), then
runs the inputs in batches, snapshotting both namespaces (links, addresses, routes of all
tables, rules, qdiscs, net sysctls, nftables, iptables) and the state directory before and after
each batch; only a batch that changed something is replayed input by input to name the culprit.
Stdlib only, so the Go run needs nothing from pycni inside the sandbox but its plugins.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SEED_ENV = "PYCNI_FUZZ_SEED"
DEFAULT_SEED = 16
TIMEOUT = 20.0  # seconds before an input counts as a hang
SUBNET, GW, CTR_ADDR = "10.77.0.0/24", "10.77.0.1", "10.77.0.5/24"
TRACE_MARKS = ("Traceback (most recent call last)", "panic:", "goroutine ")

# Wrong JSON values for a key of each kind (never null: a null key reads as its default).
WRONG = {
    "s": [1, True, [], {}, ["x"]],
    "i": ["1", True, 1.5, [], {}],
    "n": ["1", True, [], {}],  # a number, fractions allowed
    "b": ["true", 1, [], {}],
    "l": ["x", 1, {}, True],
    "d": ["x", 1, [], True],
}
HUGE = {
    "s": ["x" * 100_000],
    "i": [2 ** 64, -(2 ** 63) - 1, 10 ** 30],
    "n": [10 ** 30, -1],
    "l": [["x"] * 20_000],
}

# Keys each plugin reads (docs/plugins.md), by kind. "ipam.*" keys live in the ipam section.
COMMON = {"cniVersion": "s", "name": "s", "runtimeConfig": "d", "args": "d"}
HOST_LOCAL = {"ipam.type": "s", "ipam.subnet": "s", "ipam.ranges": "l", "ipam.routes": "l", "ipam.dataDir": "s",
              "ipam.resolvConf": "s", "ipam.gateway": "s", "ipam.rangeStart": "s", "ipam.rangeEnd": "s"}
KEYS: dict[str, dict[str, str]] = {
    "bridge": {"bridge": "s", "isGateway": "b", "isDefaultGateway": "b", "forceAddress": "b", "ipMasq": "b",
               "ipMasqBackend": "s", "mtu": "i", "hairpinMode": "b", "promiscMode": "b", "vlan": "i",
               "vlanTrunk": "l", "preserveDefaultVlan": "b", "macspoofchk": "b", "enabledad": "b",
               "disableContainerInterface": "b", "portIsolation": "b", "dns": "d", "ipam": "d", **HOST_LOCAL},
    "loopback": {},
    "ptp": {"ipMasq": "b", "ipMasqBackend": "s", "mtu": "i", "dns": "d", "ipam": "d", **HOST_LOCAL},
    "macvlan": {"master": "s", "mode": "s", "mtu": "i", "mac": "s", "linkInContainer": "b", "dns": "d", "ipam": "d"},
    "ipvlan": {"master": "s", "mode": "s", "mtu": "i", "linkInContainer": "b", "dns": "d", "ipam": "d"},
    "vlan": {"master": "s", "vlanId": "i", "mtu": "i", "linkInContainer": "b", "dns": "d", "ipam": "d"},
    "host-device": {"device": "s", "hwaddr": "s", "kernelpath": "s", "pciBusID": "s", "dataDir": "s", "dns": "d",
                    "ipam": "d"},
    "dummy": {"mtu": "i", "dns": "d", "ipam": "d"},
    "tap": {"mac": "s", "mtu": "i", "multiQueue": "b", "owner": "i", "group": "i", "selinuxContext": "s",
            "bridge": "s", "dns": "d"},
    "routed": {"mtu": "i", "dns": "d", "ipam": "d", **HOST_LOCAL},
    "host-local": {"ipam": "d", **HOST_LOCAL},
    "static": {"ipam": "d", "ipam.type": "s", "ipam.addresses": "l", "ipam.routes": "l", "ipam.dns": "d"},
    "dhcp": {"ipam": "d", "ipam.type": "s", "ipam.daemonSocketPath": "s", "ipam.provide": "l", "ipam.request": "l",
             "ipam.priority": "i"},
    "cluster-ipam": {"ipam": "d", "ipam.type": "s", "ipam.etcdEndpoints": "l", "ipam.etcdPrefix": "s",
                     "ipam.nodeName": "s", "ipam.ranges": "l", "ipam.blockSize": "i", "ipam.lockDir": "s",
                     "ipam.strictAffinity": "b", "ipam.etcdTimeout": "n"},
    "portmap": {"backend": "s", "snat": "b", "masqAll": "b", "markMasqBit": "i", "externalSetMarkChain": "s",
                "conditionsV4": "l", "conditionsV6": "l", "prevResult": "d"},
    "bandwidth": {"ingressRate": "i", "ingressBurst": "i", "egressRate": "i", "egressBurst": "i",
                  "shapedSubnets": "l", "unshapedSubnets": "l", "prevResult": "d"},
    "tuning": {"sysctl": "d", "mac": "s", "mtu": "i", "promisc": "b", "allmulti": "b", "txQLen": "i",
               "dataDir": "s", "prevResult": "d"},
    "firewall": {"backend": "s", "iptablesAdminChainName": "s", "ingressPolicy": "s", "firewalldZone": "s",
                 "prevResult": "d"},
    "sbr": {"table": "i", "gateways": "l", "addSourceHints": "b", "vrfname": "s", "prevResult": "d"},
    "flannel": {"subnetFile": "s", "dataDir": "s", "delegate": "d", "ipam": "d"},
    "vrf": {"vrfname": "s", "table": "i", "prevResult": "d"},
}
# Keys a plugin only type-checks in the base config (unused beside another, or ignored here), as Go's
ONLY_TYPE_CHECKED = {("firewall", "firewalldZone"), ("tap", "selinuxContext"), ("host-device", "hwaddr"),
                     ("host-device", "kernelpath"), ("host-device", "pciBusID")}
IPAM_DIRECT = {"host-local", "static", "dhcp", "cluster-ipam"}  # the runtime calls them as a main plugin would
META = {"portmap", "bandwidth", "tuning", "firewall", "sbr", "vrf"}  # chained: need prevResult and eth0
# Plugins whose GC removes something, so must refuse a missing or malformed attachment list
# (the others' GC is a no-op, as in the reference).
HAS_GC = {"bridge", "ptp", "macvlan", "ipvlan", "vlan", "host-device", "dummy", "routed", "host-local",
          "dhcp", "cluster-ipam", "portmap", "flannel"}
# Plugins that read CNI_ARGS (IP, MAC, GATEWAY; through their IPAM too): a malformed one is refused.
# The others ignore CNI_ARGS, as the reference's do.
READS_ARGS = {"bridge", "ptp", "macvlan", "ipvlan", "vlan", "host-device", "dummy", "routed", "host-local",
              "static", "dhcp", "cluster-ipam", "tuning", "flannel"}


def prev_result(ctr: str) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "interfaces": [{"name": "fzh0"}, {"name": "eth0", "sandbox": ctr}],
            "ips": [{"address": CTR_ADDR, "gateway": GW, "interface": 1}]}


def base_conf(plugin: str, data: str, ctr: str) -> dict[str, Any]:
    """A configuration of ``plugin`` that names only what the runner sets up (so a key's mutation is the
    only thing wrong with it)."""
    hl = {"type": "host-local", "subnet": SUBNET, "dataDir": f"{data}/ipam", "routes": [{"dst": "0.0.0.0/0"}]}
    dns = {"nameservers": ["10.0.0.53"]}
    conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": "fznet", "type": plugin}
    conf.update({
        "bridge": {"bridge": "fzbr0", "isGateway": True, "ipMasq": True, "mtu": 1400, "hairpinMode": False,
                   "promiscMode": False, "dns": dns, "ipam": hl},
        "loopback": {},
        "ptp": {"ipMasq": True, "mtu": 1400, "dns": dns, "ipam": hl},
        "macvlan": {"master": "fzm0", "mode": "bridge", "mtu": 1400, "ipam": hl},
        "ipvlan": {"master": "fzm0", "mode": "l2", "ipam": hl},
        "vlan": {"master": "fzm0", "vlanId": 10, "ipam": hl},
        "host-device": {"device": "fzhd0", "dataDir": f"{data}/hd", "ipam": hl},
        "dummy": {"mtu": 1400, "ipam": hl},
        "tap": {"mtu": 1400, "multiQueue": False},
        "routed": {"mtu": 1400, "ipam": hl},
        "host-local": {"type": "ptp", "ipam": hl},
        "static": {"type": "ptp", "ipam": {"type": "static", "addresses": [{"address": "10.78.0.5/24",
                                                                             "gateway": "10.78.0.1"}],
                                           "routes": [{"dst": "0.0.0.0/0"}], "dns": dns}},
        "dhcp": {"type": "macvlan", "ipam": {"type": "dhcp", "daemonSocketPath": f"{data}/dhcp.sock",
                                             "priority": 0}},
        "cluster-ipam": {"type": "ptp", "ipam": {"type": "cluster-ipam", "etcdEndpoints": ["http://127.0.0.1:9"],
                                                 "etcdPrefix": "/fz", "nodeName": "fznode", "blockSize": 26,
                                                 "ranges": [[{"subnet": "10.90.0.0/16"}]],
                                                 "lockDir": f"{data}/clock", "etcdTimeout": 1}},
        "portmap": {"backend": "nftables", "snat": True, "capabilities": {"portMappings": True},
                    "runtimeConfig": {"portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]}},
        "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 100_000, "egressRate": 1_000_000,
                      "egressBurst": 100_000},
        "tuning": {"sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1"}, "mtu": 1300, "dataDir": f"{data}/tuning"},
        "firewall": {"backend": "iptables"},
        "sbr": {},
        "flannel": {"subnetFile": f"{data}/subnet.env", "dataDir": f"{data}/flannel", "delegate": {"bridge": "fzfl0"},
                    "ipam": {"dataDir": f"{data}/ipam-fl"}},
        "vrf": {"vrfname": "fzvrf", "table": 100},
    }[plugin])
    if plugin in META:
        conf["prevResult"] = prev_result(ctr)
    if plugin in ("host-local", "static", "dhcp", "cluster-ipam"):
        conf["type"] = conf["type"]  # the IPAM plugin is called directly, its section is what it reads
    return conf


def _set(conf: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(conf))
    if key.startswith("ipam."):
        if not isinstance(out.get("ipam"), dict):
            out["ipam"] = {}
        out["ipam"][key[5:]] = value
    else:
        out[key] = value
    return out


def _dumps(conf: Any) -> str:
    return json.dumps(conf)


def generate(plugin: str, data: str, ctr: str, host: str, plugin_dir: str, rng: random.Random,
             *, daemon: bool = False) -> list[dict[str, Any]]:
    """Every bad input for ``plugin``: dicts with id, env, stdin (base64) and the allowed codes."""
    base = base_conf(plugin, data, ctr)
    ifname = "eth0" if plugin in META else "net1"
    env0 = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "fzctr", "CNI_NETNS": ctr, "CNI_IFNAME": ifname,
            "CNI_PATH": plugin_dir, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYCNI_SOCKET": "off"}
    cases: list[dict[str, Any]] = []

    def add(cid: str, conf: Any, codes: set[int], env: dict[str, str | None] | None = None,
            raw: bytes | None = None) -> None:
        e = dict(env0)
        for k, v in (env or {}).items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        stdin = raw if raw is not None else _dumps(conf).encode()
        cases.append({"id": f"{plugin}:{cid}", "plugin": plugin, "env": e,
                      "stdin": base64.b64encode(stdin).decode(), "codes": sorted(codes), "cleanup": cleanup})

    cleanup = {"env": dict(env0, CNI_COMMAND="DEL"), "stdin": base64.b64encode(_dumps(base).encode()).decode()}

    keys = {**COMMON, **KEYS[plugin]}
    # wrong types for every key the plugin reads
    for key, kind in keys.items():
        if key == "ipam.type" and plugin in IPAM_DIRECT:
            continue  # called directly, an IPAM plugin does not read its own type (nor does the reference)
        for value in WRONG[kind]:
            codes = {1, 6, 7} if key == "cniVersion" else {6, 7}
            add(f"type:{key}={_dumps(value)}", _set(base, key, value), codes)
    # huge values
    for key, kind in keys.items():
        for value in HUGE.get(kind, []):
            # a long name is valid (Go's skel has no limit either), as is any string only type-checked
            if key in ("cniVersion", "name") or (key == "ipam.type" and plugin in IPAM_DIRECT) \
                    or (plugin, key) in ONLY_TYPE_CHECKED:
                continue
            # a link that is not there is the reference's lookup failure (999) for host-device's device
            codes = {4, 5, 7, 999} if (plugin, key) == ("host-device", "device") else {4, 5, 7}
            add(f"huge:{key}={_dumps(value)[:20]}", _set(base, key, value), codes)
    # truncation (position 0 is empty stdin)
    text = _dumps(base).encode()
    for cut in sorted({0, 1, len(text) - 1, *(rng.randrange(1, len(text)) for _ in range(6))}):
        add(f"trunc:{cut}", None, {6}, raw=text[:cut])
    add("nested", None, {6}, raw=b"[" * 100_000 + b"]" * 100_000)
    add("not-object", None, {6}, raw=b'["cniVersion", "1.0.0"]')
    add("non-utf8", None, {6}, raw=text.replace(b'"fznet"', b'"fz\xffnet"'))
    # unknown cniVersion
    for v in ("9.9.9", "0.5.0", "1.0", "abc", "1.0.0-rc1"):
        add(f"version:{v}", _set(base, "cniVersion", v), {1})
    # environment: missing variables, broken values, path escapes, the plugin's own netns
    for var in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"):
        add(f"env:no-{var}", base, {4}, {var: None})
    add("env:command=FOO", base, {4}, {"CNI_COMMAND": "FOO"})
    for v in ("../x", "/x", "a/b", ".", "..", "x" * 16, "a b", "a:b"):
        add(f"env:ifname={v}", base, {4, 7}, {"CNI_IFNAME": v})
    for v in ("../../x", "/etc/passwd", "a b", "x\ny", "-x", "c" * 256):
        add(f"env:containerid={v[:20]!r}", base, {4}, {"CNI_CONTAINERID": v})
    for v in ("FOO", "=1", "a==b;;", "IgnoreUnknown=maybe") if plugin in READS_ARGS else ():
        add(f"env:args={v}", base, {4, 7}, {"CNI_ARGS": v})
    for v in (host, "/proc/self/ns/net", "/proc/1/ns/net"):
        add(f"env:own-netns={v.rsplit('/', 1)[-1]}", base, {8, 4}, {"CNI_NETNS": v})
    if daemon:  # a NUL cannot travel in a process environment, it can in a daemon request
        add("env:ifname=NUL", base, {4}, {"CNI_IFNAME": "e\0th"})
        add("env:containerid=NUL", base, {4}, {"CNI_CONTAINERID": "c\0x"})
    # path escapes in configuration values
    if "ipam.type" in keys and plugin not in IPAM_DIRECT:
        for v in ("../ptp", "/bin/true", "host-local/../host-local", "host-local\u0000"):  # "": no IPAM
            add(f"escape:ipam.type={v!r}", _set(base, "ipam.type", v), {7})
    for key in ("dataDir", "ipam.dataDir", "ipam.lockDir", "subnetFile", "ipam.daemonSocketPath"):
        if key in keys:
            add(f"escape:{key}=NUL", _set(base, key, f"{data}/a\u0000b"), {7})
            add(f"escape:{key}+badifname", _set(base, key, "../../../../../etc/pycni-fuzz"), {4},
                {"CNI_IFNAME": "../x"})
    if plugin == "tuning":
        for name in ("net/../../kernel/hostname", "../../etc/passwd", "kernel.hostname",
                     "net.ipv4.conf.IFNAME.arp_notify\u0000", "net.ipv4.conf.../../../x", "net/ipv4/conf/../../../x",
                     "/proc/sys/net/ipv4/ip_forward", "net..ipv4.ip_forward"):
            add(f"escape:sysctl={name!r}", _set(base, "sysctl", {name: "1"}), {7})
        add("sysctl:value-int", _set(base, "sysctl", {"net.ipv4.conf.IFNAME.arp_notify": 1}), {7})
    # garbage prevResult: ADD of chained plugins, CHECK of every plugin
    garbage = ["x", 1, [], {"ips": "x"}, {"ips": [{"address": "nope"}]}, {"interfaces": [{"name": 1}]},
               {"cniVersion": "1.0.0", "ips": [{"address": CTR_ADDR, "gateway": "x"}]},
               {"cniVersion": "1.0.0", "interfaces": "x"}]
    for g in garbage if plugin not in IPAM_DIRECT else ():  # IPAM plugins read no prevResult
        conf = _set(base, "prevResult", g)
        if plugin in META:
            add(f"prev:ADD:{_dumps(g)[:40]}", conf, {1, 6, 7})
        add(f"prev:CHECK:{_dumps(g)[:40]}", conf, {1, 6, 7}, {"CNI_COMMAND": "CHECK"})
    # GC with a missing or malformed attachment list
    if plugin in HAS_GC:
        gc_base = _set(base, "cniVersion", "1.1.0")
        gc_env: dict[str, str | None] = {"CNI_COMMAND": "GC", "CNI_CONTAINERID": None, "CNI_IFNAME": None,
                                         "CNI_NETNS": None}
        add("gc:missing", gc_base, {7}, gc_env)
        for lst in ([{}], [None], [{"containerID": 1}], "x", [{"containerID": "a"}], [{"ifname": "eth0"}],
                    {"containerID": "a", "ifname": "eth0"}, [["a", "eth0"]]):
            add(f"gc:{_dumps(lst)}", _set(gc_base, "cni.dev/valid-attachments", lst), {7}, gc_env)
    return cases


# ---- the sandbox ---------------------------------------------------------------------------------
def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def lock_down(writable: str) -> None:
    """Private mounts; ``writable`` stays writable, every other file system read-only."""
    _run(["mount", "--make-rprivate", "/"])
    _run(["mount", "--bind", writable, writable])
    skip = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "nsfs", "mqueue", "bpf", "debugfs",
            "tracefs", "securityfs", "fusectl", "configfs", "pstore", "hugetlbfs"}
    with open("/proc/self/mounts") as f:
        mounts = [line.split() for line in f]
    for _, point, fstype, *_ in mounts:
        point = point.encode().decode("unicode_escape")
        if fstype in skip or point == writable:
            continue
        _run(["mount", "-o", "remount,bind,ro", point])
    probe = os.path.join("/", f".pycni-fuzz-probe-{os.getpid()}")
    try:
        open(probe, "w").close()
    except OSError:
        return
    os.unlink(probe)
    raise SystemExit("sandbox: / is still writable")


def _strip_counters(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if line.startswith(":"):
            line = line.split(" [", 1)[0]
        lines.append(line)
    return "\n".join(lines)


def _sysctls() -> dict[str, str]:
    out: dict[str, str] = {}
    roots = ["/proc/sys/net/ipv4/conf", "/proc/sys/net/ipv6/conf"]
    for name in ("/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv4/ip_local_port_range"):
        roots.append(name)
    for root in roots:
        if os.path.isfile(root):
            paths = [root]
        else:
            paths = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
        for p in paths:
            try:
                with open(p) as f:
                    out[p[len("/proc/sys/"):]] = f.read().strip()
            except OSError:
                pass
    return out


def snapshot_here(state_dir: str | None) -> dict[str, Any]:
    """What a plugin may change in the namespace this process runs in (and in ``state_dir``)."""
    # What a plugin sets, not what the kernel derives a moment later: a bridge's carrier and MAC
    # follow its ports, IPv6 link-local addresses (and their routes) come and go with carrier.
    links = []
    for x in json.loads(_run(["ip", "-j", "-d", "addr", "show"]).stdout or "[]"):
        info = x.get("linkinfo", {})
        kind = info.get("info_kind", "")
        links.append([x.get("ifname"), "UP" in x.get("flags", []), x.get("mtu"),
                      "" if kind == "bridge" else x.get("address"), x.get("ifalias", ""), x.get("master", ""),
                      x.get("promiscuity"), x.get("txqlen"), kind, info.get("info_slave_kind", ""),
                      sorted(f"{a.get('local')}/{a.get('prefixlen')}" for a in x.get("addr_info", [])
                             if not str(a.get("local")).startswith("fe80:"))])
    snap: dict[str, Any] = {"links": sorted(links, key=str)}
    for fam in ("-4", "-6"):
        routes = _run(["ip", fam, "route", "show", "table", "all"]).stdout.splitlines()
        snap[f"routes{fam}"] = "\n".join(r.replace(" linkdown", "") for r in routes if "fe80:" not in r)
        snap[f"rules{fam}"] = _run(["ip", fam, "rule", "show"]).stdout
    snap["qdisc"] = _run(["tc", "qdisc", "show"]).stdout
    snap["nft"] = _run(["nft", "-s", "list", "ruleset"]).stdout
    snap["iptables"] = _strip_counters(_run(["iptables-save"]).stdout)
    snap["ip6tables"] = _strip_counters(_run(["ip6tables-save"]).stdout)
    snap["sysctl"] = _sysctls()
    if state_dir:
        files = {}
        for d, dirs, fs in os.walk(state_dir):
            for name in dirs + fs:
                p = os.path.join(d, name)
                rel = os.path.relpath(p, state_dir)
                # the runner's own files; lock files and cluster-ipam's lock directory are allowed to stay
                if rel.startswith(("results", "job", "daemon", "fz-", "clock")) or p.endswith(".lock"):
                    continue
                try:
                    with open(p, "rb") as f:
                        files[rel] = hashlib.sha256(f.read()).hexdigest()[:16]
                except (IsADirectoryError, OSError):
                    files[rel] = "dir" if os.path.isdir(p) else "?"
        snap["files"] = files
    return snap


def snapshot(ctr: str, state_dir: str) -> dict[str, Any]:
    """The sandbox namespace with the state directory, and the container namespace."""
    here = snapshot_here(state_dir)
    out = _run(["nsenter", f"--net={ctr}", sys.executable, "-S", os.path.abspath(__file__), "snap"])
    return {"host": here, "ctr": json.loads(out.stdout)}


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Names of what differs, with a short excerpt each."""
    out = []
    for side in ("host", "ctr"):
        for key in sorted(set(a[side]) | set(b[side])):
            x, y = a[side].get(key), b[side].get(key)
            if x == y:
                continue
            if isinstance(x, dict) and isinstance(y, dict):
                changed = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                out.append(f"{side}.{key}: {changed[:4]}")
            elif isinstance(x, str) and isinstance(y, str):
                xl, yl = set(x.splitlines()), set(y.splitlines())
                out.append(f"{side}.{key}: +{sorted(yl - xl)[:3]} -{sorted(xl - yl)[:3]}")
            else:
                out.append(f"{side}.{key}: {str(x)[:200]} -> {str(y)[:200]}")
    return out


def _daemon_request(sock_path: str, plugin: str, env: dict[str, str], stdin: bytes) -> tuple[int, bytes, bytes]:
    """One request framed as pycni.daemon.protocol does (kept here: the runner imports no pycni)."""
    magic = b"PYCNI1"
    def field(b: bytes) -> bytes:
        return len(b).to_bytes(4, "big") + b
    body = magic + field(plugin.encode()) + field(stdin)
    body += b"".join(field(k.encode() + b"=" + v.encode("utf-8", "surrogateescape")) for k, v in env.items())
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        s.connect(sock_path)
        s.sendall(len(body).to_bytes(4, "big") + body)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise OSError("daemon closed the connection")
            buf += chunk
    finally:
        s.close()
    reply, fields, i = buf[4:], [], len(magic)
    while i < len(reply):
        n = int.from_bytes(reply[i:i + 4], "big")
        fields.append(reply[i + 4:i + 4 + n])
        i += 4 + n
    return int(fields[0]), fields[1], fields[2]


def run_case(case: dict[str, Any], via: str, plugin_dir: str, sock: str) -> dict[str, Any]:
    stdin = base64.b64decode(case["stdin"])
    res: dict[str, Any] = {"id": case["id"], "plugin": case["plugin"], "via": via, "codes": case["codes"]}
    try:
        if via == "daemon":
            rc, out, err = _daemon_request(sock, case["plugin"], case["env"], stdin)
        else:
            p = subprocess.run([os.path.join(plugin_dir, case["plugin"])], input=stdin, env=case["env"],
                               capture_output=True, timeout=TIMEOUT)
            rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        res.update(hang=True, rc=None)
        return res
    except (OSError, ValueError) as e:
        if isinstance(e, TimeoutError) or "timed out" in str(e):
            res.update(hang=True, rc=None)
        else:
            res.update(rc=None, error=f"{type(e).__name__}: {e}")
        return res
    res.update(rc=rc, stdout=out.decode("utf-8", "replace")[:600], stderr=err.decode("utf-8", "replace")[-600:],
               trace=any(m in out.decode("utf-8", "replace") + err.decode("utf-8", "replace")
                         for m in TRACE_MARKS))
    try:
        body = json.loads(out)
        res["code"] = body.get("code") if isinstance(body, dict) else None
        res["spec_json"] = isinstance(body, dict) and isinstance(body.get("code"), int) and "msg" in body
    except ValueError:
        res["code"], res["spec_json"] = None, False
    return res


def setup(job: dict[str, Any]) -> None:
    """What the base configurations name: parents for macvlan/ipvlan/vlan and host-device, the
    container's eth0 with the prevResult address, flannel's subnet file, and state for GC to keep."""
    ctr_name, data = job["ctr_name"], job["data"]
    cmds = [["ip", "link", "add", "fzm0", "type", "veth", "peer", "name", "fzm0p"],
            ["ip", "link", "set", "fzm0", "up"],
            ["ip", "link", "add", "fzhd0", "type", "veth", "peer", "name", "fzhd0p"],
            ["ip", "link", "add", "fzh0", "type", "veth", "peer", "name", "fzc0"],
            ["ip", "link", "set", "fzh0", "up"],
            ["ip", "link", "set", "fzc0", "netns", ctr_name],
            ["ip", "-n", ctr_name, "link", "set", "fzc0", "name", "eth0"],
            ["ip", "-n", ctr_name, "addr", "add", CTR_ADDR, "dev", "eth0"],
            ["ip", "-n", ctr_name, "link", "set", "eth0", "up"],
            ["ip", "-n", ctr_name, "route", "add", "default", "via", GW]]
    for c in cmds:
        _run(c)
    for ns in ([], ["-n", ctr_name]):  # IPv6 duplicate address detection ends before any snapshot
        for _ in range(200):
            if not _run(["ip", *ns, "-6", "addr", "show", "tentative"]).stdout.strip():
                break
            time.sleep(0.05)
    with open(f"{data}/subnet.env", "w") as f:
        f.write("FLANNEL_NETWORK=10.79.0.0/16\nFLANNEL_SUBNET=10.79.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n")
    plugin_dir = job["plugin_dir"]
    keep = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "keep", "CNI_NETNS": job["ctr"], "CNI_IFNAME": "eth0",
            "CNI_PATH": plugin_dir, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYCNI_SOCKET": "off"}
    for plugin in ("host-local", "portmap"):
        if not os.path.exists(os.path.join(plugin_dir, plugin)):
            continue
        conf = base_conf(plugin, data, job["ctr"])
        if plugin == "portmap" and job.get("go"):
            conf.pop("backend")  # Go's portmap: iptables by default
        p = subprocess.run([os.path.join(plugin_dir, plugin)], input=json.dumps(conf).encode(), env=keep,
                           capture_output=True, timeout=TIMEOUT)
        if p.returncode != 0:
            print(f"setup: {plugin} ADD failed: {p.stdout!r} {p.stderr!r}", file=sys.stderr)


def sandbox(job_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    data = job["data"]
    lock_down(data)
    setup(job)
    daemon = None
    sock = os.path.join(data, "daemon", "d.sock")
    results: list[dict[str, Any]] = []
    try:
        for via in job["vias"]:
            if via == "daemon":
                os.makedirs(os.path.dirname(sock), exist_ok=True)
                daemon = subprocess.Popen([sys.executable, "-m", "pycni.daemon", "--socket", sock, "--no-preload",
                                           "--log-file", os.path.join(data, "daemon", "log")],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(500):
                    if os.path.exists(sock):
                        break
                    time.sleep(0.02)
            cases = [c for c in job["cases"] if via in c.get("vias", [via])]
            results += run_batches(cases, via, job, sock)
    finally:
        if daemon is not None:
            daemon.kill()
            daemon.wait()
    with open(os.path.join(data, "results.json"), "w") as f:
        json.dump(results, f)


def run_batches(cases: list[dict[str, Any]], via: str, job: dict[str, Any], sock: str) -> list[dict[str, Any]]:
    """Batches of one plugin's inputs between two snapshots; a batch that changed something is
    replayed one input at a time. Known defects run last, one batch a plugin, not replayed (what
    they leave would otherwise cost a replay every run)."""
    data, ctr, plugin_dir = job["data"], job["ctr"], job["plugin_dir"]
    out: list[dict[str, Any]] = []
    batch = job.get("batch", 60)
    chunks: list[tuple[list[dict[str, Any]], bool]] = []
    for plugin in dict.fromkeys(c["plugin"] for c in cases):
        mine = [c for c in cases if c["plugin"] == plugin and not c.get("known")]
        chunks += [(mine[i:i + batch], True) for i in range(0, len(mine), batch)]
        known = [c for c in cases if c["plugin"] == plugin and c.get("known")]
        if known:
            chunks.append((known, False))
    with ThreadPoolExecutor(job.get("jobs", 3)) as pool:
        for chunk, replay in chunks:
            before = snapshot(ctr, data)
            res = list(pool.map(lambda c: run_case(c, via, plugin_dir, sock), chunk))
            after = snapshot(ctr, data)
            changes = diff(before, after)
            if changes and not replay:
                for r in res:
                    r["batch_changed"] = changes
            elif changes:  # replay one by one to find who changed what
                print(f"batch {chunk[0]['id']}..{chunk[-1]['id']} ({via}) changed {changes}", file=sys.stderr)
                for c, r in zip(chunk, res, strict=True):  # what accepted inputs made (each is reported)
                    if r.get("rc") == 0:
                        clean(c, plugin_dir)
                b = snapshot(ctr, data)
                changes = diff(before, b)  # what refused inputs left
                res, culprits = [], 0
                for c in chunk:
                    r = run_case(c, via, plugin_dir, sock)
                    a = snapshot(ctr, data)
                    r["changed"] = diff(b, a)
                    if r["changed"] or r.get("rc") == 0:  # DEL what it made, so the next input starts clean
                        culprits += bool(r["changed"])
                        clean(c, plugin_dir)
                        a = snapshot(ctr, data)
                    res.append(r)
                    b = a
                if changes and not culprits:  # what changed did not change again: report the batch
                    res.append({"id": f"{chunk[0]['plugin']}:batch@{chunk[0]['id']}", "plugin": chunk[0]["plugin"],
                                "via": via, "codes": [], "batch": True, "batch_changed": changes})
            out += res
    return out


def clean(case: dict[str, Any], plugin_dir: str) -> None:
    """DEL of the plugin's base config, with the input's environment and with the base one."""
    exe = os.path.join(plugin_dir, case["plugin"])
    envs = [dict(case["env"], CNI_COMMAND="DEL"), case["cleanup"]["env"]]
    for env in envs:
        try:
            subprocess.run([exe], input=base64.b64decode(case["cleanup"]["stdin"]), env=env, capture_output=True,
                           timeout=TIMEOUT)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            pass


def kernel_lacks(r: dict[str, Any]) -> str:
    """The link kind this kernel cannot make, when that is why the input failed (not a verdict on it)."""
    try:
        msg = json.loads(r.get("stdout") or "{}").get("msg", "")
    except (ValueError, AttributeError):
        return ""
    return msg if "the kernel does not support" in msg else ""


def verdict(r: dict[str, Any]) -> str:
    """'' for a clean refusal, else what is wrong with this result."""
    if r.get("batch"):
        return f"a batch of inputs changed {r['batch_changed']} (no single one did again)"
    if r.get("hang"):
        return "hang"
    if r.get("rc") is None:
        return f"runner error: {r.get('error')}"
    problems = []
    if r.get("trace"):
        problems.append("traceback/panic")
    if r["rc"] == 0:
        problems.append("accepted")
    elif not r.get("spec_json"):
        problems.append(f"exit {r['rc']} without the spec's error JSON")
    elif r["code"] not in r["codes"]:
        problems.append(f"code {r['code']} not in {r['codes']}")
    if r.get("changed"):
        problems.append(f"changed {r['changed']}")
    elif r.get("batch_changed"):
        problems.append(f"its batch changed {r['batch_changed']}")
    return "; ".join(problems)


if __name__ == "__main__":
    if sys.argv[1] == "snap":
        json.dump(snapshot_here(None), sys.stdout)
    elif sys.argv[1] == "sandbox":
        sandbox(sys.argv[2])
