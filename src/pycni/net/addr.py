"""IP addresses on links, in the calling thread's netns (see :mod:`pycni.net.link`)."""

from __future__ import annotations

import errno
import time

from pycni import ipaddr
from pycni.net.errors import kernel_errors
from pycni.net.link import require_index, rtnl
from pycni.net.nl import (  # noqa: F401 - the address constants, re-exported for callers of this module
    AF_INET,
    AF_INET6,
    AF_UNSPEC,
    IFA_F_DADFAILED,
    IFA_F_NODAD,
    IFA_F_TENTATIVE,
    RT_SCOPE_HOST,
    RT_SCOPE_LINK,
    RT_SCOPE_UNIVERSE,
)
from pycni.record import record
from pycni.spec.errors import INTERNAL, CNIError

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from pycni.spec.types import IPInterface


@record
class Addr:
    """One address on a link."""

    address: IPInterface
    index: int
    scope: int = RT_SCOPE_UNIVERSE
    flags: int = 0
    label: str = ""

    @property
    def tentative(self) -> bool:
        return bool(self.flags & IFA_F_TENTATIVE)

    @property
    def dad_failed(self) -> bool:
        return bool(self.flags & IFA_F_DADFAILED)

    @classmethod
    def from_msg(cls, msg: Any) -> Addr:
        ip = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
        flags = msg.get_attr("IFA_FLAGS")
        return cls(address=ipaddr.ip_interface(f"{ip}/{msg['prefixlen']}"), index=int(msg["index"]),
                   scope=int(msg["scope"]), flags=int(flags if flags is not None else msg["flags"]),
                   label=msg.get_attr("IFA_LABEL") or "")


def _family(version: int | None) -> int:
    return {4: AF_INET, 6: AF_INET6}.get(version or 0, AF_UNSPEC)


def list_addrs(name: str | int | None = None, family: int | None = None) -> list[Addr]:
    """Addresses on link ``name`` (all links when None); ``family`` 4, 6 or None for both."""
    with rtnl() as sock:
        kw: dict[str, Any] = {}
        if name is not None:
            kw["index"] = require_index(sock, name)
        msgs = sock.get_addr(family=_family(family), **kw)
        return [Addr.from_msg(m) for m in msgs]


def add_addr(name: str | int, address: IPInterface | str, *, exist_ok: bool = False, nodad: bool = False) -> None:
    """Add ``address`` (with its prefix) to the link; IPv4 gets the broadcast ``ip`` would give.

    ``nodad`` skips IPv6 duplicate address detection, for a link with no one else to clash with.
    """
    addr = ipaddr.ip_interface(address) if isinstance(address, str) else address
    with rtnl() as sock:
        index = require_index(sock, name)
        kw: dict[str, Any] = {"index": index, "address": str(addr.ip), "prefixlen": addr.network.prefixlen}
        if addr.version == 4 and addr.network.prefixlen < 31:
            kw["broadcast"] = str(addr.network.broadcast_address)
        if nodad and addr.version == 6:
            kw["flags"] = IFA_F_NODAD
        with kernel_errors(f"failed to add IP addr {addr} to {name!r}", ignore=(errno.EEXIST,) if exist_ok else ()):
            sock.addr("add", **kw)


def del_addr(name: str | int, address: IPInterface | str) -> bool:
    """Remove ``address``; True when it was there. Idempotent (missing link or address: False)."""
    addr = ipaddr.ip_interface(address) if isinstance(address, str) else address
    with rtnl() as sock:
        try:
            index = require_index(sock, name)
        except CNIError:
            return False
        with kernel_errors(f"failed to remove IP addr {addr} from {name!r}",
                           ignore=(errno.EADDRNOTAVAIL, errno.ENOENT, errno.ENODEV, errno.ESRCH)) as refused:
            sock.addr("del", index=index, address=str(addr.ip), prefixlen=addr.network.prefixlen)
        return refused.ignored is None


def settle_addresses(name: str, timeout: float = 5.0) -> None:
    """Wait until no IPv6 address on ``name`` is tentative (DAD done), as Go's SettleAddresses.

    Raises CNIError when DAD failed for an address or when ``timeout`` runs out. Go polls every
    50 ms; a tentative address here is most often settled within a millisecond or two (the link
    has just come up), so the first re-checks come sooner (1 ms, doubling up to 50 ms): an ADD
    waits for the kernel, not for the rest of a 50 ms sleep (a daemon's bridge ADD under CRI
    took 60-80 ms instead of 15 whenever the first check found one).
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        pending = []
        for a in list_addrs(name, 6):
            if a.dad_failed:
                raise CNIError(INTERNAL, f"failed to settle addresses for {name!r}",
                               f"duplicate address detected for {a.address}")
            if a.tentative and a.scope != RT_SCOPE_HOST:
                pending.append(a)
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise CNIError(INTERNAL, f"failed to settle addresses for {name!r}",
                           f"link {name} still has tentative addresses after {timeout}s: "
                           f"{', '.join(str(a.address) for a in pending)}")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
