"""Validation of identifiers as the spec defines them, so no name can escape a directory."""

from __future__ import annotations

from pycni.spec.errors import INVALID_ENV, UNKNOWN_CONTAINER, CNIError, invalid_config

ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# Container IDs and network names: alphanumerics plus '_', '.', '-'; no leading punctuation.
_ID_REST = ALNUM + "_.-"
IFNAMSIZ = 16


def charset_match(value: str, first: str, rest: str, max_len: int | None = None, *, eol: bool = False) -> bool:
    """Whether ``value`` is one character of ``first`` then characters of ``rest``, ``max_len`` at most.

    The regular expression ``[first][rest]*`` without :mod:`re` (~3 ms of every one-shot call
    to import, with enum). ``eol`` also accepts one trailing newline, as ``re.match`` with a
    ``$`` does.
    """
    if eol and value.endswith("\n"):
        value = value[:-1]
    return (bool(value) and (max_len is None or len(value) <= max_len) and value[0] in first
            and all(c in rest for c in value[1:]))


def validate_container_id(container_id: str) -> None:
    """Empty is 'unknown container' (3), bad characters an env error (4), as in Go's utils."""
    if not container_id:
        raise CNIError(UNKNOWN_CONTAINER, "missing containerID", "CNI_CONTAINERID must not be empty")
    if not charset_match(container_id, ALNUM, _ID_REST):
        raise CNIError(INVALID_ENV, "invalid characters in containerID",
                       f"{container_id!r}: only letters, digits, '_', '.' and '-' are allowed, "
                       "starting with a letter or digit")


def validate_network_name(name: str) -> None:
    """A network name becomes part of file names (cache, IPAM store): same rule as container IDs."""
    if not name:
        raise invalid_config("missing network name", "the network configuration needs a \"name\"")
    if not charset_match(name, ALNUM, _ID_REST):
        raise invalid_config("invalid characters found in network name",
                       f"{name!r}: only letters, digits, '_', '.' and '-' are allowed, "
                       "starting with a letter or digit")


def validate_interface_name(ifname: str) -> None:
    """The kernel's rules (dev_valid_name): 1-15 bytes, not . or .., no '/', ':' or white space."""
    if not ifname:
        raise CNIError(INVALID_ENV, "interface name is empty", "CNI_IFNAME must name the interface to create")
    size = len(ifname.encode("utf-8", "surrogateescape"))  # the kernel (and Go) count bytes
    if size > IFNAMSIZ - 1:
        raise CNIError(INVALID_ENV, "interface name is too long",
                       f"{ifname!r} is {size} bytes; interface names must be less than {IFNAMSIZ} bytes")
    try:
        ifname.encode("utf-8")
    except UnicodeEncodeError:  # os.environ holds a non-UTF-8 byte as a lone surrogate
        raise CNIError(INVALID_ENV, "interface name is not valid UTF-8",
                       f"{ifname!r} holds bytes that are not UTF-8; use an ASCII interface name") from None
    if ifname in (".", ".."):
        raise CNIError(INVALID_ENV, "interface name is . or ..", f"{ifname!r} is not a valid interface name")
    for ch in ifname:
        if ch == "\0":  # no environment carries one, a daemon request can; the kernel would cut the name there
            raise CNIError(INVALID_ENV, "interface name contains a NUL byte",
                           f"{ifname!r} is not a valid interface name")
        if ch in "/:" or ch.isspace():
            raise CNIError(INVALID_ENV, "interface name contains / or : or whitespace characters",
                           f"{ifname!r} contains {ch!r}; '/', ':' and white space are not allowed")


def is_colon_mac(mac: str) -> bool:
    """Whether ``mac`` is six colon-separated hex pairs (0a:58:0a:f4:00:05), the form configs use."""
    parts = mac.split(":")
    return len(parts) == 6 and all(len(p) == 2 and all(c in "0123456789abcdefABCDEF" for c in p) for p in parts)


def validate_plugin_type(plugin_type: str) -> None:
    """A plugin ``type`` is a file name on CNI_PATH: never a path."""
    if not plugin_type:
        raise invalid_config("missing plugin type", "every plugin configuration needs a \"type\"")
    if "/" in plugin_type or "\\" in plugin_type or plugin_type in (".", "..") or "\x00" in plugin_type:
        raise invalid_config("invalid plugin type",
                             f"{plugin_type!r} must be a plain executable name, not a path")
