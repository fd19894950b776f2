"""Spec versions: parsing, comparison, and reconciling a config's version with a plugin's."""

from __future__ import annotations

from pycni.spec.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, CNIError

TYPE_CHECKING = False  # not typing's: this module is on plugins' one-shot start path
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

ALL_VERSIONS: tuple[str, ...] = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CURRENT_VERSION = "1.1.0"
# Versions whose results carry the 0.1/0.2 "ip4"/"ip6" shape.
LEGACY_RESULT_VERSIONS = ("0.1.0", "0.2.0")
# Versions whose IP configs carry a "version" field.
V04_RESULT_VERSIONS = ("0.3.0", "0.3.1", "0.4.0")
V1_RESULT_VERSIONS = ("1.0.0", "1.1.0")


def parse_version(version: str) -> tuple[int, int, int]:
    """Parse 'X', 'X.Y' or 'X.Y.Z' as the Go reference does (missing parts are 0, '' is 0.1.0)."""
    if not isinstance(version, str):
        raise CNIError(DECODE_FAILURE, "invalid version", f"version {version!r} is not a string")
    if version == "":
        return 0, 1, 0  # no version declared means 0.1.0
    parts = version.split(".")
    if len(parts) > 3:
        raise CNIError(DECODE_FAILURE, "invalid version", f"{version!r}: too many dot-separated parts")
    nums: list[int] = []
    for part in parts:
        if not (part.isascii() and part.isdigit()):
            raise CNIError(DECODE_FAILURE, "invalid version", f"{version!r}: {part!r} is not a number")
        nums.append(int(part))
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def greater_than_or_equal(version: str, other: str) -> bool:
    return parse_version(version) >= parse_version(other)


def highest(versions: Iterable[str]) -> str:
    """Highest version in ``versions`` by semver order ('' if none parse)."""
    best = ""
    best_key: tuple[int, int, int] | None = None
    for v in versions:
        try:
            key = parse_version(v)
        except CNIError:
            continue
        if best_key is None or key > best_key:
            best, best_key = v, key
    return best


def check_supported(config_version: str, plugin_versions: Sequence[str]) -> None:
    """Refuse a config whose version the plugin does not speak (spec error 1)."""
    if config_version not in plugin_versions:
        quoted = " ".join(f'"{v}"' for v in plugin_versions)
        raise CNIError(INCOMPATIBLE_VERSION, "incompatible CNI versions",
                       f'config is "{config_version}", plugin supports [{quoted}]')


def version_info(supported: Sequence[str], cni_version: str = CURRENT_VERSION) -> dict[str, object]:
    """The VERSION command's answer."""
    return {"cniVersion": cni_version, "supportedVersions": list(supported)}
