"""CNI_ARGS: ``K=V;K=V`` pairs, with the ``IgnoreUnknown`` convention. Stdlib only.

Parsing follows Go's types.LoadArgs: every ';'-separated piece must be exactly one
``K=V`` (no empty pieces, no second '='), keys are case-sensitive, a repeated key keeps its
last value, and booleans are 1/0/true/false in any case.
"""

from __future__ import annotations

from collections.abc import Iterable

from pycni.spec.errors import INVALID_ENV, CNIError


def _pairs(raw: str) -> list[tuple[str, str, str]]:
    """(key, value, original piece) for each piece of ``raw``; a malformed piece is code 4."""
    out: list[tuple[str, str, str]] = []
    if not raw:
        return out
    for pair in raw.split(";"):
        kv = pair.split("=")
        if len(kv) != 2:
            raise CNIError(INVALID_ENV, f"ARGS: invalid pair {pair!r}",
                           "CNI_ARGS must be KEY=VALUE pairs separated by ';', each with exactly one '=' "
                           "and no empty pieces")
        out.append((kv[0], kv[1], pair))
    return out


def parse_cni_args(raw: str) -> dict[str, str]:
    """Split CNI_ARGS into a dict (last value of a repeated key wins)."""
    return {key: value for key, value, _ in _pairs(raw)}


def parse_bool(value: str) -> bool:
    low = value.lower()
    if low in ("1", "true"):
        return True
    if low in ("0", "false"):
        return False
    raise CNIError(INVALID_ENV, f"boolean unmarshal error: invalid input {low}", "use true/false or 1/0")


def load_cni_args(raw: str, known: Iterable[str]) -> dict[str, str]:
    """Parse CNI_ARGS keeping only ``known`` keys (plus IgnoreUnknown).

    Unknown keys are an error unless ``IgnoreUnknown`` is true, as in the Go reference.
    Runtimes always pass K8S_POD_* keys with IgnoreUnknown=1.
    """
    pairs = _pairs(raw)
    known_set = set(known) | {"IgnoreUnknown"}
    out: dict[str, str] = {}
    unknown: list[str] = []
    for key, value, pair in pairs:
        if key not in known_set:
            unknown.append(pair)
            continue
        if key == "IgnoreUnknown":
            try:
                parse_bool(value)
            except CNIError as e:
                raise CNIError(INVALID_ENV, f"ARGS: error parsing value of pair {pair!r}: {e.msg}",
                               e.details) from None
        out[key] = value
    ignore = parse_bool(out["IgnoreUnknown"]) if "IgnoreUnknown" in out else False
    if unknown and not ignore:
        listed = " ".join(f'"{p}"' for p in unknown)
        raise CNIError(INVALID_ENV, f"ARGS: unknown args [{listed}]",
                       "pass IgnoreUnknown=1 in CNI_ARGS to let plugins skip keys they do not know")
    return out
