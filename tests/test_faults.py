"""Faults during ADD leave nothing once DEL and GC ran (issue: reliability).

- kill -9 of the plugin process at seeded random points of a chained ADD (bridge + host-local +
  portmap, ptp + host-local), then DEL and GC: the host is as a complete ADD + DEL leaves it (no
  veth, no address or route of the container, no reservation, no per-container iptables/nft
  rule) and the container has only ``lo``. The seed is printed; PYCNI_FUZZ_SEED changes it.
- 64 ADDs at once, then 64 DELs at once: 64 distinct addresses, nothing left.
- A full dataDir (a tiny tmpfs) and a read-only one: a spec error, no veth, no reservation.

The plugins are the installed executables, run in a namespace playing the host. The daemon's
own faults are in tests/test_daemon_lifecycle.py, cluster-ipam's kill -9 in test_cluster_ipam.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import badinput
import pytest
from netns_util import Namespace
from plugin_util import env

from pycni import ipaddr

SEED = int(os.environ.get(badinput.SEED_ENV, badinput.DEFAULT_SEED))
KILLS = int(os.environ.get("PYCNI_FAULT_KILLS", "12"))  # kill -9 trials per chain
SUBNET = "10.66.0.0/24"


def chain(kind: str, data: Path) -> list[dict[str, Any]]:
    """The chain's plugin configs (each as the runtime would send it, prevResult added per call)."""
    ipam = {"type": "host-local", "subnet": SUBNET, "dataDir": str(data / "ipam")}
    net = {"cniVersion": "1.1.0", "name": "faultnet"}
    if kind == "ptp":
        return [{**net, "type": "ptp", "ipMasq": True, "ipam": ipam}]
    return [{**net, "type": "bridge", "bridge": "fltbr0", "isGateway": True, "ipMasq": True, "ipam": ipam},
            {**net, "type": "portmap", "capabilities": {"portMappings": True},
             "runtimeConfig": {"portMappings": [{"hostPort": 18081, "containerPort": 80, "protocol": "tcp"}]}}]


def group_gone(pgid: int) -> bool:
    """No process of this process group runs any more (an IPAM child may outlive a killed plugin)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                return False
    return True


def start(host: Namespace, plugin_dir: str, conf: dict[str, Any], e: dict[str, str]) -> subprocess.Popen[bytes]:
    """The plugin in ``host``, in a process group of its own (``ip netns exec`` execs it: same pid)."""
    p = subprocess.Popen(["ip", "netns", "exec", host.name, os.path.join(plugin_dir, conf["type"])],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                         start_new_session=True)
    assert p.stdin is not None
    p.stdin.write(json.dumps(conf).encode())
    p.stdin.close()
    return p


def finish(p: subprocess.Popen[bytes], deadline: float | None = None) -> tuple[int | None, bytes, bytes]:
    """Wait for ``p``; at ``deadline`` (monotonic) SIGKILL it and wait for what it started. rc None: killed."""
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        p.wait()
        for _ in range(1500):
            if group_gone(p.pid):
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"children of killed plugin {p.pid} still run") from None
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()
        p.stderr.close()
        return None, b"", b""
    out, err = p.stdout.read() if p.stdout else b"", p.stderr.read() if p.stderr else b""
    for s in (p.stdout, p.stderr):
        if s is not None:
            s.close()
    return p.returncode, out, err


def add_chain(host: Namespace, ctr: Namespace, plugin_dir: str, confs: list[dict[str, Any]], cid: str,
              deadline: float | None = None) -> dict[str, Any] | None:
    """ADD through the chain; None when killed at ``deadline``."""
    prev: dict[str, Any] | None = None
    for conf in confs:
        c = dict(conf, prevResult=prev) if prev is not None else conf
        rc, out, err = finish(start(host, plugin_dir, c, env("ADD", cid, ctr, cni_path=plugin_dir)), deadline)
        if rc is None:
            return None
        assert rc == 0, (out + err).decode()
        prev = json.loads(out)
    return prev


def del_chain(host: Namespace, ctr: Namespace | None, plugin_dir: str, confs: list[dict[str, Any]],
              cid: str) -> None:
    for conf in reversed(confs):
        rc, out, err = finish(start(host, plugin_dir, conf, env("DEL", cid, ctr, cni_path=plugin_dir)))
        assert rc == 0, f"DEL {conf['type']}: {(out + err).decode()}"


def gc_chain(host: Namespace, plugin_dir: str, confs: list[dict[str, Any]], keep: list[str]) -> None:
    for conf in confs:
        c = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": k, "ifname": "eth0"} for k in keep]})
        rc, out, err = finish(start(host, plugin_dir, c, env("GC", cni_path=plugin_dir)))
        assert rc == 0, f"GC {conf['type']}: {(out + err).decode()}"


def state(host: Namespace, data: Path) -> dict[str, Any]:
    """The host namespace as badinput snapshots it, and the reservations in the IPAM dataDir."""
    out = host.run([sys.executable, "-S", badinput.__file__, "snap"])
    snap = json.loads(out.stdout)
    del snap["sysctl"]  # a veth's own sysctls come and go with it: links and rules say enough
    # (badinput's snapshot already leaves out what the kernel derives late: carrier, link-local)
    reservations = []
    for p in (data / "ipam").rglob("*"):
        try:
            ipaddr.ip_address(p.name)
            reservations.append(p.name)
        except ValueError:
            pass
    snap["reservations"] = sorted(reservations)
    return snap


def container_links(ctr: Namespace) -> list[str]:
    return sorted(x["ifname"] for x in json.loads(ctr.run(["ip", "-j", "link", "show"]).stdout))


@pytest.fixture
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from pycni.install_plugins import install

    d = tmp_path_factory.mktemp("fault-bin")
    install(str(d), ["bridge", "ptp", "host-local", "portmap"])
    return str(d)


@pytest.mark.parametrize("kind", ["bridge+portmap", "ptp"])
def test_kill9_during_add_then_del_and_gc_leave_nothing(host_ns: Namespace, netns_factory: Callable[[], Namespace],
                                                        plugin_dir: str, tmp_path: Path, kind: str) -> None:
    confs = chain(kind, tmp_path)
    # a complete ADD + DEL first: what stays after it (the bridge, ip_forward, the shared chains) is the baseline
    ctr = netns_factory()
    t0 = time.monotonic()
    assert add_chain(host_ns, ctr, plugin_dir, confs, "warm") is not None
    took = time.monotonic() - t0
    del_chain(host_ns, ctr, plugin_dir, confs, "warm")
    baseline = state(host_ns, tmp_path)
    assert baseline["reservations"] == []
    rng = random.Random(f"{SEED}-{kind}")
    print(f"fault seed {SEED} (set {badinput.SEED_ENV} to change it); a complete ADD took {took:.2f} s")
    killed = 0
    for trial in range(KILLS):
        ctr = netns_factory()
        cid = f"kill{trial}"
        delay = rng.uniform(0.0, took * 1.1)
        result = add_chain(host_ns, ctr, plugin_dir, confs, cid, deadline=time.monotonic() + delay)
        killed += result is None
        del_chain(host_ns, ctr, plugin_dir, confs, cid)
        assert container_links(ctr) == ["lo"], f"trial {trial} (SIGKILL after {delay:.3f} s)"
        gc_chain(host_ns, plugin_dir, confs, keep=[])
        after = state(host_ns, tmp_path)
        assert after == baseline, (f"trial {trial} (SIGKILL after {delay:.3f} s): "
                                   f"{badinput.diff({'host': baseline, 'ctr': {}}, {'host': after, 'ctr': {}})}")
        ctr.delete()
    print(f"{killed} of {KILLS} ADDs killed before they completed")
    assert killed > 0


def test_parallel_add_then_del(host_ns: Namespace, netns_factory: Callable[[], Namespace], plugin_dir: str,
                               tmp_path: Path) -> None:
    """64 ADDs at once get 64 distinct addresses; 64 DELs at once leave what one ADD + DEL leaves."""
    confs = chain("bridge", tmp_path)[:1]
    warm = netns_factory()
    assert add_chain(host_ns, warm, plugin_dir, confs, "warm") is not None
    del_chain(host_ns, warm, plugin_dir, confs, "warm")
    baseline = state(host_ns, tmp_path)
    ctrs = [netns_factory() for _ in range(64)]
    procs = [start(host_ns, plugin_dir, confs[0], env("ADD", f"par{i}", c, cni_path=plugin_dir))
             for i, c in enumerate(ctrs)]
    outs = [finish(p) for p in procs]
    bad = [(i, (o + e).decode()[:300]) for i, (rc, o, e) in enumerate(outs) if rc != 0]
    assert not bad, bad
    addrs = [json.loads(o)["ips"][0]["address"] for _, o, _ in outs]
    assert len(set(addrs)) == 64, sorted(addrs)
    procs = [start(host_ns, plugin_dir, confs[0], env("DEL", f"par{i}", c, cni_path=plugin_dir))
             for i, c in enumerate(ctrs)]
    outs = [finish(p) for p in procs]
    bad = [(i, (o + e).decode()[:300]) for i, (rc, o, e) in enumerate(outs) if rc != 0]
    assert not bad, bad
    assert state(host_ns, tmp_path) == baseline
    assert all(container_links(c) == ["lo"] for c in ctrs)


# The plugin runs in a private mount namespace where its dataDir is a tmpfs made full or
# read-only; this script reports its answer and what the dataDir holds afterwards.
_UNDER_BROKEN_DATADIR = r"""
import json, os, subprocess, sys
how, data, plugin, conf = sys.argv[1:5]
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", data], check=True)
os.makedirs(os.path.join(data, "faultnet"))
if how == "full":
    fd = os.open(os.path.join(data, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        os.close(fd)
else:
    subprocess.run(["mount", "-o", "remount,ro", data], check=True)
p = subprocess.run([plugin], input=conf.encode(), capture_output=True)
left = sorted(os.path.relpath(os.path.join(d, n), data) for d, ds, fs in os.walk(data) for n in ds + fs)
print(json.dumps({"rc": p.returncode, "stdout": p.stdout.decode(), "stderr": p.stderr.decode(), "left": left}))
"""


@pytest.mark.parametrize("how", ["full", "read-only"])
@pytest.mark.parametrize("kind", ["bridge", "ptp"])
def test_broken_datadir_fails_cleanly(host_ns: Namespace, container_ns: Namespace, plugin_dir: str,
                                      tmp_path: Path, how: str, kind: str) -> None:
    conf = chain(kind, tmp_path)[0]
    data = tmp_path / "ipam"
    data.mkdir()
    before = state(host_ns, tmp_path)
    e = env("ADD", "broken", container_ns, cni_path=plugin_dir)
    cmd = ["ip", "netns", "exec", host_ns.name, "unshare", "--mount", sys.executable, "-c", _UNDER_BROKEN_DATADIR,
           how, str(data), os.path.join(plugin_dir, kind), json.dumps(conf)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["rc"] == 1, got
    body = json.loads(got["stdout"])
    assert isinstance(body.get("code"), int) and body.get("msg"), got
    assert not any(m in got["stdout"] + got["stderr"] for m in badinput.TRACE_MARKS), got
    assert [x for x in got["left"] if x not in ("faultnet", "faultnet/lock", "filler")] == [], got
    assert state(host_ns, tmp_path) == before
    assert container_links(container_ns) == ["lo"]
