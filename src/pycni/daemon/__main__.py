"""``python -m pycni.daemon``: the same as ``pycni daemon``."""

import sys

from pycni.daemon.server import main

sys.exit(main())
