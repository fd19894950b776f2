"""macvlan: a macvlan link on ``master`` (default: the default-route interface) in the container."""

from __future__ import annotations

from pycni.plugins.main._sublink import LinkMode, SublinkPlugin, SublinkSpec
from pycni.skel import run_plugin

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# IFLA_MACVLAN_MODE values
MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8}
MODE = LinkMode("macvlan", MODES, default="bridge")


def link_attrs(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The netlink attributes for the configured mode (net.nl takes macvlan modes by name)."""
    return {"macvlan_mode": MODE.of(conf)}


SPEC = SublinkSpec(name="macvlan", kind="macvlan", mac_configurable=True, link_attrs=link_attrs,
                   check_link=MODE.check, about="pycni macvlan: a macvlan interface on a host link")
IMPL = SublinkPlugin(SPEC)
parse_conf, cmd_add, cmd_del, cmd_check, cmd_gc, cmd_status = (IMPL.parse_conf, IMPL.add, IMPL.delete, IMPL.check,
                                                                IMPL.gc, IMPL.status)
PLUGIN = IMPL.plugin()


def main() -> None:
    run_plugin(PLUGIN)
