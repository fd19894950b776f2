"""The main job, end to end: attach two fresh namespaces to a network and prove it works.

``pycni demo`` (or ``python -m pycni.demo [--conf-dir conf/net.d] [--network pycni-demo]``, what
``scripts/demo`` runs) installs our plugins into a temporary directory, creates throwaway namespaces — one
plays the host, two play containers — attaches both containers through the pycni runtime
(bridge + host-local + tuning + portmap, as shipped in conf/net.d), prints the results, pings
container to container, fetches a page from a server in one container through a mapped host
port, checks the attachments, then deletes them and removes everything it made. IPAM state
and the result cache live in a temporary directory too: nothing outside it is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence

TYPE_CHECKING = False  # not typing's: importing typing costs a process ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

HOST_PORT = 8080
CONTAINER_PORT = 80
# Addresses of the throwaway "outside" link between the client namespace and the host namespace
# (RFC 2544 benchmarking range: never routed anywhere real).
HOST_ADDR = "198.18.0.1"
CLIENT_ADDR = "198.18.0.2"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal arrived: unwind through run()'s cleanup (not an Exception: no "demo failed")."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signum)


def _say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}", flush=True)


def _ns_path(ns: str) -> str:
    """Where ``ip netns`` keeps the namespace called ``ns`` (what CNI_NETNS names)."""
    return f"/var/run/netns/{ns}"


def _ns_run(ns: str, cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` inside namespace ``ns``; RuntimeError with its output when it fails and ``check``."""
    proc = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` in {ns} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _with_private_state(conf_dir: str, network: str, state_dir: str) -> str:
    """Copy the network's config to ``state_dir`` with every plugin's state dir pointed inside it.

    host-local's reservations, tuning's saved originals and flannel's/host-device's saved
    configs would otherwise land under /var/lib/cni or /run/cni on this machine.
    """
    from pycni.runtime import load_network

    net = load_network(conf_dir, network)
    raw: dict[str, Any] = json.loads(net.bytes)
    for plugin in raw.get("plugins", [raw]):
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type") == "host-local":
            ipam["dataDir"] = os.path.join(state_dir, "ipam")
        if plugin.get("type") in ("tuning", "flannel", "host-device"):
            plugin["dataDir"] = os.path.join(state_dir, str(plugin["type"]))
    out_dir = os.path.join(state_dir, "net.d")
    os.makedirs(out_dir)
    name = "10-demo.conflist" if "plugins" in raw else "10-demo.conf"
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(raw, f, indent=2)
    return out_dir


def _make_namespaces(host: str, containers: Sequence[str], client: str, made: list[str]) -> None:
    """Create the namespaces (recording each in ``made`` for cleanup) and the client's uplink to the host."""
    for ns in (host, *containers, client):
        subprocess.run(["ip", "netns", "add", ns], check=True)
        made.append(ns)
        _ns_run(ns, ["ip", "link", "set", "lo", "up"])
    # The client reaches the host over a veth, as the outside world reaches a node.
    subprocess.run(["ip", "link", "add", "uplink", "netns", host, "type", "veth", "peer", "name", "eth0",
                    "netns", client], check=True)
    _ns_run(host, ["ip", "addr", "add", f"{HOST_ADDR}/24", "dev", "uplink"])
    _ns_run(host, ["ip", "link", "set", "uplink", "up"])
    _ns_run(client, ["ip", "addr", "add", f"{CLIENT_ADDR}/24", "dev", "eth0"])
    _ns_run(client, ["ip", "link", "set", "eth0", "up"])


def _fetch(client: str, url: str) -> str:
    """The body at ``url`` fetched from namespace ``client``, retried for ~5 s while the server starts."""
    fetch = ("import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode(),"
             " end='')")
    for _ in range(50):
        proc = _ns_run(client, [sys.executable, "-c", fetch, url], check=False)
        if proc.returncode == 0:
            return proc.stdout
        time.sleep(0.1)
    return ""


def run(conf_dir: str, network: str) -> int:
    """The whole demo; 0 when it worked. Everything it made is removed whatever happens."""
    from pycni.install_plugins import install
    from pycni.net import netns
    from pycni.runtime import CNI

    tag = uuid.uuid4().hex[:6]
    host, c1, c2 = f"pycni-demo-host-{tag}", f"pycni-demo-c1-{tag}", f"pycni-demo-c2-{tag}"
    client = f"pycni-demo-client-{tag}"
    state = tempfile.mkdtemp(prefix="pycni-demo-")
    made: list[str] = []
    attached: list[str] = []
    server: subprocess.Popen[bytes] | None = None
    rt: CNI | None = None
    net = None
    try:
        _say(f"installing pycni plugins into {state}/bin")
        bin_dir = os.path.join(state, "bin")
        print("  " + " ".join(os.path.basename(p) for p in install(bin_dir)))
        private_conf = _with_private_state(conf_dir, network, state)
        rt = CNI(conf_dir=private_conf, plugin_path=[bin_dir], cache_dir=os.path.join(state, "cache"),
                 env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "PYCNI_SOCKET": "off"})
        net = rt.load_network(network)
        print(f"  network {net.name!r} (cniVersion {net.cni_version}): "
              + " -> ".join(p.type for p in net.plugins))

        _say(f"creating throwaway namespaces: host {host}, containers {c1} and {c2}, outside client {client}")
        _make_namespaces(host, (c1, c2), client, made)

        results: dict[str, Any] = {}
        for ns in (c1, c2):
            mapping = {"hostPort": HOST_PORT, "containerPort": CONTAINER_PORT, "protocol": "tcp"}
            caps = {"portMappings": [mapping] if ns == c1 else []}  # c1 serves the mapped port
            _say(f"ADD {ns} to {net.name} (plugins run inside {host})")
            with netns.enter(_ns_path(host)):
                result = rt.add(net, ns, _ns_path(ns), "eth0", capability_args=caps)
            attached.append(ns)
            results[ns] = result
            print(json.dumps(result.to_dict(), indent=2))

        ip1 = str(results[c1].ips[0].address.ip)
        ip2 = str(results[c2].ips[0].address.ip)

        _say(f"ping {c1} ({ip1}) -> {c2} ({ip2})")
        print(_ns_run(c1, ["ping", "-c", "3", "-i", "0.2", "-W", "2", ip2]).stdout.strip().splitlines()[-2])

        _say(f"HTTP server in {c1} on port {CONTAINER_PORT}; {client} fetches it via the host's port "
             f"{HOST_ADDR}:{HOST_PORT}")
        www = os.path.join(state, "www")
        os.makedirs(www)
        with open(os.path.join(www, "index.html"), "w") as f:
            f.write(f"hello from {c1}\n")
        # its own session: a Ctrl-C in the terminal reaches the demo, which stops the server itself
        server = subprocess.Popen(["ip", "netns", "exec", c1, sys.executable, "-m", "http.server",
                                   str(CONTAINER_PORT), "--bind", ip1, "--directory", www],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        body = _fetch(client, f"http://{HOST_ADDR}:{HOST_PORT}/index.html")
        if not body:
            raise RuntimeError(f"could not fetch http://{HOST_ADDR}:{HOST_PORT}/ through the port mapping")
        print(f"  got: {body.strip()!r}")

        _say("CHECK both attachments")
        with netns.enter(_ns_path(host)):
            for ns in (c1, c2):
                rt.check(net, ns, _ns_path(ns), "eth0")
                print(f"  {ns}: ok")
        _say("the main job worked")
        return 0
    except Stopped as e:
        print(f"\ndemo stopped by {e}: cleaning up", file=sys.stderr)
        return 128 + e.signum
    except Exception as e:  # noqa: BLE001 - the demo reports, then cleans up
        print(f"\ndemo failed: {e}", file=sys.stderr)
        return 1
    finally:
        # a second Ctrl-C or SIGTERM must not cut the cleanup short
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        if server is not None:
            server.terminate()
            server.wait(timeout=5)
        if rt is not None and net is not None and attached:
            _say("DEL both attachments")
            with netns.enter(_ns_path(host)):
                for ns in reversed(attached):
                    try:
                        rt.delete(net, ns, _ns_path(ns), "eth0")
                        print(f"  {ns}: deleted")
                    except Exception as e:  # noqa: BLE001
                        print(f"  {ns}: DEL failed: {e}", file=sys.stderr)
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
        if made:
            print(f"  removed namespaces {', '.join(made)} and {state}")


def main_parser() -> argparse.ArgumentParser:
    """The demo's options (``pycni demo ...``, ``python -m pycni.demo ...``)."""
    parser = argparse.ArgumentParser(prog="pycni demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--conf-dir", default=os.path.join(os.path.dirname(__file__), "demo_net.d"),
                        help="where the network config lives (default: the demo network shipped with pycni, "
                        "also at conf/net.d in the repository)")
    parser.add_argument("--network", default="pycni-demo", help="network name to attach to")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = main_parser().parse_args(argv[1:] if argv[:1] == ["--"] else argv)
    if os.geteuid() != 0:
        print("pycni demo: needs root (it creates network namespaces)", file=sys.stderr)
        return 1
    for signum in STOP_SIGNALS:  # SIGINT too: cleaned up, and no traceback
        signal.signal(signum, _stop)
    return run(args.conf_dir, args.network)


if __name__ == "__main__":
    sys.exit(main())
