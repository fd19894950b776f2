"""CNI_ARGS: ``K=V;K=V`` pairs, with the ``IgnoreUnknown`` convention. Stdlib only."""

from __future__ import annotations

from collections.abc import Iterable

from pycni.spec.errors import INVALID_ENV, CNIError

_TRUE = ("1", "true", "True", "TRUE")
_FALSE = ("0", "false", "False", "FALSE")


def parse_cni_args(raw: str) -> dict[str, str]:
    """Split CNI_ARGS into a dict; a pair without '=' is an error (code 4)."""
    out: dict[str, str] = {}
    if not raw:
        return out
    for pair in raw.split(";"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CNIError(INVALID_ENV, f"ARGS: invalid pair {pair!r}", "CNI_ARGS must be KEY=VALUE pairs separated by ';'")
        out[key] = value
    return out


def parse_bool(value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise CNIError(INVALID_ENV, f"boolean unmarshal error: invalid input {value}", "use true/false or 1/0")


def load_cni_args(raw: str, known: Iterable[str]) -> dict[str, str]:
    """Parse CNI_ARGS keeping only ``known`` keys (plus IgnoreUnknown).

    Unknown keys are an error unless ``IgnoreUnknown`` is true, as in the Go reference.
    Runtimes always pass K8S_POD_* keys with IgnoreUnknown=1.
    """
    pairs = parse_cni_args(raw)
    known_set = set(known) | {"IgnoreUnknown"}
    ignore = parse_bool(pairs["IgnoreUnknown"]) if "IgnoreUnknown" in pairs else False
    unknown = [k for k in pairs if k not in known_set]
    if unknown and not ignore:
        raise CNIError(INVALID_ENV, f"ARGS: unknown args {unknown!r}",
                       "pass IgnoreUnknown=1 in CNI_ARGS to let plugins skip keys they do not know")
    return {k: v for k, v in pairs.items() if k in known_set}
