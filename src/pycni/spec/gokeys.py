"""Go's ``encoding/json`` key matching, the one place pycni reads a JSON object's keys. Stdlib only.

Why: the Go plugins and libcni decode configs and results into structs, and Go matches an
object's keys to a struct's fields without regard to letter case. Runtimes rely on it —
containerd's CRI sends ``{"HostPort": 8080, "ContainerPort": 80}`` in ``runtimeConfig`` and
``{"IngressRate": ..., "IngressBurst": ...}`` for bandwidth, the reference's own tests write
``"RuntimeConfig"`` — so a reader that looks up only the camelCase spelling silently ignores
what the runtime asked for.

The rule, from Go's ``decode.go`` (``object``) and ``fold.go``, for an object decoded into a
struct with a field named ``name``:

* each key of the object, in document order, is given to the field whose name equals it
  exactly, else to a field whose name equals it under Unicode simple case folding (for the
  ASCII names used here: ASCII letters in either case, plus ``K`` U+212A KELVIN SIGN for ``k``
  and ``ſ`` U+017F LATIN SMALL LETTER LONG S for ``s``; digits and punctuation must match);
* every key given to the field is decoded into it in turn, so **the last one wins** — an
  exact spelling has no priority over a folded one that comes after it. A JSON ``null`` leaves
  a scalar field as it was (it is skipped here), and two objects given to one field are
  merged (here: shallowly, the later's keys over the earlier's).

What Go reads as a *map* keeps exact keys (a conflist's top level in libcni, ``capabilities``'s
entries, tuning's ``sysctl`` names, ``args``' free-form values): those are read with ``dict.get``,
not with :func:`lookup`. docs/sdk.md lists which is which.

Cost: one pass over the object's keys comparing lengths (a folded key has the same length as
the name in Python), ``str.lower`` only for the keys of that length; no ``re``. Measured here
(CPU time, best of 9): a whole ``parse_conf`` costs 7 µs more than with ``dict.get`` for bridge
(21 -> 28 µs), 11 µs for portmap with a prevResult (40 -> 51 µs) — a fraction of a percent
of a one-shot call. An "exact key first" shortcut (counting key lengths in C first) measured
slower: a later key in another case still wins in Go, so the keys are looked at either way.


"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

_ABSENT: Any = object()


def fold(key: str) -> str:
    """``key`` folded as Go compares it with an ASCII field name (``fold(a) == fold(b)``)."""
    low = key.lower()  # U+212A KELVIN SIGN lowers to "k" already
    return low if low.isascii() else low.replace("\u017f", "s")


def lookup(obj: Any, name: str, default: Any = None) -> Any:
    """The value Go's decoder would put in the struct field ``name`` of ``obj``; ``default`` when
    no key names it (or ``obj`` is not an object, or every key naming it holds ``null``)."""
    if not isinstance(obj, dict):
        return default
    n = len(name)
    folded = ""
    found = _ABSENT
    for key in obj:
        if len(key) != n:
            continue
        if key != name:
            if not folded:
                folded = name.lower()
            if fold(key) != folded:
                continue
        value = obj[key]
        if value is None:
            continue
        if isinstance(found, dict) and isinstance(value, dict):
            value = {**found, **value}  # Go decodes the second object into the first
        found = value
    return default if found is _ABSENT else found


def has(obj: Any, name: str) -> bool:
    """Is some key of ``obj`` given to the field ``name`` (``null`` counts, as Go allocates an
    embedded pointer for it)?"""
    if not isinstance(obj, dict):
        return False
    if name in obj:
        return True
    folded = name.lower()
    return any(len(key) == len(name) and fold(key) == folded for key in obj)


__all__ = ["fold", "lookup", "has"]
