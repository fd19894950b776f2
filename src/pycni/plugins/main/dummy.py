"""dummy: a dummy link in the container holding the IPAM addresses (IPAM required)."""

from __future__ import annotations

from pycni.plugins.main.sublink_base import SublinkPlugin, SublinkSpec
from pycni.skel import run_plugin

SPEC = SublinkSpec(name="dummy", kind="dummy", needs_master=False, ipam_required=True,
                   about="pycni dummy: a dummy interface carrying IPAM addresses")
PLUGIN = SublinkPlugin(SPEC).plugin()


def main() -> None:
    run_plugin(PLUGIN)
