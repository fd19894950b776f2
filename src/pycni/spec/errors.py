"""CNI error codes and the error type every layer raises (spec: "Error" section)."""

from __future__ import annotations

from pycni import jsonlite as json

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
# Go reference (libcni 1.2+): CNI_NETNS is the plugin's own namespace.
INVALID_NETNS = 8
TRY_AGAIN = 11
# Spec 1.1 STATUS: the plugin cannot serve ADD (50), and containers may have lost
# connectivity too (51).
PLUGIN_NOT_AVAILABLE = 50
LIMITED_CONNECTIVITY = 51
# Codes 0-99 are the spec's; plugins use 100 and above for their own errors.
PLUGIN_SPECIFIC = 100
# What the Go reference reports for a failure that was not a CNI error (a bug, an OSError...).
INTERNAL = 999
# What Go's invoke reports when a failed plugin printed no parsable error (ErrUnknown).
UNKNOWN = 0


class CNIError(Exception):
    """A CNI error: what a plugin prints on failure and what the runtime raises.

    ``code`` is the spec error code, ``msg`` a short description, ``details`` the
    longer story a person needs to act on it.
    """

    def __init__(self, code: int, msg: str, details: str = "", cni_version: str = "") -> None:
        super().__init__(msg)
        self.code = int(code)
        self.msg = msg
        self.details = details
        self.cni_version = cni_version

    def __str__(self) -> str:
        return f"{self.msg}; {self.details}" if self.details else self.msg

    def __repr__(self) -> str:
        return f"CNIError(code={self.code}, msg={self.msg!r}, details={self.details!r})"

    def to_dict(self, cni_version: str | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {}
        version = cni_version or self.cni_version
        if version:
            d["cniVersion"] = version
        d["code"] = self.code
        d["msg"] = self.msg
        if self.details:
            d["details"] = self.details
        return d

    def to_json(self, cni_version: str | None = None) -> str:
        return json.dumps(self.to_dict(cni_version), indent=4)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CNIError:
        code = d.get("code")
        if not isinstance(code, int):
            code = PLUGIN_SPECIFIC
        return cls(code, str(d.get("msg", "")), str(d.get("details", "")), str(d.get("cniVersion", "")))


def invalid_config(msg: str, details: str = "") -> CNIError:
    return CNIError(INVALID_CONFIG, msg, details)

