"""macvlan: a macvlan link on ``master`` (default: the default-route interface) in the container."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pycni.plugins.main.sublink_base import SublinkPlugin, SublinkSpec, link_info_data
from pycni.skel import run_plugin
from pycni.spec import errors as E
from pycni.spec.errors import CNIError

# IFLA_MACVLAN_MODE values
MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8}


def _mode(conf: Mapping[str, Any]) -> str:
    mode = conf.get("mode") or "bridge"
    if mode not in MODES:
        raise CNIError(E.INVALID_CONFIG, f"unknown macvlan mode: {mode!r}", f"use one of {', '.join(MODES)}")
    return str(mode)


def link_attrs(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {"macvlan_mode": _mode(conf)}


def check_link(conf: Mapping[str, Any], msg: Any) -> None:
    data = link_info_data(msg)
    have = data.get_attr("IFLA_MACVLAN_MODE") if data is not None else None
    names = {v: k for k, v in MODES.items()}
    have_name = names.get(have, have) if isinstance(have, int) else have  # pyroute2 may decode the name
    if have_name != _mode(conf):
        raise CNIError(999, f"container macvlan mode {have_name} does not match expected value: {_mode(conf)}")


SPEC = SublinkSpec(name="macvlan", kind="macvlan", mac_configurable=True, link_attrs=link_attrs,
                   check_link=check_link, about="pycni macvlan: a macvlan interface on a host link")
PLUGIN = SublinkPlugin(SPEC).plugin()


def main() -> None:
    run_plugin(PLUGIN)
