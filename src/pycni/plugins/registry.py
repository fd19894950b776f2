"""Every plugin pycni ships: CNI type name -> module, and the one loader. Stdlib only.

Each module defines ``PLUGIN`` (a :class:`pycni.skel.Plugin`) and ``main()``. Whoever runs a
plugin by its type — the shim (in-process and delegate paths), the daemon, the CLI,
``python -m pycni.plugins`` — goes through :func:`load` (or :func:`run_main` for a plugin run by
hand). This module imports nothing of pycni's at import time: it is on the shim's in-process path,
and pycni.shim imports it, not the other way round (:func:`install` takes the executable format
from pycni.shim when it runs).
"""

from __future__ import annotations

import os
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


def import_paths() -> list[str]:
    """The directory that holds pycni (it has no dependencies), for shims run with ``-I -S``."""
    import pycni

    return [os.path.dirname(os.path.dirname(os.path.abspath(pycni.__file__)))]


def checked_interpreter(python: str, paths: list[str]) -> str:
    """``python`` as an absolute path, once it has imported pycni from ``paths`` as the executables
    will; ValueError naming it and what failed otherwise (an executable baked with an interpreter
    that cannot run would fail every call)."""
    import shutil
    import subprocess

    found = shutil.which(python) if os.sep not in python else python
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise ValueError(f"--python {python}: no such executable interpreter; give the path of the Python that "
                         f"has pycni installed (this one is {sys.executable})")
    found = os.path.abspath(found)
    probe = f"import sys; sys.path[:0] = {paths!r}; import pycni.shim, pycni.skel"
    try:
        proc = subprocess.run([found, "-IS", "-c", probe], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise ValueError(f"--python {found}: cannot run it: {e}") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ValueError(f"--python {found} cannot import pycni from {', '.join(paths)}: {why}")
    return found


class ForeignExecutable(Exception):
    """install() would replace executables that ``pycni install-plugins`` did not write."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(", ".join(paths))
        self.paths = paths


def install(target_dir: str, names: list[str] | None = None, python: str | None = None,
            daemon: bool = False, socket: str | None = None, force: bool = False,
            forwarder: bool = True, check_python: bool = True) -> list[str]:
    """Write one executable per plugin type into ``target_dir`` (format: :mod:`pycni.shim`); return their paths.

    Executables answer VERSION in sh and otherwise run ``python -IS`` with an explicit
    ``sys.path`` (no site scan: fast start). With ``daemon`` they go through pycni.shim (served
    by a running ``pycni daemon`` on ``$PYCNI_SOCKET``, else on ``socket`` when given, else on
    the default socket; else in-process); without, they always run the plugin in-process.
    With ``daemon`` and ``forwarder`` the native forwarder is built there too when a C compiler
    is at hand (:mod:`pycni.forwarder`): a call the daemon serves then starts no Python at all.
    Unknown names raise KeyError. A file in the way that is not one of ours (say a Go plugin)
    raises ForeignExecutable before anything is written, unless ``force``. An interpreter given
    as ``python`` must run this pycni (:func:`checked_interpreter`; ``check_python=False`` skips
    that, for tests that bake in a stand-in).
    """
    from pycni import statefile
    from pycni.shim import executable_text, shim_type

    mods = PLUGIN_MODULES
    selected = list(names) if names else sorted(mods)
    unknown = [n for n in selected if n not in mods]
    if unknown:
        raise KeyError(f"unknown plugin(s) {unknown}; available: {sorted(mods)}")
    if socket is not None and (not daemon or not os.path.isabs(socket) or "\n" in socket or "\0" in socket
                               or len(socket.encode()) > 107):  # sun_path holds 108 bytes with the NUL
        raise ValueError(f"a daemon socket must be an absolute path of at most 107 bytes on one line, for "
                         f"executables that forward: {socket!r}")
    targets = [os.path.join(target_dir, name) for name in selected]
    if not force:
        foreign = [p for p in targets if os.path.lexists(p) and shim_type(p) is None]
        if foreign:
            raise ForeignExecutable(foreign)
    paths = import_paths()
    if python is not None and check_python:
        python = checked_interpreter(python, paths)
    os.makedirs(target_dir, exist_ok=True)
    fwd = None
    if daemon and forwarder:
        from pycni.forwarder import build

        fwd = build(target_dir)
    texts = [executable_text(name, mods[name], load(name).versions, python=python or sys.executable, paths=paths,
                             daemon=daemon, socket=socket, forwarder=fwd) for name in selected]
    for path, text in zip(targets, texts, strict=True):
        statefile.write_bytes(path, text.encode(), mode=0o755, dir_mode=0o755, failure="cannot install plugins")
    return targets
