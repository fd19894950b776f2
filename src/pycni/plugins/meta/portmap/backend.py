"""The one interface portmap's handlers use; ``iptables`` and ``nftables`` implement it.

A backend owns one rule layout. Handlers never ask which backend they hold: ADD and CHECK
use the configured one, DEL and GC call every backend, because a container may have been
mapped under another configuration or by the Go plugin (whose iptables layout the
``iptables`` backend writes too).
"""

from __future__ import annotations

from pycni.spec.errors import PLUGIN_SPECIFIC, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from pycni.plugins.meta.portmap.plugin import PortmapConf


class Unusable(CNIError):
    """The backend's tool or kernel support is missing here (ADD may fall back to the other)."""

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(PLUGIN_SPECIFIC, msg, details)


class Backend:
    """What a port-mapping layout must do. Every method acts in the calling thread's netns."""

    name = ""

    def forward(self, conf: PortmapConf) -> None:
        """ADD: map ``conf.mappings`` to ``conf.nets``; all or nothing (roll back on failure).
        Raise :class:`Unusable` when the layout cannot be written here at all."""
        raise NotImplementedError

    def unforward(self, conf: PortmapConf) -> None:
        """DEL: remove every trace of ``conf.container_id`` on network ``conf.name`` from this
        layout, found without ``conf.mappings`` if need be. Idempotent; nothing to do (and no
        error) when the layout's tool is missing."""
        raise NotImplementedError

    def check(self, conf: PortmapConf) -> None:
        """CHECK: raise a CNIError naming the first missing piece; cost linear in what is listed."""
        raise NotImplementedError

    def gc(self, conf: PortmapConf, valid: set[str]) -> None:
        """GC: remove the mappings of network ``conf.name`` whose container ID is not in ``valid``."""
        raise NotImplementedError


def named(name: str) -> Backend:
    """The backend for a ``backend`` config value (imported only when asked for)."""
    if name == "iptables":
        from pycni.plugins.meta.portmap import iptables

        return iptables.BACKEND
    from pycni.plugins.meta.portmap import nftables

    return nftables.BACKEND


def fallback(conf: PortmapConf, why: Unusable) -> Backend:
    """The backend an ADD falls back to when ``conf``'s is unusable here: nftables when the
    config named none (the reference's rule), else ``why`` re-raised with the way out."""
    if not conf.auto:
        raise CNIError(why.code, why.msg, f"{why.details}; or set \"backend\": \"nftables\"")
    conf.backend = "nftables"
    return named(conf.backend)


def chosen(conf: PortmapConf) -> Backend:
    """The backend CHECK verifies: the one ADD used (see :func:`fallback`)."""
    if conf.auto and conf.backend == "iptables":
        from pycni.net import iptables

        if not iptables.usable():
            return named("nftables")
    return named(conf.backend)


def every(configured: str) -> list[Backend]:
    """Every backend, ``configured`` last: DEL and GC clean all layouts. The other one mostly
    only asks the kernel whether it has anything (a netfilter socket that closes after a commit
    waits for the kernel to release what the commit replaced, so asking comes first)."""
    return [named("nftables" if configured == "iptables" else "iptables"), named(configured)]
