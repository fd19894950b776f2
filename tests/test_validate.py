"""Identifier validation: container IDs, network names, interface names, plugin types."""

from __future__ import annotations

import pytest

from pycni.spec import errors as E
from pycni.spec.errors import CNIError
from pycni.spec.validate import (
    validate_container_id,
    validate_interface_name,
    validate_network_name,
    validate_plugin_type,
)


@pytest.mark.parametrize("good", ["a", "0", "abc-DEF_1.2", "f" * 64, "9f86d081884c7d65"])
def test_good_ids_and_names(good: str) -> None:
    validate_container_id(good)
    validate_network_name(good)


@pytest.mark.parametrize("bad", ["-a", ".a", "_a", "a b", "a/b", "../x", "a:b", "ä", "a\n"])
def test_bad_ids_and_names(bad: str) -> None:
    with pytest.raises(CNIError) as ei:
        validate_container_id(bad)
    assert (ei.value.code, ei.value.msg) == (E.INVALID_ENV, "invalid characters in containerID")
    with pytest.raises(CNIError) as ei:
        validate_network_name(bad)
    assert (ei.value.code, ei.value.msg) == (E.INVALID_CONFIG, "invalid characters found in network name")


def test_empty_id_and_name() -> None:
    with pytest.raises(CNIError) as ei:
        validate_container_id("")
    assert ei.value.code == E.UNKNOWN_CONTAINER
    with pytest.raises(CNIError) as ei:
        validate_network_name("")
    assert ei.value.code == E.INVALID_CONFIG


@pytest.mark.parametrize("good", ["eth0", "a" * 15, "net1.100", "vеth"])
def test_good_interface_names(good: str) -> None:
    validate_interface_name(good)


@pytest.mark.parametrize(("bad", "msg"), [
    ("", "interface name is empty"),
    ("a" * 16, "interface name is too long"),
    ("ü" * 8, "interface name is too long"),
    (".", "interface name is . or .."),
    ("..", "interface name is . or .."),
    ("a/b", "interface name contains / or : or whitespace characters"),
    ("a:b", "interface name contains / or : or whitespace characters"),
    ("a b", "interface name contains / or : or whitespace characters"),
    ("a\tb", "interface name contains / or : or whitespace characters"),
    ("a\u00a0b", "interface name contains / or : or whitespace characters"),
])
def test_bad_interface_names(bad: str, msg: str) -> None:
    with pytest.raises(CNIError) as ei:
        validate_interface_name(bad)
    assert (ei.value.code, ei.value.msg) == (E.INVALID_ENV, msg)


@pytest.mark.parametrize("bad", ["", "a/b", "/bin/sh", "..", ".", "a\\b", "a\x00b"])
def test_plugin_types_are_not_paths(bad: str) -> None:
    with pytest.raises(CNIError) as ei:
        validate_plugin_type(bad)
    assert ei.value.code == E.INVALID_CONFIG


def test_plugin_type_ok() -> None:
    validate_plugin_type("host-local")
