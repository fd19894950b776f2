"""Veth pairs between the calling thread's netns (the host) and a container netns.

Same outcome as Go's ``ip.SetupVeth``: the host end is called ``veth`` + 8 random hex digits
and brought up (with ``accept_ra`` off so we own its routes), the container end is called
``ifname`` and left down for the caller to configure. We create the pair from the host side
with the peer born directly in the container (IFLA_NET_NS_FD), so no link ever appears under
the container's name in the host namespace.
"""

from __future__ import annotations

import errno

from pycni.net import netns
from pycni.net.errors import kernel_errors
from pycni.net.link import (
    Link,
    delete_link_quietly,
    lookup_msg,
    rtnl,
    setlink,
)
from pycni.net.names import random_ifname
from pycni.net.sysctl import try_write_sysctl
from pycni.record import record
from pycni.spec.errors import INTERNAL, CNIError, invalid_config
from pycni.spec.validate import is_colon_mac

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from typing import Any

MAX_NAME_TRIES = 10


def random_veth_name() -> str:
    """``veth`` + 8 hex digits, as the Go reference names host-side veths."""
    return random_ifname("veth")


@record
class VethPair:
    host: Link       # as seen in the host (calling) namespace
    container: Link  # as seen in the container namespace


def setup_veth(container_netns: str, ifname: str, *, mtu: int = 0, mac: str = "",
               host_name: str = "", master: int | None = None, host_mac: str = "") -> VethPair:
    """Create a veth pair: ``ifname`` in ``container_netns``, the host end here (up).

    ``mac`` is the container end's MAC, ``host_mac`` the host end's (both random when empty).

    With no ``host_name`` a random one is chosen and retried on a clash. A clash on the
    container side (``ifname`` exists there) is an error, as in the reference.

    With ``master`` (a bridge's index) the host end is enslaved to it and gets no IPv6: a
    bridge port's own IP stack never sees a packet, and the link-local address, its DAD and
    the per-port fe80::/64 and ff00::/8 routes it would otherwise get make every IPv6
    multicast lookup on the host, and the RTNL-holding DAD work of each new port, slower
    by one entry per port (see the README's performance notes).
    """
    with netns.opened(container_netns) as target:
        return _setup(target, container_netns, ifname, mtu, mac, host_name, master, host_mac)


def _create(sock: Any, host: str, ifname: str, target: int, mtu: int, mac: str, up: bool,
            host_mac: str = "") -> None:
    """RTM_NEWLINK for the pair: ``host`` here, ``ifname`` born (down) in the namespace open at
    ``target``. Up at creation saves a separate set-up request: each RTNL round trip costs more
    as a bridge fills."""
    peer: dict[str, Any] = {"ifname": ifname, "net_ns_fd": target}
    kw: dict[str, Any] = {"ifname": host, "kind": "veth", "peer": peer, "state": "up" if up else "down"}
    if mtu:
        kw["mtu"] = mtu
        peer["mtu"] = mtu
    if mac:
        peer["address"] = mac
    if host_mac:
        kw["address"] = host_mac
    sock.link("add", **kw)


def _container_has(container_netns: str, ifname: str) -> bool:
    """Whether ``container_netns`` already has a link ``ifname`` (tells the two EEXIST causes apart)."""
    with netns.enter(container_netns), rtnl() as sock:
        return lookup_msg(sock, ifname) is not None


def _setup(target: int, container_netns: str, ifname: str, mtu: int, mac: str, host_name: str,
           master: int | None, host_mac: str = "") -> VethPair:
    """:func:`setup_veth` with the container namespace open; retries random host names that clash."""
    for m in (mac, host_mac):
        if m:
            _check_mac(m)
    for _ in range(MAX_NAME_TRIES):
        host = host_name or random_veth_name()
        with rtnl() as sock:
            with kernel_errors("failed to make veth pair", ignore=(errno.EEXIST,)) as refused:
                _create(sock, host, ifname, target, mtu, mac, up=master is None, host_mac=host_mac)
            if refused.ignored is not None:
                if not host_name and lookup_msg(sock, host) is not None and not _container_has(
                        container_netns, ifname):
                    continue  # our random host name was taken: pick another
                raise CNIError(INTERNAL,
                               f"container veth name ({ifname!r}) peer provided ({host!r}) already exists",
                               f"an interface named {ifname!r} already exists in {container_netns} "
                               f"(or {host!r} in the host); choose another CNI_IFNAME")
        try:
            if master is not None:
                _enslave(host, master)
            return _finish(host, ifname, container_netns, host_ipv6=master is None)
        except BaseException:
            delete_link_quietly(host)  # never leave half a pair behind
            raise
    raise CNIError(INTERNAL, "failed to find a unique veth name", f"{MAX_NAME_TRIES} random names were all taken")


def _enslave(host: str, master: int) -> None:
    """IPv6 off on the (still down) host end, then enslaved and up in one request."""
    try_write_sysctl(f"net/ipv6/conf/{host}/disable_ipv6", "1")  # IPv6 may be absent altogether
    with rtnl() as sock:
        setlink(sock, f"failed to connect {host!r} to bridge (index {master})", ifname=host, master=master,
                state="up")


def _finish(host: str, ifname: str, container_netns: str, host_ipv6: bool) -> VethPair:
    """Turn accept_ra off on the host end if it has IPv6 (as the reference) and read both ends back."""
    if host_ipv6:
        try_write_sysctl(f"net/ipv6/conf/{host}/accept_ra", "0")  # IPv6 may be disabled
    host_link = _read_back(host)
    with netns.enter(container_netns):
        cont_link = _read_back(ifname)
    return VethPair(host=host_link, container=cont_link)


def _read_back(name: str) -> Link:
    """The link just made; an error if it vanished in between."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
    if msg is None:
        raise CNIError(INTERNAL, f"failed to lookup {name!r}", "the veth vanished right after creation")
    return Link.from_msg(msg)


def _check_mac(mac: str) -> None:
    """Refuse a container MAC that is not six hex pairs before anything is made."""
    if not is_colon_mac(mac):
        raise invalid_config(f"invalid MAC address {mac!r}",
                             "give a 6-byte MAC address in the form 0a:58:0a:f4:00:05")
