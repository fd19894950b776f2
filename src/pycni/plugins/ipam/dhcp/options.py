"""The ``provide`` / ``request`` entries of a dhcp IPAM config, read once for the plugin and the daemon.

The plugin checks them before it contacts the daemon (so a malformed entry is code 7 whether
or not the daemon runs); the daemon turns them into what its client sends.
"""

from __future__ import annotations

from pycni import netconf
from pycni.plugins.ipam.dhcp import message as M
from pycni.spec.errors import invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~3 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def entries(ipam: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """``ipam[key]`` as a list of objects (code 7 otherwise)."""
    value = netconf.get_list(ipam, key, label=f"ipam.{key}")
    if not all(isinstance(e, dict) for e in value):
        raise netconf.invalid(f"ipam.{key}", "a list of objects", value)
    return value


def option_code(entry: Mapping[str, Any]) -> int:
    """The DHCP option an entry names (a number or a name the reference knows)."""
    name = netconf.lookup(entry, "option")
    try:
        return M.parse_option_name(str(name) if name is not None else "")
    except ValueError as e:
        raise invalid_config(f"Can not parse option {name!r}", str(e)) from None


def check(ipam: Mapping[str, Any]) -> None:
    """Every ``provide`` and ``request`` entry well-formed: an option, string value and fromArg."""
    for entry in entries(ipam, "provide"):
        option_code(entry)
        value = netconf.get_str(entry, "value", label="ipam.provide[].value")
        netconf.get_str(entry, "fromArg", label="ipam.provide[].fromArg")
        if len(value.encode()) > 255:
            raise invalid_config(f"value too long for option {netconf.lookup(entry, 'option')!r}",

                                 "DHCP options hold at most 255 bytes")
    for entry in entries(ipam, "request"):
        option_code(entry)
        netconf.get_bool(entry, "skipDefault", label="ipam.request[].skipDefault")
