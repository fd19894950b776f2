"""Links (network interfaces): look up, change, delete — in the calling thread's netns.

Namespace contract of the whole ``pycni.net`` link/addr/route layer: every function acts in
the network namespace of the *calling thread*; callers switch with
``with pycni.net.netns.enter(path): ...``.

:func:`rtnl` opens our netlink client (:mod:`pycni.net.nl`, the one netlink stack) in the
calling thread, so a socket opened inside ``netns.enter`` talks to that namespace; open one
per operation group and close it before leaving. Helpers that take a ``sock``
(:func:`lookup_msg`, :func:`link_index`…) take such a socket.
"""

from __future__ import annotations

import errno
import os

from pycni import callscope
from pycni.net import netns
from pycni.net.errors import is_netlink_error, kernel_errors
from pycni.net.nl import IFF_ALLMULTI, IFF_PROMISC, IFF_UP
from pycni.net.nl import IPRoute as _NlIPRoute
from pycni.record import field, record
from pycni.spec.errors import INTERNAL, CNIError
from pycni.spec.validate import IFNAMSIZ

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    # (answer, leave): answer() is None while a link deletion's request runs, then True or the
    # kernel's refusal; leave() lets it finish on its own (see _delete_until_unlisted)
    Carrier = tuple[Callable[[], BaseException | bool | None], Callable[[], None]]

_UNSET: Any = ...  # sentinel: "leave this attribute alone" (None means "detach" for master)


def rtnl() -> _NlIPRoute:
    """Our stdlib rtnetlink socket (:mod:`pycni.net.nl`) in the calling thread's namespace;
    use it in a ``with`` block, which closes it.

    Within a plugin call (:mod:`pycni.callscope`) every ``rtnl()`` in one namespace gets the
    same socket, which the ``with`` leaves open and the call's end closes: a socket is bound
    to the namespace it was made in, so there is one per namespace the call visits. Replies
    are matched by sequence number, so what an aborted request left unread is skipped.
    """
    scope = callscope.current()
    if scope is None:
        return _NlIPRoute()
    st = os.stat("/proc/thread-self/ns/net")
    key = (st.st_dev, st.st_ino)
    sock: _NlIPRoute | None = scope.socks.get(key)
    if sock is None:
        sock = scope.socks[key] = _NlIPRoute()
        sock.kept = True
    return sock


@record
class Link:
    """What plugins need to know about a link, decoded from an RTM_NEWLINK message."""

    index: int
    name: str
    kind: str = ""
    mac: str = ""
    mtu: int = 0
    up: bool = False
    promisc: bool = False
    allmulti: bool = False
    txqlen: int = 0
    master: int | None = None
    flags: int = 0
    link_netnsid: int | None = None
    peer_index: int | None = None  # IFLA_LINK: a veth's peer index (in its own netns)
    operstate: int = 0  # IFLA_OPERSTATE (RFC 2863): 6 is "up"
    alias: str = ""  # IFLA_IFALIAS
    # The kind's own settings (IFLA_INFO_DATA) under the keywords link("add") takes for them:
    # vlan_id, macvlan_mode, ipvlan_mode, vrf_table, vxlan_id, br_vlan_filtering…
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def oper_up(self) -> bool:
        return self.operstate == 6

    @classmethod
    def from_msg(cls, msg: Any) -> Link:
        flags = int(msg["flags"])
        kind = ""
        data: dict[str, Any] = {}
        linkinfo = msg.get_attr("IFLA_LINKINFO")
        if linkinfo is not None:
            kind = linkinfo.get_attr("IFLA_INFO_KIND") or ""
            info_data = linkinfo.get_attr("IFLA_INFO_DATA")
            if info_data is not None:
                data = {name[5:].lower(): value for name, value in info_data.attrs}  # IFLA_VLAN_ID -> vlan_id
        master = msg.get_attr("IFLA_MASTER")
        return cls(index=int(msg["index"]), name=msg.get_attr("IFLA_IFNAME") or "", kind=kind,
                   mac=(msg.get_attr("IFLA_ADDRESS") or "").lower(), mtu=int(msg.get_attr("IFLA_MTU") or 0),
                   up=bool(flags & IFF_UP), promisc=bool(flags & IFF_PROMISC),
                   allmulti=bool(flags & IFF_ALLMULTI), txqlen=int(msg.get_attr("IFLA_TXQLEN") or 0),
                   master=int(master) if master else None, flags=flags,
                   link_netnsid=msg.get_attr("IFLA_LINK_NETNSID"), peer_index=msg.get_attr("IFLA_LINK"),
                   operstate=_operstate(msg.get_attr("IFLA_OPERSTATE")), alias=msg.get_attr("IFLA_IFALIAS") or "",
                   data=data)


def _operstate(value: Any) -> int:
    """IFLA_OPERSTATE as its number (RFC 2863: 6 is "up"), 0 when the kernel sent none."""
    return int(value or 0)


def lookup_msg(sock: Any, name: str | int) -> Any | None:
    """The raw RTM_NEWLINK message of link ``name`` (or index) on ``sock``, None when missing.

    The one lookup the net layer shares, for callers that need attributes :class:`Link` drops.
    """
    if isinstance(name, str) and len(name.encode("utf-8", "surrogateescape")) >= IFNAMSIZ:
        return None  # no link has a longer name (and netlink could not even carry a 64 KB one)
    with kernel_errors(f"failed to lookup {name!r}", ignore=(errno.ENODEV, errno.ENOENT)):
        msgs = list(sock.link("get", index=name) if isinstance(name, int) else sock.link("get", ifname=name))
        return msgs[0] if msgs else None
    return None  # the kernel has no such link


def not_found(name: str | int) -> CNIError:
    """The error for a link that should be there and is not (the reference's lookup failure)."""
    return CNIError(INTERNAL, f"failed to lookup {name!r}", f"link {name!r} not found")


def require_msg(sock: Any, name: str | int) -> Any:
    """Like :func:`lookup_msg` but a missing link is :func:`not_found`."""
    msg = lookup_msg(sock, name)
    if msg is None:
        raise not_found(name)
    return msg


def link_index(sock: Any, name: str | int) -> int | None:
    """The index of link ``name`` (an index passes through unchecked), None when there is none."""
    if isinstance(name, int):
        return name
    found = sock.link_lookup(ifname=name)
    return int(found[0]) if found else None


def require_index(sock: Any, name: str | int) -> int:
    """Like :func:`link_index` but a missing link is :func:`not_found`."""
    index = link_index(sock, name)
    if index is None:
        raise not_found(name)
    return index


def delete_link_quietly(name: str) -> None:
    """Delete link ``name`` if it is there, ignoring every failure: rollback of a half-made link."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
        if msg is not None:
            try:
                sock.link("del", index=int(msg["index"]))
            except Exception:  # noqa: BLE001 - best-effort rollback
                pass


def get_link(name: str | int) -> Link | None:
    """The link called ``name`` (or with index ``name``), or None when there is none."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
        return Link.from_msg(msg) if msg is not None else None


def require_link(name: str | int) -> Link:
    """Like :func:`get_link` but a missing link is :func:`not_found` (CNIError 999 naming it)."""
    link = get_link(name)
    if link is None:
        raise not_found(name)
    return link


def require_free_ifname(ifname: str, netns_path: str) -> None:
    """Refuse CNI_IFNAME when this namespace (the container's, ``netns_path``) already has it."""
    if get_link(ifname) is not None:
        raise CNIError(INTERNAL, f"container interface {ifname!r} already exists",
                       f"{netns_path} already has an interface named {ifname!r}; choose another CNI_IFNAME")


def check_container_ifname(netns_path: str, ifname: str) -> None:
    """Before an ADD makes anything: the container namespace opens and has no ``ifname`` yet."""
    with netns.enter(netns_path):
        require_free_ifname(ifname, netns_path)


def list_links() -> list[Link]:
    """Every link in the calling thread's namespace."""
    with rtnl() as sock:
        return [Link.from_msg(m) for m in sock.get_links()]


def set_link(name: str | int, *, up: bool | None = None, mtu: int | None = None, mac: str | None = None,
             promisc: bool | None = None, allmulti: bool | None = None, txqlen: int | None = None,
             new_name: str | None = None, master: str | int | None = _UNSET) -> Link:
    """Change the named attributes of a link (None / unset: leave alone); return it after.

    ``master``: a link name or index to enslave to, ``None`` (or 0) to release from any master.
    Raises :func:`not_found` when the link does not exist; netlink errors become CNIError 999.
    """
    with rtnl() as sock:
        msg = require_msg(sock, name)
        index = int(msg["index"])
        with kernel_errors(f"failed to set attributes of link {name!r}"):
            # Order matters: rename needs the link down; state goes last so "up" sees the rest.
            if new_name is not None and new_name != msg.get_attr("IFLA_IFNAME"):
                sock.link("set", index=index, ifname=new_name)
            if mtu is not None:
                sock.link("set", index=index, mtu=int(mtu))
            if mac is not None:
                sock.link("set", index=index, address=mac)
            if txqlen is not None:
                sock.link("set", index=index, txqlen=int(txqlen))
            for want, bit in ((promisc, IFF_PROMISC), (allmulti, IFF_ALLMULTI)):
                if want is not None:
                    sock.link("set", index=index, flags=bit if want else 0, change=bit)
            if master is not _UNSET:
                if master is None or master == 0:
                    sock.link("set", index=index, master=0)
                else:
                    m = lookup_msg(sock, master)
                    if m is None:
                        raise CNIError(INTERNAL, f"failed to lookup master {master!r}",
                                       f"link {master!r} not found")
                    sock.link("set", index=index, master=int(m["index"]))
            if up is not None:
                sock.link("set", index=index, state="up" if up else "down")
        after = lookup_msg(sock, index)
        return Link.from_msg(after)


def setlink(sock: Any, failure: str, **kw: Any) -> None:
    """One RTM_SETLINK (``kw`` as for ``sock.link("set")``); a netlink error becomes CNIError 999 ``failure``."""
    with kernel_errors(failure):
        sock.link("set", **kw)


def set_up(index: int, name: str = "") -> None:
    """Bring link ``index`` up: one request, no lookups and no read-back (a read right after
    waits for the kernel's carrier work on every port of a big bridge)."""
    with rtnl() as sock:
        setlink(sock, f"failed to set {name or index!r} UP", index=index, state="up")


IPV4_DEVCONF_FORWARDING = 1  # linux/ip.h
IPV4_DEVCONF_PROXY_ARP = 3
IPV4_DEVCONF_ARP_NOTIFY = 22


def try_set_ipv4_devconf(index: int, values: dict[int, int]) -> bool:
    """Set per-interface IPv4 sysctls (``IPV4_DEVCONF_*`` index: value) over netlink; False if the
    kernel refused (no IPv4 on the link). Unlike ``/proc/sys/net/ipv4/conf/...`` this costs the
    same however many namespaces the host has (see pycni.net.sysctl)."""
    with rtnl() as sock:
        try:
            sock.link("set", index=index, ipv4_devconf=values)
        except Exception as e:
            if not is_netlink_error(e):
                raise
            return False
    return True


def delete_link(name: str | int) -> bool:
    """Delete a link; True when it existed. Idempotent (a missing link is success).

    Returns once the link has left its namespace (see :func:`_delete_until_unlisted`)."""
    with rtnl() as sock:
        msg = lookup_msg(sock, name)
    if msg is None:
        return False
    with kernel_errors(f"failed to delete link {name!r}", ignore=(errno.ENODEV, errno.ENOENT)) as refused:
        _delete_until_unlisted(int(msg["index"]))
    return refused.ignored is None


def _index_listed(index: int) -> bool:
    import _socket

    try:
        _socket.if_indextoname(index)
    except OSError:
        return False
    return True


def _delete_until_unlisted(index: int) -> None:
    """RTM_DELLINK for ``index``, returning when the link has left the calling thread's namespace
    rather than when the request does.

    Why: the kernel unlists a deleted link — its name free, its index unknown, its addresses,
    routes and neighbours gone, a veth's peer with it — within a millisecond, and then holds the
    deleting request for its own teardown (an RCU barrier: 15-40 ms here, most of a bridge, ptp
    or macvlan DEL). The request is carried by a helper while this thread watches the index: a
    thread where the process has others (the daemon), else a forked child, since a runtime
    waits for a plugin process's exit and that would include its threads' requests. The
    helper's answer is still the caller's when it comes first: a refusal raises the same
    :class:`pycni.net.nl.NetlinkError` as before.
    """
    import time

    # other threads (the daemon): fork is not safe, and the process's exit is not the call's
    carrier = _carry_in_thread if len(os.listdir("/proc/self/task")) > 1 else _carry_in_child
    answer, leave = carrier(index)
    pause = 0.0002
    while (got := answer()) is None:
        if not _index_listed(index):
            leave()
            return
        time.sleep(pause)
        pause = min(pause * 1.5, 0.002)
    if isinstance(got, BaseException):
        raise got


def _carry_in_thread(index: int) -> Carrier:
    import _thread

    outcome: list[BaseException | bool] = []

    def carry() -> None:
        try:
            with _NlIPRoute() as sock:  # its own socket: the call's belongs to the caller's thread
                sock.link("del", index=index)
            outcome.append(True)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            outcome.append(e)

    _thread.start_new_thread(carry, ())  # a new thread starts in this thread's namespace
    return (lambda: outcome[0] if outcome else None), (lambda: None)


def _carry_in_child(index: int) -> Carrier:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: the request, then its errno as the exit status
        code = 1
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # never hold the runtime's pipes open
                os.dup2(devnull, fd)
            os.closerange(3, 1 << 16)  # nor a lock or socket of the caller's
            try:
                with _NlIPRoute() as sock:  # not rtnl(): the call's cached socket was closed above
                    sock.link("del", index=index)
                code = 0
            except OSError as e:
                code = (e.errno or 1) & 0xFF
        finally:
            os._exit(code)

    def answer() -> BaseException | bool | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            return None
        code = os.waitstatus_to_exitcode(status)
        if not code:
            return True
        from pycni.net.nl import NetlinkError

        return NetlinkError(code if code > 0 else errno.EINTR)

    def leave() -> None:
        from pycni.net.tools import forget_child

        forget_child(pid)  # its exit is the kernel's teardown; reaped later

    return answer, leave


def move_link_to_netns(name: str | int, netns_fd: int, new_name: str | None = None) -> None:
    """Move a link into the namespace open at ``netns_fd`` (optionally renaming it on the way)."""
    with rtnl() as sock:
        msg = require_msg(sock, name)
        kw: dict[str, Any] = {"index": int(msg["index"]), "net_ns_fd": netns_fd}
        if new_name:
            kw["ifname"] = new_name
        with kernel_errors(f"failed to move link {name!r} to another netns"):
            sock.link("set", **kw)


def get_alias(name: str | int) -> str:
    """The link's alias (IFLA_IFALIAS), '' when unset; host-device keeps the original name there."""
    with rtnl() as sock:
        msg = require_msg(sock, name)
        return str(msg.get_attr("IFLA_IFALIAS") or "")


def set_alias(name: str | int, alias: str) -> None:
    """Set the link's alias (IFLA_IFALIAS); see :func:`get_alias`."""
    with rtnl() as sock:
        msg = require_msg(sock, name)
        with kernel_errors(f"failed to set alias of {name!r}"):
            sock.link("set", index=int(msg["index"]), ifalias=alias)

