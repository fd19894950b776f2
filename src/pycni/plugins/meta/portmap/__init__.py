"""portmap: forward host ports to a container (chained; passes prevResult through).

Split as the Go reference splits it:

* :mod:`.plugin` — configuration (:func:`parse_conf` -> :class:`PortmapConf`) and the
  ADD/DEL/CHECK/GC handlers;
* :mod:`.backend` — the one interface the handlers drive;
* :mod:`.iptables` — the reference's chains and rules (the default, as in the reference:
  nftables only where iptables cannot work), one ``iptables-restore`` per ADD and DEL;
* :mod:`.nftables` — pycni's ``table inet pycni_hostport`` (``"backend": "nftables"``).

DEL and GC clean every layout, so implementations and configurations can be swapped under
live containers. The backends (and everything they import) load only when a command needs
them: VERSION imports this package and :mod:`.plugin` alone.
"""

from __future__ import annotations

from pycni.plugins.meta.portmap.plugin import (
    PLUGIN,
    PortmapConf,
    PortMapping,
    cmd_add,
    cmd_check,
    cmd_del,
    cmd_gc,
    main,
    parse_conf,
)

__all__ = ["PLUGIN", "PortMapping", "PortmapConf", "cmd_add", "cmd_check", "cmd_del", "cmd_gc", "main",
           "parse_conf"]
