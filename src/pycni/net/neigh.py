"""Neighbour (ARP/NDP) and forwarding-database entries, in the calling thread's netns.

A routed pod's gateway and an overlay's remote VTEPs are known in advance, so their entries
are written permanent instead of being learnt: no ARP/NDP round trip before the first
packet, and nothing to go stale. FDB entries (``bridge fdb ... self``) tell a vxlan device
which underlay address a remote VTEP's MAC lives behind.
"""

from __future__ import annotations

import errno

from pycni import ipaddr
from pycni.net.errors import kernel_errors
from pycni.net.link import require_index, rtnl
from pycni.net.nl import AF_BRIDGE, AF_INET, AF_INET6, NTF_SELF, NUD_PERMANENT
from pycni.record import record
from pycni.spec.errors import CNIError

_GONE = (errno.ENOENT, errno.ESRCH, errno.ENODEV, errno.EADDRNOTAVAIL)


@record
class Neighbour:
    """One neighbour or FDB entry as the kernel reports it."""

    ifindex: int
    lladdr: str
    dst: str = ""       # the IP (neighbour) or the remote tunnel endpoint (FDB); '' when none
    state: int = 0
    flags: int = 0


def set_neighbour(dev: str | int, ip: str, mac: str) -> None:
    """A permanent ``ip`` -> ``mac`` entry on ``dev``, replacing whatever was there."""
    fam = AF_INET6 if ipaddr.ip_address(ip).version == 6 else AF_INET
    with rtnl() as sock:
        index = require_index(sock, dev)
        with kernel_errors(f"failed to set neighbour {ip} lladdr {mac} on {dev!r}"):
            sock.neigh("replace", ifindex=index, dst=ip, lladdr=mac, family=fam, state=NUD_PERMANENT)


def del_neighbour(dev: str | int, ip: str) -> bool:
    """Remove the entry for ``ip`` on ``dev``; True when one was there. Idempotent."""
    fam = AF_INET6 if ipaddr.ip_address(ip).version == 6 else AF_INET
    with rtnl() as sock:
        try:
            index = require_index(sock, dev)
        except CNIError:
            return False
        with kernel_errors(f"failed to delete neighbour {ip} on {dev!r}", ignore=_GONE) as refused:
            sock.neigh("del", ifindex=index, dst=ip, family=fam)
        return refused.ignored is None


def set_fdb(dev: str | int, mac: str, remote: str) -> None:
    """``bridge fdb replace MAC dev DEV dst REMOTE self permanent``: frames for ``mac`` go to ``remote``."""
    with rtnl() as sock:
        index = require_index(sock, dev)
        with kernel_errors(f"failed to set fdb entry {mac} dst {remote} on {dev!r}"):
            sock.neigh("replace", ifindex=index, lladdr=mac, dst=remote, family=AF_BRIDGE, state=NUD_PERMANENT,
                       flags=NTF_SELF)


def del_fdb(dev: str | int, mac: str, remote: str) -> bool:
    """Remove an FDB entry made by :func:`set_fdb`; True when it was there. Idempotent."""
    with rtnl() as sock:
        try:
            index = require_index(sock, dev)
        except CNIError:
            return False
        with kernel_errors(f"failed to delete fdb entry {mac} on {dev!r}", ignore=_GONE) as refused:
            sock.neigh("del", ifindex=index, lladdr=mac, dst=remote, family=AF_BRIDGE, flags=NTF_SELF)
        return refused.ignored is None


def list_neighbours(dev: str | int, *, fdb: bool = False) -> list[Neighbour]:
    """The entries on ``dev``: IPv4 and IPv6 neighbours, or with ``fdb`` its forwarding database."""
    with rtnl() as sock:
        index = require_index(sock, dev)
        families = [AF_BRIDGE] if fdb else [AF_INET, AF_INET6]
        out = []
        for fam in families:
            for m in sock.get_neighbours(fam, index):
                out.append(Neighbour(ifindex=index, lladdr=str(m.get_attr("NDA_LLADDR") or ""),
                                     dst=str(m.get_attr("NDA_DST") or ""), state=int(m["state"]),
                                     flags=int(m["flags"])))
        return out
