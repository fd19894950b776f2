"""``python -m pycni.plugins TYPE``: run the plugin named by its CNI type."""

import sys

from pycni.plugins.registry import PLUGIN_MODULES, run_main

if len(sys.argv) != 2 or sys.argv[1] not in PLUGIN_MODULES:
    sys.stderr.write(f"usage: python -m pycni.plugins TYPE  (TYPE one of {', '.join(PLUGIN_MODULES)})\n")
    sys.exit(2)
run_main(sys.argv[1])
