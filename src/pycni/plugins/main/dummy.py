"""dummy: a dummy link in the container holding the IPAM addresses (IPAM required)."""

from __future__ import annotations

from pycni.plugins.main._sublink import SublinkPlugin, SublinkSpec
from pycni.skel import run_plugin

SPEC = SublinkSpec(name="dummy", kind="dummy", needs_master=False, ipam_required=True,
                   about="pycni dummy: a dummy interface carrying IPAM addresses")
IMPL = SublinkPlugin(SPEC)
parse_conf, cmd_add, cmd_del, cmd_check, cmd_gc, cmd_status = (IMPL.parse_conf, IMPL.add, IMPL.delete, IMPL.check,
                                                                IMPL.gc, IMPL.status)
PLUGIN = IMPL.plugin()


def main() -> None:
    run_plugin(PLUGIN)
