"""``python -m pycni``: the ``pycni`` command."""

from pycni.cli import main

main()
