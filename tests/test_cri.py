"""Kubernetes' path: containerd 1.6's CRI plugin drives the plugins as it does under kubelet.

A CRI v1 client (tests/cri/) plays kubelet over containerd's socket: RunPodSandbox,
PodSandboxStatus, ListPodSandbox, StopPodSandbox, RemovePodSandbox. containerd runs on a
throwaway host (tests/runtime_host.py: its own network, mount and PID namespaces, scratch
/etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /run and containerd state), its CRI plugin
configured as on a kubeadm node (runc on cgroupfs, a local sandbox image built from
busybox-static whose process is an HTTP server on port 80, so a hostPort has something to
reach). One containerd serves the module; every scenario runs three times, with the Go
reference plugins (/usr/lib/cni) in its /opt/cni/bin, with ours (``pycni install-plugins``)
one-shot, and with ours served by ``pycni daemon`` on its default socket.

The network is a kubeadm-like conflist: bridge (isGateway, ipMasq, hairpinMode) with
host-local v4 + v6, portmap (capabilities.portMappings), bandwidth (capabilities.bandwidth),
and a small recording plugin at the end of the chain (cr-record, a test plugin: it writes the
environment and runtimeConfig each call got, and fails on request, which is how a failed ADD
is made).

Skipped, saying why, only when a runtime's binaries or grpcio are not installed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import runtime_host
from cri import kubeadm
from cri.kubeadm import BRIDGE, CONFLIST, SANDBOX_CMD, SANDBOX_IMAGE, SUBNET4, SUBNET6
from netns_util import Namespace, new_namespace
from runtime_host import RuntimeHost, busybox_rootfs, connect_outside, missing

PYCNI = str(Path(sys.executable).with_name("pycni"))
HOST_IP, OUTSIDE_IP = "192.0.2.1", "192.0.2.2"
HOST_IP6, OUTSIDE_IP6 = "fd93::1", "fd93::2"
BRIDGE2 = "cr1"  # the bridge of a changed conflist
IMPLS = ("go", "ours", "daemon")  # daemon: ours, served by `pycni daemon` on its default socket
DAEMON_LOG = "/run/pycni-daemon.log"
RECORDS = "/run/cr-record"

# A chained plugin that only records: the env of every call into RECORDS, prevResult passed on.
# It fails ADD of a pod named cr-fail*, and its DEL while /run/cr-fail-del exists.
RECORDER = f"""#!/usr/bin/python3
import json, os, sys
conf = json.load(sys.stdin)
cmd = os.environ.get("CNI_COMMAND", "")
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}}))
    sys.exit(0)
os.makedirs("{RECORDS}", exist_ok=True)
env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
name = "%s-%s-%s.json" % (cmd, env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", ""))
with open(os.path.join("{RECORDS}", name), "w") as f:
    json.dump({{"env": env, "runtimeConfig": conf.get("runtimeConfig")}}, f)
pod = dict(kv.split("=", 1) for kv in env.get("CNI_ARGS", "").split(";") if "=" in kv).get("K8S_POD_NAME", "")
if pod.startswith("cr-fail") and (cmd == "ADD" or (cmd == "DEL" and os.path.exists("/run/cr-fail-del"))):
    print(json.dumps({{"cniVersion": conf["cniVersion"], "code": 999, "msg": "cr-record: %s refused" % cmd}}))
    sys.exit(1)
if cmd == "ADD":
    print(json.dumps(conf.get("prevResult") or {{"cniVersion": conf["cniVersion"]}}))
"""


def kubeadm_conflist(subnet4: str = SUBNET4, subnet6: str = SUBNET6, bridge: str = BRIDGE) -> str:
    """The kubeadm-like network with the recorder at the end of the chain."""
    return kubeadm.kubeadm_conflist(subnet4, subnet6, bridge, extra=[
        {"type": "cr-record", "capabilities": {"portMappings": True, "bandwidth": True}}])


def need(*binaries: str) -> None:
    """runtime_host.need, and the CRI client's grpc packages."""
    runtime_host.need(*binaries)
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
    except ImportError:
        pytest.skip("grpcio and grpcio-tools (the test extras) are not installed")


class Kubelet:
    """The module's containerd (CRI) host, a client for it, and the outside namespace."""

    def __init__(self, host: RuntimeHost, outside: Namespace) -> None:
        from cri.client import CRIClient

        self.host, self.outside = host, outside
        self.cri = CRIClient(host.outside_path("/run/containerd/containerd.sock"))
        self.cgroup_parent = f"/{host.ctr_namespace}"
        self.impl = ""  # which plugins /opt/cni/bin holds now: one of IMPLS

    def pod(self, name: str, **kw: Any) -> Any:
        from cri.client import Pod

        return Pod(name=name, cgroup_parent=self.cgroup_parent, **kw)

    def in_pod(self, sandbox_id: str, cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in the pod's network namespace (entered by its sandbox process)."""
        info = json.loads(self.cri.status(sandbox_id, verbose=True).info["info"])
        return self.host.run(["nsenter", "-t", str(info["pid"]), "-n", "--", *cmd], check=check)


@pytest.fixture(scope="module")
def kubelet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubelet]:
    """containerd with its CRI plugin on a throwaway host, the sandbox image imported, the
    network conflist in place (the CRI plugin reports no network until one is), an outside
    namespace joined to the host by a veth (v4 and v6)."""
    need("containerd", "ctr", "containerd-shim-runc-v2", "runc", "podman", "busybox", "nsenter", "unshare")
    scratch = tmp_path_factory.mktemp("cri-host")
    outside = new_namespace("cr")
    try:
        with RuntimeHost(scratch) as host:
            host.path(CONFLIST).write_text(kubeadm_conflist())
            host.start_containerd(host.cri_config(SANDBOX_IMAGE))
            host.import_image(busybox_rootfs(scratch), SANDBOX_IMAGE, SANDBOX_CMD)
            connect_outside(host, outside, HOST_IP, OUTSIDE_IP)
            host.sh(f"ip addr add {HOST_IP6}/64 dev uplink0 nodad; sysctl -qw net.ipv6.conf.all.forwarding=1")
            outside.run(["ip", "addr", "add", f"{OUTSIDE_IP6}/64", "dev", "out0", "nodad"])
            outside.run(["ip", "-6", "route", "add", "default", "via", HOST_IP6])
            kubelet = Kubelet(host, outside)
            try:
                kubelet.cri.wait_ready()
                yield kubelet
            finally:
                kubelet.cri.close()
    finally:
        outside.delete()


@pytest.fixture(params=IMPLS)
def k8s(request: pytest.FixtureRequest, kubelet: Kubelet) -> Iterator[Kubelet]:
    """The module's host with one implementation's plugins (and the recorder) in /opt/cni/bin
    and the kubeadm-like conflist; every pod removed after, and the host's rules reset."""
    host = kubelet.host
    if request.param == "go":
        if missing("/usr/lib/cni/bridge"):
            pytest.skip("Go reference plugins not installed (containernetworking-plugins)")
        host.install_go()
    else:
        host.install_ours(PYCNI)
        if request.param == "daemon":
            host.start_pycni_daemon(PYCNI, "--debug", "--log-file", DAEMON_LOG)
    install_recorder(host)
    write_conflist(host, kubeadm_conflist())
    kubelet.impl = request.param
    yield kubelet
    # what a failed case left must not fail the next one: pods the plugins could not remove are
    # removed with the Go plugins (they undo ours), then the rules and state are reset
    host.sh(f"rm -rf {RECORDS} /run/cr-fail-del")
    for attempt in ("as is", "with the Go plugins"):
        sandboxes = kubelet.cri.list()
        if not sandboxes:
            break
        if attempt != "as is":
            host.install_go()
            install_recorder(host)
        for sandbox in sandboxes:
            try:
                kubelet.cri.stop_remove(sandbox.id)
            except Exception as e:  # noqa: BLE001 - the case itself reports what it left
                print(f"teardown ({attempt}): {sandbox.metadata.name}: {e}", file=sys.stderr)
    if request.param == "daemon":
        host.stop_pycni_daemon()
    host.sh("iptables -t nat -F; iptables -t nat -X; ip6tables -t nat -F; ip6tables -t nat -X; "
            "iptables -F; iptables -X; ip6tables -F; ip6tables -X; nft flush ruleset; "
            "rm -rf /var/lib/cni/networks/* /var/lib/cni/results/*", check=False)


def install_recorder(host: RuntimeHost) -> None:
    host.run(["sh", "-c", "cat > /opt/cni/bin/cr-record && chmod 755 /opt/cni/bin/cr-record"], input=RECORDER)


def write_conflist(host: RuntimeHost, text: str, path: str = CONFLIST) -> None:
    """Replace the network's conflist as an operator would (write aside, rename over)."""
    tmp = host.path("/etc/cni/net.d") / ".conflist.tmp"
    tmp.write_text(text)
    tmp.rename(host.path(path))


# ---- what is left ------------------------------------------------------------------------------

def leftovers(host: RuntimeHost, needles: tuple[str, ...] = ("10.92.", "fd92:"),
              keep: tuple[str, ...] = ()) -> list[str]:
    """Everything a pod's network may leave on the host: interfaces but the bridges, uplink and
    lo (a veth, an ifb), host-local reservations, libcni's result cache, netns files, rules
    naming a pod address or a per-pod chain."""
    left: list[str] = []
    links = host.run(["ip", "-o", "link", "show"]).stdout
    names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
    left += [f"link {n}" for n in names if n not in ("lo", "uplink0", BRIDGE, BRIDGE2, *keep)]
    networks = host.path("/var/lib/cni") / "networks"
    for f in networks.glob("*/*") if networks.is_dir() else []:
        if f.name != "lock" and not f.name.startswith("last_reserved_ip"):
            left.append(f"reservation {f.parent.name}/{f.name}")
    results = host.path("/var/lib/cni") / "results"
    left += [f"cache file {f.name}" for f in results.iterdir()] if results.is_dir() else []
    left += [f"netns file {n}" for n in host.sh("ls /run/netns").split()]
    dump = host.sh("iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; nft list ruleset 2>/dev/null",
                   check=False)
    per_pod = re.compile(r"CNI-(?:[A-Z]{2}-)?[0-9a-f]{24}")
    left += [f"rule {line.strip()}" for line in dump.splitlines()
             if per_pod.search(line) or any(n in line for n in needles)]
    return left


# ---- the scenarios -----------------------------------------------------------------------------

def fetch(host: RuntimeHost, url: str, wrap: list[str] | None = None) -> str:
    # busybox wget's own -T crashes in the static build here: bound it with timeout instead
    proc = host.run([*(wrap or []), "timeout", "10", "busybox", "wget", "-q", "-O", "-", url], check=False)
    assert proc.returncode == 0, f"GET {url} failed: {proc.stderr.strip()}"
    return proc.stdout


def url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}/" if ":" in ip else f"http://{ip}:{port}/"


def ping(k: Kubelet, sandbox_id: str, ip: str) -> None:
    """One echo answered; IPv6 retried while fresh addresses finish duplicate address detection."""
    tries = 30 if ":" in ip else 1
    k.in_pod(sandbox_id, ["sh", "-c", f"for i in $(seq {tries}); do busybox ping -c 1 -W 3 {ip} && exit 0; "
                                      "sleep 0.2; done; exit 1"])


def test_cri_version(kubelet: Kubelet) -> None:
    v = kubelet.cri.version()
    assert v.runtime_name == "containerd" and v.runtime_api_version == "v1", v


def test_hostport_pods(k8s: Kubelet) -> None:
    """Three pods; one publishes hostPort 18080 (v4 and v6): reachable from the outside
    namespace, from the host and from itself (hairpin); pods ping each other v4 and v6;
    K8S_POD_* reach the plugins; Stop + Remove leave nothing."""
    from cri.client import Port

    cri, host = k8s.cri, k8s.host
    web = cri.run_pod(k8s.pod("cr-web", namespace="shop", ports=[Port(80, 18080)]))
    a = cri.run_pod(k8s.pod("cr-a"))
    b = cri.run_pod(k8s.pod("cr-b"))
    ips = {sid: cri.ips(sid) for sid in (web, a, b)}
    for sid, got in ips.items():
        assert len(got) == 2 and got[0].startswith("10.92.0.") and got[1].startswith("fd92::"), (sid, got)
    assert len({ip for got in ips.values() for ip in got}) == 6

    for ip in ips[b]:
        ping(k8s, a, ip)
    for ip in ips[a]:
        ping(k8s, b, ip)
    assert fetch(host, url(ips[web][0], 80), ["nsenter", "-t", pod_pid(k8s, a), "-n"]) == "pycni\n"

    for front in (HOST_IP, HOST_IP6):
        proc = k8s.outside.run(["timeout", "10", "busybox", "wget", "-q", "-O", "-", url(front, 18080)],
                               check=False)
        assert proc.stdout == "pycni\n", f"outside -> {front}:18080: {proc.stderr}"
        assert fetch(host, url(front, 18080)) == "pycni\n", f"host -> {front}:18080"
        hairpin = ["nsenter", "-t", pod_pid(k8s, web), "-n"]
        assert fetch(host, url(front, 18080), hairpin) == "pycni\n", f"hairpin {front}:18080"
        neighbour = ["nsenter", "-t", pod_pid(k8s, b), "-n"]
        assert fetch(host, url(front, 18080), neighbour) == "pycni\n", f"pod -> {front}:18080"

    # K8S_POD_* reached every plugin of the chain (the recorder is the last)
    rec = json.loads(Path(host.outside_path(f"{RECORDS}/ADD-{web}-eth0.json")).read_text())
    args = dict(kv.split("=", 1) for kv in rec["env"]["CNI_ARGS"].split(";"))
    assert args["K8S_POD_NAME"] == "cr-web" and args["K8S_POD_NAMESPACE"] == "shop", args
    assert args["K8S_POD_INFRA_CONTAINER_ID"] == web and args["IgnoreUnknown"] in ("1", "true"), args
    # containerd sends Go's field names (what godecode's case-insensitive reading is for)
    assert rec["runtimeConfig"]["portMappings"] == [
        {"HostPort": 18080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}], rec

    served_by_daemon(k8s, web)
    for sid in (web, a, b):
        cri.stop_remove(sid)
    assert cri.list() == []
    assert leftovers(host) == []


def served_by_daemon(k: Kubelet, sandbox_id: str) -> None:
    """With the daemon up, it ran the pod's plugin calls (the executables forwarded them with
    nothing set in containerd's environment)."""
    if k.impl != "daemon":
        return
    served = k.host.sh(f"cat {DAEMON_LOG}")
    for plugin in ("bridge", "portmap", "bandwidth"):
        assert re.search(rf"{plugin} ADD {sandbox_id}", served), (plugin, served[-2000:])


def pod_pid(k: Kubelet, sandbox_id: str) -> str:
    return str(json.loads(k.cri.status(sandbox_id, verbose=True).info["info"])["pid"])


# ---- bandwidth -----------------------------------------------------------------------------------

def host_veth(host: RuntimeHost) -> str:
    """The host side of the only pod's veth (a port of the bridge)."""
    ports = [line.split(":")[1].strip().split("@")[0]
             for line in host.run(["ip", "-o", "link", "show", "master", BRIDGE]).stdout.splitlines()]
    assert len(ports) == 1, ports
    return ports[0]


def tbf(host: RuntimeHost, dev: str) -> dict[str, str]:
    """The tbf qdisc on ``dev``: its rate and burst as tc prints them ({} when there is none)."""
    for line in host.run(["tc", "qdisc", "show", "dev", dev]).stdout.splitlines():
        f = line.split()
        if f[:2] == ["qdisc", "tbf"]:
            return {"rate": f[f.index("rate") + 1], "burst": f[f.index("burst") + 1]}
    return {}


def ifbs(host: RuntimeHost) -> list[str]:
    return [line.split(":")[1].strip() for line in host.run(["ip", "-o", "link", "show", "type", "ifb"]
                                                            ).stdout.splitlines()]


def test_bandwidth_annotations(k8s: Kubelet) -> None:
    """kubernetes.io/ingress-bandwidth and egress-bandwidth become a tbf on the host veth
    (traffic to the pod) and a tbf on an ifb the veth's ingress is redirected to (traffic from
    the pod), as Go's bandwidth plugin makes them; a pod without annotations gets neither."""
    cri, host = k8s.cri, k8s.host
    plain = cri.run_pod(k8s.pod("cr-plain"))
    served_by_daemon(k8s, plain)
    assert tbf(host, host_veth(host)) == {} and ifbs(host) == []
    cri.stop_remove(plain)

    shaped = cri.run_pod(k8s.pod("cr-shaped", annotations={"kubernetes.io/ingress-bandwidth": "10M",
                                                           "kubernetes.io/egress-bandwidth": "20M"}))
    rec = json.loads(Path(host.outside_path(f"{RECORDS}/ADD-{shaped}-eth0.json")).read_text())
    # containerd's spelling: Go field names, and a burst of MaxUint32 ("no particular burst")
    assert rec["runtimeConfig"]["bandwidth"] == {"IngressRate": 10_000_000, "IngressBurst": 2**32 - 1,
                                                 "EgressRate": 20_000_000, "EgressBurst": 2**32 - 1}, rec
    veth = host_veth(host)
    ingress = tbf(host, veth)
    # MaxUint32 bits at 10 Mbit/s is more than the kernel's bucket holds: Go's arithmetic wraps
    # (193 MB), ours takes the largest bucket the kernel holds (~343 MB, 275 s; docs/plugins.md)
    burst = "193273526b" if k8s.impl == "go" else "343597381b"
    assert ingress == {"rate": "10Mbit", "burst": burst}, ingress
    [ifb] = ifbs(host)
    egress = tbf(host, ifb)
    assert egress == {"rate": "20Mbit", "burst": "512Mb"}, egress  # 2^32 bits fit at 20 Mbit/s: both agree
    redirect = host.run(["tc", "filter", "show", "dev", veth, "ingress"]).stdout
    assert f"Redirect to device {ifb}" in redirect, redirect
    # traffic flows through the shaped veth
    ping(k8s, shaped, f"{SUBNET4.rsplit('.', 1)[0]}.1")
    cri.stop_remove(shaped)
    assert ifbs(host) == [] and leftovers(host) == []


# ---- failures and reloads --------------------------------------------------------------------------

def test_failed_add_cleaned_by_stop(k8s: Kubelet) -> None:
    """A pod whose ADD fails (the last plugin of the chain refuses) and whose first teardown
    fails too is kept by containerd, NOTREADY; kubelet's StopPodSandbox tears its network down
    (the DEL carries the runtimeConfig again) and RemovePodSandbox removes it: nothing left."""
    from cri.client import CRIError, Port

    cri, host = k8s.cri, k8s.host
    host.sh("touch /run/cr-fail-del")
    with pytest.raises(CRIError) as failed:
        cri.run_pod(k8s.pod("cr-fail", ports=[Port(80, 18081)]))
    assert "cr-record: ADD refused" in failed.value.details, failed.value
    [kept] = cri.list()
    assert kept.metadata.name == "cr-fail" and kept.state == cri.pb.SANDBOX_NOTREADY
    assert leftovers(host) != []  # its veth, reservations, netns are still there
    host.sh("rm /run/cr-fail-del")
    cri.stop(kept.id)
    dels = sorted(p.name for p in Path(host.outside_path(RECORDS)).glob(f"DEL-{kept.id}-*"))
    assert dels == [f"DEL-{kept.id}-eth0.json"], dels
    rec = json.loads((Path(host.outside_path(RECORDS)) / dels[0]).read_text())
    assert rec["runtimeConfig"]["portMappings"][0]["HostPort"] == 18081, rec
    cri.remove(kept.id)
    assert cri.list() == []
    assert leftovers(host) == []


def test_conflist_change_picked_up_live(k8s: Kubelet) -> None:
    """containerd reloads /etc/cni/net.d on change: a pod started after the conflist is
    replaced gets an address from the new ranges; pods of the old config are still removed."""
    cri, host = k8s.cri, k8s.host
    old = cri.run_pod(k8s.pod("cr-old"))
    assert cri.ips(old)[0].startswith("10.92.0."), cri.ips(old)
    write_conflist(host, kubeadm_conflist("10.92.7.0/24", "fd92:7::/64", BRIDGE2))
    deadline = time.monotonic() + 30
    while True:  # the reload is asynchronous (an fsnotify event): a pod or two may come first
        new = cri.run_pod(k8s.pod("cr-new"))
        ips = cri.ips(new)
        if ips[0].startswith("10.92.7.") or time.monotonic() > deadline:
            break
        cri.stop_remove(new)
        time.sleep(0.2)
    assert ips[0].startswith("10.92.7.") and ips[1].startswith("fd92:7::"), ips
    ping(k8s, new, "10.92.7.1")
    for sid in (old, new):
        cri.stop_remove(sid)
    assert cri.list() == []
    assert leftovers(host) == []
    host.run(["ip", "link", "del", BRIDGE2])


# ---- routed + cluster-ipam on etcd (ours: Go has no counterpart) -------------------------------------

ROUTED = "cr-routed"


@pytest.mark.parametrize("k8s", ["ours", "daemon"], indirect=True)  # Go has no routed nor cluster-ipam
def test_routed_cluster_ipam(k8s: Kubelet, tmp_path: Path) -> None:
    """Our routed + cluster-ipam under the CRI, on a local etcd: two pods get addresses from
    the cluster pool and ping each other; ``pycni ipam list`` names their sandboxes; after
    Stop + Remove the pool is empty and nothing is left on the host."""
    from etcd_util import EtcdCluster, etcd_available

    if not etcd_available():
        pytest.skip("etcd (etcd-server) is not installed")
    cri, host = k8s.cri, k8s.host
    with EtcdCluster(size=1, subnet="10.231.9.0/24", prefix="cr") as etcd:
        assert etcd.underlay is not None
        # the runtime host joins the etcd underlay (the member answers on 10.231.9.1)
        etcd.underlay.run(["ip", "link", "add", "cretcd", "type", "veth", "peer", "name", "etcd0",
                           "netns", host.ns.path])
        etcd.underlay.run(["ip", "link", "set", "cretcd", "master", "br0", "up"])
        host.sh("ip addr add 10.231.9.200/24 dev etcd0 && ip link set etcd0 up")
        try:
            write_conflist(host, json.dumps({
                "cniVersion": "1.0.0", "name": ROUTED,
                "plugins": [
                    {"type": "routed",
                     "ipam": {"type": "cluster-ipam", "etcdEndpoints": etcd.endpoints, "nodeName": "cr-node",
                              "ranges": [[{"subnet": "10.94.0.0/16"}]]}},
                    {"type": "cr-record", "capabilities": {"portMappings": True}},
                ]}))
            deadline = time.monotonic() + 30
            while True:  # the reload is asynchronous: a pod of the old network may come first
                first = cri.run_pod(k8s.pod("cr-r1"))
                if cri.ips(first)[0].startswith("10.94.") or time.monotonic() > deadline:
                    break
                cri.stop_remove(first)
                time.sleep(0.2)
            second = cri.run_pod(k8s.pod("cr-r2"))
            ips = {sid: cri.ips(sid) for sid in (first, second)}
            assert all(got and got[0].startswith("10.94.") for got in ips.values()), ips
            ping(k8s, first, ips[second][0])
            ping(k8s, second, ips[first][0])

            def allocations() -> list[dict[str, Any]]:
                out = host.run([PYCNI, "ipam", "list", ROUTED, "-o", "json", "--conf-dir", "/etc/cni/net.d"]).stdout
                return list(json.loads(out))

            held = allocations()
            assert sorted((a["containerID"], a["ip"]) for a in held) == sorted(
                (sid, ips[sid][0]) for sid in (first, second)), held
            for sid in (first, second):
                cri.stop_remove(sid)
            assert cri.list() == []
            assert allocations() == []
            assert leftovers(host, ("10.94.",), keep=("etcd0",)) == []
        finally:
            host.sh("ip link del etcd0", check=False)
