"""ipvlan: an ipvlan link (mode l2, l3 or l3s) on ``master`` in the container.

Like the reference, it may also run chained after a plugin that only allocated addresses:
with no ``ipam`` section it applies the prevResult's IPs and routes.
"""

from __future__ import annotations

from pycni.plugins.main._sublink import LinkMode, SublinkPlugin, SublinkSpec
from pycni.skel import run_plugin

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# IFLA_IPVLAN_MODE values
MODES = {"l2": 0, "l3": 1, "l3s": 2}
MODE = LinkMode("ipvlan", MODES, default="l2")


def link_attrs(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The netlink attributes for the configured mode (ipvlan modes by number)."""
    return {"ipvlan_mode": MODES[MODE.of(conf)]}


SPEC = SublinkSpec(name="ipvlan", kind="ipvlan", link_attrs=link_attrs, check_link=MODE.check,
                   uses_prev_result_ips=True, about="pycni ipvlan: an ipvlan interface on a host link")
IMPL = SublinkPlugin(SPEC)
parse_conf, cmd_add, cmd_del, cmd_check, cmd_gc, cmd_status = (IMPL.parse_conf, IMPL.add, IMPL.delete, IMPL.check,
                                                                IMPL.gc, IMPL.status)
PLUGIN = IMPL.plugin()


def main() -> None:
    run_plugin(PLUGIN)
