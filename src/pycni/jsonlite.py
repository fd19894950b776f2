"""``loads`` and ``dumps`` as the stdlib :mod:`json` does them, without importing it on the start path.

Why: ``import json`` compiles regular expressions at import time, so it loads :mod:`re` (with
enum, re._parser and re._compiler): ~5 ms of CPU of every one-shot plugin call, more than half
what the C accelerator it ends up using costs (measured with ``python -X importtime`` and
bench/plugins.py). Here the same C scanner and encoder (``_json``) are driven directly, the
indented form (``indent=``, the plugins' output) is laid out in a few lines of Python, and
anything out of the ordinary — invalid input, a type JSON does not know, a circular reference —
is handed to the stdlib :mod:`json`, so results and error messages are exactly its own.
Import it as ``from pycni import jsonlite as json`` where only these two functions are used.
"""

import _json

TYPE_CHECKING = False  # true for mypy only (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WS = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """What ``_json.make_scanner`` reads from a decoder (the attributes json.JSONDecoder has)."""

    def __init__(self, object_pairs_hook: "Callable[[list[tuple[str, Any]]], Any] | None") -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = object_pairs_hook
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = _CONSTANTS.__getitem__
        self.memo: dict[str, str] = {}


_plain_scanner = _json.make_scanner(_Context(None))  # type: ignore[arg-type]


def loads(s: "str | bytes | bytearray", *,
          object_pairs_hook: "Callable[[list[tuple[str, Any]]], Any] | None" = None) -> "Any":
    """``json.loads(s, object_pairs_hook=...)``."""
    try:
        text = s.decode("utf-8") if isinstance(s, (bytes, bytearray)) else s
        if isinstance(text, str) and not text.startswith("\ufeff"):
            scan = _plain_scanner if object_pairs_hook is None else _json.make_scanner(_Context(object_pairs_hook))  # type: ignore[arg-type]
            start = len(text) - len(text.lstrip(_WS))
            obj, end = scan(text, start)
            if not text[end:].strip(_WS):
                return obj
    except (ValueError, StopIteration, SystemError):
        # Invalid input: json says why its own way. (Until json.decoder is imported, the C scanner
        # cannot raise its JSONDecodeError and fails with a SystemError instead.)
        pass
    import json

    return json.loads(s, object_pairs_hook=object_pairs_hook)


def _refuse(o: object) -> object:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def _encoder(ensure_ascii: bool, separators: "tuple[str, str]" = (", ", ": ")) -> "Callable[[Any, int], Any]":
    item_sep, key_sep = separators
    return _json.make_encoder({}, _refuse, _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring,
                              None, key_sep, item_sep, False, False, True)


def _layout(o: object, scalar: "Callable[[Any, int], Any]", step: str, level: int, out: list[str]) -> None:
    """``o`` as json.dumps(o, indent=...) lays it out (separators ``,`` and ``: ``)."""
    if isinstance(o, dict):
        if not o:
            out.append("{}")
            return
        inner = "\n" + step * (level + 1)
        out.append("{")
        first = True
        for k, v in o.items():
            if not isinstance(k, str):
                raise TypeError("non-string key")  # json converts some; let it
            out.append(inner if first else "," + inner)
            first = False
            out.append("".join(scalar(k, 0)))
            out.append(": ")
            _layout(v, scalar, step, level + 1, out)
        out.append("\n" + step * level + "}")
    elif isinstance(o, (list, tuple)):
        if not o:
            out.append("[]")
            return
        inner = "\n" + step * (level + 1)
        out.append("[")
        for i, v in enumerate(o):
            out.append(inner if i == 0 else "," + inner)
            _layout(v, scalar, step, level + 1, out)
        out.append("\n" + step * level + "]")
    elif isinstance(o, (str, int, float)) or o is None:
        out.append("".join(scalar(o, 0)))
    else:
        raise TypeError("not a JSON type")


def dumps(obj: object, *, indent: "int | str | None" = None, ensure_ascii: bool = True,
          separators: "tuple[str, str] | None" = None) -> str:
    """``json.dumps(obj, indent=..., ensure_ascii=..., separators=...)`` (``separators`` without ``indent``)."""
    try:
        if indent is None:
            return "".join(_encoder(ensure_ascii, separators or (", ", ": "))(obj, 0))
        if separators is None:
            out: list[str] = []
            _layout(obj, _encoder(ensure_ascii), " " * indent if isinstance(indent, int) else indent, 0, out)
            return "".join(out)
    except (TypeError, ValueError, RecursionError):
        pass
    import json

    return json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii, separators=separators)
