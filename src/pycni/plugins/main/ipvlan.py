"""ipvlan: an ipvlan link (mode l2, l3 or l3s) on ``master`` in the container.

Like the reference, it may also run chained after a plugin that only allocated addresses:
with no ``ipam`` section it applies the prevResult's IPs and routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pycni.plugins.main.sublink_base import SublinkPlugin, SublinkSpec, link_info_data
from pycni.skel import run_plugin
from pycni.spec import errors as E
from pycni.spec.errors import CNIError

# IFLA_IPVLAN_MODE values
MODES = {"l2": 0, "l3": 1, "l3s": 2}


def _mode(conf: Mapping[str, Any]) -> str:
    mode = conf.get("mode") or "l2"
    if mode not in MODES:
        raise CNIError(E.INVALID_CONFIG, f"unknown ipvlan mode: {mode!r}", f"use one of {', '.join(MODES)}")
    return str(mode)


def link_attrs(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {"ipvlan_mode": MODES[_mode(conf)]}


def check_link(conf: Mapping[str, Any], msg: Any) -> None:
    data = link_info_data(msg)
    have = data.get_attr("IFLA_IPVLAN_MODE") if data is not None else None
    names = {v: k for k, v in MODES.items()}
    have_name = names.get(have, have) if isinstance(have, int) else have  # pyroute2 may decode the name
    if have_name != _mode(conf):
        raise CNIError(999, f"container ipvlan mode {have_name} does not match expected value: {_mode(conf)}")


SPEC = SublinkSpec(name="ipvlan", kind="ipvlan", link_attrs=link_attrs, check_link=check_link,
                   about="pycni ipvlan: an ipvlan interface on a host link")
PLUGIN = SublinkPlugin(SPEC).plugin()


def main() -> None:
    run_plugin(PLUGIN)
