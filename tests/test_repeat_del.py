"""DELs of what is already gone: nearly free, and still complete.

containerd runs every DEL of a pod twice: StopPodSandbox with the netns and the cached result,
RemovePodSandbox again with CNI_NETNS empty and no prevResult. Most pods ask for no port
mapping and no shaping. These tests replay that on the kubeadm-like chain (loopback; bridge
with ipMasq and host-local v4+v6, portmap, bandwidth) one-shot, with iptables, ip6tables,
their -restore and nft replaced by logging wrappers around the real tools (the wrapper of
iptables is named ``xtables-nft-multi``, as the real one is, so pycni.net.probe treats it as
iptables-nft): which tool each DEL runs, and which modules it imports, are asserted, never
its time. The other way round, a DEL that finds state left behind (the netns deleted before
any DEL, no prevResult, no runtimeConfig) must still remove every rule, chain and device.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plugin_util
import pytest
from netns_util import Namespace
from test_import_set import _modules

from pycni.install_plugins import install
from pycni.net import probe

TOOLS = ("iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "iptables-save", "ip6tables-save")
NETWORK = "k8s-pod-network"
LOOPBACK = {"cniVersion": "0.3.1", "name": "cni-loopback", "type": "loopback"}
# modules none of the already-gone DELs may load (tools' and tc's machinery, OpenSSL, setns' ctypes)
HEAVY = ("subprocess", "ctypes", "hashlib", "_hashlib", "typing", "pycni.net.tc", "pycni.net.nftlib", "json", "re")
# with no netns there is no link to look at either
NO_NETNS_HEAVY = (*HEAVY, "pycni.net.link", "pycni.net.addr", "pycni.net.netns")


def _chain(data_dir: str) -> list[dict[str, Any]]:
    return [dict(p, cniVersion="1.0.0", name=NETWORK) for p in (
        {"type": "bridge", "bridge": "ccbr0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.93.0.0/24"}], [{"subnet": "fd93::/64"}]],
                  "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}], "dataDir": data_dir}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}})]


@pytest.fixture
def logged_tools(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose iptables family and nft log each call to a file, then run the real tool."""
    if not os.path.exists("/usr/sbin/xtables-nft-multi") or not os.path.exists("/usr/sbin/nft"):
        pytest.skip("needs iptables-nft (/usr/sbin/xtables-nft-multi) and nft")
    d, log = tmp_path / "tools", tmp_path / "tools.log"
    d.mkdir()
    multi = d / "xtables-nft-multi"
    multi.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {log}\n'
                     'exec /usr/sbin/xtables-nft-multi "$(basename "$0")" "$@"\n')
    (d / "nft").write_text(f'#!/bin/sh\necho "nft $*" >> {log}\nexec /usr/sbin/nft "$@"\n')
    for f in (multi, d / "nft"):
        f.chmod(0o755)
    for t in TOOLS:
        (d / t).symlink_to(multi)
    log.write_text("")
    return f"{d}:/usr/sbin:/usr/bin:/sbin:/bin", log


def _calls(log: Path) -> list[str]:
    lines = log.read_text().splitlines()
    log.write_text("")
    return lines


class Pod:
    """One pod's plugin calls, one-shot through installed executables in ``host``."""

    def __init__(self, host: Namespace, ctr: Namespace, shims: str, path: str, cid: str) -> None:
        self.host, self.ctr, self.shims, self.path, self.cid = host, ctr, shims, path, cid

    def env(self, command: str, netns: str, ifname: str) -> dict[str, str]:
        """containerd's environment: CNI_NETNS as given (empty on RemovePodSandbox's DEL), the logged tools' PATH."""
        return plugin_util.env(command, self.cid, ifname=ifname, cni_path=self.shims, PATH=self.path, CNI_NETNS=netns,
                               args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={self.cid}")

    def call(self, command: str, conf: dict[str, Any], netns: str, ifname: str = "eth0") -> Any:
        out = plugin_util.run(conf["type"], command, conf, via="exec", host=self.host,
                              environ=self.env(command, netns, ifname))
        assert out.exit_code == 0, (conf["type"], command, out.stdout.decode(), out.stderr.decode())
        return json.loads(out.stdout) if out.stdout.strip() else None

    def modules(self, command: str, conf: dict[str, Any], netns: str, tmp: Path, ifname: str = "eth0") -> set[str]:
        return _modules(os.path.join(self.shims, conf["type"]), self.env(command, netns, ifname),
                        json.dumps(conf).encode(), tmp, self.host)

    def add(self, chain: list[dict[str, Any]]) -> dict[str, Any]:
        self.call("ADD", LOOPBACK, self.ctr.path, "lo")
        prev: dict[str, Any] | None = None
        for conf in chain:
            prev = self.call("ADD", dict(conf, prevResult=prev) if prev else conf, self.ctr.path)
        assert prev is not None
        return prev


def _nat_chains(host: Namespace) -> list[str]:
    return [line.split()[1] for v in ("iptables", "ip6tables")
            for line in host.run([v, "-w", "-t", "nat", "-S"]).stdout.splitlines()
            if line.startswith("-N CNI-") and not line.startswith("-N CNI-HOSTPORT")]


def _reservations(data_dir: Path) -> list[str]:
    net = data_dir / NETWORK
    return sorted(p.name for p in net.iterdir() if p.name[0].isdigit() or ":" in p.name) if net.exists() else []


def _heavy(mods: set[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in heavy))


def test_plain_pod_stop_and_remove_run_no_needless_tool(netns_factory: Callable[[], Namespace], tmp_path: Path,
                                                        logged_tools: tuple[str, Path]) -> None:
    """A plain pod's cycle as containerd drives it: Stop's DELs of portmap and bandwidth (asked for
    nothing), loopback, and bridge's nft side run no tool; Remove's repeated DELs run none at all
    and import none of the heavy modules; nothing is left."""
    path, log = logged_tools
    host, ctr = netns_factory(), netns_factory()
    shims = str(tmp_path / "bin")
    install(shims, daemon=True)
    data = tmp_path / "ipam"
    chain = _chain(str(data))
    pod = Pod(host, ctr, shims, path, "ccplain1")
    result = pod.add(chain)
    assert _nat_chains(host) and _reservations(data)
    _calls(log)
    # StopPodSandbox: the chain's DEL in reverse with the cached result, then loopback's
    for conf in reversed(chain):
        pod.call("DEL", dict(conf, prevResult=result), ctr.path)
        calls = _calls(log)
        if conf["type"] == "bridge":  # the masquerade rules it made: one restore per family, no nft
            assert sorted(c.split()[0] for c in calls) == ["ip6tables-restore", "iptables-restore"], calls
        else:
            assert calls == [], conf["type"]
    pod.call("DEL", LOOPBACK, ctr.path, "lo")
    assert _calls(log) == []
    assert _nat_chains(host) == [] and _reservations(data) == []
    ctr.delete()
    # RemovePodSandbox: every DEL again, netns closed, libcni's cache entry gone
    for conf in [*reversed(chain), LOOPBACK]:
        ifname = "lo" if conf is LOOPBACK else "eth0"
        mods = pod.modules("DEL", conf, "", tmp_path, ifname)
        assert _calls(log) == [], conf["type"]
        assert _heavy(mods, NO_NETNS_HEAVY) == [], conf["type"]
    with host.enter():
        assert probe.link_exists("ccbr0") is True  # the bridge stays, as Go's
    assert not [line for line in host.run(["ip", "-o", "link"]).stdout.splitlines() if "bwp" in line]


def test_del_without_netns_or_prev_result_still_removes_everything(
        netns_factory: Callable[[], Namespace], tmp_path: Path, logged_tools: tuple[str, Path]) -> None:
    """The netns vanished before any DEL (a crashed sandbox): DEL comes with CNI_NETNS empty, no
    prevResult and no runtimeConfig. The probes see what is there, so the tools run and the
    masquerade chains, the hostPort chain and the ifb all go, as do the reservations."""
    path, log = logged_tools
    host, ctr = netns_factory(), netns_factory()
    shims = str(tmp_path / "bin")
    install(shims, daemon=True)
    data = tmp_path / "ipam"
    chain = _chain(str(data))
    rc = {"portMappings": [{"hostPort": 18093, "containerPort": 80, "protocol": "tcp"}],
          "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 80_000, "egressRate": 8_000_000,
                        "egressBurst": 80_000}}
    with_rc = [dict(c, runtimeConfig={k: v for k, v in rc.items() if c["capabilities"].get(k)})
               if c["type"] != "bridge" else c for c in chain]
    pod = Pod(host, ctr, shims, path, "ccgone1")
    pod.add(with_rc)
    chains = _nat_chains(host)
    assert any(c.startswith("CNI-DN-") for c in chains) and len(chains) >= 3, chains
    ifbs = [line for line in host.run(["ip", "-o", "link"]).stdout.splitlines() if "bwp" in line]
    assert len(ifbs) == 1
    ctr.delete()
    _calls(log)
    for conf in reversed(chain):
        pod.call("DEL", conf, "")
    pod.call("DEL", LOOPBACK, "", "lo")
    assert _calls(log), "the probes saw the rules, so the tools had to run"
    assert _nat_chains(host) == []
    assert not [line for line in host.run(["ip", "-o", "link"]).stdout.splitlines() if "bwp" in line]
    assert _reservations(data) == []
    # and a third DEL finds nothing and runs nothing
    for conf in reversed(chain):
        pod.call("DEL", conf, "")
    assert _calls(log) == []


def test_probes_agree_with_the_tools(host_ns: Namespace, tmp_path: Path) -> None:
    """Each probe says present or absent as the tools do, in the calling thread's namespace; a
    legacy iptables is never answered for (None: the caller asks the tool)."""
    with host_ns.enter():
        assert probe.link_exists("lo") is True
        assert probe.link_exists("ccnope0") is False
        assert probe.link_exists("x" * 20) is False
        assert probe.nft_object_exists("inet", "ccprobe") is False
        assert probe.iptables_chain_exists("nat", "CC-PROBE") in (False, None)
        assert probe.nft_object_exists("nosuchfamily", "t") is None
    host_ns.run(["ip", "link", "add", "ccdummy0", "type", "veth", "peer", "name", "ccdummy1"])
    host_ns.run(["nft", "add table inet ccprobe; add chain inet ccprobe c"])
    host_ns.run(["iptables", "-w", "-t", "nat", "-N", "CC-PROBE"])
    host_ns.run(["ip6tables", "-w", "-t", "nat", "-N", "CC-PROBE6"])
    nft_iptables = probe.iptables_is_nft()
    with host_ns.enter():
        assert probe.link_exists("ccdummy0") is True
        assert probe.nft_object_exists("inet", "ccprobe") is True
        assert probe.nft_object_exists("inet", "ccprobe", "c") is True
        assert probe.nft_object_exists("inet", "ccprobe", "d") is False
        assert probe.nft_object_exists("ip", "ccprobe") is False
        if nft_iptables:
            assert probe.iptables_chain_exists("nat", "CC-PROBE") is True
            assert probe.iptables_chain_exists("nat", "CC-PROBE6", ipv6=True) is True
            assert probe.iptables_chain_exists("nat", "CC-PROBE6") is False
            assert probe.iptables_chain_exists("filter", "CC-PROBE") is False
    assert probe.link_exists("ccdummy0") is False  # back in this thread's own namespace
    if not os.path.exists("/usr/sbin/xtables-legacy-multi"):
        return
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "iptables").symlink_to("/usr/sbin/xtables-legacy-multi")
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{legacy}:{old}"
    try:
        assert probe.iptables_is_nft() is False
        assert probe.iptables_chain_exists("nat", "CC-PROBE") is None
    finally:
        os.environ["PATH"] = old


def test_usable_asks_the_kernel_once_the_nat_table_is_there(host_ns: Namespace, logged_tools: tuple[str, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """iptables.usable() (every ADD of bridge with ipMasq, or of portmap, asks it) runs iptables
    only until iptables-nft's nat POSTROUTING chain exists in the namespace; then the kernel's
    word is enough."""
    from pycni.net import iptables

    path, log = logged_tools
    monkeypatch.setenv("PATH", path)
    monkeypatch.setattr(iptables, "_usable", set())
    with host_ns.enter():
        assert iptables.usable()
        assert [c for c in _calls(log) if "-S OUTPUT" in c], "a fresh namespace: the tool is asked"
        iptables._usable.clear()
        iptables.run(["-t", "nat", "-A", "POSTROUTING", "-d", "192.0.2.1/32", "-j", "RETURN"])
        _calls(log)
        assert iptables.usable()
        assert _calls(log) == []


def test_shaping_runs_tc_without_subprocess(netns_factory: Callable[[], Namespace], tmp_path: Path,
                                            logged_tools: tuple[str, Path]) -> None:
    """A pod with bandwidth annotations: bandwidth's ADD (tbf, ifb, the redirect through
    ``tc -batch``) and DEL run tc through pycni.net.tools, never importing subprocess or typing."""
    path, _log = logged_tools
    host, ctr = netns_factory(), netns_factory()
    shims = str(tmp_path / "bin")
    install(shims, daemon=True)
    bridge, _portmap, bandwidth = _chain(str(tmp_path / "ipam"))
    pod = Pod(host, ctr, shims, path, "ccshape1")
    prev = pod.call("ADD", bridge, ctr.path)
    shaped = dict(bandwidth, prevResult=prev, runtimeConfig={"bandwidth": {
        "ingressRate": 8_000_000, "ingressBurst": 80_000, "egressRate": 8_000_000, "egressBurst": 80_000}})
    never = ("subprocess", "typing")
    mods = pod.modules("ADD", shaped, ctr.path, tmp_path)
    assert "pycni.net.tc" in mods and [m for m in mods if m in never] == []
    qdiscs = host.run(["tc", "qdisc", "show"]).stdout
    assert "tbf" in qdiscs and "ingress" in qdiscs and "bwp" in host.run(["ip", "-o", "link"]).stdout
    mods = pod.modules("DEL", shaped, ctr.path, tmp_path)
    assert "pycni.net.tc" in mods and [m for m in mods if m in never] == []
    assert "bwp" not in host.run(["ip", "-o", "link"]).stdout
    pod.call("DEL", dict(bridge, prevResult=prev), ctr.path)
