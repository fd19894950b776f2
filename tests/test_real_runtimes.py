"""Our plugins under real runtimes: podman (CNI backend) and containerd (``ctr run --cni``).

Each runtime runs on a throwaway host (tests/runtime_host.py: its own network, mount and PID
namespaces, scratch /etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /run and container storage),
with our plugins installed into its /opt/cni/bin by ``pycni install-plugins``. An "outside"
namespace, joined to the host by a veth, plays a client on the network. After each scenario
nothing may be left on the host: no interface, host-local reservation, result cache file,
netns file, or rule of a container or network.

The swap tests run containers with one implementation in /opt/cni/bin and remove them with
the other (a node operator replacing the plugins under live containers).

Skipped, saying why, only when a runtime's binaries are not installed (``bash scripts/setup --test``
installs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from netns_util import Namespace, have_root, new_namespace
from runtime_host import IMAGE, RuntimeHost, busybox_rootfs, connect_outside, missing, need

PYCNI = str(Path(sys.executable).with_name("pycni"))
HOST_IP = "192.0.2.1"
OUTSIDE_IP = "192.0.2.2"
# busybox ping needs a raw socket; podman's default capabilities leave NET_RAW out
RUN_OPTS = ("--cap-add", "NET_RAW")
# chain names the reference derives per container (CNI-<hash>, CNI-DN-<hash>, ...)
PER_CONTAINER_CHAIN = re.compile(r"CNI-(?:[A-Z]{2}-)?[0-9a-f]{24}")


@pytest.fixture(scope="session")
def busybox_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need("busybox")
    return busybox_rootfs(tmp_path_factory.mktemp("busybox-image"))


@pytest.fixture(scope="module")
def outside_ns() -> Iterator[Namespace]:
    if not have_root():
        pytest.skip("network namespaces need root")
    ns = new_namespace()
    yield ns
    ns.delete()


@pytest.fixture(scope="module")
def podman_host(tmp_path_factory: pytest.TempPathFactory, busybox_tar: Path,
                outside_ns: Namespace) -> Iterator[RuntimeHost]:
    """One host for every podman case: the image imported once, an outside namespace wired."""
    need("podman", "runc", "conmon", "nsenter", "unshare")
    with RuntimeHost(tmp_path_factory.mktemp("podman-host")) as host:
        host.podman_import(busybox_tar)
        connect_outside(host, outside_ns, HOST_IP, OUTSIDE_IP)
        yield host


@pytest.fixture
def podman(podman_host: RuntimeHost) -> Iterator[RuntimeHost]:
    """The shared host with our plugins installed; every container and network removed after."""
    podman_host.install_ours(PYCNI)
    yield podman_host
    podman_host.podman("rm", "-af", "-t", "0", check=False)
    for net in podman_host.podman("network", "ls", "-q", check=False).split():
        if net != "podman":
            podman_host.podman("network", "rm", "-f", net, check=False)
    # each case checks its own leftovers; what a failed case left must not fail the next one
    podman_host.sh("nft flush ruleset; nft list tables | while read -r _ f t; do nft delete table $f $t; done",
                   check=False)


# ---- helpers ---------------------------------------------------------------------------------

def fetch(host: RuntimeHost, url: str, where: Callable[[list[str]], list[str]] | None = None) -> str:
    """The page at ``url`` fetched with busybox wget (from the host unless ``where`` wraps it)."""
    # busybox wget's own -T crashes in the static build here: bound it with timeout instead
    cmd = ["timeout", "10", "busybox", "wget", "-q", "-O", "-", url]
    proc = host.run(where(cmd) if where else cmd, check=False)
    assert proc.returncode == 0, f"GET {url} failed: {proc.stderr.strip()}"
    return proc.stdout


def fetch_from(ns: Namespace, url: str) -> str:
    """The page at ``url`` fetched from a plain namespace (the outside world)."""
    proc = ns.run(["timeout", "10", "busybox", "wget", "-q", "-O", "-", url], check=False)
    assert proc.returncode == 0, f"GET {url} from {ns.name} failed: {proc.stderr.strip()}"
    return proc.stdout


def in_ctr(name: str) -> Callable[[list[str]], list[str]]:
    return lambda cmd: ["podman", "exec", name, *cmd]


def container_ip(host: RuntimeHost, name: str, ifname: str = "eth0", family: str = "-4") -> str:
    out = host.podman("exec", name, "ip", family, "-o", "addr", "show", ifname, "scope", "global")
    return out.split()[3].split("/")[0]


def v6_default_gateways(host: RuntimeHost, name: str) -> list[str]:
    """Gateways of a container's IPv6 default routes (from /proc: busybox's ip shows two default
    routes through different gateways, which the kernel keeps as one multipath route, without
    their next hops)."""
    table = host.podman("exec", name, "cat", "/proc/net/ipv6_route").splitlines()
    return [f[4] for f in (line.split() for line in table) if f[0] == "0" * 32 and f[1] == "00" and f[4] != "0" * 32]


def ping(host: RuntimeHost, name: str, ip: str) -> None:
    """One echo answered; IPv6 retried while fresh addresses finish duplicate address detection."""
    tries = 30 if ":" in ip else 1
    script = f"for i in $(seq {tries}); do ping -c 1 -W 3 {ip} && exit 0; sleep 0.2; done; exit 1"
    host.podman("exec", name, "sh", "-c", script)


def run_httpd(host: RuntimeHost, name: str, *opts: str) -> str:
    return host.podman("run", "-d", "--name", name, *RUN_OPTS, *opts, IMAGE, "httpd", "-f", "-p", "80", "-h", "/www")


def run_idle(host: RuntimeHost, name: str, *opts: str) -> str:
    return host.podman("run", "-d", "--name", name, *RUN_OPTS, *opts, IMAGE, "sleep", "100000")


def rule_leftovers(host: RuntimeHost, needles: list[str]) -> list[str]:
    """Rules, chains and set elements of containers or networks still on the host: lines that
    name a per-container chain or one of ``needles`` (a network's address prefix: every DNAT,
    masquerade, firewall rule and map element of a container carries its address)."""
    dump = host.sh("iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; nft list ruleset 2>/dev/null",
                   check=False)
    return [line.strip() for line in dump.splitlines()
            if PER_CONTAINER_CHAIN.search(line) or any(n in line for n in needles)]


def state_leftovers(host: RuntimeHost) -> list[str]:
    """Reservations, cache files and netns files left in the host's CNI and runtime state."""
    left: list[str] = []
    networks = host.path("/var/lib/cni") / "networks"
    for f in networks.glob("*/*") if networks.is_dir() else []:
        if f.name != "lock" and not f.name.startswith("last_reserved_ip"):
            left.append(f"reservation {f.parent.name}/{f.name}")
    results = host.path("/var/lib/cni") / "results"
    left += [f"cache file {f.name}" for f in results.iterdir()] if results.is_dir() else []
    left += [f"netns file {n}" for n in host.sh("ls /run/netns").split()]
    return left


def interfaces(host: RuntimeHost) -> list[str]:
    out = host.run(["ip", "-o", "link", "show"]).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines())


def assert_clean(host: RuntimeHost, needles: list[str]) -> None:
    assert interfaces(host) == ["lo", "uplink0"], "interfaces left on the host"
    assert state_leftovers(host) == []
    assert rule_leftovers(host, needles) == []


# ---- podman ----------------------------------------------------------------------------------

def test_podman_bridge_ports_restart_rm(podman: RuntimeHost, outside_ns: Namespace) -> None:
    host = podman
    host.podman("network", "create", "--subnet", "10.91.1.0/24", "pnet1")
    run_httpd(host, "web", "--network", "pnet1", "-p", "8080:80")
    run_idle(host, "c2", "--network", "pnet1")
    run_idle(host, "c3", "--network", "pnet1")
    ips = {n: container_ip(host, n) for n in ("web", "c2", "c3")}
    assert all(ip.startswith("10.91.1.") for ip in ips.values()), ips
    assert len(set(ips.values())) == 3

    ping(host, "c2", ips["c3"])
    ping(host, "c3", ips["c2"])
    ping(host, "web", ips["c2"])
    assert fetch(host, f"http://{ips['web']}:80/", in_ctr("c2")) == "pycni\n"

    # the published port: from the outside namespace, from the host, hairpin, a neighbour
    assert fetch_from(outside_ns, f"http://{HOST_IP}:8080/") == "pycni\n"
    assert fetch(host, f"http://{HOST_IP}:8080/") == "pycni\n"
    assert fetch(host, f"http://{HOST_IP}:8080/", in_ctr("web")) == "pycni\n"
    assert fetch(host, f"http://{HOST_IP}:8080/", in_ctr("c3")) == "pycni\n"

    # restart: the network is torn down and set up again, the port still mapped
    host.podman("restart", "-t", "0", "web")
    ips["web"] = container_ip(host, "web")
    ping(host, "c2", ips["web"])
    assert fetch(host, f"http://{HOST_IP}:8080/", in_ctr("c2")) == "pycni\n"

    host.podman("rm", "-f", "-t", "0", "web", "c2", "c3")
    host.podman("network", "rm", "pnet1")
    assert_clean(host, ["10.91.1."])


def test_podman_two_networks(podman: RuntimeHost) -> None:
    host = podman
    host.podman("network", "create", "--subnet", "10.91.2.0/24", "--subnet", "fd91:2::/64", "pnet2")
    host.podman("network", "create", "--subnet", "10.91.3.0/24", "--subnet", "fd91:3::/64", "pnet3")
    run_idle(host, "solo2", "--network", "pnet2")
    run_idle(host, "solo3", "--network", "pnet3")
    run_idle(host, "multi", "--network", "pnet2,pnet3")
    # podman names the interfaces in its own order of the networks
    multi = {ip.rsplit(".", 1)[0]: ip for ip in (container_ip(host, "multi", i) for i in ("eth0", "eth1"))}
    assert sorted(multi) == ["10.91.2", "10.91.3"], multi
    assert host.podman("exec", "multi", "ip", "route", "show", "default").count("default via") == 2
    assert len(v6_default_gateways(host, "multi")) == 2
    solo3_v6 = container_ip(host, "solo3", family="-6")
    assert solo3_v6.startswith("fd91:3::"), solo3_v6
    ping(host, "multi", solo3_v6)
    ping(host, "multi", container_ip(host, "solo2"))
    ping(host, "multi", container_ip(host, "solo3"))
    ping(host, "solo2", multi["10.91.2"])
    ping(host, "solo3", multi["10.91.3"])

    # podman network connect/disconnect on a running container
    host.podman("network", "connect", "pnet3", "solo2")
    ping(host, "solo2", container_ip(host, "solo3"))
    ping(host, "solo3", container_ip(host, "solo2", "eth1"))
    host.podman("network", "disconnect", "pnet3", "solo2")
    assert "eth1" not in host.podman("exec", "solo2", "ip", "-o", "link")
    ping(host, "solo2", multi["10.91.2"])

    host.podman("restart", "-t", "0", "multi")
    ping(host, "multi", container_ip(host, "solo3"))
    ping(host, "multi", container_ip(host, "solo2"))

    host.podman("rm", "-f", "-t", "0", "multi", "solo2", "solo3")
    host.podman("network", "rm", "pnet2", "pnet3")
    assert_clean(host, ["10.91.2.", "10.91.3.", "fd91:2:", "fd91:3:"])


@pytest.mark.parametrize("first,then", [("go", "ours"), ("ours", "go")])
def test_podman_swap_plugins_under_live_containers(podman: RuntimeHost, outside_ns: Namespace,
                                                   first: str, then: str) -> None:
    """Containers created by one implementation, removed by the other: nothing left behind,
    and the same host port works for the next container."""
    if missing("/usr/lib/cni/bridge"):
        pytest.skip("Go reference plugins not installed (containernetworking-plugins)")
    host = podman

    def install(which: str) -> None:
        host.install_ours(PYCNI) if which == "ours" else host.install_go()

    install(first)
    host.podman("network", "create", "--subnet", "10.91.4.0/24", "swapnet")
    run_httpd(host, "old", "--network", "swapnet", "-p", "8081:80")
    run_idle(host, "old2", "--network", "swapnet", "-p", "8082:80")
    assert fetch(host, f"http://{HOST_IP}:8081/") == "pycni\n"

    install(then)  # the operator replaces /opt/cni/bin under live containers
    host.podman("rm", "-f", "-t", "0", "old", "old2")
    assert rule_leftovers(host, ["10.91.4."]) == []

    run_httpd(host, "new", "--network", "swapnet", "-p", "8081:80")
    new_ip = container_ip(host, "new")
    assert fetch_from(outside_ns, f"http://{HOST_IP}:8081/") == "pycni\n"
    assert fetch(host, f"http://{HOST_IP}:8081/") == "pycni\n"
    assert fetch(host, f"http://{new_ip}:80/") == "pycni\n"

    host.podman("rm", "-f", "-t", "0", "new")
    host.podman("network", "rm", "swapnet")
    assert_clean(host, ["10.91.4."])


def test_podman_daemon_on_default_socket(podman: RuntimeHost) -> None:
    """With ``pycni daemon`` on its default socket, podman's plugin calls reach it with no
    environment set: the ADD from ``podman run`` and the DEL from conmon's ``podman container
    cleanup`` (conmon filters the environment) when a container exits on its own."""
    host = podman
    log = "/run/pycni-daemon.log"
    host.popen(["sh", "-c", f"echo $$ > /run/pycni-daemon.pid; exec {PYCNI} daemon --debug --log-file {log}"],
               host.scratch / "daemon.out")
    try:
        host.sh("for i in $(seq 300); do [ -S /run/pycni/pycni.sock ] && exit 0; sleep 0.1; done; exit 1")
        host.podman("network", "create", "--subnet", "10.91.5.0/24", "dnet")
        run_httpd(host, "dweb", "--network", "dnet", "-p", "8083:80")
        assert fetch(host, f"http://{HOST_IP}:8083/") == "pycni\n"
        host.podman("run", "-d", "--name", "brief", "--network", "dnet", "-p", "8084:80", IMAGE, "sleep", "1")
        host.podman("wait", "brief")
        host.sh("for i in $(seq 100); do [ -z \"$(ls /var/lib/cni/results | grep -v dweb)\" ] && exit 0; "
                "sleep 0.1; done; exit 1", check=False)
        served = host.sh(f"cat {log}")
        brief = host.podman("inspect", "-f", "{{.Id}}", "brief")
        assert re.search(rf"bridge ADD {brief}", served) and re.search(rf"bridge DEL {brief}", served), served
        assert re.search(r"portmap DEL", served), served
        host.podman("rm", "-f", "-t", "0", "dweb", "brief")
        host.podman("network", "rm", "dnet")
        assert_clean(host, ["10.91.5."])
    finally:
        host.sh("kill $(cat /run/pycni-daemon.pid); rm -f /run/pycni-daemon.pid", check=False)


# ---- containerd (ctr run --cni) --------------------------------------------------------------

CTR_CONFLIST = """{
  "cniVersion": "1.0.0",
  "name": "ctrnet",
  "plugins": [
    {"type": "bridge", "bridge": "ctr0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.91.8.0/24"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall"},
    {"type": "tuning"}
  ]
}
"""


@pytest.fixture(scope="module")
def ctr_host(tmp_path_factory: pytest.TempPathFactory, busybox_tar: Path) -> Iterator[RuntimeHost]:
    need("containerd", "ctr", "containerd-shim-runc-v2", "runc", "podman", "nsenter", "unshare")
    scratch = tmp_path_factory.mktemp("ctr-host")
    with RuntimeHost(scratch) as host:
        host.podman_import(busybox_tar)  # podman builds the image archive containerd imports
        host.podman("save", "-o", str(scratch / "image.tar"), IMAGE)
        host.start_containerd()
        host.ctr("images", "import", str(scratch / "image.tar"))
        host.install_ours(PYCNI)
        host.path("/etc/cni/net.d/10-ctrnet.conflist").write_text(CTR_CONFLIST)
        yield host


def test_ctr_run_cni(ctr_host: RuntimeHost) -> None:
    """``ctr run --cni --rm``: ADD once the task starts, DEL (without a netns: the task is gone)
    once it exits; ctr only removes the network in the foreground, so each runs as a process."""
    host = ctr_host
    runs = {}
    for name in ("k1", "k2"):
        runs[name] = host.popen(host.ctr_argv("run", "--cni", "--rm", IMAGE, name, "sleep", "100000"),
                                host.scratch / f"ctr-run-{name}.log")
    ips = {name: wait_ctr_ip(host, name, runs[name]) for name in runs}
    assert all(ip.startswith("10.91.8.") for ip in ips.values()) and ips["k1"] != ips["k2"], ips
    host.ctr("tasks", "exec", "--exec-id", "p1", "k1", "ping", "-c", "1", "-W", "3", ips["k2"])
    host.ctr("tasks", "exec", "--exec-id", "p2", "k2", "ping", "-c", "1", "-W", "3", ips["k1"])
    assert host.sh("ip -4 -o addr show dev ctr0").split()[3] == "10.91.8.1/24"
    for name, proc in runs.items():
        host.ctr("tasks", "kill", "-s", "SIGKILL", name)
        assert proc.wait(60) == 128 + 9, (host.scratch / f"ctr-run-{name}.log").read_text()
    assert host.ctr("containers", "list", "-q") == ""
    assert state_leftovers(host) == []
    assert rule_leftovers(host, ["10.91.8."]) == []
    assert [i for i in interfaces(host) if i not in ("lo", "ctr0")] == []


def wait_ctr_ip(host: RuntimeHost, name: str, proc: subprocess.Popen[bytes]) -> str:
    """The task's eth0 address, once ``ctr run`` has set up its network and started it (an
    exec into a task still "CREATED" would start it behind ctr's back)."""
    deadline = time.monotonic() + 60
    while not any(line.split()[:1] == [name] and line.split()[-1] == "RUNNING"
                  for line in host.ctr("tasks", "list", check=False).splitlines()):
        assert proc.poll() is None, (host.scratch / f"ctr-run-{name}.log").read_text()
        assert time.monotonic() < deadline, f"{name}: task not running"
        time.sleep(0.05)
    out = host.ctr("tasks", "exec", "--exec-id", f"ip-{name}", name, "ip", "-4", "-o", "addr", "show", "eth0")
    return out.split()[3].split("/")[0]


# ---- the harness itself ----------------------------------------------------------------------

def processes_in(pidns: str) -> dict[int, str]:
    """Host PIDs (and their command names) of every process in the PID namespace ``pidns``
    or in one nested in it (containers run in their own)."""
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            if os.readlink(proc / "ns" / "pid") == pidns or _nested(status, proc, pidns):
                found[int(proc.name)] = (proc / "comm").read_text().strip()
        except OSError:
            continue
    return found


def _nested(status: str, proc: Path, pidns: str) -> bool:
    """A process in a child namespace of ``pidns``: its parent chain reaches that namespace."""
    ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    for _ in range(16):
        if ppid <= 1:
            return False
        if os.readlink(f"/proc/{ppid}/ns/pid") == pidns:
            return True
        ppid = int(next(line.split()[1] for line in Path(f"/proc/{ppid}/status").read_text().splitlines()
                        if line.startswith("PPid:")))
    return False


def test_runtime_host_close_kills_every_runtime_process(tmp_path: Path, busybox_tar: Path) -> None:
    """Closing a host with podman, conmon, containerd, its shims and containers running (as
    after a failed test) leaves none of them alive."""
    need("podman", "runc", "conmon", "containerd", "ctr", "nsenter", "unshare")
    host = RuntimeHost(tmp_path)
    try:
        host.install_ours(PYCNI)
        host.podman_import(busybox_tar)
        host.podman("run", "-d", "--name", "left", IMAGE, "sleep", "100000")
        host.start_containerd()
        pidns = os.readlink(f"/proc/{host.pid}/ns/pid")
        running = processes_in(pidns)
        names = set(running.values())
        assert {"conmon", "containerd", "sleep"} <= names, names
    finally:
        host.close()
    alive = {pid: name for pid, name in processes_in(pidns).items()}
    assert alive == {}, alive
    assert not Path(host.ns.path).exists()
