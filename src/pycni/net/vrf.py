"""VRF devices: listing them with their routing tables, creating one — in the calling thread's netns.

The one place that reads a VRF's table and creates VRFs, for the vrf plugin
and sbr's ``vrfname``; each plugin keeps its own rule for picking a free table, as upstream.
"""

from __future__ import annotations

import errno

from pycni.net.errors import kernel_errors
from pycni.net.link import Link, delete_link_quietly, lookup_msg, rtnl, setlink
from pycni.net.sublink import kernel_lacks

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from typing import Any


def _vrf_table(msg: Any) -> int | None:
    """The table of a link message's VRF, None when the link is not a VRF."""
    link = Link.from_msg(msg)
    return int(link.data.get("vrf_table") or 0) if link.kind == "vrf" else None


def list_vrfs() -> dict[str, tuple[int, int]]:
    """VRF devices here: name -> (index, table)."""
    out: dict[str, tuple[int, int]] = {}
    with rtnl() as sock:
        for msg in sock.get_links():
            table = _vrf_table(msg)
            if table is not None:
                out[str(msg.get_attr("IFLA_IFNAME"))] = (int(msg["index"]), table)
    return out


def vrf_of(name: str) -> tuple[str, int] | None:
    """(kind, VRF table or 0) of link ``name``: kind '' for a plain link; None when there is no such link."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
    if msg is None:
        return None
    return Link.from_msg(msg).kind, _vrf_table(msg) or 0


def create_vrf(name: str, table: int) -> int:
    """Create VRF ``name`` on ``table``, up; return its index. A kernel without VRFs is
    :func:`pycni.net.sublink.kernel_lacks`; a VRF left half-made (not up) is deleted."""
    with rtnl() as sock:
        with kernel_errors(f"failed to create VRF {name!r}", ignore=(errno.EOPNOTSUPP,)) as refused:
            sock.link("add", ifname=name, kind="vrf", vrf_table=table)
        if refused.ignored is not None:
            raise kernel_lacks("vrf")
        msg = lookup_msg(sock, name)
        try:
            if msg is None:
                raise kernel_lacks("vrf")
            setlink(sock, f"could not set VRF {name!r} up", index=int(msg["index"]), state="up")
        except BaseException:
            delete_link_quietly(name)
            raise
        return int(msg["index"])
