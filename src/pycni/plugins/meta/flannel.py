"""flannel: turn flannel's node subnet file into a delegate configuration and run the delegate.

flanneld writes the node's share of the cluster network to a subnet file (default
/run/flannel/subnet.env). On ADD this plugin builds a configuration for the delegate plugin
(bridge by default) with host-local IPAM over the node's subnet and a route to the whole
flannel network, saves that configuration under ``dataDir`` keyed by container ID, and runs
the delegate. DEL replays the saved configuration, so it works after the subnet file has
gone or changed, and removes it once the delegate's DEL succeeded. Stdlib only.
"""

from __future__ import annotations

import os

from pycni import invoke, ipaddr, netconf, statefile
from pycni import jsonlite as json
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import IO_FAILURE, PLUGIN_NOT_AVAILABLE, UNKNOWN_CONTAINER, CNIError, invalid_config
from pycni.spec.types import IPNetwork, Result
from pycni.spec.validate import validate_container_id

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~3 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SUBNET_FILE = "/run/flannel/subnet.env"
DEFAULT_DATA_DIR = "/var/lib/cni/flannel"


@record
class SubnetEnv:
    """What flanneld wrote about this node (IPv4 and/or IPv6)."""

    networks: list[IPNetwork] = field(default_factory=list)
    subnets: list[IPNetwork] = field(default_factory=list)
    mtu: int | None = None
    ipmasq: bool | None = None


@record
class FlannelConf:
    """The checked config; ``raw`` keeps the rest for CHECK."""
    name: str
    cni_version: str
    subnet_file: str
    data_dir: str
    delegate: dict[str, Any]
    ipam: dict[str, Any]
    runtime_config: dict[str, Any] | None  # None: the config has none (the delegate gets none)
    raw: dict[str, Any]
    valid: list[tuple[str, str]] = field(default_factory=list)  # GC's attachments still in use


def parse_conf(args: CmdArgs) -> FlannelConf:
    """Decode the config and refuse delegate keys flannel sets itself, as the reference."""
    raw = args.conf()
    delegate = netconf.get_dict(raw, "delegate")
    if "type" in delegate and not isinstance(delegate["type"], str):
        raise invalid_config("'delegate' dictionary, if present, must have (string) 'type' field")
    if "name" in delegate:
        raise invalid_config("'delegate' dictionary must not have 'name' field, it'll be set by flannel")
    if "ipam" in delegate:
        raise invalid_config("'delegate' dictionary must not have 'ipam' field, it'll be set by flannel")
    rc = netconf.runtime_config(raw)
    netconf.args_cni(raw)
    return FlannelConf(name=netconf.network_name(raw), cni_version=config_version(raw),
                       subnet_file=netconf.get_str(raw, "subnetFile") or DEFAULT_SUBNET_FILE,
                       data_dir=netconf.get_str(raw, "dataDir") or DEFAULT_DATA_DIR, delegate=dict(delegate),
                       ipam=netconf.get_dict(raw, "ipam"),
                       runtime_config=rc if netconf.lookup(raw, "runtimeConfig") is not None else None,

                       raw=raw, valid=netconf.valid_attachments(raw) if args.command == "GC" else [])


def load_subnet_env(path: str) -> SubnetEnv:
    """Parse flannel's subnet file; missing keys and bad values are config errors (code 7)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise invalid_config(f"failed to read flannel subnet file {path}",
                             f"{e.strerror or e}; is flanneld running on this node?") from None
    env = SubnetEnv()
    v4: dict[str, Any] = {}
    v6: dict[str, Any] = {}
    for lineno, line in enumerate(lines, 1):
        key, sep, value = line.strip().partition("=")
        if not sep:
            continue
        try:
            if key in ("FLANNEL_NETWORK", "FLANNEL_SUBNET"):
                v4[key] = ipaddr.ip_network(value, strict=False)
            elif key in ("FLANNEL_IPV6_NETWORK", "FLANNEL_IPV6_SUBNET"):
                v6[key] = ipaddr.ip_network(value, strict=False)
            elif key == "FLANNEL_MTU":
                env.mtu = int(value)
                if not 0 < env.mtu < 2**32:
                    raise ValueError("MTU out of range")
            elif key == "FLANNEL_IPMASQ":
                env.ipmasq = value == "true"
        except ValueError as e:
            raise invalid_config(f"invalid {key} in flannel subnet file {path}",
                                 f"line {lineno}: {value!r}: {e}") from None
    env.networks = [n for n in (v4.get("FLANNEL_NETWORK"), v6.get("FLANNEL_IPV6_NETWORK")) if n]
    env.subnets = [n for n in (v4.get("FLANNEL_SUBNET"), v6.get("FLANNEL_IPV6_SUBNET")) if n]
    missing = []
    if not env.networks:
        missing += ["FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK"]
    if not env.subnets:
        missing += ["FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET"]
    if env.mtu is None:
        missing.append("FLANNEL_MTU")
    if env.ipmasq is None:
        missing.append("FLANNEL_IPMASQ")
    if missing:
        raise invalid_config(f"{path} is missing {', '.join(missing)}",
                             "flanneld writes all of these; check the file or the subnetFile setting")
    return env


def delegate_conf(conf: FlannelConf, env: SubnetEnv) -> dict[str, Any]:
    """The delegate's configuration, merged as flannel merges it (explicit delegate keys win)."""
    d = dict(conf.delegate)
    d["name"] = conf.name
    d.setdefault("type", "bridge")
    if "ipMasq" not in d:
        d["ipMasq"] = not env.ipmasq  # masquerade in the delegate only when flanneld does not
    if "mtu" not in d:
        d["mtu"] = env.mtu
    if d["type"] == "bridge":
        d.setdefault("isGateway", True)
    if conf.cni_version:
        d["cniVersion"] = conf.cni_version
    ipam = dict(conf.ipam)
    ipam.setdefault("type", "host-local")
    ipam["ranges"] = [[{"subnet": str(sn)}] for sn in env.subnets]
    routes = netconf.get_list(ipam, "routes", label="ipam.routes")
    ipam["routes"] = [*routes, *({"dst": str(nw)} for nw in env.networks)]
    d["ipam"] = ipam
    if conf.runtime_config is not None:
        d["runtimeConfig"] = conf.runtime_config
    return d


def _scratch_path(data_dir: str, container_id: str) -> str:
    """Where ADD keeps the delegate config for DEL and CHECK to replay."""
    validate_container_id(container_id)  # the ID names a file: it must not escape dataDir
    return os.path.join(data_dir, container_id)


def _read_saved(path: str) -> bytes | None:
    """The saved delegate config, None when there is none."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CNIError(IO_FAILURE, f"failed to read saved flannel delegate config {path}", str(e)) from None


def validate_delegate(delegate: dict[str, Any], args: CmdArgs) -> None:
    """Refuse, before anything is made, what the delegate's IPAM would refuse only after the
    delegate has built its interfaces: host-local's whole config (ranges from the subnet file,
    routes, dataDir, requested IPs in CNI_ARGS and runtimeConfig)."""
    if delegate["ipam"].get("type") == "host-local":
        from pycni.plugins.ipam import host_local

        host_local.parse_conf(CmdArgs(command="ADD", container_id=args.container_id, ifname=args.ifname,
                                      args=args.args, path=args.path, stdin_data=json.dumps(delegate).encode()))


def _new_bridge(delegate: dict[str, Any]) -> str:
    """The bridge a bridge delegate is about to create ("" when it exists or is not ours to make)."""
    if delegate.get("type") != "bridge":
        return ""
    from pycni.net import link

    name = delegate.get("bridge") or "cni0"
    return "" if link.get_link(name) is not None else name


def _remove_unused_bridge(name: str) -> None:
    """Delete bridge ``name``, made by this failed ADD, unless something joined it meanwhile."""
    from pycni.net import link

    br = link.get_link(name)
    if br is None or br.kind != "bridge" or any(lk.master == br.index for lk in link.list_links()):
        return
    link.delete_link_quietly(name)


def cmd_add(args: CmdArgs) -> Result:
    """Save the merged delegate config, then delegate ADD; a failed ADD is undone and forgotten."""
    conf = parse_conf(args)
    path = _scratch_path(conf.data_dir, args.container_id)
    env = load_subnet_env(conf.subnet_file)
    delegate = delegate_conf(conf, env)
    validate_delegate(delegate, args)
    data = json.dumps(delegate).encode()
    # Leave nothing behind: a failed ADD undoes what the delegate made (and the bridge it
    # created, which the delegate's DEL keeps), then forgets the config.
    with Rollback() as undo:
        statefile.write_bytes(path, data, failure=f"failed to save delegate config in {conf.data_dir}")
        undo.push(statefile.remove, path)
        bridge = _new_bridge(delegate)
        if bridge:
            undo.push(_remove_unused_bridge, bridge)
        undo.push(invoke.delegate_del, delegate["type"], data, args)
        return invoke.delegate_add(delegate["type"], data, args)


def cmd_del(args: CmdArgs) -> None:
    """Replay DEL with the config ADD saved (not the current subnet file), then forget it."""
    conf = parse_conf(args)
    path = _scratch_path(conf.data_dir, args.container_id)
    saved = _read_saved(path)
    if saved is None:
        return  # never added, or already deleted: DEL is idempotent
    try:
        delegate = json.loads(saved)
        plugin_type = delegate["type"]
    except (ValueError, KeyError, TypeError):
        statefile.remove(path)  # unusable leftover; nothing can be replayed from it
        return
    invoke.delegate_del(plugin_type, saved, args)
    statefile.remove(path)


def cmd_check(args: CmdArgs) -> None:
    """Replay CHECK through the delegate with the saved configuration and our prevResult."""
    conf = parse_conf(args)
    prev = netconf.prev_result(conf.raw)  # a malformed prevResult is refused before anything is looked up
    path = _scratch_path(conf.data_dir, args.container_id)
    saved = _read_saved(path)
    if saved is None:
        raise CNIError(UNKNOWN_CONTAINER, f"no flannel delegate config for container {args.container_id}",
                       f"nothing saved in {conf.data_dir}; was ADD run for this container?")
    try:
        delegate = json.loads(saved)
        delegate["type"]
    except (ValueError, KeyError, TypeError):
        raise CNIError(IO_FAILURE, f"saved flannel delegate config for {args.container_id} is unreadable",
                       f"{_scratch_path(conf.data_dir, args.container_id)} is not a delegate config") from None
    if prev is not None:
        delegate["prevResult"] = prev.to_dict(delegate.get("cniVersion") or conf.cni_version)
    invoke.delegate_check(delegate["type"], json.dumps(delegate).encode(), args)


def cmd_gc(args: CmdArgs) -> None:
    """Let the delegate collect what is not in cni.dev/valid-attachments; drop stale saved configs."""
    conf = parse_conf(args)
    keep = {cid for cid, _ifname in conf.valid}
    try:
        env = load_subnet_env(conf.subnet_file)
    except CNIError:
        env = None
    if env is not None:
        delegate = delegate_conf(conf, env)
        delegate[netconf.VALID_ATTACHMENTS] = [{"containerID": c, "ifname": i} for c, i in conf.valid]
        invoke.delegate_gc(delegate["type"], json.dumps(delegate).encode(), args)
    try:
        names = os.listdir(conf.data_dir)
    except FileNotFoundError:
        return
    for name in names:
        # Not an ADD's file in the making (older versions named those <id>.tmp<pid>).
        if name not in keep and not name.startswith(statefile.TMP_PREFIX) and ".tmp" not in name:
            statefile.remove(os.path.join(conf.data_dir, name))


def cmd_status(args: CmdArgs) -> None:
    """Ready when flanneld's subnet file is readable and complete."""
    conf = parse_conf(args)
    try:
        load_subnet_env(conf.subnet_file)
    except CNIError as e:
        raise CNIError(PLUGIN_NOT_AVAILABLE, "flannel subnet file not available", str(e)) from None


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="pycni flannel: delegates to bridge (or another plugin) using flannel's subnet file")


def main() -> None:
    run_plugin(PLUGIN)
