"""Links born in the container from a parent in the host: macvlan, ipvlan, vlan, dummy.

The link is created under a temporary name directly inside the container's namespace
(IFLA_NET_NS_FD) — so nothing ever shows up under the container's name on the host — and then
renamed to CNI_IFNAME there, as the Go reference ends up doing. With ``link_in_container`` the
parent lives in the container namespace too (the reference's ``linkInContainer``).
Acts from the calling thread's namespace (the host).
"""

from __future__ import annotations

import errno

from pycni.net import netns
from pycni.net.errors import kernel_errors
from pycni.net.link import (
    Link,
    delete_link_quietly,
    get_link,
    lookup_msg,
    require_free_ifname,
    rtnl,
    setlink,
)
from pycni.net.names import random_ifname
from pycni.spec.errors import INTERNAL, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot process ~4 ms
if TYPE_CHECKING:
    from typing import Any


def kernel_lacks(kind: str) -> CNIError:
    """The error for a link kind this kernel cannot make (EOPNOTSUPP), saying which module to load."""
    return CNIError(INTERNAL, f"the kernel does not support {kind} links",
                    f"creating a {kind} link failed with EOPNOTSUPP: load the {kind} module "
                    f"(modprobe {'8021q' if kind == 'vlan' else kind}) or use another plugin")


def parent_link(name: str, container_netns: str, link_in_container: bool) -> Link:
    """Look up the parent (``master``) where it lives; a missing one is a config error."""
    if link_in_container:
        with netns.enter(container_netns):
            link = get_link(name)
    else:
        link = get_link(name)
    if link is None:
        where = "the container namespace" if link_in_container else "the host namespace"
        raise invalid_config(f"failed to lookup master {name!r}",
                             f"no interface named {name!r} in {where}; fix \"master\" in the config")
    return link


def create_in_container(kind: str, container_netns: str, ifname: str, *, parent: int | None = None,
                        link_in_container: bool = False, mtu: int = 0, mac: str = "",
                        **attrs: Any) -> Link:
    """Create a ``kind`` link named ``ifname`` in ``container_netns``; return it (down)."""
    with netns.enter(container_netns):
        require_free_ifname(ifname, container_netns)
    tmp = random_ifname(kind[:5])
    spec: dict[str, Any] = {"ifname": tmp, "kind": kind, **attrs}
    if parent is not None:
        spec["link"] = parent
    if mtu:
        spec["mtu"] = mtu
    if mac:
        spec["address"] = mac
    with netns.opened(container_netns) as target:
        if link_in_container:
            with netns.enter(container_netns), rtnl() as sock:
                _add(sock, spec, kind)
        else:
            spec["net_ns_fd"] = target
            with rtnl() as sock:
                _add(sock, spec, kind)
    with netns.enter(container_netns):
        try:
            with rtnl() as sock:
                msg = lookup_msg(sock, tmp)
                if msg is None:
                    raise CNIError(INTERNAL, f"failed to lookup new {kind} link", f"{tmp!r} vanished after creation")
                setlink(sock, f"failed to rename {kind} link to {ifname!r}", index=int(msg["index"]), ifname=ifname)
                return Link.from_msg(lookup_msg(sock, int(msg["index"])))
        except BaseException:
            delete_link_quietly(tmp)
            raise


def _add(sock: Any, spec: dict[str, Any], kind: str) -> None:
    """RTM_NEWLINK with ``spec``; a kernel refusal becomes a CNIError naming ``kind``."""
    with kernel_errors(f"failed to create {kind} link", ignore=(errno.EOPNOTSUPP,)) as refused:
        sock.link("add", **spec)
    if refused.ignored is not None:
        raise kernel_lacks(kind)
