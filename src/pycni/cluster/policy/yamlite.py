"""A small YAML reader: the subset Kubernetes manifests use, so ``pycni policy apply`` needs no PyYAML.

Why not PyYAML: pycni has no run-time dependencies, and a NetworkPolicy needs little of YAML —
block mappings and sequences (a sequence may sit at its key's indentation, as kubectl writes
them), single-line flow collections (``{}``, ``[]``, ``{a: b}``, ``["x", "y"]``), plain,
single- and double-quoted scalars, comments and a multi-document stream (``---``). Anything
else (anchors, tags, block scalars, multi-line flow) is refused with the line it is on, never
guessed. A stream that is JSON is read as JSON.

Scalars resolve as YAML 1.2's core schema: ``null``/``~``/empty, ``true``/``false``, decimal
integers and floats; everything else is a string.
"""

from __future__ import annotations

from typing import Any


class YAMLError(ValueError):
    """Text this reader cannot read; the message names the line."""


class _Line:
    __slots__ = ("indent", "text", "no")

    def __init__(self, indent: int, text: str, no: int) -> None:
        self.indent = indent
        self.text = text
        self.no = no


def _strip_comment(text: str) -> str:
    """``text`` without a trailing ``# comment`` (a ``#`` inside quotes, or not after a space, stays)."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "\"'" and (i == 0 or text[i - 1] in " \t[{,:-"):
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text.rstrip()


def load_all(text: str) -> list[Any]:
    """Every document of a YAML (or JSON) stream, empty documents left out."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        import json

        try:
            doc = json.loads(text)
        except ValueError:
            pass  # a YAML flow document after all: read below
        else:
            return [doc]
    docs: list[Any] = []
    current: list[_Line] = []
    for no, raw in enumerate(text.splitlines(), 1):
        if raw.startswith(("---", "...")) and raw[3:4] in ("", " ", "\t"):
            if current:
                docs.append(_document(current))
            current = []
            rest = _strip_comment(raw[3:]).strip()
            if rest and raw.startswith("---"):
                current.append(_Line(0, rest, no))
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YAMLError(f"line {no}: tabs are not allowed in indentation")
        body = _strip_comment(raw)
        if not body.strip() or body.lstrip().startswith("%"):
            continue
        current.append(_Line(len(body) - len(body.lstrip()), body.strip(), no))
    if current:
        docs.append(_document(current))
    return [d for d in docs if d is not None]


def _document(lines: list[_Line]) -> Any:
    value, i = _block(lines, 0, lines[0].indent)
    if i < len(lines):
        raise YAMLError(f"line {lines[i].no}: unexpected indentation or content: {lines[i].text!r}")
    return value


def _is_item(text: str) -> bool:
    return text == "-" or text.startswith("- ")


def _block(lines: list[_Line], i: int, indent: int) -> tuple[Any, int]:
    line = lines[i]
    if _is_item(line.text):
        return _sequence(lines, i, line.indent)
    if _split_key(line) is not None:
        return _mapping(lines, i, line.indent)
    value = _scalar_or_flow(line.text, line.no)
    return value, i + 1


def _sequence(lines: list[_Line], i: int, indent: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while i < len(lines) and lines[i].indent == indent and _is_item(lines[i].text):
        line = lines[i]
        rest = line.text[1:].lstrip()
        if not rest:
            if i + 1 < len(lines) and lines[i + 1].indent > indent:
                value, i = _block(lines, i + 1, lines[i + 1].indent)
            else:
                value, i = None, i + 1
        else:
            # "- key: v" starts a mapping whose keys sit at the column after "- "
            inner = _Line(indent + len(line.text) - len(rest), rest, line.no)
            lines = [*lines[:i], inner, *lines[i + 1:]]
            value, i = _block(lines, i, inner.indent)
        out.append(value)
    if i < len(lines) and lines[i].indent > indent:
        raise YAMLError(f"line {lines[i].no}: unexpected indentation: {lines[i].text!r}")
    return out, i


def _split_key(line: _Line) -> tuple[str, str] | None:
    """``(key, rest)`` when the line is ``key: rest`` (or ``key:``), else None."""
    text = line.text
    if text[0] in "\"'":
        end = _quoted_end(text, 0, line.no)
        key = _unquote(text[: end + 1], line.no)
        after = text[end + 1:].lstrip()
        if after == ":" or after.startswith(": "):
            return key, after[1:].strip()
        return None
    if text[0] in "[{":
        return None
    for i, ch in enumerate(text):
        if ch == ":" and (i + 1 == len(text) or text[i + 1] in " \t"):
            return text[:i].rstrip(), text[i + 1:].strip()
    return None


def _mapping(lines: list[_Line], i: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while i < len(lines) and lines[i].indent == indent and not _is_item(lines[i].text):
        line = lines[i]
        kv = _split_key(line)
        if kv is None:
            raise YAMLError(f"line {line.no}: expected 'key: value', got {line.text!r}")
        key, rest = kv
        if key in out:
            raise YAMLError(f"line {line.no}: duplicate key {key!r}")
        i += 1
        if rest:
            if rest[0] in "|>&*!":
                raise YAMLError(f"line {line.no}: {rest[0]!r} (block scalars, anchors, tags) is not supported here")
            out[key] = _scalar_or_flow(rest, line.no)
        elif i < len(lines) and lines[i].indent > indent:
            out[key], i = _block(lines, i, lines[i].indent)
        elif i < len(lines) and lines[i].indent == indent and _is_item(lines[i].text):
            out[key], i = _sequence(lines, i, indent)  # kubectl style: the list at its key's column
        else:
            out[key] = None
    if i < len(lines) and lines[i].indent > indent:
        raise YAMLError(f"line {lines[i].no}: unexpected indentation: {lines[i].text!r}")
    return out, i


def _quoted_end(text: str, start: int, no: int) -> int:
    q = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\" and q == '"':
            i += 2
            continue
        if text[i] == q:
            if q == "'" and text[i + 1:i + 2] == "'":
                i += 2
                continue
            return i
        i += 1
    raise YAMLError(f"line {no}: unterminated quoted string: {text[start:]!r}")


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "/": "/", "0": "\0", "r": "\r"}


def _unquote(text: str, no: int) -> str:
    body = text[1:-1]
    if text[0] == "'":
        return body.replace("''", "'")
    out = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1:i + 2]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt == "u":
                out.append(chr(int(body[i + 2:i + 6], 16)))
                i += 6
                continue
            raise YAMLError(f"line {no}: unknown escape \\{nxt} in {text!r}")
        out.append(ch)
        i += 1
    return "".join(out)


def _plain(text: str) -> Any:
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    digits = text[1:] if text[:1] in "+-" else text
    if digits.isdigit() and digits.isascii():
        return int(text)
    if any(c.isdigit() for c in text) and all(c in "0123456789.eE+-" for c in text):
        try:
            return float(text)
        except ValueError:
            return text
    return text


def _scalar_or_flow(text: str, no: int) -> Any:
    if text[0] in "[{":
        value, end = _flow(text, 0, no)
        if text[end:].strip():
            raise YAMLError(f"line {no}: unexpected text after a flow collection: {text[end:]!r}")
        return value
    if text[0] in "\"'":
        end = _quoted_end(text, 0, no)
        if text[end + 1:].strip():
            raise YAMLError(f"line {no}: unexpected text after a quoted string: {text!r}")
        return _unquote(text[: end + 1], no)
    if text[0] in "&*!|>":
        raise YAMLError(f"line {no}: {text[0]!r} (anchors, aliases, tags, block scalars) is not supported here")
    return _plain(text)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _flow(text: str, i: int, no: int) -> tuple[Any, int]:
    """One flow node starting at ``text[i]``: its value and the index after it."""
    i = _skip(text, i)
    if i >= len(text):
        raise YAMLError(f"line {no}: unterminated flow collection (multi-line flow is not supported)")
    ch = text[i]
    if ch in "[{":
        close = "]" if ch == "[" else "}"
        items: list[Any] = []
        mapping: dict[str, Any] = {}
        i = _skip(text, i + 1)
        while True:
            if i >= len(text):
                raise YAMLError(f"line {no}: unterminated flow collection (multi-line flow is not supported)")
            if text[i] == close:
                return (items if ch == "[" else mapping), i + 1
            node, i = _flow(text, i, no)
            i = _skip(text, i)
            if ch == "{":
                if i >= len(text) or text[i] != ":":
                    raise YAMLError(f"line {no}: expected ':' after key {node!r} in {text!r}")
                value, i = _flow(text, i + 1, no)
                mapping[str(node)] = value
                i = _skip(text, i)
            else:
                items.append(node)
            if i < len(text) and text[i] == ",":
                i = _skip(text, i + 1)
            elif i < len(text) and text[i] != close:
                raise YAMLError(f"line {no}: expected ',' or {close!r} in {text!r}")
    if ch in "\"'":
        end = _quoted_end(text, i, no)
        return _unquote(text[i:end + 1], no), end + 1
    j = i
    while j < len(text) and text[j] not in ",]}" and not (text[j] == ":" and text[j + 1:j + 2] in (" ", "")):
        j += 1
    return _plain(text[i:j].strip()), j
