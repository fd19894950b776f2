"""Every plugin pycni ships: CNI type name -> module, and the one loader. Stdlib only.

Each module defines ``PLUGIN`` (a :class:`pycni.skel.Plugin`) and ``main()``. Whoever runs a
plugin by its type — the shim (in-process and delegate paths), the daemon, the CLI,
``python -m pycni.plugins`` — goes through :func:`load` (or :func:`run_main` for a plugin run by
hand). This module imports nothing of pycni's but the plugins it loads: it is on the shim's in-process path, and
pycni.shim and :mod:`pycni.install_plugins` (the executables' format and their installation)
import it, not the other way round.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: the in-process runner imports this module on a plugin's start path
if TYPE_CHECKING:
    from typing import Any

    from pycni.skel import Plugin

PLUGIN_MODULES: dict[str, str] = {
    # main: interface-creating plugins
    "bridge": "pycni.plugins.main.bridge",
    "loopback": "pycni.plugins.main.loopback",
    "ptp": "pycni.plugins.main.ptp",
    "macvlan": "pycni.plugins.main.macvlan",
    "ipvlan": "pycni.plugins.main.ipvlan",
    "vlan": "pycni.plugins.main.vlan",
    "host-device": "pycni.plugins.main.host_device",
    "dummy": "pycni.plugins.main.dummy",
    "tap": "pycni.plugins.main.tap",
    "routed": "pycni.plugins.main.routed",
    # ipam
    "host-local": "pycni.plugins.ipam.host_local",
    "static": "pycni.plugins.ipam.static",
    "dhcp": "pycni.plugins.ipam.dhcp",
    "cluster-ipam": "pycni.plugins.ipam.cluster_ipam",
    # meta: chained plugins
    "portmap": "pycni.plugins.meta.portmap",
    "bandwidth": "pycni.plugins.meta.bandwidth",
    "tuning": "pycni.plugins.meta.tuning",
    "firewall": "pycni.plugins.meta.firewall",
    "sbr": "pycni.plugins.meta.sbr",
    "flannel": "pycni.plugins.meta.flannel",
    "vrf": "pycni.plugins.meta.vrf",
}


def _module(plugin_type: str) -> Any:
    """The module of ``plugin_type``, imported; KeyError for a type pycni does not ship."""
    module = PLUGIN_MODULES[plugin_type]
    # The __import__ builtin, not importlib.import_module: importing the importlib package (and
    # warnings with it) would cost a one-shot plugin ~0.4 ms for nothing else.
    __import__(module)
    return sys.modules[module]


def load(plugin_type: str) -> Plugin:
    """The :class:`pycni.skel.Plugin` of ``plugin_type`` (KeyError when pycni has none)."""
    return _module(plugin_type).PLUGIN  # type: ignore[no-any-return]


def parser(plugin_type: str) -> Any:
    """The plugin module's ``parse_conf(args)`` (None when it has none): what ``pycni validate``
    runs to refuse what ADD would refuse, before anything is made."""
    return getattr(_module(plugin_type), "parse_conf", None)


def run_main(plugin_type: str) -> None:
    """The plugin module's own ``main()``: run by hand it describes itself; dhcp's serves ``daemon``."""
    _module(plugin_type).main()
