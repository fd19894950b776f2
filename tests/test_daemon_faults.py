"""Fault suite for daemon mode: bridge (or ptp) + host-local + portmap ADDs served through a `pycni
daemon` that is killed with SIGKILL at random points, flooded with silent and garbage clients, or
stopped with SIGTERM under parallel load.

What must hold: every plugin call answers a result or the spec's error JSON (never a hang or a
traceback), and a one-shot DEL then GC afterwards leave nothing of the attachment — no link, no
address reservation, no nftables or iptables rule — compared with the host as it was after a
complete ADD and DEL. (GC is needed for one point only: an ADD killed between creating its
reservation file and writing the owner into it leaves an empty file no DEL can attribute.)
Seeded (PYCNI_FAULT_SEED) and bounded (PYCNI_FAULT_TRIALS) for CI; the kill points are drawn
from the time one chain takes through the daemon on this machine. The daemon runs in a
namespace of its own and serves callers in throwaway "host" namespaces; its socket and the
IPAM store are in temporary directories.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import WAIT, DaemonProc, alive, children_of, needs_privileges, request, running_with, wait_until
from netns_util import Namespace
from plugin_util import run

from pycni import ipaddr
from pycni.daemon import protocol
from pycni.install_plugins import install

SEED = int(os.environ.get("PYCNI_FAULT_SEED", "1616"))
TRIALS = int(os.environ.get("PYCNI_FAULT_TRIALS", "8"))
NET = "faults"


class Setup:
    """Shims, a host namespace with its bridge network, and a daemon namespace."""

    def __init__(self, tmp: Path, netns_factory: Callable[[], Namespace], main: str = "bridge") -> None:
        self.tmp, self.new_ns, self.main = tmp, netns_factory, main
        self.bindir = tmp / "bin"
        install(str(self.bindir), [main, "host-local", "portmap"], daemon=True)
        self.data_dir = tmp / "ipam"
        self.home, self.host = netns_factory(), netns_factory()
        (tmp / "run").mkdir(exist_ok=True)  # the daemon creates no directory but its default's
        self.sock = str(tmp / "run" / "pycni.sock")
        self.daemons: list[DaemonProc] = []
        self.baseline: dict[str, str] = {}

    def start(self, workers: int = 2) -> DaemonProc:
        d = DaemonProc(self.sock, self.tmp / f"daemon{len(self.daemons)}.log", "--workers", str(workers),
                       prefix=["ip", "netns", "exec", self.home.name], preload=True)
        self.daemons.append(d)
        return d.ready(workers=workers if workers > 1 else 0)

    def main_conf(self) -> dict[str, Any]:
        """The main plugin's config: bridge (with a gateway and masquerading) or ptp."""
        conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": NET, "type": self.main, "ipMasq": True,
                                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]],
                                         "dataDir": str(self.data_dir), "routes": [{"dst": "0.0.0.0/0"}]}}
        if self.main == "bridge":
            conf.update(bridge="cni-f", isGateway=True)
        return conf

    def portmap_conf(self, port: int, prev: dict[str, Any] | None) -> dict[str, Any]:
        conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": NET, "type": "portmap",
                                "capabilities": {"portMappings": True},
                                "runtimeConfig": {"portMappings": [{"hostPort": port, "containerPort": 80,
                                                                    "protocol": "tcp"}]}}
        if prev is not None:
            conf["prevResult"] = prev
        return conf

    def call(self, plugin: str, command: str, conf: dict[str, Any], cid: str, ctr: Namespace,
             sock: str) -> tuple[int, dict[str, Any]]:
        """One plugin executable run as a runtime runs it; (exit code, parsed stdout)."""
        proc = run(plugin, command, conf, via="exec", host=self.host, cni_path=str(self.bindir), container_id=cid,
                   netns=ctr, PYCNI_SOCKET=sock)
        stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
        assert "Traceback" not in stderr, stderr
        try:
            out = json.loads(stdout) if stdout.strip() else {}
        except ValueError:
            raise AssertionError(f"{plugin} {command}: not JSON: {stdout!r} {stderr!r}") from None
        if proc.exit_code == 0:
            assert command != "ADD" or out.get("cniVersion") == "1.0.0", out
        else:  # the spec's error shape, with a code
            assert isinstance(out.get("code"), int) and out.get("msg"), (plugin, command, out, stderr, proc.exit_code)
        return proc.exit_code, out

    def add_chain(self, cid: str, ctr: Namespace, port: int, sock: str) -> list[tuple[str, int, dict[str, Any]]]:
        """The main plugin then portmap, stopping at the first error, as a runtime does."""
        code, result = self.call(self.main, "ADD", self.main_conf(), cid, ctr, sock)
        steps = [(self.main, code, result)]
        if code == 0:
            code, out = self.call("portmap", "ADD", self.portmap_conf(port, result), cid, ctr, sock)
            steps.append(("portmap", code, out))
        return steps

    def del_chain(self, cid: str, ctr: Namespace, port: int, sock: str = "off") -> None:
        """DEL in reverse order, one-shot unless ``sock`` says otherwise; each must succeed."""
        for plugin, conf in (("portmap", self.portmap_conf(port, None)), (self.main, self.main_conf())):
            code, out = self.call(plugin, "DEL", conf, cid, ctr, sock)
            assert code == 0, (plugin, out)

    def gc(self, ctr: Namespace) -> None:
        """GC (spec 1.1) one-shot with no valid attachment, as a runtime's sweep after a crash; must succeed."""
        for plugin, conf in (("portmap", self.portmap_conf(0, None)), (self.main, self.main_conf())):
            conf = dict(conf, cniVersion="1.1.0")
            conf["cni.dev/valid-attachments"] = []
            conf.pop("runtimeConfig", None)
            code, out = self.call(plugin, "GC", conf, "", ctr, "off")
            assert code == 0, (plugin, out)

    # ---- what an attachment leaves -----------------------------------------------------------
    def state(self) -> dict[str, str]:
        """Host state an attachment could leave behind (counters and generated comments masked)."""
        links = self.host.run(["ip", "-o", "link", "show"]).stdout
        ipt = "".join(self.host.run([tool]).stdout for tool in ("iptables-save", "ip6tables-save"))
        return {"links": "\n".join(sorted(re.sub(r"^\d+: (\S+?)[@:].*$", r"\1", ln) for ln in links.splitlines())),
                "nft": re.sub(r"(packets|bytes) \d+", r"\1 N", self.host.run(["nft", "list", "ruleset"]).stdout),
                "iptables": re.sub(r"^#.*$|\[\d+:\d+\]", "", ipt, flags=re.M)}

    def reservations(self) -> list[str]:
        d = self.data_dir / NET
        out = []
        for name in (os.listdir(d) if d.exists() else []):
            try:
                ipaddr.ip_address(name)
            except ValueError:
                continue
            out.append(name)
        return out

    def assert_nothing_left(self, ctrs: list[Namespace]) -> None:
        assert self.reservations() == []
        assert self.state() == self.baseline
        for ctr in ctrs:
            assert ctr.run(["ip", "-o", "link", "show", "dev", "eth0"], check=False).returncode != 0

    def warm_up(self, d: DaemonProc) -> float:
        """One complete ADD and DEL through ``d``: the baseline state, and how long an ADD takes."""
        ctr = self.new_ns()
        started = time.monotonic()
        steps = self.add_chain("warm", ctr, 9999, d.sock)
        took = time.monotonic() - started
        assert [code for _, code, _ in steps] == [0, 0], steps
        self.del_chain("warm", ctr, 9999, d.sock)
        self.baseline = self.state()
        assert self.reservations() == []
        return took


@pytest.fixture
def setup(tmp_path: Path, netns_factory: Callable[[], Namespace]) -> Iterator[Setup]:
    s = Setup(tmp_path, netns_factory)
    try:
        yield s
    finally:
        for d in s.daemons:
            d.reap()


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            box.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, box


def _outcome(t: threading.Thread, box: list[Any]) -> Any:
    t.join(WAIT * 3)
    assert not t.is_alive(), "a plugin call hung"
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


# ---- kill -9 at random points ------------------------------------------------------------------

@pytest.mark.parametrize("main", ["bridge", "ptp"])
def test_kill_9_at_random_points_leaves_nothing_after_del(main: str, tmp_path: Path,
                                                          netns_factory: Callable[[], Namespace]) -> None:
    """Kill points are a seeded fraction of how long a chain takes on a fresh daemon here.

    That time is measured once (after the first ADD, which also makes the bridge) and shrinks
    to what a trial's undisturbed chain took, so the points keep landing inside the chain on a
    loaded machine as on an idle one.
    """
    setup = Setup(tmp_path, netns_factory, main)
    try:
        _kill_trials(setup, random.Random(SEED))
    finally:
        for d in setup.daemons:
            d.reap()


def _kill_trials(setup: Setup, rng: random.Random) -> None:
    first = setup.start()
    setup.warm_up(first)
    assert first.terminate() == 0
    fresh = setup.start()
    span = setup.warm_up(fresh) * 1.5
    assert fresh.terminate() == 0
    # What an ADD killed between creating its reservation file and writing the owner leaves:
    # a GC with no valid attachment for it sweeps it (as the trials below may need).
    leftover = setup.data_dir / NET / "10.77.0.250"
    leftover.touch()
    setup.gc(setup.new_ns())
    assert not leftover.exists()
    print(f"seed {SEED}, {TRIALS} trials")
    inside = 0
    for trial in range(TRIALS):
        d = setup.start()
        ctr = setup.new_ns()
        cid, port = f"kill{trial}", 8000 + trial
        what, delay = rng.choice(["session", "session", "session", "main"]), rng.uniform(0, 1) * span
        started = time.monotonic()
        t, box = _in_thread(lambda cid=cid, ctr=ctr, port=port: (setup.add_chain(cid, ctr, port, setup.sock),
                                                                 time.monotonic()))
        time.sleep(delay)
        during = t.is_alive()
        if what == "session":  # the daemon with everything it runs, as systemd's final SIGKILL
            os.killpg(d.pid, signal.SIGKILL)
        else:  # only the main process: its workers must go too
            os.kill(d.pid, signal.SIGKILL)
        d.proc.wait(WAIT)
        wait_until(lambda d=d: not any(alive(w) for w in d.workers), "the workers to exit")
        steps, ended = _outcome(t, box)
        inside += during
        if not during:
            span = min(span, (ended - started) * 1.5)
        print(f"trial {trial}: kill -9 {what} at {delay * 1000:.0f} ms{'' if during else ' (after the chain)'} ->",
              ", ".join(f"{p} {code}" + (f" ({out['code']})" if code else "") for p, code, out in steps))
        setup.del_chain(cid, ctr, port)
        # An ADD killed between creating a reservation file and writing its owner into it
        # leaves an empty file that no DEL can attribute (Go's host-local alike); GC sweeps it.
        after_del = setup.reservations()
        setup.gc(ctr)
        if after_del:
            print(f"  DEL left unattributable reservations {after_del}; GC removed them")
        setup.assert_nothing_left([ctr])
    print(f"{inside}/{TRIALS} kills landed while the chain ran")


@needs_privileges
def test_kill_9_of_the_main_process_while_it_replaces_a_worker(tmp_path: Path) -> None:
    """A worker forked just before the main process dies (maybe before its prctl) does not stay."""
    rng = random.Random(SEED + 3)
    for trial in range(max(2, TRIALS // 2)):
        sock = str(tmp_path / f"r{trial}.sock")
        d = DaemonProc(sock, tmp_path / f"r{trial}.log", "--workers", "2")
        try:
            d.ready(workers=2)
            os.kill(d.workers[0], signal.SIGKILL)  # the main process forks a replacement within 0.2 s
            time.sleep(rng.uniform(0, 0.3))
            os.kill(d.pid, signal.SIGKILL)
            d.proc.wait(WAIT)
            wait_until(lambda sock=sock: running_with(sock) == [], "every process of the daemon to exit")
        finally:
            d.workers = running_with(sock)
            d.reap()


# ---- silent and garbage clients ----------------------------------------------------------------

def _garbage(rng: random.Random) -> bytes:
    """One malformed client message: random bytes, lies about lengths, broken fields."""
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))
    if kind == 1:  # a length far beyond the limit
        return (protocol.MAX_FRAME + rng.randrange(1, 1 << 20)).to_bytes(4, "big") + rng.randbytes(8)
    if kind == 2:  # a frame cut short
        body = protocol.encode_request("bridge", rng.randbytes(64), {b"CNI_COMMAND": b"ADD"})
        return body[:rng.randrange(1, len(body) - 1)]
    if kind == 3:  # a field that overruns the frame
        body = protocol.MAGIC + (1000).to_bytes(4, "big") + b"bridge"
        return len(body).to_bytes(4, "big") + body
    body = protocol.MAGIC + b"\x00\x00\x00\x06bridge" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x03=x\xff"
    return len(body).to_bytes(4, "big") + body


def test_silent_and_garbage_clients_do_not_block_others(setup: Setup) -> None:
    rng = random.Random(SEED + 1)
    d = setup.start()
    setup.warm_up(d)
    silent, garbage = [], []
    for i in range(64):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(setup.sock)
        if i % 2:
            s.sendall(_garbage(rng))
            garbage.append(s)
        else:
            silent.append(s)
    try:
        ctrs = [setup.new_ns() for _ in range(4)]
        chains = [_in_thread(lambda i=i: setup.add_chain(f"busy{i}", ctrs[i], 8100 + i, setup.sock))
                  for i in range(4)]
        for t, box in chains:
            assert [code for _, code, _ in _outcome(t, box)] == [0, 0]
        assert request(setup.sock, "loopback", {"CNI_COMMAND": "VERSION"})[0] == 0
        for s in garbage:  # each one answered with a spec error (or closed), none left hanging
            s.settimeout(WAIT)
            data = b""
            try:
                while chunk := s.recv(1 << 16):
                    data += chunk
            except ConnectionResetError:
                pass
            if len(data) >= 4 and data[4:4 + len(protocol.MAGIC)] == protocol.MAGIC:
                code, out, _ = protocol.decode_reply(data[4:])
                assert code == 1 and json.loads(out)["code"] in (4, 11), out
        for i, ctr in enumerate(ctrs):
            setup.del_chain(f"busy{i}", ctr, 8100 + i, setup.sock)
        assert d.terminate() == 0  # with the silent clients still connected
        setup.assert_nothing_left(ctrs)
        assert "Traceback" not in d.log.read_text()
    finally:
        for s in silent + garbage:
            s.close()


# ---- SIGTERM under load ------------------------------------------------------------------------

def test_sigterm_under_load(setup: Setup) -> None:
    rng = random.Random(SEED + 2)
    n = 12
    d = setup.start()
    span = setup.warm_up(d) * 2
    ctrs = [setup.new_ns() for _ in range(n)]
    chains = [_in_thread(lambda i=i: setup.add_chain(f"load{i}", ctrs[i], 8200 + i, setup.sock)) for i in range(n)]
    delay = rng.uniform(0, span)
    time.sleep(delay)
    running = sum(t.is_alive() for t, _ in chains)
    d.proc.send_signal(signal.SIGTERM)
    workers = list(d.workers)
    assert d.wait() == 0
    assert not any(alive(w) for w in workers) and children_of(d.pid) == []
    outcomes = [_outcome(t, box) for t, box in chains]
    done = sum(1 for steps in outcomes if [code for _, code, _ in steps] == [0, 0])
    print(f"seed {SEED + 2}: SIGTERM at {delay * 1000:.0f} ms with {running} chains running, {done}/{n} completed, "
          f"errors: {sorted({out['code'] for steps in outcomes for _, code, out in steps if code})}")
    for i, ctr in enumerate(ctrs):
        setup.del_chain(f"load{i}", ctr, 8200 + i)
    setup.assert_nothing_left(ctrs)
    assert not os.path.exists(setup.sock)
    assert "Traceback" not in d.log.read_text()
