"""pycni.jsonlite gives exactly what the stdlib json gives (output, results and errors)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import OrderedDict

import pytest

from pycni import jsonlite

VALUES = [
    {}, [], "", 0, -1, 1.5, 1e300, True, False, None, "ünïcødé ☃ \u2028 \x00 \"q\" \\",
    {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mac": "aa:bb", "sandbox": "/x"}], "ips": [],
     "nested": {"a": [1, [2, [3, {}]], {"b": None}], "e": [], "f": {}}, "n": 10**30, "x": -0.0},
    [1, (2, 3), {"k": (4,)}], {"1": 1, "": "", " ": [True]},
    float("inf"), float("nan"), {"a": float("-inf")},
]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("indent", [None, 0, 2, 4, "\t"])
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_dumps_matches_json(value: object, indent: int | str | None, ensure_ascii: bool) -> None:
    assert jsonlite.dumps(value, indent=indent, ensure_ascii=ensure_ascii) == \
        json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


@pytest.mark.parametrize("value", [{1: "int key", None: 2, 1.5: 3, False: 4}, {"s": {1, 2}}, object()])
def test_dumps_out_of_the_ordinary_is_jsons(value: object) -> None:
    try:
        want: object = json.dumps(value, indent=4)
    except TypeError as e:
        with pytest.raises(TypeError, match=str(e)):
            jsonlite.dumps(value, indent=4)
    else:
        assert jsonlite.dumps(value, indent=4) == want


def test_dumps_circular_is_jsons_error() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsonlite.dumps(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsonlite.dumps(loop, indent=4)


@pytest.mark.parametrize("text", [
    '{"a": 1}', ' \n\t{"a": [1, 2.5, -3e2, "x\\u00e9", true, false, null]} \r\n', "[]", '"s"', "12",
    "NaN", "-Infinity", '{"a": 1, "a": 2}', '{"big": 123456789012345678901234567890}',
])
def test_loads_matches_json(text: str) -> None:
    for s in (text, text.encode(), bytearray(text.encode())):
        got, want = jsonlite.loads(s), json.loads(s)
        assert repr(got) == repr(want)


@pytest.mark.parametrize("bad", ["", " ", "{", '{"a": 1} x', '{"a": 1}{}', "[1,]", "\ufeff{}", '"\x01"', "nul",
                                 b"\xff{}", b'\xef\xbb\xbf{"a": 1}', "[" * 100000])
def test_loads_errors_and_oddities_are_jsons(bad: str | bytes) -> None:
    try:
        want = json.loads(bad)
    except (ValueError, RecursionError) as e:
        with pytest.raises(type(e)) as got:
            jsonlite.loads(bad)
        assert str(got.value) == str(e)
    else:
        assert jsonlite.loads(bad) == want


def test_loads_pairs_hook() -> None:
    got = jsonlite.loads('{"b": 1, "a": {"c": 2}}', object_pairs_hook=OrderedDict)
    assert isinstance(got, OrderedDict) and isinstance(got["a"], OrderedDict) and list(got) == ["b", "a"]
    assert math.isnan(jsonlite.loads("NaN"))


def test_imports_neither_json_nor_re() -> None:
    src = os.path.dirname(os.path.dirname(os.path.abspath(jsonlite.__file__)))
    code = ("import sys; sys.path.insert(0, " + repr(src) + "); from pycni import jsonlite as j;"
            "j.dumps(j.loads(b'{\"a\": [1, 2.5]}'), indent=4);"
            "j.dumps({'a': None}); print(sorted(m for m in ('json', 're', 'enum') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_invalid_input_before_json_is_imported() -> None:
    """The C scanner raises JSONDecodeError only once json.decoder is loaded: the error is json's all the same."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(jsonlite.__file__)))
    code = ("import sys; sys.path.insert(0, " + repr(src) + "); from pycni import jsonlite as j\n"
            "for bad in ('{nope}', '[1,', '\"x', '{\"a\": 1} 2'):\n"
            "    try: j.loads(bad)\n"
            "    except ValueError as e: print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-IS", "-c", code], capture_output=True, text=True, timeout=60)
    want = []
    for bad in ("{nope}", "[1,", '"x', '{"a": 1} 2'):
        try:
            json.loads(bad)
        except ValueError as e:
            want.append(f"{type(e).__name__} {e}")
    assert out.stdout.splitlines() == want, out.stderr


def test_compact_separators_match_json() -> None:
    """What the etcd store writes: json's compact form, byte for byte."""
    import json

    from pycni import jsonlite

    for obj in ({"cidr": "10.0.0.0/26", "allocations": {"1": "h"}, "next": 2}, [1, "a", None], {}):
        assert jsonlite.dumps(obj, separators=(",", ":")) == json.dumps(obj, separators=(",", ":"))
