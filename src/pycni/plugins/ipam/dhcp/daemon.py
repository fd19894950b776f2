"""``dhcp daemon``: holds DHCP leases for containers and answers the dhcp plugin. Stdlib only.

Flags are the reference's: ``-socketpath`` (default /run/cni/dhcp.sock), ``-pidfile``,
``-hostprefix``, ``-broadcast``, ``-timeout`` (one DISCOVER..ACK exchange, default 10s),
``-resendmax`` (longest pause between retries, 62s), ``-resendtimeout`` (give up an ADD after,
208s); durations in Go's syntax (``1m30s``, ``500ms``). Under systemd socket activation the
passed socket is used instead of ``-socketpath``.

Each request gets a thread; each lease keeps one thread that renews it. Leases are keyed by
the reference's client id, ``containerID/network/ifname``. Stopping the daemon leaves leases
held at the server (as the reference does); DEL releases them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import socketserver
import sys
import threading
import zlib
from collections.abc import Mapping

from pycni import netconf
from pycni.cniargs import parse_cni_args
from pycni.plugins.ipam.dhcp import client as C
from pycni.plugins.ipam.dhcp import message as M
from pycni.plugins.ipam.dhcp import options
from pycni.plugins.ipam.dhcp.lease import Lease, Timing
from pycni.plugins.ipam.dhcp.protocol import DEFAULT_SOCKET_PATH, receive, send
from pycni.record import record
from pycni.skel import config_version, load_conf
from pycni.spec.errors import DECODE_FAILURE, INTERNAL, INVALID_ENV, PLUGIN_SPECIFIC, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("pycni.dhcp")

# Asked for unless a "request" entry says skipDefault: the reference's (mask, router) plus
# what a CNI result can carry (DNS servers, domain, search list, classless routes).
DEFAULT_REQUEST = [M.OPT_SUBNET_MASK, M.OPT_ROUTER, M.OPT_DNS, M.OPT_DOMAIN_NAME, M.OPT_DOMAIN_SEARCH,
                   M.OPT_CLASSLESS_ROUTE]
LOCK_STRIPES = 256


def client_id(container_id: str, network: str, ifname: str) -> str:
    """The reference's client id (also our lease key), cut to fit a DHCP option."""
    return f"{container_id}/{network}/{ifname}"[:254]


def client_options(ipam: Mapping[str, Any], cni_args: str, key: str, broadcast: bool) -> C.ClientOptions:
    """ipam ``provide`` / ``request`` entries -> what the client sends (reference semantics)."""
    args = parse_cni_args(cni_args)
    provide: dict[int, bytes] = {}
    for entry in options.entries(ipam, "provide"):
        code = options.option_code(entry)
        value = netconf.get_str(entry, "value", label="ipam.provide[].value")
        from_arg = netconf.get_str(entry, "fromArg", label="ipam.provide[].fromArg")
        if from_arg in args:
            value = args[from_arg]
        if value:
            if len(value.encode()) > 255:
                raise invalid_config(f"value too long for option {netconf.lookup(entry, 'option')!r}",
                                     "DHCP options hold at most 255 bytes")
            provide[code] = value.encode()
    request: list[int] = []
    skip_default = False
    for entry in options.entries(ipam, "request"):
        skip_default = skip_default or bool(netconf.lookup(entry, "skipDefault"))
        code = options.option_code(entry)
        if code not in request:
            request.append(code)
    if not skip_default:
        request += [c for c in DEFAULT_REQUEST if c not in request]
    return C.ClientOptions(client_id=b"\0" + key.encode(), provide=provide, request=request, broadcast=broadcast)


@record
class Request:
    method: str
    container_id: str
    netns: str
    ifname: str
    cni_args: str
    conf: dict[str, Any]
    ipam: dict[str, Any]

    @property
    def network(self) -> str:
        name = netconf.lookup(self.conf, "name", "")

        return name if isinstance(name, str) else ""

    @property
    def key(self) -> str:
        return client_id(self.container_id, self.network, self.ifname)


class DHCPService:
    """The lease table and the operations the plugin asks for."""

    def __init__(self, timing: Timing, broadcast: bool = False, host_prefix: str = "") -> None:
        self.timing = timing
        self.broadcast = broadcast
        self.host_prefix = host_prefix
        self._leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        # One lock per stripe of keys: concurrent ADD/DEL of one attachment run in turn.
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def _stripe(self, key: str) -> threading.Lock:
        return self._stripes[zlib.crc32(key.encode()) % LOCK_STRIPES]

    def leases(self) -> list[Lease]:
        with self._lock:
            return list(self._leases.values())

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.get(lease.key) is lease:
                del self._leases[lease.key]

    # ---- request handling ---------------------------------------------------------------------
    def handle(self, raw: Any) -> dict[str, Any]:
        try:
            req = self._parse(raw)
            handler = {"add": self.add, "del": self.delete, "check": self.check, "gc": self.gc,
                       "status": self.status}.get(req.method)
            if handler is None:
                raise CNIError(INVALID_ENV, f"unknown daemon method {req.method!r}", "the plugin and daemon differ")
            return handler(req)
        except CNIError as e:
            return {"error": e.to_dict()}
        except Exception as e:  # noqa: BLE001 - report, never kill the connection thread silently
            log.exception("request failed")
            return {"error": CNIError(INTERNAL, f"DHCP daemon error: {e}", type(e).__name__).to_dict()}

    def _parse(self, raw: Any) -> Request:
        if not isinstance(raw, dict):
            raise CNIError(DECODE_FAILURE, "malformed request to the DHCP daemon", repr(raw)[:200])
        conf = load_conf(str(raw.get("stdin", "")).encode())
        ipam = netconf.ipam_section(conf)
        fields = {k: raw.get(k, "") for k in ("method", "containerID", "netns", "ifname", "args")}
        if not all(isinstance(v, str) for v in fields.values()):
            raise CNIError(DECODE_FAILURE, "malformed request to the DHCP daemon", "fields must be strings")
        return Request(method=fields["method"], container_id=fields["containerID"], netns=fields["netns"],
                       ifname=fields["ifname"], cni_args=fields["args"], conf=conf, ipam=ipam)

    def add(self, req: Request) -> dict[str, Any]:
        if not req.netns:
            raise CNIError(INVALID_ENV, "CNI_NETNS missing", "ADD needs the container's network namespace")
        version = config_version(req.conf)
        priority = netconf.get_int(req.ipam, "priority", minimum=0, label="ipam.priority")
        opts = client_options(req.ipam, req.cni_args, req.key, self.broadcast)
        netns_path = self.host_prefix + req.netns
        with self._stripe(req.key):
            with self._lock:
                old = self._leases.get(req.key)
            if old is not None:
                if old.alive and old.held() and old.netns_path == netns_path and old.ifname == req.ifname:
                    log.info("%s: ADD again; the lease is still held", req.key)
                    return {"result": old.result(version, priority)}
                self._forget(old)
                old.stop(release=old.netns_path == netns_path)
            lease = Lease(req.key, req.container_id, req.network, netns_path, req.ifname, opts, self.timing,
                          on_gone=self._forget)
            log.info("%s: acquiring lease on %s in %s", req.key, req.ifname, netns_path)
            lease.acquire()
            with self._lock:
                self._leases[req.key] = lease
            lease.start()
            return {"result": lease.result(version, priority)}

    def delete(self, req: Request) -> dict[str, Any]:
        with self._stripe(req.key):
            with self._lock:
                lease = self._leases.pop(req.key, None)
            if lease is not None:
                log.info("%s: releasing lease", req.key)
                lease.stop(release=True, wait=self.timing.timeout + 2)
        return {}

    def check(self, req: Request) -> dict[str, Any]:
        with self._lock:
            lease = self._leases.get(req.key)
        if lease is None or lease.binding is None:
            raise CNIError(PLUGIN_SPECIFIC, f"no DHCP lease held for {req.key}",
                           "ADD was not done, or the lease was lost (daemon restarted, container namespace gone); "
                           "run DEL and ADD again")
        if not lease.alive or not lease.held():
            raise CNIError(PLUGIN_SPECIFIC, f"the DHCP lease for {req.key} has expired or is no longer maintained",
                           "the server did not renew it; run DEL and ADD again")
        prev = netconf.lookup(req.conf, "prevResult")
        if isinstance(prev, dict):
            addr = str(lease.binding.address)
            listed = [str(netconf.lookup(ip, "address", "")).split("/")[0]
                      for ip in netconf.lookup(prev, "ips") or [] if isinstance(ip, dict)]
            ip4 = netconf.lookup(prev, "ip4")
            if isinstance(ip4, dict):
                listed.append(str(netconf.lookup(ip4, "ip", "")).split("/")[0])

            if addr not in listed:
                raise CNIError(PLUGIN_SPECIFIC, f"leased address {addr} is not in prevResult",
                               f"prevResult lists {listed}; the server may have given a new address")
        return {}

    def gc(self, req: Request) -> dict[str, Any]:
        """Release this network's leases whose attachment the runtime no longer lists."""
        keep = set(netconf.valid_attachments(req.conf))  # none given is not "none valid": code 7
        for lease in self.leases():
            if lease.network == req.network and (lease.container_id, lease.ifname) not in keep:
                log.info("%s: GC releases lease", lease.key)
                with self._stripe(lease.key):
                    self._forget(lease)
                    lease.stop(release=True, wait=self.timing.timeout + 2)
        return {}

    def status(self, req: Request) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:
        for lease in self.leases():
            lease.stop(release=False, wait=1)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            raw = json.loads(receive(self.request))
        except ConnectionError as e:
            log.info("client went away before its request was whole: %s", e)
            return
        except ValueError as e:
            reply: dict[str, Any] = {"error": CNIError(DECODE_FAILURE, "undecodable request", str(e)).to_dict()}
        else:
            reply = self.server.service.handle(raw)  # type: ignore[attr-defined]
        try:
            send(self.request, reply)
        except OSError as e:
            log.info("client went away before the reply: %s", e)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, sock: socket.socket, service: DHCPService) -> None:
        super().__init__("", _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_address = sock.getsockname()
        self.service = service


# ---- command line ---------------------------------------------------------------------------
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration, in seconds ("10s", "1m30s", "250ms", "0")."""
    if text == "0":
        return 0.0
    pos = 0
    total = 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use Go syntax: 10s, 1m30s, 500ms)")
    return total


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dhcp daemon", allow_abbrev=False,
                                description="Serve DHCP leases to the CNI dhcp IPAM plugin.")
    for name, kind, default, text in (
            ("pidfile", str, "", "optional path to write the daemon's PID to"),
            ("hostprefix", str, "", "optional prefix to the host root (daemon in a container)"),
            ("socketpath", str, "", f"the socket the plugin connects to (default {DEFAULT_SOCKET_PATH})"),
            ("timeout", parse_duration, 10.0, "timeout of one DHCP exchange (default 10s)"),
            ("resendmax", parse_duration, 62.0, "longest pause between resends (default 62s)"),
            ("resendtimeout", parse_duration, 208.0, "give up acquiring a lease after this (default 208s)")):
        p.add_argument(f"-{name}", f"--{name}", type=kind, default=default, help=text)
    p.add_argument("-broadcast", "--broadcast", action="store_true", help="set the broadcast flag in requests")
    return p


def _normalise_bool_flags(argv: list[str]) -> list[str]:
    """Go accepts -broadcast=true / =false; argparse's store_true does not."""
    out = []
    for a in argv:
        flag, _, value = a.partition("=")
        if flag.lstrip("-") == "broadcast" and value:
            if value.lower() in ("1", "t", "true"):
                out.append(flag)
            elif value.lower() not in ("0", "f", "false"):
                out.append(a)  # let argparse report it
            continue
        out.append(a)
    return out


def _listener(path: str) -> tuple[socket.socket, tuple[int, int] | None]:
    """The listening socket — systemd's (LISTEN_FDS) or our own at ``path`` (pycni.unixsock: never
    replaces anything but a dead socket, appears listening and 0660) — and the inode we own there."""
    from pycni.unixsock import activated_socket, listen

    inherited = activated_socket(os.environ, "cni-dhcp.socket")
    if inherited is not None:
        return inherited, None
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    return listen(path, 0o660)


def run(argv: list[str]) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit status."""
    opts = _parser().parse_args(_normalise_bool_flags(argv))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s dhcp: %(message)s")
    if opts.pidfile and not os.path.isabs(opts.pidfile):
        log.error("Error writing pidfile %r: path not absolute", opts.pidfile)
        return 1
    path = opts.hostprefix + (opts.socketpath or DEFAULT_SOCKET_PATH)
    from pycni.unixsock import AlreadyServing, Refused, unlisten

    try:
        sock, owned = _listener(path)
    except AlreadyServing:
        log.error("dhcp daemon: another daemon already listens on %s", path)
        return 1
    except (Refused, OSError) as e:
        log.error("Error getting listener on %s: %s", path, e)
        return 1
    if opts.pidfile:
        with open(opts.pidfile, "w") as f:
            f.write(str(os.getpid()))
    service = DHCPService(Timing(timeout=opts.timeout, resend_max=opts.resendmax,
                                 resend_timeout=opts.resendtimeout), broadcast=opts.broadcast,
                          host_prefix=opts.hostprefix)
    server = _Server(sock, service)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serving = threading.Thread(target=server.serve_forever, name="dhcp-server", daemon=True)
    serving.start()
    log.info("listening on %s", path)
    while not stop.wait(3600):
        pass
    log.info("shutting down; leases stay held at their servers")
    server.shutdown()
    server.server_close()
    service.shutdown()
    unlisten(None, path, owned)  # the socket server closed the socket; the path only while ours
    if opts.pidfile:
        _unlink(opts.pidfile)
    return 0


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
