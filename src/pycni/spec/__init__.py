"""The CNI specification as code: result types, versions, errors, validation. Stdlib only."""

from pycni.spec.errors import CNIError
from pycni.spec.types import DNS, Interface, IPConfig, Result, Route
from pycni.spec.version import ALL_VERSIONS, CURRENT_VERSION

__all__ = ["ALL_VERSIONS", "CURRENT_VERSION", "CNIError", "DNS", "IPConfig", "Interface", "Result", "Route"]
