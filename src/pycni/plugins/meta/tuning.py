"""tuning: a chained plugin that sets network sysctls and interface attributes in the container.

Config keys, as in the Go reference: ``sysctl`` (map of net.* keys to values; ``IFNAME`` in a
key stands for CNI_IFNAME), ``mac``, ``mtu``, ``promisc``, ``allmulti``, ``txQLen``, ``dataDir``
(default /run/cni/tuning); ``runtimeConfig.mac`` (capability "mac"); ``MAC`` in CNI_ARGS; and
``args.cni`` overriding any of sysctl/mac/mtu/promisc/allmulti/txQLen. Precedence for the MAC:
CNI_ARGS < runtimeConfig < args.cni. If /etc/cni/tuning/allowlist.conf exists, every sysctl
key must match one of its regular expressions.

ADD saves the interface's original mac/mtu/promisc/allmulti/txQLen (only those it changes) to
``<dataDir>/<containerID>_<ifname>.json`` — the reference's file and JSON — and DEL puts them
back. Sysctls are not restored on DEL (nor by the reference): they live and die with the
namespace.

Where we are stricter or safer than the reference: every key and value is checked before
anything is touched; a failure part-way through ADD undoes what it did; sysctls the kernel
keeps global (visible only in the initial namespace) are refused; a repeated ADD keeps the
first saved originals; DEL reads only ``dataDir`` (bad CNI_ARGS cannot block it) and removes
the saved file when the namespace or interface is gone; CHECK compares MACs case-blind and
multi-value sysctls ("4096 87380 6291456") whitespace-blind.
"""

from __future__ import annotations

import os

from pycni import jsonlite as json
from pycni import netconf, statefile
from pycni.cniargs import load_cni_args
from pycni.net.sysctl import normalize_key, proc_path, read_sysctl, try_write_sysctl, write_sysctl
from pycni.record import field, record
from pycni.rollback import Rollback
from pycni.skel import CmdArgs, Plugin, config_version, run_plugin
from pycni.spec.errors import DECODE_FAILURE, IO_FAILURE, PLUGIN_SPECIFIC, CNIError, invalid_config
from pycni.spec.types import Result
from pycni.spec.validate import charset_match

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

    from pycni.net import link as netlink

# pycni.net.link and .netns are imported by the handlers that use them: VERSION needs neither.

DEFAULT_DATA_DIR = "/run/cni/tuning"
ALLOWLIST_FILE = "/etc/cni/tuning/allowlist.conf"

# Net sysctls the kernel keeps global: they exist (writable) only in the initial namespace,
# so a container must never set them (they would change the whole host). Slash form, globs.
GLOBAL_SYSCTLS = (
    "net/core/bpf_jit_*", "net/core/busy_poll", "net/core/busy_read", "net/core/default_qdisc",
    "net/core/dev_weight*", "net/core/devconf_inherit_init_net", "net/core/fb_tunnels_only_for_init_net",
    "net/core/flow_limit_*", "net/core/gro_normal_batch", "net/core/high_order_alloc_disable",
    "net/core/max_skb_frags", "net/core/mem_pcpu_rsv", "net/core/message_*", "net/core/netdev_*",
    "net/core/rmem_default", "net/core/rmem_max", "net/core/wmem_default", "net/core/wmem_max",
    "net/core/rps_sock_flow_entries", "net/core/skb_defer_max", "net/core/warnings",
    "net/ipv4/cipso_*", "net/ipv4/fib_sync_mem", "net/ipv4/inet_peer_*", "net/ipv4/ipfrag_secret_interval",
    "net/ipv4/route/error_*", "net/ipv4/route/gc_*", "net/ipv4/route/max_size", "net/ipv4/route/redirect_*",
    "net/ipv4/tcp_low_latency", "net/ipv4/tcp_max_orphans", "net/ipv4/tcp_mem", "net/ipv4/udp_mem",
    "net/ipv4/tcp_allowed_congestion_control",
    "net/ipv6/calipso_*", "net/ipv6/ip6frag_secret_interval", "net/ipv6/mld_max_msf", "net/ipv6/mld_qrv",
    "net/nf_conntrack_max", "net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_buckets",
    "net/netfilter/nf_conntrack_expect_max", "net/netfilter/nf_log_all_netns",
)


def _glob(pattern: str, name: str, anchored: bool) -> bool:
    """``name`` starts with (``anchored``: is) ``pattern``, whose '*' matches within one path element."""
    head, star, rest = pattern.partition("*")
    if not name.startswith(head):
        return False
    name = name[len(head):]
    if not star:
        return not (anchored and name)
    for i in range(len(name) + 1):
        if _glob(rest, name[i:], anchored):
            return True
        if i < len(name) and name[i] == "/":
            return False
    return False


def is_global_sysctl(name: str) -> bool:
    r"""Whether GLOBAL_SYSCTLS names ``name`` (slash form), as the regular expression this replaces
    matched it: ``re.match("|".join(globs) + r"\Z")``, so only the last entry must match to the end
    and the others match as prefixes. Without re: re (with enum, functools and collections) costs
    a tuning call ~3 ms."""
    last = len(GLOBAL_SYSCTLS) - 1
    return any(_glob(g, name, i == last) for i, g in enumerate(GLOBAL_SYSCTLS))


@record
class Sysctl:
    """One sysctl to set: the key as configured, its /proc/sys file and the value."""
    key: str  # as configured, for messages
    path: str  # /proc/sys/net/..., IFNAME substituted
    value: str


@record
class TuningConf:
    """The checked config: sysctls and the link attributes to change (None/0/"": leave alone)."""
    cni_version: str
    data_dir: str = DEFAULT_DATA_DIR
    sysctls: list[Sysctl] = field(default_factory=list)
    mac: str = ""  # as configured: the reference reports it verbatim in the result
    promisc: bool = False
    mtu: int = 0
    allmulti: bool | None = None
    txqlen: int | None = None
    prev_result: Result | None = None

    @property
    def changes_link(self) -> bool:
        """Whether ADD touches the link itself (and so saves originals for DEL)."""
        return bool(self.mac or self.mtu or self.promisc or self.allmulti is not None or self.txqlen is not None)


# ---- config ------------------------------------------------------------------------------------

class _DupDict(dict):  # type: ignore[type-arg]
    """A JSON object that remembers keys it saw more than once."""

    dups: list[str]


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object_pairs_hook that records duplicated keys, so duplicated sysctls can be refused."""
    d = _DupDict()
    d.dups = []
    for k, v in pairs:
        if k in d:
            d.dups.append(k)
        d[k] = v
    return d


def _load(stdin: bytes) -> dict[str, Any]:
    """The config as a JSON object (with duplicate keys recorded); CNIError 6 otherwise."""
    try:
        conf = json.loads(stdin, object_pairs_hook=_pairs_hook)
    except (ValueError, UnicodeDecodeError) as e:
        raise CNIError(DECODE_FAILURE, "failed to load netconf", str(e)) from None
    if not isinstance(conf, dict):
        raise CNIError(DECODE_FAILURE, "failed to load netconf", "the network configuration must be a JSON object")
    return conf


_HEX = "0123456789abcdefABCDEF"


def parse_mac(value: str) -> str:
    """Lower-case colon form of a hardware address in any form Go's net.ParseMAC takes."""
    s = value
    groups: list[str] = []
    if len(s) >= 14 and s[2] in ":-" and (len(s) + 1) % 3 == 0:
        groups = s.split(s[2])
        ok = all(len(g) == 2 for g in groups)
    elif len(s) >= 14 and s[4] == "." and (len(s) + 1) % 5 == 0:
        quads = s.split(".")
        ok = all(len(q) == 4 for q in quads)
        groups = [q[i:i + 2] for q in quads for i in (0, 2)]
    else:
        ok = False
    if ok and len(groups) in (6, 8, 20) and all(charset_match(g, _HEX, _HEX) and len(g) == 2 for g in groups):
        return ":".join(groups).lower()
    raise invalid_config(f"invalid args {value} for MAC addr",
                         "expected a hardware address such as 0a:58:0a:f4:00:05")


def _sysctl_map(raw: Any, where: str) -> dict[str, str]:
    """A ``sysctl`` object: string values, no duplicated keys."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise netconf.invalid(where, "an object of sysctl names to string values", raw)
    dups = getattr(raw, "dups", [])
    if dups:
        raise invalid_config("duplicated sysctl keys are not allowed", f"{where}: {sorted(set(dups))}")
    for k, v in raw.items():
        if not isinstance(v, str):
            raise netconf.invalid(f"{where}[{k}]", "a string", v)
    return dict(raw)


def sysctl_file(key: str, ifname: str) -> str:
    """The /proc/sys/net file a tuning key names; CNIError 7 unless it is a namespaced net sysctl."""
    name = normalize_key(key).replace("IFNAME", ifname, 1)
    path = proc_path(name, key)
    if not name.startswith("net/"):
        raise invalid_config(f"invalid net sysctl key: {json.dumps(key)}",
                             "tuning only sets network sysctls (net.*), which belong to the container's namespace")
    if is_global_sysctl(name):
        raise invalid_config(f"sysctl {key!r} is not namespaced",
                             "the kernel keeps it global (host-wide); it cannot be set for one container")
    return path


def check_allowlist(keys: list[str], allowlist_file: str = ALLOWLIST_FILE) -> None:
    """Every key must match (re.search, like Go's regexp.MatchString) a line of the allowlist, if any."""
    try:
        with open(allowlist_file) as f:
            patterns = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return
    except OSError as e:
        raise CNIError(IO_FAILURE, "failed to read the sysctl allowlist", f"{allowlist_file}: {e}") from None
    import re

    for key in keys:
        try:
            if any(re.search(p, key) for p in patterns):
                continue
        except re.error as e:
            raise invalid_config("invalid pattern in the sysctl allowlist",
                                 f"{allowlist_file}: {e}") from None
        raise invalid_config(f"Sysctl {key} is not allowed",
                             f"only sysctls matching these patterns are allowed ({allowlist_file}): {patterns}")


def _link_attrs(conf: TuningConf, section: dict[str, Any], where: str) -> None:
    """mac, promisc, mtu, allmulti and txQLen of ``section`` (the config or args.cni), where given."""
    given = netconf.lookup
    if given(section, "mac") is not None:
        conf.mac = netconf.get_str(section, "mac", label=where + "mac")
    if given(section, "promisc") is not None:
        conf.promisc = netconf.get_bool(section, "promisc", label=where + "promisc")
    if given(section, "mtu") is not None:
        conf.mtu = netconf.get_int(section, "mtu", minimum=0, maximum=netconf.MAX_MTU, label=where + "mtu")
    if given(section, "allmulti") is not None:
        conf.allmulti = netconf.get_bool(section, "allmulti", label=where + "allmulti")
    if given(section, "txQLen") is not None:
        conf.txqlen = netconf.get_int(section, "txQLen", minimum=0, maximum=2**32 - 1, label=where + "txQLen")


def parse_conf(args: CmdArgs, allowlist_file: str = ALLOWLIST_FILE) -> TuningConf:
    """Decode and check the whole configuration before anything is touched.

    DEL reads only ``dataDir``: it restores what ADD saved, and nothing else in the config
    (nor bad CNI_ARGS) may keep it from doing so. GC and STATUS (no interface) read no more.
    """
    raw = _load(args.stdin_data)
    conf = TuningConf(cni_version=config_version(raw))
    conf.data_dir = netconf.get_str(raw, "dataDir") or DEFAULT_DATA_DIR
    if args.command not in ("ADD", "CHECK"):
        return conf
    sysctls = _sysctl_map(netconf.lookup(raw, "sysctl"), "sysctl")  # the key folds, the sysctl names do not
    _link_attrs(conf, raw, "")
    # The MAC, later wins: the config's, CNI_ARGS MAC, runtimeConfig.mac, args.cni.mac.
    env_mac = load_cni_args(args.args, ["MAC"]).get("MAC", "")
    if env_mac:
        conf.mac = env_mac
    rc_mac = netconf.get_str(netconf.runtime_config(raw), "mac", label="runtimeConfig.mac")
    if rc_mac:
        conf.mac = rc_mac
    cni = netconf.args_cni(raw)
    sysctls.update(_sysctl_map(netconf.lookup(cni, "sysctl"), "args.cni.sysctl"))

    _link_attrs(conf, cni, "args.cni.")

    if conf.mac:
        parse_mac(conf.mac)
    by_path: dict[str, Sysctl] = {}
    for key, value in sysctls.items():
        path = sysctl_file(key, args.ifname)
        if path in by_path and by_path[path].value != value:
            raise invalid_config("conflicting sysctl keys",
                                 f"{by_path[path].key!r} and {key!r} name the same sysctl with different values")
        by_path[path] = Sysctl(key, path, value)
    conf.sysctls = list(by_path.values())
    check_allowlist(list(sysctls), allowlist_file)
    conf.prev_result = netconf.require_prev_result(raw, "tuning")  # ADD and CHECK: tuning only runs chained
    return conf


# ---- saved originals ---------------------------------------------------------------------------

def backup_path(data_dir: str, container_id: str, ifname: str) -> str:
    """The reference's file for the saved originals, so either implementation restores the other's."""
    return os.path.join(data_dir, f"{container_id}_{ifname}.json")


def _read_backup(path: str) -> dict[str, Any] | None:
    """The saved originals; None when there is no file, {} when it is unreadable."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: nothing we can restore from it
    return data if isinstance(data, dict) else {}


def _write_backup(path: str, saved: dict[str, Any]) -> None:
    """Atomically write the reference's JSON (one-space indent, its key order), mode 0600."""
    order = ("mac", "promisc", "mtu", "allmulti", "txQLen")
    statefile.write_json(path, {k: saved[k] for k in order if k in saved}, indent=1,
                         failure="failed to save the interface's original settings")


def _originals(conf: TuningConf, link: netlink.Link) -> dict[str, Any]:
    """What ADD is about to change, as it is now (the reference's omitempty fields)."""
    saved: dict[str, Any] = {}
    if conf.mac:
        saved["mac"] = link.mac
    if conf.promisc:
        saved["promisc"] = link.promisc
    if conf.mtu:
        saved["mtu"] = link.mtu
    if conf.allmulti is not None:
        saved["allmulti"] = link.allmulti
    if conf.txqlen is not None:
        saved["txQLen"] = link.txqlen
    return saved


# The saved keys in the reference's restore order: (JSON key, set_link argument, type, wording).
_RESTORE = (("mtu", "mtu", int, "MTU"), ("mac", "mac", str, "MAC address"),
            ("promisc", "promisc", bool, "promiscuous mode"), ("allmulti", "allmulti", bool, "all-multicast mode"),
            ("txQLen", "txqlen", int, "transmit queue length"))


def _restore_link(ifname: str, saved: dict[str, Any]) -> list[str]:
    """Put back saved attributes one by one, in the reference's order; return the failures."""
    from pycni.net import link as netlink

    errors = []
    for key, attr, kind, what in _RESTORE:
        value = saved.get(key)
        if value is None or (kind is not bool and not value and key != "txQLen"):
            continue  # absent, or the reference's empty value (no MAC / MTU 0)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            errors.append(f"failed to restore {what}: saved value {value!r} is not a {kind.__name__}")
            continue
        try:
            change: dict[str, Any] = {attr: value}
            netlink.set_link(ifname, **change)
        except CNIError as e:
            errors.append(f"failed to restore {what}: {e}")
    return errors


# ---- handlers ----------------------------------------------------------------------------------

def _write_sysctls(sysctls: list[Sysctl], undo: Rollback) -> None:
    """Set every sysctl, each put back by ``undo`` if the ADD fails later."""
    for s in sysctls:
        if not os.path.isfile(s.path):
            raise invalid_config(f"sysctl {s.key!r} does not exist in the container's namespace",
                                 f"{s.path} not found (does the interface exist? is the kernel module loaded?)")
    for s in sysctls:
        key = _slash_key(s.path)
        try:
            undo.push(try_write_sysctl, key, read_sysctl(key))
        except CNIError:
            pass  # write-only (e.g. route/flush): nothing to put back
        write_sysctl(key, s.value)


def _slash_key(path: str) -> str:
    """The slash-form key of a /proc/sys path (read/write_sysctl take it as it is)."""
    return path[len("/proc/sys/"):]


def cmd_add(args: CmdArgs) -> Result:
    """Set sysctls, save the originals, change the link; undo all of it if any step fails."""
    from pycni.net import netns

    conf = parse_conf(args)
    assert conf.prev_result is not None  # parse_conf requires it for ADD
    result = conf.prev_result.copy()
    with netns.enter(args.netns), Rollback() as undo:  # a failure part-way undoes all of it
        link = None
        if conf.changes_link:
            from pycni.net import link as netlink  # only here: a tuning that changes no link needs no netlink

            link = netlink.get_link(args.ifname)
            if link is None:
                raise CNIError(PLUGIN_SPECIFIC, f"failed to get {args.ifname!r}",
                               f"no interface {args.ifname!r} in {args.netns}")
        _write_sysctls(conf.sysctls, undo)
        if link is not None:
            path = backup_path(conf.data_dir, args.container_id, args.ifname)
            previous = _read_backup(path)
            # A repeated ADD keeps the first originals (the true ones) and anything saved before.
            saved = {**_originals(conf, link), **(previous or {})}
            if not os.path.isdir(conf.data_dir):
                undo.push(_remove_dir, conf.data_dir)  # made by this ADD: goes with it (after the file)
            _write_backup(path, saved)
            if previous is None:
                undo.push(statefile.remove, path)
            else:
                undo.push(_write_backup, path, previous)
            undo.push(_restore_link, args.ifname, _originals(conf, link))
            netlink.set_link(args.ifname, mac=parse_mac(conf.mac) if conf.mac else None,
                             promisc=True if conf.promisc else None, mtu=conf.mtu or None,
                             allmulti=conf.allmulti, txqlen=conf.txqlen)
    if conf.mac:
        # The reference edits the MAC on the result converted to the current (1.x) type, so
        # what it prints is that conversion's (e.g. 0.4.0 IP "version"s recomputed).
        result = result.convert("1.1.0")
        for iface in result.interfaces:
            if iface.name == args.ifname:
                iface.mac = conf.mac
    return result


def _remove_dir(path: str) -> None:
    """Remove the directory ``path`` if it is empty (another container's saved file keeps it)."""
    try:
        os.rmdir(path)
    except OSError:
        pass


def _remove(path: str) -> None:
    """Delete the saved originals if there are any."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CNIError(IO_FAILURE, "failed to remove saved settings", f"{path}: {e}") from None


def cmd_del(args: CmdArgs) -> None:
    """Restore what ADD saved. Succeeds when there is nothing to restore or nowhere to restore it."""
    conf = parse_conf(args)
    path = backup_path(conf.data_dir, args.container_id, args.ifname)
    saved = _read_backup(path)
    if saved is None:
        return  # the usual case (ADD changed no link): neither netns nor netlink needed
    from pycni.net import link as netlink
    from pycni.net import netns

    if not saved or not args.netns or not netns.netns_exists(args.netns):
        _remove(path)  # nothing restorable, or the namespace (and interface) is gone
        return
    with netns.enter(args.netns):
        if netlink.get_link(args.ifname) is None:
            _remove(path)
            return
        if _restore_link(args.ifname, saved):
            return  # like the reference: DEL succeeds, the file stays for a later retry
    _remove(path)


def _check_error(msg: str) -> CNIError:
    """A CHECK mismatch, worded exactly as the reference words it."""
    return CNIError(PLUGIN_SPECIFIC, f"Error: {msg}", "the container no longer has the configured tuning")


def cmd_check(args: CmdArgs) -> None:
    """Every configured sysctl and link attribute still holds, worded as the reference."""
    from pycni.net import link as netlink
    from pycni.net import netns

    conf = parse_conf(args)
    with netns.enter(args.netns):
        for s in conf.sysctls:
            current = read_sysctl(_slash_key(s.path))
            if current.split() != s.value.split():
                raise _check_error(f"Tuning configured value of {s.path} is {s.value}, current value is {current}")
        link = netlink.get_link(args.ifname)
        if link is None:
            raise CNIError(PLUGIN_SPECIFIC, f"Cannot find container link {args.ifname}",
                           f"no interface {args.ifname!r} in {args.netns}")
    ifn = args.ifname
    if conf.mac and parse_mac(conf.mac) != link.mac:
        raise _check_error(f"Tuning configured Ethernet of {ifn} is {conf.mac}, current value is {link.mac}")
    if conf.promisc != link.promisc:
        raise _check_error(f"Tuning link {ifn} configured promisc is {str(conf.promisc).lower()}, "
                           f"current value is {int(link.promisc)}")
    if conf.mtu and conf.mtu != link.mtu:
        raise _check_error(f"Tuning configured MTU of {ifn} is {conf.mtu}, current value is {link.mtu}")
    if conf.allmulti is not None and conf.allmulti != link.allmulti:
        raise _check_error(f"Tuning configured all-multicast mode of {ifn} is {str(conf.allmulti).lower()}, "
                           f"current value is {str(link.allmulti).lower()}")
    if conf.txqlen is not None and conf.txqlen != link.txqlen:
        raise _check_error(f"Tuning configured Transmit Queue Length of {ifn} is {conf.txqlen}, "
                           f"current value is {link.txqlen}")


def cmd_gc(args: CmdArgs) -> None:
    """Nothing to collect by attachment (saved originals are per container, in a directory other
    networks share); the list is still checked."""
    parse_conf(args)
    netconf.valid_attachments(args.conf())


def cmd_status(args: CmdArgs) -> None:
    """Always ready."""
    parse_conf(args)


PLUGIN = Plugin(add=cmd_add, delete=cmd_del, check=cmd_check, gc=cmd_gc, status=cmd_status,
                about="CNI tuning plugin (pycni): net sysctls and interface attributes in the container")


def main() -> None:
    run_plugin(PLUGIN)
