"""``python -m pycni.plugins.ipam.dhcp [daemon ...]``."""

from pycni.plugins.ipam.dhcp import main

main()
