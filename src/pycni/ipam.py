"""IPAM delegation for interface plugins (what Go's pkg/ipam is for). Stdlib only.

An interface plugin hands its whole configuration to the IPAM plugin named in ``ipam.type``
(found on CNI_PATH), uses the addresses it returns, and must give them back if anything
after that fails (push :func:`delete` on a :class:`pycni.rollback.Rollback`). GC and STATUS
are the IPAM plugin's answer: an interface plugin owns no other state a GC could release,
and it cannot serve ADD when its IPAM cannot.
"""

from __future__ import annotations

from pycni import invoke
from pycni.netconf import ipam_type, valid_attachments
from pycni.skel import CmdArgs
from pycni.spec.errors import INTERNAL, CNIError, invalid_config
from pycni.spec.types import Result

__all__ = ["ipam_type", "require_ipam", "locate", "add", "delete", "check", "gc", "status"]

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def require_ipam(conf: Mapping[str, Any], plugin: str) -> str:
    """The IPAM type of a plugin that cannot work without one; CNIError 7 when there is none."""
    t = ipam_type(conf)
    if not t:
        raise invalid_config(f"{plugin}: IPAM type is required",
                             "add an \"ipam\" section, e.g. {\"type\": \"host-local\", \"subnet\": \"10.1.0.0/24\"}")
    return t


def add(conf: Mapping[str, Any], args: CmdArgs) -> Result:
    """Run IPAM ADD with the plugin's own stdin; refuse a result with no address (after an IPAM
    DEL, as the reference's deferred one: whatever the IPAM plugin recorded is released)."""
    result = invoke.delegate_add(ipam_type(conf), args.stdin_data, args)
    if not result.ips:
        try:
            delete(conf, args)
        except CNIError:
            pass  # the refusal below is the answer
        raise CNIError(INTERNAL, "IPAM plugin returned missing IP config",
                       f"{ipam_type(conf)} returned no addresses for {args.container_id}/{args.ifname}")
    return result


def delete(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Run IPAM DEL when the config has an IPAM section."""
    if ipam_type(conf):
        invoke.delegate_del(ipam_type(conf), args.stdin_data, args)


def check(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Run IPAM CHECK when the config has an IPAM section."""
    if ipam_type(conf):
        invoke.delegate_check(ipam_type(conf), args.stdin_data, args)


def locate(conf: Mapping[str, Any], args: CmdArgs) -> str:
    """The IPAM plugin's path on CNI_PATH ('' without an IPAM section): look before making anything,
    so a missing IPAM plugin is refused up front rather than after the interface exists."""
    t = ipam_type(conf)
    return invoke.find_in_path(t, args.cni_path) if t else ""


def gc(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Run IPAM GC when the config has an IPAM section (it releases what valid-attachments omits).

    A missing or malformed ``cni.dev/valid-attachments`` is code 7 here, before any delegate
    sees it: an IPAM plugin reading a missing list as empty would release every reservation.
    """
    valid_attachments(conf)
    if ipam_type(conf):
        invoke.delegate_gc(ipam_type(conf), args.stdin_data, args)


def status(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Run IPAM STATUS when the config has an IPAM section: its error is the plugin's answer."""
    if ipam_type(conf):
        invoke.delegate_status(ipam_type(conf), args.stdin_data, args)
