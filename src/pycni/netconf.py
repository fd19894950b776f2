"""Typed readers for a plugin's network configuration. Stdlib only.

Why: every plugin reads the same kinds of keys (an MTU, a flag, a name, a list), and a wrong
type must be refused *before* anything is made, with code 7 naming the key — not a
``TypeError`` half-way through an ADD. These readers are the one way to do that::

    mtu = netconf.get_int(conf, "mtu", minimum=0, maximum=65535)
    masq = netconf.get_bool(conf, "ipMasq")
    rc = netconf.get_dict(conf, "runtimeConfig")
    mac = netconf.get_str(rc, "mac", label="runtimeConfig.mac")

A key that is absent or JSON ``null`` reads as the default (Go's decoder leaves the zero value).
``label`` names the key in messages when ``conf`` is a nested section.

Keys are matched as Go's ``encoding/json`` matches them to a struct's fields
(:mod:`pycni.spec.gokeys`): ``"RuntimeConfig"``, ``"HostPort"`` or ``"MAC"`` name the same value as
``runtimeConfig``, ``hostPort``, ``mac``; of several spellings the last one wins. Read every key a
Go plugin decodes into a struct through these readers (or ``gokeys.lookup``), never ``dict.get``.
"""

from __future__ import annotations

from pycni.spec.errors import INCOMPATIBLE_VERSION, CNIError, invalid_config
from pycni.spec.gokeys import has, lookup
from pycni.spec.validate import is_colon_mac

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from pycni.spec.types import Result

VALID_ATTACHMENTS = "cni.dev/valid-attachments"
MAX_MTU = 65535  # the kernel's ETH_MAX_MTU: no link here takes more
# The name libcni also sets, from before the spec fixed it (containernetworking/cni#1101).
OLD_ATTACHMENTS = "cni.dev/attachments"


def invalid(label: str, want: str, value: Any) -> CNIError:
    """Code 7 for key ``label`` holding ``value`` where ``want`` (e.g. "an integer") belongs."""
    return invalid_config(f"{label!r} must be {want}", f"got {value!r}")


def _get(conf: Mapping[str, Any], key: str) -> Any:
    return lookup(conf, key)


def get_int(conf: Mapping[str, Any], key: str, default: int = 0, *, minimum: int | None = None,
            maximum: int | None = None, label: str = "") -> int:
    """``conf[key]`` as an int within [minimum, maximum]; JSON true/false and 1.5 are refused."""
    label = label or key
    value = _get(conf, key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(label, "an integer", value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if minimum is not None and maximum is not None:
            want = f"an integer from {minimum} to {maximum}"
        elif minimum is not None:
            want = f"an integer of at least {minimum}"
        else:
            want = f"an integer of at most {maximum}"
        raise invalid(label, want, value)
    return value


def get_bool(conf: Mapping[str, Any], key: str, default: bool = False, *, label: str = "") -> bool:
    """``conf[key]`` as a JSON boolean (not 0/1, not "true")."""
    value = _get(conf, key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(label or key, "true or false", value)
    return value


def get_str(conf: Mapping[str, Any], key: str, default: str = "", *, label: str = "",
            choices: tuple[str, ...] = ()) -> str:
    """``conf[key]`` as a string; with ``choices``, one of them (or the default when absent)."""
    label = label or key
    value = _get(conf, key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise invalid(label, "a string", value)
    if "\0" in value:  # no name, path or address holds one; the OS would refuse it half-way through
        raise invalid(label, "a string without NUL bytes", value)
    if choices and value not in choices:
        raise invalid(label, "one of " + ", ".join(choices), value)
    return value


def get_list(conf: Mapping[str, Any], key: str, default: list[Any] | None = None, *, label: str = "") -> list[Any]:
    """``conf[key]`` as a JSON array (a new empty list when absent and no default)."""
    value = _get(conf, key)
    if value is None:
        return [] if default is None else default
    if not isinstance(value, list):
        raise invalid(label or key, "a list", value)
    return value


def get_dict(conf: Mapping[str, Any], key: str, default: dict[str, Any] | None = None, *,
             label: str = "") -> dict[str, Any]:
    """``conf[key]`` as a JSON object (a new empty dict when absent and no default)."""
    value = _get(conf, key)
    if value is None:
        return {} if default is None else default
    if not isinstance(value, dict):
        raise invalid(label or key, "a JSON object", value)
    return value


def network_name(conf: Mapping[str, Any]) -> str:
    """The network's ``name`` ('' when absent; skel has refused a missing or non-string one)."""
    name = lookup(conf, "name")
    return name if isinstance(name, str) else ""


def ipam_section(conf: Mapping[str, Any], why: str = "the network configuration needs an \"ipam\" object"
                 ) -> dict[str, Any]:
    """An IPAM plugin's own section, ``ipam``; code 7 (the reference's words, ``why`` as details)
    when it is missing or not an object."""
    ipam = lookup(conf, "ipam")
    if not isinstance(ipam, dict):
        raise invalid_config("IPAM config missing 'ipam' key", why)
    return ipam


def ipam_type(conf: Mapping[str, Any]) -> str:
    """The IPAM plugin type named by the config, '' when there is no IPAM section."""
    return get_str(get_dict(conf, "ipam"), "type", label="ipam.type")


def runtime_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``runtimeConfig`` (what the runtime passes for the plugin's capabilities), checked."""
    return get_dict(conf, "runtimeConfig")


def args_cni(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The config's ``args.cni`` section (CONVENTIONS.md "args"), checked; {} when absent."""
    return get_dict(get_dict(conf, "args"), "cni", label="args.cni")


def check_mac(mac: str, where: str) -> str:
    """``mac`` lower-cased; code 7 naming ``where`` it came from unless it is a colon MAC."""
    if not is_colon_mac(mac):
        raise invalid_config(f"invalid MAC address {mac!r} in {where}",
                             "give a MAC address like 0a:58:0a:f4:00:05")
    return mac.lower()


def container_mac(conf: Mapping[str, Any], cni_args: str, *, config_key: bool = False,
                  from_args: bool = False) -> str:
    """The MAC the container interface asks for, '' for the kernel's choice; lower case.

    The reference's precedence, later wins: the config's ``mac`` (with ``config_key``: macvlan,
    tap), CNI_ARGS ``MAC``, ``args.cni.mac`` (with ``from_args``: bridge), ``runtimeConfig.mac``.
    """
    from pycni.cniargs import load_cni_args

    mac, where = "", ""
    if config_key:
        mac, where = get_str(conf, "mac"), "mac"
    env_mac = load_cni_args(cni_args, ["MAC"]).get("MAC", "")
    if env_mac:
        mac, where = env_mac, "CNI_ARGS"
    if from_args:
        value = lookup(args_cni(conf), "mac")
        if value:
            mac, where = str(value), "args.cni.mac"
    value = lookup(runtime_config(conf), "mac")
    if value:
        mac, where = str(value), "runtimeConfig.mac"
    return check_mac(mac, where) if mac else ""


def require_ip_result(cni_version: str, has_ips: bool, plugin: str) -> None:
    """Code 1 before ADD makes anything when its result will have no address but the config's
    version (0.1.0, 0.2.0) has results that are nothing but addresses: the conversion would fail
    after the interface exists (the reference fails there, leaving it, with this msg)."""
    if not has_ips and cni_version in ("0.1.0", "0.2.0"):
        raise CNIError(INCOMPATIBLE_VERSION, "cannot convert: no valid IP addresses",
                       f"{plugin}: a {cni_version} result is IP addresses only and this config assigns none "
                       "(no ipam); use cniVersion 0.3.0 or later, or add an ipam section")


def prev_result(conf: Mapping[str, Any]) -> Result | None:
    """The chained ``prevResult`` parsed at the config's version (code 6 when malformed), or None."""
    from pycni.skel import prev_result as parse

    return parse(conf)


def require_prev_result(conf: Mapping[str, Any], plugin: str) -> Result:
    """The ``prevResult`` a chained plugin (or CHECK) cannot work without; code 7 when absent."""
    prev = prev_result(conf)
    if prev is None:
        raise invalid_config("Required prevResult missing",  # the reference's words
                             f"{plugin} needs the result of the plugins before it (prevResult)")
    return prev


def valid_attachments(conf: Mapping[str, Any]) -> list[tuple[str, str]]:
    """GC's ``cni.dev/valid-attachments`` as (containerID, ifname) pairs.

    Code 7 when the list is missing (GC without it would release everything) or any entry is
    not an object with string ``containerID`` and ``ifname``: ``[{}]``, ``[null]``,
    ``[{"containerID": 1}]``. The pre-spec name ``cni.dev/attachments`` is read when the
    spec's is absent, as libcni sends both.
    """
    raw = lookup(conf, VALID_ATTACHMENTS)
    key = VALID_ATTACHMENTS
    if raw is None and lookup(conf, OLD_ATTACHMENTS) is not None:
        raw, key = lookup(conf, OLD_ATTACHMENTS), OLD_ATTACHMENTS
    if raw is None:
        raise invalid_config(f"GC needs {VALID_ATTACHMENTS!r}",
                       "without the list of attachments still in use, GC would release every one; the runtime "
                       "must pass it (an empty list means none is in use)")
    if not isinstance(raw, list):
        raise invalid(key, "a list of {\"containerID\", \"ifname\"}", raw)
    out: list[tuple[str, str]] = []
    for i, item in enumerate(raw):
        cid, ifname = lookup(item, "containerID"), lookup(item, "ifname")
        if not (isinstance(cid, str) and isinstance(ifname, str)):
            raise invalid(f"{key}[{i}]", "an object with string \"containerID\" and \"ifname\"", item)
        out.append((cid, ifname))
    return out


__all__ = ["lookup", "has", "network_name", "ipam_section", "get_int",
 "get_bool", "get_str", "get_list", "get_dict", "ipam_type", "runtime_config", "args_cni",
           "check_mac", "container_mac", "prev_result", "require_prev_result", "require_ip_result",
           "valid_attachments", "invalid", "VALID_ATTACHMENTS"]
