"""The ``pycni`` command: cnitool's verbs and environment, and a few more.

    pycni add|check|del NETWORK NETNS      run a network's plugin chain for a namespace
    pycni gc|status NETWORK [NETNS]         spec 1.1 GC / STATUS of a network
    pycni list | validate NETWORK | version
    pycni install-plugins --dir DIR [TYPE...]
    pycni install-cni [--watch | --uninstall]  install on a node: plugins, conflist, kubeconfig, systemd units
    pycni plugin TYPE                       run one of our plugins in this process
    pycni daemon [--socket PATH]            serve installed plugin shims with warm imports
    pycni node [status | remove NAME] ...   the node agent routing pod blocks between nodes (etcd)
    pycni ipam list|check NETWORK           cluster-ipam allocations in etcd (a table; -o json) / consistency
    pycni ipam release NETWORK --ip IP      free one cluster-ipam address (--node N: all of a dead node's)
    pycni ipam show [--show-blocks] NETWORK  pools and blocks: addresses total, in use, free
    pycni endpoint|namespace|policy ...     workload endpoints, labels, NetworkPolicy (docs/policy.md)
    pycni bgp config|peer|status ...        BGP mode's settings, external peers, sessions (docs/cluster.md)
    pycni demo                              the end-to-end demo, in throwaway namespaces

Environment as cnitool: NETCONFPATH (default /etc/cni/net.d), CNI_PATH, CNI_IFNAME (default
eth0), CNI_ARGS (``K=V;K=V``), CAP_ARGS (JSON object of capability args). Without
``--container-id`` the ID is cnitool's: ``cnitool-`` + the first 10 bytes of the SHA-512 of
the absolute netns path in hex, so either tool deletes what the other added.

Errors are one line on stderr, ``pycni: <msg>: <details> (code N)``, and exit status 1;
usage errors are CNI errors too (code 4 for the environment, 6 for undecodable input). A
command line argparse refuses exits 2 with the verb's own usage; 3 is a "no" answer
(pycni.output.EXIT_NO). docs/api.md has the table and the conventions every verb follows.
``PYCNI_DEBUG=1`` adds a failing plugin's stderr and, for internal errors, the traceback.
The runtime is imported per verb to keep start-up short.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pycni.cniargs import runtime_args
from pycni.daemon.protocol import DEFAULT_SOCKET
from pycni.output import EXIT_ERROR, EXIT_NO
from pycni.spec.errors import DECODE_FAILURE, INVALID_ENV, IO_FAILURE, UNKNOWN_CONTAINER, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a process ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

    from pycni.cluster.settings import ClusterSettings
    from pycni.runtime import CNI, NetworkConfigList

DEFAULT_NETCONFPATH = "/etc/cni/net.d"


def cnitool_container_id(netns: str) -> str:
    """cnitool's container ID for ``netns``: sha512 of the absolute path, first 10 bytes in hex."""
    import hashlib

    path = os.path.abspath(netns)
    if path.startswith("//"):  # Go's filepath.Clean collapses the leading '//' POSIX keeps
        path = "/" + path.lstrip("/")
    return "cnitool-" + hashlib.sha512(path.encode()).hexdigest()[:20]


def parse_cap_args(raw: str) -> dict[str, Any]:
    """CAP_ARGS: a JSON object of capability name -> value."""
    import json

    if not raw:
        return {}
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise CNIError(DECODE_FAILURE, "invalid CAP_ARGS", f"{e}; CAP_ARGS must be a JSON object, "
                       "e.g. '{\"portMappings\": [...]}'") from None
    if not isinstance(obj, dict):
        raise CNIError(DECODE_FAILURE, "invalid CAP_ARGS", f"expected a JSON object, got {type(obj).__name__}")
    return obj


# ---- building the runtime from flags and environment ---------------------------------------

def _runtime(opts: argparse.Namespace) -> CNI:
    from pycni.runtime import CNI

    conf_dir = opts.conf_dir or os.environ.get("NETCONFPATH") or DEFAULT_NETCONFPATH
    raw_path = opts.cni_path if opts.cni_path is not None else os.environ.get("CNI_PATH", "")
    paths = [p for p in raw_path.split(os.pathsep) if p]
    return CNI(conf_dir=conf_dir, plugin_path=paths, cache_dir=opts.cache_dir or "")


def _network(rt: CNI, name: str) -> NetworkConfigList:
    return rt.load_network(name)


def _attachment(opts: argparse.Namespace) -> dict[str, Any]:
    ifname = opts.ifname or os.environ.get("CNI_IFNAME") or "eth0"
    netns = os.path.abspath(opts.netns)
    if netns.startswith("//"):
        netns = "/" + netns.lstrip("/")
    return {"container_id": opts.container_id or cnitool_container_id(opts.netns), "netns": netns,
            "ifname": ifname, "args": runtime_args(os.environ.get("CNI_ARGS", "")),
            "capability_args": parse_cap_args(os.environ.get("CAP_ARGS", ""))}


# ---- verbs --------------------------------------------------------------------------------

def cmd_add(opts: argparse.Namespace) -> int:
    rt = _runtime(opts)
    att = _attachment(opts)
    result = rt.add(_network(rt, opts.network), **att)
    sys.stdout.write(result.to_json() + "\n")
    return 0


def cmd_check(opts: argparse.Namespace) -> int:
    rt = _runtime(opts)
    att = _attachment(opts)
    rt.check(_network(rt, opts.network), **att)
    return 0


def cmd_del(opts: argparse.Namespace) -> int:
    rt = _runtime(opts)
    att = _attachment(opts)
    rt.delete(_network(rt, opts.network), **att)
    return 0


def cmd_gc(opts: argparse.Namespace) -> int:
    """GC with the attachments in use (--valid), or with none (--all: every one is DELeted); with
    neither, refused: cnitool's "nothing given, nothing valid" took every container's interface."""
    from pycni.runtime import cache

    rt = _runtime(opts)
    net = _network(rt, opts.network)
    cached = sorted((e.container_id, e.ifname) for e in cache.list_entries(rt.cache_dir) if e.network_name == net.name)
    if opts.valid is None and not opts.all:
        shown = ", ".join(f"{c}:{i}" for c, i in cached[:5]) + (f" and {len(cached) - 5} more" if len(cached) > 5
                                                                    else "")
        raise CNIError(INVALID_ENV, f"refusing to GC network {net.name} without --valid",
                       f"with no attachment listed as valid, GC would DEL all {len(cached)} cached attachment(s) "
                       f"({shown or 'none now'}) and let every plugin release everything it holds for {net.name}; "
                       "list the ones in use with --valid CONTAINERID:IFNAME (repeatable), or pass --all")
    valid: list[tuple[str, str]] = []
    for item in opts.valid or ():
        cid, sep, ifname = item.rpartition(":")
        if not sep or not cid or not ifname:
            raise CNIError(INVALID_ENV, f"invalid --valid attachment {item!r}", "use CONTAINERID:IFNAME")
        valid.append((cid, ifname))
    rt.gc(net, valid)
    gone = [a for a in cached if a not in valid]
    print(f"gc {net.name}: deleted {len(gone)} cached attachment(s)"
          + (f" ({', '.join(f'{c}:{i}' for c, i in gone)})" if gone else "") + f", kept {len(cached) - len(gone)}")
    return 0


def cmd_status(opts: argparse.Namespace) -> int:
    rt = _runtime(opts)
    rt.status(_network(rt, opts.network))
    return 0


class _Tracked(dict):  # type: ignore[type-arg]
    """A JSON object that remembers which keys were looked up (what a plugin's parser read)."""

    def __init__(self, pairs: Any = ()) -> None:
        super().__init__(pairs)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.read.add(key)
        return super().__contains__(key)


# Keys the runtime or the spec gives every plugin: never "unknown".
_SPEC_KEYS = {"cniVersion", "cniVersions", "name", "type", "ipam", "dns", "args", "runtimeConfig", "capabilities",
              "prevResult", "disableCheck", "disableGC"}


def _parse_with_ours(rt: CNI, net: NetworkConfigList) -> tuple[list[CNIError], list[str]]:
    """Run the config parsing of each plugin (and IPAM) of ``net`` that is one of ours, as its ADD
    would: the errors ADD would refuse with, and warnings for keys no parser read (misspelled?)."""
    import json

    from pycni import invoke
    from pycni.plugins import registry
    from pycni.runtime.api import RuntimeConf, build_config
    from pycni.shim import plugin_of
    from pycni.skel import CmdArgs
    from pycni.spec.types import Result

    class Args(CmdArgs):
        def conf(self) -> dict[str, Any]:
            return self.tracked  # type: ignore[attr-defined,no-any-return]

    errors: list[CNIError] = []
    warnings: list[str] = []
    rtc = RuntimeConf(container_id="pycni-validate", netns="", ifname="eth0", args=[], capability_args={})
    # what the plugins after the first get at ADD: a result (TEST-NET-1, documentation only)
    prev = Result.from_dict({"cniVersion": net.cni_version, "interfaces": [{"name": "eth0", "sandbox": "/x"}],
                             "ips": [{"address": "192.0.2.2/24", "gateway": "192.0.2.1", "interface": 0}]},
                            net.cni_version)
    for i, plugin in enumerate(net.plugins):
        stdin = build_config(net.name, net.cni_version, plugin, prev if i else None, rtc)
        raw = plugin.raw
        ipam = raw.get("ipam")
        checks: list[tuple[str, str | None]] = [(plugin.type, None)]
        if isinstance(ipam, dict) and isinstance(ipam.get("type"), str) and ipam["type"]:
            checks.append((ipam["type"], "ipam"))
        for type_, section in checks:
            where = f"plugin {plugin.type}" + (f" (ipam {type_})" if section else "")
            try:
                path = invoke.find_in_path(type_, rt.plugin_path)
            except CNIError as e:
                errors.append(CNIError(e.code, f"{where}: {e.msg}", e.details))
                continue
            ours = plugin_of(path)
            if ours is None:
                continue  # not ours (a Go plugin, say): only its own ADD can tell
            parse = registry.parser(ours)
            if parse is None:
                continue
            args = Args(command="ADD", container_id=rtc.container_id, ifname="eth0",
                        path=os.pathsep.join(rt.plugin_path), stdin_data=stdin)
            args.tracked = json.loads(stdin, object_pairs_hook=_Tracked)  # type: ignore[attr-defined]
            try:
                parse(args)
            except CNIError as e:
                errors.append(CNIError(e.code, f"{where}: {e.msg}", e.details))
                continue
            obj = args.tracked if section is None else args.tracked.get(section)  # type: ignore[attr-defined]
            if isinstance(obj, _Tracked) and obj.read:
                known = obj.read | (_SPEC_KEYS if section is None else {"type"})
                for key in sorted(set(obj) - known):
                    warnings.append(f"{where}: key {(section + '.' if section else '') + key!r} is not read by "
                                    f"{type_} (misspelled?)")
    return errors, warnings


def cmd_validate(opts: argparse.Namespace) -> int:
    """libcni's validation (every plugin found, speaking the version), then our plugins' own config
    parsing, so that what ADD would refuse is refused here; keys no parser reads are warnings."""
    rt = _runtime(opts)
    net = _network(rt, opts.network)
    caps = rt.validate(net)
    errors, warnings = _parse_with_ours(rt, net)
    for w in warnings:
        sys.stderr.write(f"pycni: warning: {w}\n")
    if errors:
        raise CNIError(errors[0].code, f"network {net.name!r} is not valid: " + "; ".join(e.msg for e in errors),
                       "; ".join(e.details for e in errors if e.details))
    types = ", ".join(p.type for p in net.plugins)
    print(f"network {net.name!r} (cniVersion {net.cni_version}, {net.path or 'inline'}) is valid: "
          f"plugins {types} found and speak {net.cni_version}" + "; pycni's plugins accept their config")
    print(f"capabilities: {', '.join(caps) if caps else '(none)'}")
    return 0


def cmd_list(opts: argparse.Namespace) -> int:
    """Every configuration file: its network, version and plugins (wide: capabilities and notes);
    exit 1 when the directory is missing or a file is broken (each said on stderr too)."""
    from pycni.output import emit

    rt = _runtime(opts)
    if not os.path.isdir(rt.conf_dir):
        raise CNIError(IO_FAILURE, f"no configuration directory {rt.conf_dir}",
                       "set NETCONFPATH or --conf-dir to the directory holding .conflist/.conf files")
    items: list[dict[str, Any]] = []
    status = 0
    for item in rt.networks():
        net = item.network
        row: dict[str, Any] = {"file": item.path, "name": net.name if net else "", "shadowed": bool(item.shadowed),
                               "cniVersion": net.cni_version if net else "",
                               "plugins": [p.type for p in net.plugins] if net else [],
                               "capabilities": sorted({c for p in net.plugins for c in p.enabled_capabilities()})
                               if net else [], "error": _error_line(item.error) if item.error else ""}
        if item.error is not None:
            sys.stderr.write(f"pycni: {item.path}: {row['error']}\n")
            status = 1
        items.append(row)

    def note(row: dict[str, Any]) -> str:
        return "ERROR (see stderr)" if row["error"] else "shadowed: an earlier file defines this name" \
            if row["shadowed"] else ""

    emit(opts.output, items, [("NAME", "name"), ("VERSION", "cniVersion"), ("PLUGINS", "plugins"), ("FILE", "file"),
                              ("NOTE", note)], wide=[("CAPABILITIES", "capabilities")],
         empty=f"no network configurations in {rt.conf_dir}")
    return status


def cmd_version(opts: argparse.Namespace) -> int:
    from pycni import __version__
    from pycni.spec.version import ALL_VERSIONS, CURRENT_VERSION

    print(f"pycni {__version__}")
    print(f"CNI protocol versions supported: {', '.join(ALL_VERSIONS)} (current {CURRENT_VERSION})")
    return 0


def cmd_install_plugins(opts: argparse.Namespace) -> int:
    from pycni.install_plugins import ForeignExecutable, daemon_note, install

    try:
        written = install(opts.dir, opts.names or None, python=opts.python, daemon=not opts.direct,
                          socket=opts.socket, force=opts.force, forwarder=not opts.no_forwarder)
    except KeyError as e:
        raise invalid_config("cannot install plugins", str(e.args[0])) from None
    except ValueError as e:
        raise invalid_config("cannot install plugins", str(e)) from None
    except ForeignExecutable as e:
        raise CNIError(IO_FAILURE, f"refusing to replace executables that pycni did not write in {opts.dir}",
                         f"{', '.join(e.paths)} (another implementation's plugin?); nothing was written; "
                         "move them away, or pass --force to replace them") from None
    except OSError as e:
        raise CNIError(IO_FAILURE, f"cannot write plugins to {opts.dir}", e.strerror or str(e)) from None
    for path in written:
        print(path)
    if not opts.direct:
        sys.stderr.write(f"pycni: {daemon_note(opts.socket)}\n")
    return 0


def cmd_plugin(opts: argparse.Namespace) -> int:
    from pycni.plugins import registry

    mods = registry.PLUGIN_MODULES
    if opts.type not in mods:
        raise invalid_config(f"unknown plugin type {opts.type!r}", f"available: {', '.join(sorted(mods))}")
    from pycni.skel import run_plugin

    run_plugin(registry.load(opts.type))  # exits
    return 0


def cmd_daemon(opts: argparse.Namespace) -> int:
    from pycni.daemon import server

    return server.run(opts)


def cmd_node(opts: argparse.Namespace) -> int:
    from pycni.cluster import node

    return node.main(opts)


def _cluster_ipam(opts: argparse.Namespace) -> tuple[ClusterSettings, dict[str, Any] | None]:
    """The cluster-ipam settings of NETWORK and its conflist's ``ipam`` section (None without one).

    etcd is named as for every other verb (``--etcd-*``, ``$PYCNI_ETCD_ENDPOINTS``); without
    them, by NETWORK's conflist (its first plugin whose ipam.type is cluster-ipam). Either way
    the command's budget is the CLI's one (``--etcd-timeout``), not the plugin's etcdTimeout.
    """
    from pycni.cluster.settings import (
        ClusterSettings,
        etcd_endpoints_given,
        etcd_settings_from_args,
        parse_cluster_settings,
    )
    from pycni.spec.validate import validate_network_name

    flags = bool(etcd_endpoints_given(opts))
    try:
        net = _network(_runtime(opts), opts.network)
    except CNIError as e:
        if not flags:
            raise CNIError(e.code, e.msg, "; ".join([*[e.details] * bool(e.details),
                           "name etcd with --etcd-endpoints (or PYCNI_ETCD_ENDPOINTS), or give the directory of "
                           "NETWORK's conflist with --conf-dir (or NETCONFPATH)"])) from None
        validate_network_name(opts.network)
        return ClusterSettings(network=opts.network, etcd=etcd_settings_from_args(opts)), None
    ipam = next((p.raw["ipam"] for p in net.plugins
                 if isinstance(p.raw.get("ipam"), dict) and p.raw["ipam"].get("type") == "cluster-ipam"), None)
    if ipam is None:
        raise invalid_config(f"network {net.name!r} does not use cluster-ipam",
                             f"none of its plugins ({', '.join(p.type for p in net.plugins)}) has \"ipam\": "
                             "{\"type\": \"cluster-ipam\", ...}")
    cfg = parse_cluster_settings({"name": net.name, "ipam": ipam})
    # the conflist fills in what no flag gives; the budget and the fail-fast are the CLI's
    if not flags:
        opts.etcd_endpoints = ",".join(cfg.etcd.endpoints)
    opts.etcd_prefix = opts.etcd_prefix or cfg.etcd.prefix
    opts.etcd_ca_cert = opts.etcd_ca_cert or cfg.etcd.ca_cert
    opts.etcd_cert = opts.etcd_cert or cfg.etcd.cert
    opts.etcd_key = opts.etcd_key or cfg.etcd.key
    cfg.etcd = etcd_settings_from_args(opts)
    return cfg, ipam


def cmd_ipam_list(opts: argparse.Namespace) -> int:
    """Every allocated address: ip, node, containerID, ifname (wide: block, network; json/yaml: all)."""
    from pycni import ipaddr
    from pycni.cluster.session import session
    from pycni.output import emit

    cfg, _ = _cluster_ipam(opts)
    with session(cfg, who="") as store:
        handles = store.handles()
    rows = []
    for h in sorted(handles, key=lambda h: (h.get("node", ""), h.get("containerID", ""), h.get("ifname", ""))):
        if opts.node and h.get("node") != opts.node:
            continue
        blocks = [ipaddr.ip_network(b) for b in h.get("blocks", ())]
        for text in h.get("ips", ()):
            iface = ipaddr.ip_interface(text)
            block = next((str(b) for b in blocks if iface.ip in b), "")
            rows.append({"ip": str(iface.ip), "prefixLength": iface.network.prefixlen,
                         "containerID": h.get("containerID"), "ifname": h.get("ifname"),
                         "node": h.get("node"), "network": h.get("network"), "block": block})
    emit(opts.output, rows, [("IP", "ip"), ("NODE", "node"), ("CONTAINER-ID", "containerID"), ("IFNAME", "ifname")],
         wide=[("BLOCK", "block"), ("NETWORK", "network")],
         empty=f"no address of network {cfg.network} is allocated" + (f" on node {opts.node}" if opts.node else ""))
    return 0


def cmd_ipam_show(opts: argparse.Namespace) -> int:
    """Per pool of NETWORK (its cluster-ipam ranges' subnets) and, with --show-blocks, per block."""
    from pycni import ipaddr
    from pycni.cluster.policy.cli import ipam_show

    cfg, ipam = _cluster_ipam(opts)
    pools = None if ipam is None else [ipaddr.ip_network(r["subnet"], strict=False)
                                       for rs in ipam.get("ranges") or () for r in rs]
    return ipam_show(cfg, pools, opts.show_blocks, opts.output)


def cmd_ipam_release(opts: argparse.Namespace) -> int:
    """Free one address, whoever holds it (its handle keeps its other addresses); or, with
    --node, everything a node that is gone for good holds (handles, then its empty blocks)."""
    from pycni import ipaddr
    from pycni.cluster.session import session

    if bool(opts.ip) == bool(opts.node):
        raise CNIError(INVALID_ENV, "give exactly one of --ip IP and --node NODE")
    if opts.node:
        cfg, _ = _cluster_ipam(opts)
        cfg.node = opts.node
        with session(cfg, who="") as store:
            handles, blocks = store.release_node()
        print(f"released {len(handles)} attachment(s) and {len(blocks)} block(s) of node {opts.node}")
        return 0
    try:
        ip = ipaddr.ip_address(opts.ip)
    except ValueError:
        raise invalid_config(f"invalid --ip {opts.ip!r}", "give one address, e.g. --ip 10.90.0.5") from None
    cfg, _ = _cluster_ipam(opts)
    with session(cfg, who="") as store:
        block = next((b.cidr for b in store.blocks() if b.cidr.version == ip.version and ip in b.cidr), None)
        owner = store.release_ip(ip, block) if block is not None else None
    if owner is None:
        raise CNIError(UNKNOWN_CONTAINER, f"{ip} is not allocated in network {cfg.network}",
                         "`pycni ipam list NETWORK` shows what is allocated")
    print(f"released {ip} (held by {owner})")
    return 0


def cmd_ipam_check(opts: argparse.Namespace) -> int:
    """Blocks vs handles vs affinities; prints each problem as JSON, exit 3 when there is any."""
    import json

    from pycni.cluster.session import session

    cfg, _ = _cluster_ipam(opts)
    with session(cfg, who="") as store:
        problems = store.inconsistencies()
        blocks, handles = len(store.blocks()), len(store.handles())
    for p in problems:
        print(json.dumps(p))
    if problems:
        sys.stderr.write(f"network {cfg.network}: {len(problems)} inconsistencies\n")
        return EXIT_NO
    # on stderr as the line above: stdout stays JSON lines, one per problem
    sys.stderr.write(f"network {cfg.network}: consistent ({blocks} block(s), {handles} attachment(s))\n")
    return 0


def cmd_demo(opts: argparse.Namespace) -> int:
    from pycni import demo

    return demo.main(opts.demo_args)


# ---- argument parsing and the entry point ----------------------------------------------------

ENVIRONMENT_HELP = f"""\
environment:
  NETCONFPATH   network configuration directory (default /etc/cni/net.d)
  CNI_PATH      plugin search path, ':'-separated
  CNI_IFNAME    interface name for add/check/del (default eth0)
  CNI_ARGS      extra arguments for the plugins, KEY=VALUE;KEY=VALUE (as cnitool)
  CAP_ARGS      capability arguments, a JSON object, e.g. '{{"portMappings": [...]}}'
  PYCNI_SOCKET  the daemon's socket for installed plugins (default {DEFAULT_SOCKET}; 'off' never forwards)
  PYCNI_DEBUG   1: show a failing plugin's stderr, and tracebacks of internal errors
  PYCNI_ETCD_ENDPOINTS  etcd client URLs for every verb that talks to etcd (node, ipam, endpoint,
                namespace, policy; comma-separated; --etcd-endpoints wins)

exit status: 0 done, 1 error (one line: pycni: ... (code N)), 2 usage error, 3 the answer is no
(policy why DENIED, node status not in sync, ipam check inconsistent); see docs/api.md

add/check/del/gc change the network of the machine they run on (bridges, routes, firewall
rules in the namespace you run them in); try them inside a throwaway namespace first:
  ip netns add host && ip netns exec host pycni add NETWORK /var/run/netns/ctr
"""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a verb refuses what it does not know with its own usage (argparse
    leaves unknown arguments to the top level, whose usage says nothing of the verb's flags).
    Sub-parsers are made of the parent's class, so every verb's parser is one of these."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None and self.prog != "pycni":  # a verb's leaf parser
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def _parser() -> argparse.ArgumentParser:
    from pycni import __version__
    from pycni.cluster.settings import add_etcd_arguments
    from pycni.output import add_output_argument

    p = _Parser(prog="pycni", description="Run CNI networks and plugins (cnitool-compatible).",
                                epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"pycni {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--conf-dir", help="network configuration directory (default: $NETCONFPATH or "
                        f"{DEFAULT_NETCONFPATH})")
        sp.add_argument("--cni-path", help="plugin search path, ':'-separated (default: $CNI_PATH)")
        sp.add_argument("--cache-dir", help="result cache directory (default: /var/lib/cni)")

    for verb, fn, text in (("add", cmd_add, "attach NETNS to NETWORK and print the result"),
                           ("check", cmd_check, "check NETNS's attachment to NETWORK"),
                           ("del", cmd_del, "detach NETNS from NETWORK")):
        sp = sub.add_parser(verb, help=text, description=text)
        sp.add_argument("network", metavar="NETWORK", help="the network's name (its configuration in --conf-dir)")
        sp.add_argument("netns", metavar="NETNS", help="path of the network namespace")
        sp.add_argument("-i", "--ifname", help="interface name (default: $CNI_IFNAME or eth0)")
        sp.add_argument("--container-id", help="container ID (default: cnitool's, derived from NETNS)")
        common(sp)
        sp.set_defaults(fn=fn)

    sp = sub.add_parser("gc", help="garbage-collect NETWORK (spec 1.1)",
                        description="DEL cached attachments of NETWORK that are not --valid, then GC "
                        "every plugin with that list. One of --valid or --all is required (cnitool takes "
                        "neither to mean that every attachment is stale).")
    sp.add_argument("network", metavar="NETWORK", help="the network's name (its configuration in --conf-dir)")
    sp.add_argument("netns", metavar="NETNS", nargs="?", help="ignored (cnitool takes it)")
    which = sp.add_mutually_exclusive_group()
    which.add_argument("--valid", action="append", metavar="CONTAINERID:IFNAME",
                       help="an attachment still in use (repeatable)")
    which.add_argument("--all", action="store_true",
                       help="no attachment is in use: DEL every cached one, and plugins release all they hold")
    sp.add_argument("-i", "--ifname", help=argparse.SUPPRESS)
    common(sp)
    sp.set_defaults(fn=cmd_gc)

    text = "ask every plugin of NETWORK whether it can serve ADD (spec 1.1)"
    sp = sub.add_parser("status", help=text, description=text + "; exit 1 with the first plugin's error.")
    sp.add_argument("network", metavar="NETWORK", help="the network's name (its configuration in --conf-dir)")
    sp.add_argument("netns", metavar="NETNS", nargs="?", help="ignored (cnitool takes it)")
    sp.add_argument("-i", "--ifname", help=argparse.SUPPRESS)
    common(sp)
    sp.set_defaults(fn=cmd_status)

    text = "check NETWORK's plugins exist and speak its version"
    sp = sub.add_parser("validate", help=text, description=text + "; print the capabilities it enables.")
    sp.add_argument("network", metavar="NETWORK", help="the network's name (its configuration in --conf-dir)")
    common(sp)
    sp.set_defaults(fn=cmd_validate)

    sp = sub.add_parser("list", help="list networks and their plugins",
                        description="List every configuration file, its network and plugins; exit 1 when the "
                        "directory is missing or a file is broken.")
    add_output_argument(sp, "networks")
    common(sp)
    sp.set_defaults(fn=cmd_list)

    text = "print pycni's version and the CNI versions it speaks"
    sp = sub.add_parser("version", help=text, description=text + ".")
    sp.set_defaults(fn=cmd_version)

    sp = sub.add_parser("install-plugins", help="write plugin executables into a CNI bin directory",
                        description="Write one executable per plugin type (named as its CNI type) into --dir. "
                        "They run this interpreter and this installation of pycni: with an editable install "
                        "they follow the clone.")
    sp.add_argument("--dir", required=True, help="target directory (e.g. /opt/cni/bin)")
    sp.add_argument("--python", help="interpreter for the executables (default: this one)")
    how = sp.add_mutually_exclusive_group()
    how.add_argument("--direct", action="store_true", help="never forward to a pycni daemon")
    how.add_argument("--socket", metavar="PATH",
                     help="the daemon's socket, baked into the executables so they find it with no environment "
                     f"(default {DEFAULT_SOCKET}; a PYCNI_SOCKET passed at run time still wins)")
    sp.add_argument("--force", action="store_true",
                    help="replace executables that pycni did not write (e.g. the Go plugins); refused otherwise")
    sp.add_argument("--no-forwarder", action="store_true",
                    help="do not build the native forwarder (.pycni-forward, needs a C compiler): calls the daemon "
                    "serves then start Python to forward")
    sp.add_argument("names", nargs="*", metavar="TYPE", help="plugin types (default: all)")
    sp.set_defaults(fn=cmd_install_plugins)

    text = "run plugin TYPE in this process (CNI_COMMAND etc. from the env)"
    sp = sub.add_parser("plugin", help=text, description=text + ", reading the config on stdin, as an "
                        "installed executable would.")
    sp.add_argument("type", metavar="TYPE", help="the plugin's CNI type, e.g. bridge")
    sp.set_defaults(fn=cmd_plugin)

    ipam_p = sub.add_parser("ipam", help="cluster-ipam allocations in etcd: list, show, release, check",
                            description="cluster-ipam's allocations in etcd. etcd is named by the --etcd-* flags "
                            "(or $PYCNI_ETCD_ENDPOINTS) as for every verb, or else found in NETWORK's conflist.")
    ipam_sub = ipam_p.add_subparsers(dest="ipam_verb", metavar="ACTION")
    ipam_sub.required = True
    for action, fn, text in (("list", cmd_ipam_list, "every allocated address: IP, node, container, interface"),
                             ("release", cmd_ipam_release, "free one address (--ip) or a node's all (--node)"),
                             ("check", cmd_ipam_check, "blocks vs handles consistency; exit 3 when not"),
                             ("show", cmd_ipam_show, "per pool (and block): addresses total, in use, free")):
        sp = ipam_sub.add_parser(action, help=text, description=text)
        sp.add_argument("network", metavar="NETWORK", help="the network's name (its key space in etcd)")
        if action == "show":
            sp.add_argument("--show-blocks", action="store_true", help="also every block, with its node")
        if action == "release":
            sp.add_argument("--ip", help="the address to free")
            sp.add_argument("--node", help="free everything this node holds (a node gone for good)")
        if action == "list":
            sp.add_argument("--node", help="only this node's allocations")
        if action in ("list", "show"):
            add_output_argument(sp, "addresses" if action == "list" else "pools and blocks")
        add_etcd_arguments(sp)
        common(sp)
        sp.set_defaults(fn=fn)

    sp = sub.add_parser("daemon", help="serve plugin shims in-process (foreground; stops on SIGTERM)",
                        description="Run plugin handlers for the installed shims with imports and netlink "
                        "warm, each request in its caller's network namespace. See docs/daemon.md.")
    from pycni.daemon.options import add_arguments

    add_arguments(sp)
    sp.set_defaults(fn=cmd_daemon)

    sp = sub.add_parser("node", help="the node agent: route pod blocks between nodes (foreground; SIGTERM stops "
                        "it); also `node status`, `node remove NAME`",
                        description="Register this node in etcd and keep its routes to every other node's "
                        "address blocks (cluster-ipam's affinities) converged. See docs/cluster.md.")
    from pycni.cluster.node import add_arguments as node_arguments

    node_arguments(sp)
    sp.set_defaults(fn=cmd_node)

    from pycni.cluster.policy.cli import add_parsers as policy_parsers

    policy_parsers(sub)  # endpoint, namespace, policy
    from pycni.cluster.kube.cli import add_parser as kube_parser

    kube_parser(sub)  # kube-controllers
    from pycni.flows_cli import add_parser as flows_parser

    flows_parser(sub)  # flows (docs/flows.md)

    sp = sub.add_parser("install-cni", help="install pycni on this node: plugins, conflist, kubeconfig (see README)",
                        description="Calico install-cni's job for pycni: the plugin executables (daemon path), the "
                        "conflist from a template, a kubeconfig from the service account; --watch keeps them "
                        "current, --systemd adds units, --uninstall removes what it wrote.")
    from pycni.install_cni import add_arguments as install_cni_arguments
    from pycni.install_cni import main as install_cni_main

    install_cni_arguments(sp)
    sp.set_defaults(fn=install_cni_main)
    from pycni.cluster.bgp.cli import add_parsers as bgp_parsers

    bgp_parsers(sub)  # bgp config|peer|status (docs/cluster.md)


    text = "run the end-to-end demo in throwaway namespaces (needs root)"
    sp = sub.add_parser("demo", help=text, description=text + ": two containers on a bridge network, a "
                        "ping, a page through a mapped port, then everything removed. Options: see "
                        "`pycni demo -- --help`.")
    sp.add_argument("demo_args", nargs=argparse.REMAINDER, metavar="...", help="options of the demo")
    sp.set_defaults(fn=cmd_demo)
    return p


def _error_line(e: CNIError) -> str:
    return f"{e.msg}: {e.details} (code {e.code})" if e.details else f"{e.msg} (code {e.code})"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pycni`` and ``python -m pycni``; returns (and exits with) the status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["demo"]:  # its options are the demo's own (argparse's REMAINDER refuses a leading option)
        from pycni import demo

        status = demo.main(args[1:])
        if argv is None:
            sys.exit(status)
        return status
    opts = _parser().parse_args(argv)
    try:
        status = int(opts.fn(opts))
    except CNIError as e:
        if os.geteuid() != 0 and opts.fn in (cmd_add, cmd_check, cmd_del, cmd_gc, cmd_status):
            # not the first thing such a failure says (Permission denied on /var/lib/cni, a netns...)
            e = CNIError(e.code, e.msg, "; ".join([*[e.details] * bool(e.details),
                         f"pycni {opts.verb} needs root (this is uid {os.geteuid()}): plugins change network "
                         "namespaces and keep state under /var/lib/cni and /run"]), e.cni_version)
        sys.stderr.write(f"pycni: {_error_line(e)}\n")
        status = EXIT_ERROR
    except KeyboardInterrupt:
        status = 130
    except Exception as e:  # noqa: BLE001 - one line, never a traceback (PYCNI_DEBUG=1 shows it)
        if os.environ.get("PYCNI_DEBUG"):
            raise
        sys.stderr.write(f"pycni: internal error: {type(e).__name__}: {e} (code 999)\n")
        status = EXIT_ERROR
    if argv is None:
        sys.exit(status)
    return status
