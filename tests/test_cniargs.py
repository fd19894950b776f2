"""CNI_ARGS parsing, as Go's types.LoadArgs parses it."""

from __future__ import annotations

import pytest

from pycni.cniargs import load_cni_args, parse_bool, parse_cni_args
from pycni.spec import errors as E
from pycni.spec.errors import CNIError


def test_pairs() -> None:
    assert parse_cni_args("") == {}
    assert parse_cni_args("A=1;B=two;A=3") == {"A": "3", "B": "two"}
    assert parse_cni_args("EMPTY=") == {"EMPTY": ""}


@pytest.mark.parametrize("raw", ["A", "A=1;", ";A=1", "A=1;;B=2", "A=b=c", "K8S_POD_NAME"])
def test_malformed_pairs_are_refused(raw: str) -> None:
    with pytest.raises(CNIError) as ei:
        parse_cni_args(raw)
    assert ei.value.code == E.INVALID_ENV and ei.value.msg.startswith("ARGS: invalid pair")


@pytest.mark.parametrize(("value", "expect"), [("1", True), ("true", True), ("TRUE", True), ("True", True),
                                               ("0", False), ("false", False), ("FaLsE", False)])
def test_bools(value: str, expect: bool) -> None:
    assert parse_bool(value) is expect


@pytest.mark.parametrize("value", ["yes", "", "2", "on"])
def test_bad_bools(value: str) -> None:
    with pytest.raises(CNIError) as ei:
        parse_bool(value)
    assert ei.value.code == E.INVALID_ENV


def test_known_keys_only() -> None:
    assert load_cni_args("IP=10.0.0.5", ["IP"]) == {"IP": "10.0.0.5"}
    with pytest.raises(CNIError) as ei:
        load_cni_args("IP=10.0.0.5;K8S_POD_NAME=web", ["IP"])
    assert ei.value.msg == 'ARGS: unknown args ["K8S_POD_NAME=web"]'
    assert "IgnoreUnknown" in ei.value.details


@pytest.mark.parametrize("flag", ["1", "true", "True"])
def test_ignore_unknown(flag: str) -> None:
    raw = f"IgnoreUnknown={flag};K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;IP=10.0.0.5"
    assert load_cni_args(raw, ["IP"]) == {"IgnoreUnknown": flag, "IP": "10.0.0.5"}


def test_ignore_unknown_false_still_refuses() -> None:
    with pytest.raises(CNIError):
        load_cni_args("IgnoreUnknown=0;X=1", ["IP"])


def test_keys_are_case_sensitive() -> None:
    with pytest.raises(CNIError):
        load_cni_args("ip=10.0.0.5", ["IP"])


def test_bad_ignore_unknown_value() -> None:
    with pytest.raises(CNIError) as ei:
        load_cni_args("IgnoreUnknown=maybe;X=1", [])
    assert "IgnoreUnknown=maybe" in ei.value.msg


def test_runtime_args_are_cnitools() -> None:
    from pycni.cniargs import runtime_args

    assert runtime_args("") == []
    assert runtime_args("A=1;B=x=y;A=2;") == [("A", "1"), ("B", "x=y"), ("A", "2")]
    for raw in ("A=1;B", "=1", "A=", "A=1;;=2"):
        with pytest.raises(CNIError) as e:
            runtime_args(raw)
        assert e.value.code == E.INVALID_ENV
