"""pycni: the Container Network Interface in Python."""

__version__ = "0.1.0"
