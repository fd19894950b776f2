"""Spec versions: parsing and ordering as Go's pkg/version, reconciliation, VERSION answers."""

from __future__ import annotations

import pytest

from pycni.spec import errors as E
from pycni.spec.errors import CNIError
from pycni.spec.version import (
    ALL_VERSIONS,
    CURRENT_VERSION,
    check_supported,
    greater_than_or_equal,
    highest,
    parse_version,
    version_info,
)


def test_known_versions() -> None:
    assert ALL_VERSIONS == ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
    assert CURRENT_VERSION == "1.1.0"


@pytest.mark.parametrize(("text", "parsed"), [("1.0.0", (1, 0, 0)), ("0.3.1", (0, 3, 1)), ("1", (1, 0, 0)),
                                              ("2.5", (2, 5, 0)), ("", (0, 1, 0)), ("10.20.30", (10, 20, 30))])
def test_parse(text: str, parsed: tuple[int, int, int]) -> None:
    assert parse_version(text) == parsed


@pytest.mark.parametrize("bad", ["1.0.0.0", "a.b.c", "1..0", "1.0.x", "v1.0.0", "１.0.0"])
def test_parse_refuses(bad: str) -> None:
    with pytest.raises(CNIError) as ei:
        parse_version(bad)
    assert ei.value.code == E.DECODE_FAILURE


def test_ordering_is_numeric_not_textual() -> None:
    assert greater_than_or_equal("0.10.0", "0.4.0")
    assert greater_than_or_equal("1.0.0", "0.4.0")
    assert not greater_than_or_equal("0.3.1", "0.4.0")
    assert greater_than_or_equal("0.4.0", "0.4.0")
    assert greater_than_or_equal("0.1.0", "")  # "" means 0.1.0
    ordered = sorted(ALL_VERSIONS, key=parse_version)
    assert tuple(ordered) == ALL_VERSIONS


def test_highest() -> None:
    assert highest(["0.4.0", "1.1.0", "0.10.0", "junk"]) == "1.1.0"
    assert highest(["junk"]) == ""


def test_check_supported_is_exact_membership() -> None:
    check_supported("0.3.1", ALL_VERSIONS)
    with pytest.raises(CNIError) as ei:
        check_supported("0.3.2", ["0.3.1", "0.4.0"])
    assert ei.value.code == E.INCOMPATIBLE_VERSION
    assert ei.value.details == 'config is "0.3.2", plugin supports ["0.3.1" "0.4.0"]'


def test_version_info() -> None:
    assert version_info(["0.4.0", "1.0.0"], "1.0.0") == {"cniVersion": "1.0.0", "supportedVersions": ["0.4.0",
                                                                                                       "1.0.0"]}
