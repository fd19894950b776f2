"""Daemon mode end to end: the Go libcni drives our shims, served by a `pycni daemon`.

The daemon runs as its own process inside a namespace of its own, so everything it does for a
request must happen in the *caller's* namespace (a throwaway "host") for these tests to pass;
the machine's namespace is never involved. Results, kernel state and clean-up must be the same
as in one-shot mode (PYCNI_SOCKET=off).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_util import Namespace
from runtimes import write_conflist

from pycni.install_plugins import install

WAIT = 30.0
PORTS = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}


def plugins(data_dir: Path, subnet: str = "10.88.0.0/16") -> list[dict[str, Any]]:
    return [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(data_dir),
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]


class Daemon:
    """A `pycni daemon` process in its own namespace, logging every request."""

    def __init__(self, ns: Namespace, tmp: Path) -> None:
        self.sock = str(tmp / "pycni.sock")
        self.log = tmp / "daemon.log"
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns.name, sys.executable, "-m", "pycni.daemon",
                                      "--socket", self.sock, "--debug", "--log-file", str(self.log)])
        for _ in range(int(WAIT * 20)):
            if os.path.exists(self.sock) or self.proc.poll() is not None:
                break
            threading.Event().wait(0.05)
        assert os.path.exists(self.sock), "daemon did not start"

    def requests(self) -> list[str]:
        return re.findall(r"DEBUG (\S+ \S+ \S+) \(pid", self.log.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemon(netns_factory: Callable[[], Namespace], tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(netns_factory(), tmp_path)
    try:
        yield d
    finally:
        d.stop()
    assert not os.path.exists(d.sock)


@pytest.fixture
def shims(tmp_path: Path) -> str:
    d = tmp_path / "bin"
    install(str(d), daemon=True)
    return str(d)


def go(tool: str, host: Namespace, verb: str, conf_dir: Path, cni_path: str, cid: str, ctr: Namespace,
       socket_path: str, cache: Path, cap: dict[str, Any] | None = PORTS, check: bool = True) -> str:
    cmd = [tool, "-confdir", str(conf_dir), "-net", "dm", "-path", cni_path, "-cachedir", str(cache),
           "-cid", cid, "-netns", ctr.path, "-ifname", "eth0"]
    if cap:
        cmd += ["-cap", json.dumps(cap)]
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin"), "PYCNI_SOCKET": socket_path}
    proc = host.run([*cmd, verb], check=False, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"gocnitool {verb} failed: {proc.stdout} {proc.stderr}")
    return proc.stdout


def normalised(result: dict[str, Any]) -> dict[str, Any]:
    """A result without what is random by design (MACs, the host-side veth name)."""
    r = json.loads(json.dumps(result))
    for i, iface in enumerate(r.get("interfaces", [])):
        iface.pop("mac", None)
        if iface["name"].startswith("veth"):
            iface["name"] = f"veth#{i}"
        iface.pop("sandbox", None)
    return r


def state(host: Namespace, ctr: Namespace) -> dict[str, Any]:
    """Kernel state a plugin chain leaves behind, comparable across two host namespaces."""
    # rule counters count whatever the namespace sent (a router solicitation, say): not state
    ruleset = re.sub(r"counter packets \d+ bytes \d+", "counter", host.run(["nft", "list", "ruleset"]).stdout)
    addrs = ctr.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"], check=False).stdout
    routes = ctr.run(["ip", "route", "show"]).stdout
    bridge = host.run(["ip", "-4", "-o", "addr", "show", "dev", "cni0"], check=False).stdout
    strip = re.compile(r"^\d+: |\s+valid_lft.*$|\\", re.M)
    return {"nft": ruleset, "addrs": strip.sub("", addrs), "routes": routes, "bridge": strip.sub("", bridge)}


def test_same_results_and_state_as_one_shot(go_libcni_tool: str, daemon: Daemon, shims: str, tmp_path: Path,
                                            netns_factory: Callable[[], Namespace]) -> None:
    """ADD/CHECK/DEL of bridge+host-local+portmap: one-shot in host A, daemon-served in host B."""
    runs = {}
    for mode, sock in (("oneshot", "off"), ("daemon", daemon.sock)):
        host, ctr = netns_factory(), netns_factory()
        conf = tmp_path / mode / "net.d"
        write_conflist(conf, "dm", plugins(tmp_path / mode / "ipam"))
        cache = tmp_path / mode / "cache"
        before = state(host, ctr)
        added = json.loads(go(go_libcni_tool, host, "add", conf, shims, "same1", ctr, sock, cache))
        after_add = state(host, ctr)
        go(go_libcni_tool, host, "check", conf, shims, "same1", ctr, sock, cache, cap=None)
        go(go_libcni_tool, host, "del", conf, shims, "same1", ctr, sock, cache)
        after_del = state(host, ctr)
        veths = host.run(["ip", "-o", "link", "show", "type", "veth"]).stdout
        runs[mode] = (normalised(added), after_add, after_del, veths, before["nft"])
    for a, b in zip(runs["daemon"], runs["oneshot"], strict=True):
        assert a == b
    assert "10.88.0.2/16" in runs["daemon"][1]["addrs"] and "8080" in runs["daemon"][1]["nft"]
    assert runs["daemon"][3] == ""  # no veth left in the host
    served = daemon.requests()
    assert "bridge ADD same1" in served and "portmap ADD same1" in served and "bridge CHECK same1" in served
    assert "bridge DEL same1" in served and "portmap DEL same1" in served
    # host-local ran inside the daemon's bridge request, not as a forwarded shim of its own
    assert not [r for r in served if r.startswith("host-local")]


def test_parallel_adds_get_distinct_addresses(go_libcni_tool: str, daemon: Daemon, shims: str, tmp_path: Path,
                                              netns_factory: Callable[[], Namespace]) -> None:
    host = netns_factory()
    ctrs = [netns_factory() for _ in range(16)]
    conf = tmp_path / "net.d"
    write_conflist(conf, "dm", plugins(tmp_path / "ipam"))
    results: dict[int, Any] = {}

    def add(i: int) -> None:
        try:
            results[i] = json.loads(go(go_libcni_tool, host, "add", conf, shims, f"par{i}", ctrs[i], daemon.sock,
                                       tmp_path / "cache", cap=None))
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = e

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = {i: r for i, r in results.items() if isinstance(r, Exception)}
    assert not errors
    ips = [results[i]["ips"][0]["address"] for i in range(16)]
    assert len(set(ips)) == 16
    assert len(host.run(["ip", "-o", "link", "show", "master", "cni0"]).stdout.splitlines()) == 16
    for i in range(16):
        go(go_libcni_tool, host, "del", conf, shims, f"par{i}", ctrs[i], daemon.sock, tmp_path / "cache", cap=None)
    assert host.run(["ip", "-o", "link", "show", "type", "veth"]).stdout == ""
    assert len([r for r in daemon.requests() if r.startswith("bridge ADD par")]) == 16


def test_foreign_delegate_is_executed(go_libcni_tool: str, daemon: Daemon, shims: str, tmp_path: Path,
                                      netns_factory: Callable[[], Namespace]) -> None:
    """A delegate that is not one of our shims (Go's host-local) is exec'd, from the caller's namespace."""
    if not os.path.exists("/usr/lib/cni/host-local"):
        pytest.skip("Go reference plugins not installed")
    host, ctr = netns_factory(), netns_factory()
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("bridge", "portmap"):
        os.symlink(os.path.join(shims, name), mixed / name)
    marker = tmp_path / "go-host-local-ran"
    wrapper = mixed / "host-local"
    wrapper.write_text(f"#!/bin/sh\nreadlink /proc/self/ns/net >> {marker}\nexec /usr/lib/cni/host-local\n")
    wrapper.chmod(0o755)
    conf = tmp_path / "net.d"
    write_conflist(conf, "dm", plugins(tmp_path / "ipam", "10.89.0.0/24"))
    added = json.loads(go(go_libcni_tool, host, "add", conf, str(mixed), "foreign1", ctr, daemon.sock,
                          tmp_path / "cache"))
    assert added["ips"][0]["address"] == "10.89.0.2/24"
    host_ns = host.run(["readlink", "/proc/self/ns/net"]).stdout.strip()
    assert marker.read_text().split() == [host_ns]  # exec'd once, in the caller's namespace
    go(go_libcni_tool, host, "del", conf, str(mixed), "foreign1", ctr, daemon.sock, tmp_path / "cache")
    assert marker.read_text().split() == [host_ns, host_ns]
    assert "bridge ADD foreign1" in daemon.requests()
    assert not list((tmp_path / "ipam" / "dm").glob("10.*"))


def test_one_shot_in_process_delegation_matches_exec(go_libcni_tool: str, shims: str, tmp_path: Path,
                                                     netns_factory: Callable[[], Namespace]) -> None:
    """One-shot shims run our IPAM in-process (PYCNI_INPROC_DELEGATE); turning that off gives the same."""
    out = {}
    for inproc in ("1", "0"):
        host, ctr = netns_factory(), netns_factory()
        conf = tmp_path / inproc / "net.d"
        write_conflist(conf, "dm", plugins(tmp_path / inproc / "ipam"))
        cmd = [go_libcni_tool, "-confdir", str(conf), "-net", "dm", "-path", shims, "-cachedir",
               str(tmp_path / inproc / "cache"), "-cid", "ip1", "-netns", ctr.path]
        env = {"PATH": os.environ.get("PATH", ""), "PYCNI_SOCKET": "off", "PYCNI_INPROC_DELEGATE": inproc}
        out[inproc] = normalised(json.loads(host.run([*cmd, "add"], env=env).stdout))
        host.run([*cmd, "del"], env=env)
        assert not list((tmp_path / inproc / "ipam" / "dm").glob("10.*"))
    assert out["1"] == out["0"]


# ---- finding the daemon without any environment (runtimes such as conmon filter it) ---------------------

def host_local_conf(tmp_path: Path, name: str) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": name, "ipam": {
        "type": "host-local", "subnet": "10.90.0.0/24", "dataDir": str(tmp_path / "ipam")}}).encode()


def cni_only_env(command: str, cid: str, cni_path: str) -> list[str]:
    """`env -i` and the CNI_* variables: no PATH, no PYCNI_SOCKET, nothing else."""
    return ["env", "-i", f"CNI_COMMAND={command}", f"CNI_CONTAINERID={cid}", "CNI_NETNS=/nonexistent",
            "CNI_IFNAME=eth0", f"CNI_PATH={cni_path}"]


def test_baked_socket_serves_an_empty_environment(daemon: Daemon, tmp_path: Path,
                                                   netns_factory: Callable[[], Namespace]) -> None:
    """`install-plugins --socket PATH` bakes the daemon's socket in: found with no PYCNI_SOCKET at all."""
    host = netns_factory()
    (exe,) = install(str(tmp_path / "baked"), ["host-local"], daemon=True, socket=daemon.sock)
    conf = host_local_conf(tmp_path, "baked")
    added = host.run([*cni_only_env("ADD", "envless1", str(tmp_path / "baked")), exe], input=conf)
    assert json.loads(added.stdout)["ips"][0]["address"] == "10.90.0.2/24"
    host.run([*cni_only_env("DEL", "envless1", str(tmp_path / "baked")), exe], input=conf)
    assert daemon.requests() == ["host-local ADD envless1", "host-local DEL envless1"]
    assert not (tmp_path / "ipam" / "baked" / "10.90.0.2").exists()
    # PYCNI_SOCKET still wins when a runtime passes it: "off" runs in-process, not served
    host.run(["env", "-i", "PYCNI_SOCKET=off", *cni_only_env("ADD", "envless2", str(tmp_path / "baked"))[2:], exe],
             input=conf)
    assert "host-local ADD envless2" not in daemon.requests()


def test_default_socket_serves_an_empty_environment(tmp_path: Path, netns_factory: Callable[[], Namespace]) -> None:
    """The default socket is the contract: a daemon started with no options serves executables installed
    with none, whatever their environment. Run in private mount and PID namespaces with a tmpfs on /run,
    so the machine's /run/pycni is never touched and the daemon dies with the test."""
    host = netns_factory()
    (exe,) = install(str(tmp_path / "bin"), ["host-local"], daemon=True)
    conf = tmp_path / "conf.json"
    conf.write_bytes(host_local_conf(tmp_path, "dflt"))
    log = tmp_path / "daemon.log"
    add = " ".join(cni_only_env("ADD", "dflt1", str(tmp_path / "bin")))
    delete = " ".join(cni_only_env("DEL", "dflt1", str(tmp_path / "bin")))
    script = f"""set -e
mount -t tmpfs pycni-test-run /run
env -i {sys.executable} -m pycni.daemon --debug --workers 1 --log-file {log} &
i=0; until [ -S /run/pycni/pycni.sock ]; do i=$((i+1)); [ $i -lt 600 ]; sleep 0.05; done
{add} {exe} < {conf} > {tmp_path / "added.json"}
{delete} {exe} < {conf}
kill -TERM $!; wait $!
"""
    proc = host.run(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
                     "--kill-child", "sh", "-c", script], timeout=120)
    assert proc.returncode == 0
    assert json.loads((tmp_path / "added.json").read_text())["ips"][0]["address"] == "10.90.0.2/24"
    served = re.findall(r"DEBUG (\S+ \S+ \S+) \(pid", log.read_text())
    assert served == ["host-local ADD dflt1", "host-local DEL dflt1"]
    assert not (tmp_path / "ipam" / "dflt" / "10.90.0.2").exists()
