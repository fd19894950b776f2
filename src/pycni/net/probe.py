"""Cheap existence probes for DEL's "already gone" paths: no exec, next to no imports.

A runtime repeats DELs (containerd's RemovePodSandbox runs the whole chain's DEL again after
StopPodSandbox did), and most pods never asked for what portmap, bandwidth or ipMasq's nft
layout would have made. Asking ``iptables -L CHAIN`` or ``nft list table`` whether anything is
there costs an exec (10–30 ms of CPU each, more than the rest of the call), and the Go
reference answers such DELs in 1–5 ms. These probes ask the kernel directly:

* :func:`link_exists` — one SIOCGIFINDEX ioctl;
* :func:`nft_object_exists` — one nf_tables GETTABLE or GETCHAIN over netlink;
* :func:`iptables_chain_exists` — the same, where ``iptables`` is iptables-nft (its chains
  are nf_tables chains of table ``ip nat`` / ``ip6 nat``);
* :func:`nft_set_has_ifname` — one nf_tables GETSETELEM: whether an interface name is an
  element of a set (routed asks it of the policy agent's ``covered`` set until its pod is
  programmed, instead of running ``nft get element`` per try).

Each answers for the calling thread's network namespace and returns None when it cannot tell
(no permission, nf_tables not loaded, legacy iptables): the caller then asks the tool as
before. Only a definite "absent" lets a caller skip work, so a probe never hides anything.
"""

from __future__ import annotations

import os

from pycni.net.nfnl import (
    FAMILIES,
    NETLINK_NETFILTER,
    NFNL_SUBSYS_NFTABLES,
    NFT_MSG_GETCHAIN,
    NFT_MSG_GETSETELEM,
    NFT_MSG_GETTABLE,
    NFTA_CHAIN_NAME,
    NFTA_CHAIN_TABLE,
    NFTA_DATA_VALUE,
    NFTA_LIST_ELEM,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_LIST_SET,
    NFTA_SET_ELEM_LIST_TABLE,
    NFTA_TABLE_NAME,
)

TYPE_CHECKING = False  # not typing's: probes are on one-shot DEL paths
if TYPE_CHECKING:
    from pycni.net.nl import NetlinkSocket

IFNAMSIZ = 16  # an ifname set's key: the name, NUL-padded
_ENOENT, _ENODEV = 2, 19
SIOCGIFINDEX = 0x8933
# what iptables resolves to when it is iptables-nft (Debian's and most distributions' default)
_NFT_MULTI, _LEGACY_MULTI = "xtables-nft-multi", "xtables-legacy-multi"


def link_exists(name: str) -> bool | None:
    """Whether a link called ``name`` exists in the calling thread's namespace (None: cannot tell).

    SIOCGIFINDEX on a fresh socket (created in the calling thread's namespace); not
    ``socket.if_nametoindex``, whose error does not say why it failed."""
    import _socket
    import fcntl
    import struct

    raw = name.encode()
    if not raw or len(raw) >= 16 or b"\0" in raw or b"/" in raw:
        return False  # not a name the kernel gives a link
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        fcntl.ioctl(sock.fileno(), SIOCGIFINDEX, struct.pack("16si", raw, 0))
    except OSError as e:
        return False if e.errno == _ENODEV else None
    finally:
        sock.close()
    return True


def nft_object_exists(family: str, table: str, chain: str | None = None) -> bool | None:
    """Whether nf_tables table ``family table`` (with ``chain``: that chain of it) exists; None
    when the kernel does not say (unknown family, no permission, nf_tables unavailable)."""
    from pycni.net.nl import nla

    if chain is None:
        return _nft_ask(family, NFT_MSG_GETTABLE, nla(NFTA_TABLE_NAME, table.encode() + b"\0"))
    return _nft_ask(family, NFT_MSG_GETCHAIN,
                    nla(NFTA_CHAIN_TABLE, table.encode() + b"\0") + nla(NFTA_CHAIN_NAME, chain.encode() + b"\0"))


def _nft_ask(family: str, mtype: int, attrs: bytes) -> bool | None:
    """One nf_tables request: True when the kernel answers it, False on ENOENT, None otherwise."""
    import struct

    from pycni.net.nl import NetlinkError, NetlinkSocket

    fam = FAMILIES.get(family)
    if fam is None:
        return None
    try:
        sock = NetlinkSocket(NETLINK_NETFILTER)
    except OSError:
        return None
    try:
        sock.settimeout(5)
        sock.exchange((NFNL_SUBSYS_NFTABLES << 8) | mtype, struct.pack("=BBH", fam, 0, 0) + attrs)
    except NetlinkError as e:
        return False if e.code == _ENOENT else None
    except OSError:
        return None
    finally:
        close_aside(sock)
    return True


def close_aside(sock: NetlinkSocket) -> None:
    """Close a netfilter socket, on a thread of its own where the process has others (the daemon).

    Why: closing any netfilter netlink socket (NETLINK_URELEASE: nf_tables takes the namespace's
    commit mutex and flushes the deferred release of earlier commits, of any namespace) waits a
    grace period whenever a commit was made just before. Under CRI that is a RemovePodSandbox
    right after StopPodSandbox's masquerade teardown: the daemon's portmap DEL there took 13 ms
    (median), 0.5 ms without the wait. The answer is in by then; only the close waits, and in
    the daemon it need not be the caller's. A one-shot process closes it here (its exit would
    wait the same)."""
    try:
        threaded = len(os.listdir("/proc/self/task")) > 1
    except OSError:
        threaded = False
    if threaded:
        import _thread

        _thread.start_new_thread(sock.close, ())
    else:
        sock.close()


def nft_set_has_ifname(family: str, table: str, set_name: str, ifname: str) -> bool | None:
    """Whether ``ifname`` is an element of the ifname set ``set_name`` of nf_tables table
    ``family table``; False also when the table or set is absent; None when the kernel does
    not say (no permission, nf_tables unavailable, interrupted by a concurrent commit)."""
    from pycni.net.nl import nla

    raw = ifname.encode()
    if not raw or len(raw) >= IFNAMSIZ:
        return False
    key = nla(NFTA_DATA_VALUE, raw.ljust(IFNAMSIZ, b"\0"))
    elem = nla(NFTA_LIST_ELEM, nla(NFTA_SET_ELEM_KEY, key, nested=True), nested=True)
    attrs = (nla(NFTA_SET_ELEM_LIST_TABLE, table.encode() + b"\0")
             + nla(NFTA_SET_ELEM_LIST_SET, set_name.encode() + b"\0")
             + nla(NFTA_SET_ELEM_LIST_ELEMENTS, elem, nested=True))
    return _nft_ask(family, NFT_MSG_GETSETELEM, attrs)


def xtables_is_nft(path: str) -> bool | None:
    """Whether the iptables tool at ``path`` is iptables-nft, by the multi-call binary it resolves
    to (the Debian/upstream layout: iptables -> ... -> xtables-{nft,legacy}-multi); None when
    its name does not say (only running it can)."""
    if os.sep not in path:
        return None  # not found on PATH
    multi = os.path.basename(os.path.realpath(path))
    return True if multi == _NFT_MULTI else False if multi == _LEGACY_MULTI else None


def iptables_is_nft(ipv6: bool = False) -> bool:
    """Whether the ``iptables`` (``ip6tables``) a plugin would run is iptables-nft."""
    from pycni.net.tools import find_tool

    return xtables_is_nft(find_tool("ip6tables" if ipv6 else "iptables")) is True


def iptables_chain_exists(table: str, chain: str, ipv6: bool = False) -> bool | None:
    """Whether iptables chain ``chain`` of ``table`` exists; None when only the tool can tell
    (legacy iptables, or the kernel did not answer)."""
    if not iptables_is_nft(ipv6):
        return None
    return nft_object_exists("ip6" if ipv6 else "ip", table, chain)
