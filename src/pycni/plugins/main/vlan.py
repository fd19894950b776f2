"""vlan: an 802.1Q link with ``vlanId`` on ``master`` in the container (IPAM required)."""

from __future__ import annotations

from pycni import netconf
from pycni.plugins.main._sublink import SublinkPlugin, SublinkSpec
from pycni.skel import run_plugin
from pycni.spec.errors import INTERNAL, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from pycni.net.link import Link


def _vlan_id(conf: Mapping[str, Any]) -> int:
    """``vlanId``, 0 to 4094; CNIError 7 otherwise."""
    vid = netconf.get_int(conf, "vlanId")
    if not 0 <= vid <= 4094:
        raise invalid_config(f"invalid VLAN ID {vid} (must be between 0 and 4095 exclusive)",
                             "set \"vlanId\" to a number from 0 to 4094")
    return vid


def link_attrs(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The netlink attributes of the 802.1Q link."""
    return {"vlan_id": _vlan_id(conf)}


def check_link(conf: Mapping[str, Any], link: Link) -> None:
    """CHECK: the container link still carries the configured VLAN id."""
    have = link.data.get("vlan_id")
    if have != _vlan_id(conf):
        raise CNIError(INTERNAL, f"error: Container interface vlan id {have} does not match expected {_vlan_id(conf)}")


SPEC = SublinkSpec(name="vlan", kind="vlan", ipam_required=True, link_attrs=link_attrs, check_link=check_link,
                   about="pycni vlan: an 802.1Q VLAN interface on a host link")
IMPL = SublinkPlugin(SPEC)
parse_conf, cmd_add, cmd_del, cmd_check, cmd_gc, cmd_status = (IMPL.parse_conf, IMPL.add, IMPL.delete, IMPL.check,
                                                                IMPL.gc, IMPL.status)
PLUGIN = IMPL.plugin()


def main() -> None:
    run_plugin(PLUGIN)
