"""The settings of the cluster layer, read once, and the one etcd client factory.

:class:`EtcdSettings` is how to reach etcd (endpoints, prefix, budget, TLS files) for the
plugin, the agent (``pycni node``) and the CLI (``pycni ipam``) alike; :func:`client` is the
one place an :class:`~pycni.cluster.etcd.Etcd` is built from it. :class:`ClusterSettings` adds
what one network on one node needs (node name, lock directory, block sizes), parsed from a
cluster-ipam ``ipam`` section by :func:`parse_cluster_settings` (the plugin adds its ranges;
the CLI needs no more).
"""

from __future__ import annotations

import os
import time

from pycni import netconf
from pycni.cluster.etcd import DEFAULT_TIMEOUT
from pycni.cluster.model import DEFAULT_PREFIX
from pycni.record import record
from pycni.spec.errors import invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from pycni.cluster.etcd import Etcd
    from pycni.cluster.model import Keys

DEFAULT_BLOCK_V4 = 26
DEFAULT_BLOCK_V6 = 122
# Where this node's ADD/DEL/GC of one network queue behind each other (see pycni.cluster.session).
DEFAULT_LOCK_DIR = "/run/pycni/cluster-ipam"
MAX_NODE_NAME = 253  # a DNS name, the longest Kubernetes node name
# The one budget of a command-line verb's etcd work (seconds, all its calls together;
# --etcd-timeout changes it): docs/cluster.md "Talking to etcd from the command line".
CLI_ETCD_TIMEOUT = 5.0
# When every endpoint refuses the connection (nothing listens) for this long, a command-line
# verb or the agent gives up at once instead of waiting out its budget.
REFUSED_GRACE = 0.3


@record
class EtcdSettings:
    """How to reach etcd: client URLs, key prefix, the budget of one command (seconds), TLS files."""

    endpoints: list[str]
    prefix: str = DEFAULT_PREFIX
    timeout: float = DEFAULT_TIMEOUT
    ca_cert: str = ""
    cert: str = ""
    key: str = ""
    fail_fast: bool = False  # give up after REFUSED_GRACE when every endpoint refuses (the CLI, the agent)


@record
class ClusterSettings:
    """One network as seen from one node: its etcd, its node name and the node-local lock directory."""

    network: str
    etcd: EtcdSettings
    node: str = ""
    lock_dir: str = DEFAULT_LOCK_DIR
    block_sizes: tuple[int, int] = (DEFAULT_BLOCK_V4, DEFAULT_BLOCK_V6)
    strict_affinity: bool = False


def check_endpoints(endpoints: Sequence[Any], label: str) -> list[str]:
    """The endpoints, or code 7 naming ``label`` when they are not a non-empty list of http(s) URLs."""
    if not endpoints or not all(isinstance(e, str) for e in endpoints):
        raise invalid_config(f"invalid {label}", f"{label} must be a non-empty list of URLs such as "
                             "[\"http://10.0.0.1:2379\"]")
    for ep in endpoints:
        if not ep.startswith(("http://", "https://")):
            raise invalid_config(f"invalid {label}", f"{ep!r}: an endpoint is http://host:port or https://host:port")
    return list(endpoints)


def check_prefix(prefix: str, label: str) -> str:
    if not prefix.startswith("/"):
        raise invalid_config(f"invalid {label}", f"{prefix!r}: the prefix must start with '/'")
    return prefix


def parse_etcd_settings(section: Mapping[str, Any], label: str = "ipam") -> EtcdSettings:
    """``etcdEndpoints``, ``etcdPrefix``, ``etcdTimeout``, ``etcdCACert``/``etcdCert``/``etcdKey`` of a
    config section (``label`` names it in errors)."""
    eps = check_endpoints(netconf.get_list(section, "etcdEndpoints", label=f"{label}.etcdEndpoints"),
                          f"{label}.etcdEndpoints")
    prefix = check_prefix(netconf.get_str(section, "etcdPrefix", DEFAULT_PREFIX, label=f"{label}.etcdPrefix"),
                          f"{label}.etcdPrefix")
    timeout = netconf.lookup(section, "etcdTimeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
        raise netconf.invalid(f"{label}.etcdTimeout", "a number of seconds (0 < t <= 300)", timeout)
    out = EtcdSettings(endpoints=eps, prefix=prefix, timeout=float(timeout),
                       ca_cert=netconf.get_str(section, "etcdCACert", label=f"{label}.etcdCACert"),
                       cert=netconf.get_str(section, "etcdCert", label=f"{label}.etcdCert"),
                       key=netconf.get_str(section, "etcdKey", label=f"{label}.etcdKey"))
    if out.key and not out.cert:
        raise invalid_config(f"invalid {label}.etcdKey",
                             "etcdKey needs etcdCert (the client certificate it belongs to)")
    check_tls_files(out, (f"{label}.etcdCACert", f"{label}.etcdCert", f"{label}.etcdKey"))
    return out


def check_tls_files(settings: EtcdSettings, labels: tuple[str, str, str]) -> None:
    """Each TLS file given can be read: else code 7 naming its key (``labels``: CA, cert, key) and
    path, before any connection (a bare FileNotFoundError from ssl names neither)."""
    for label, path in zip(labels, (settings.ca_cert, settings.cert, settings.key), strict=True):
        if path and not os.access(path, os.R_OK):
            why = "no such file" if not os.path.exists(path) else "not readable by this user"
            raise invalid_config(f"invalid {label}", f"{path}: {why}")


def check_node_name(node: str, label: str) -> str:
    if "/" in node or not node or len(node) > MAX_NODE_NAME:
        raise invalid_config(f"invalid {label}", f"{node[:80]!r}{'...' if len(node) > 80 else ''}: a node name "
                             f"must be 1 to {MAX_NODE_NAME} characters (a DNS name, as Kubernetes' node names) "
                             "and hold no '/'")
    return node


def parse_cluster_settings(conf: Mapping[str, Any]) -> ClusterSettings:
    """Everything of a cluster-ipam network config but its ranges (what the CLI needs too)."""
    from pycni.spec.validate import validate_network_name

    ipam = netconf.ipam_section(conf, "cluster-ipam reads its settings from the \"ipam\" object")
    name = netconf.lookup(conf, "name")
    if not isinstance(name, str):
        raise invalid_config("missing network name", "the network config needs a \"name\": its blocks and "
                             "handles live under <etcdPrefix>/ipam/.../<name>")
    validate_network_name(name)
    etcd = parse_etcd_settings(ipam)
    # ipam.nodeName, else Calico's top-level "nodename" (routed and cluster-ipam then agree), else the host's
    node = check_node_name(netconf.get_str(ipam, "nodeName", label="ipam.nodeName")
                           or netconf.get_str(conf, "nodename") or os.uname().nodename, "ipam.nodeName")
    lock_dir = netconf.get_str(ipam, "lockDir", DEFAULT_LOCK_DIR, label="ipam.lockDir")
    # The node lock and block hint are files named <network>.<node>.*: refuse what cannot name one.
    if len(lock_dir) > 1024 or len(f"{name}.{node}.blocks".encode()) > 255:
        raise invalid_config("invalid ipam.lockDir", f"the lock directory ({len(lock_dir)} characters, at most "
                             f"1024) or the file names <network>.<nodeName>.lock in it ({len(name) + len(node) + 7} "
                             "characters, at most 255) are too long")
    # blockSize is the IPv4 block prefix (20..32); a value only IPv6 can have (116..128) sets the
    # IPv6 one instead, unless blockSizeV6 does.
    v4 = DEFAULT_BLOCK_V4
    v6 = netconf.get_int(ipam, "blockSizeV6", DEFAULT_BLOCK_V6, minimum=116, maximum=128, label="ipam.blockSizeV6")
    bs = netconf.get_int(ipam, "blockSize", DEFAULT_BLOCK_V4, label="ipam.blockSize")
    if 20 <= bs <= 32:
        v4 = bs
    elif 116 <= bs <= 128 and netconf.lookup(ipam, "blockSizeV6") is None:
        v6 = bs
    else:
        raise netconf.invalid("ipam.blockSize", "a prefix length from 20 to 32 (IPv4 blocks), or 116 to 128 "
                              "(IPv6 blocks, when blockSizeV6 is not set)", bs)
    strict = netconf.get_bool(ipam, "strictAffinity", label="ipam.strictAffinity")
    return ClusterSettings(network=name, etcd=etcd, node=node, lock_dir=lock_dir, block_sizes=(v4, v6),
                           strict_affinity=strict)


def client(settings: EtcdSettings, timeout: float | None = None, *, one_shot: bool = True) -> Etcd:
    """The etcd client for ``settings``. ``timeout`` (default ``settings.timeout``) is the budget of
    each call; with ``one_shot`` (a plugin command, a CLI action) it is also the deadline of all
    of them together, counted from now. A long-running caller (the agent) passes False."""
    from pycni.cluster.etcd import Etcd

    budget = timeout or settings.timeout
    # A third of the budget per attempt (at most 3 s): a member stuck without a leader (an election
    # after the leader died, or no quorum) must not eat the whole budget before the others are tried.
    try:
        etcd = Etcd(settings.endpoints, timeout=budget, attempt_timeout=max(0.5, min(3.0, budget / 3)),
                    ca_cert=settings.ca_cert, cert=settings.cert, key=settings.key,
                    refused_grace=REFUSED_GRACE if settings.fail_fast else None)
    except (OSError, ValueError) as e:  # say, a file that is not PEM
        files = ", ".join(f"{what} {path}" for what, path in (("CA", settings.ca_cert), ("certificate", settings.cert),
                                                              ("key", settings.key)) if path)
        raise invalid_config("cannot set up the etcd client", f"{e}" + (f" (TLS files: {files})" if files else "")
                             ) from None
    if one_shot:
        etcd.deadline = time.monotonic() + budget
    return etcd


def add_etcd_arguments(sp: Any) -> None:
    """The etcd flags every verb that talks to etcd takes (one set, one way: docs/api.md "Conventions
    for a verb"); :func:`etcd_settings_from_args` reads them."""
    g = sp.add_argument_group("etcd")
    g.add_argument("--etcd-endpoints", default=None, metavar="URL[,URL...]",
                   help="etcd client URLs, comma-separated (default: $PYCNI_ETCD_ENDPOINTS)")
    g.add_argument("--etcd-prefix", default=None, metavar="PREFIX", help=f"key prefix (default {DEFAULT_PREFIX})")
    g.add_argument("--etcd-ca-cert", default="", metavar="FILE", help="CA certificate for https endpoints")
    g.add_argument("--etcd-cert", default="", metavar="FILE", help="client certificate")
    g.add_argument("--etcd-key", default="", metavar="FILE", help="client key")
    g.add_argument("--etcd-timeout", type=float, default=None, metavar="SECONDS",
                   help=f"the budget of this command's etcd work (default {CLI_ETCD_TIMEOUT:g}); when every "
                        "endpoint refuses the connection it fails at once")


def etcd_endpoints_given(ns: Any) -> str:
    """The endpoints named by ``--etcd-endpoints`` or, failing it, ``$PYCNI_ETCD_ENDPOINTS`` ('' if neither)."""
    flag = getattr(ns, "etcd_endpoints", None)
    return (flag if flag is not None else os.environ.get("PYCNI_ETCD_ENDPOINTS", "")).strip()


def etcd_settings_from_args(ns: Any, timeout: float = CLI_ETCD_TIMEOUT) -> EtcdSettings:
    """The settings :func:`add_etcd_arguments`' flags give; code 7 naming the flag for anything wrong.
    ``timeout`` is the verb's budget when ``--etcd-timeout`` is not given."""
    endpoints = [e.strip() for e in etcd_endpoints_given(ns).split(",") if e.strip()]
    if not endpoints:
        raise invalid_config("--etcd-endpoints is required", "e.g. --etcd-endpoints http://10.0.0.1:2379 (or set "
                             "PYCNI_ETCD_ENDPOINTS)")
    budget = getattr(ns, "etcd_timeout", None) or timeout
    if not 0 < budget <= 300:
        raise invalid_config("invalid --etcd-timeout", f"{budget:g}: a number of seconds (0 < t <= 300)")
    out = EtcdSettings(endpoints=check_endpoints(endpoints, "--etcd-endpoints"),
                       prefix=check_prefix(ns.etcd_prefix or DEFAULT_PREFIX, "--etcd-prefix"),
                       timeout=budget, ca_cert=ns.etcd_ca_cert, cert=ns.etcd_cert, key=ns.etcd_key, fail_fast=True)
    check_tls_files(out, ("--etcd-ca-cert", "--etcd-cert", "--etcd-key"))
    return out


def cli_client(ns: Any) -> tuple[Etcd, Keys]:
    """An operator verb's etcd client and key layout, from :func:`add_etcd_arguments`' flags (one
    budget, failing fast when every endpoint refuses)."""
    from pycni.cluster.model import Keys

    settings = etcd_settings_from_args(ns)
    return client(settings, one_shot=True), Keys(settings.prefix)


def etcd_errors_mapped(fn: Callable[[Any], int]) -> Callable[[Any], int]:
    """An operator verb whose etcd failures become CNI errors (code 11 when no endpoint answers),
    mapped at this one boundary; any other exception goes on as it was."""
    from pycni.spec.errors import TRY_AGAIN

    def run(ns: Any) -> int:
        from pycni.cluster.etcd import EtcdError
        from pycni.cluster.ipam import IpamError
        from pycni.cluster.session import raise_mapped

        try:
            return int(fn(ns))
        except (EtcdError, IpamError) as e:
            raise_mapped(e, TRY_AGAIN, "")
            raise
    run.__doc__ = fn.__doc__
    return run
