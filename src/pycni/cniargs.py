"""CNI_ARGS: ``K=V;K=V`` pairs, with the ``IgnoreUnknown`` convention. Stdlib only.

Two sides, one module. A plugin reads CNI_ARGS as Go's types.LoadArgs does
(:func:`parse_cni_args`, :func:`load_cni_args`): every ';'-separated piece must be exactly one
``K=V`` (no empty pieces, no second '='), keys are case-sensitive, a repeated key keeps its
last value, and booleans are 1/0/true/false in any case. A runtime builds CNI_ARGS from what
its user typed as cnitool does (:func:`runtime_args`).
"""

from __future__ import annotations

from pycni.spec.errors import INVALID_ENV, CNIError

TYPE_CHECKING = False  # not typing's: this module is on plugins' one-shot start path
if TYPE_CHECKING:
    from collections.abc import Iterable


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
    """Split CNI_ARGS into a dict (last value of a repeated key wins).

    An empty key names no argument and a non-boolean ``IgnoreUnknown`` is refused, as Go's
    LoadArgs refuses both whatever the plugin's own keys are.
    """
    out = {}
    for key, value, pair in _pairs(raw):
        if not key:
            raise CNIError(INVALID_ENV, f"ARGS: invalid pair {pair!r}", "a CNI_ARGS key cannot be empty")
        if key == "IgnoreUnknown":
            _ignore_unknown(value, pair)
        out[key] = value
    return out


def parse_bool(value: str) -> bool:
    low = value.lower()
    if low in ("1", "true"):
        return True
    if low in ("0", "false"):
        return False
    raise CNIError(INVALID_ENV, f"boolean unmarshal error: invalid input {low}", "use true/false or 1/0")


def _ignore_unknown(value: str, pair: str) -> bool:
    """``IgnoreUnknown``'s value; any other value than a boolean is refused, as Go's LoadArgs does."""
    try:
        return parse_bool(value)
    except CNIError as e:
        raise CNIError(INVALID_ENV, f"ARGS: error parsing value of pair {pair!r}: {e.msg}", e.details) from None


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
            _ignore_unknown(value, pair)
        out[key] = value
    ignore = parse_bool(out["IgnoreUnknown"]) if "IgnoreUnknown" in out else False
    if unknown and not ignore:
        listed = " ".join(f'"{p}"' for p in unknown)
        raise CNIError(INVALID_ENV, f"ARGS: unknown args [{listed}]",
                       "pass IgnoreUnknown=1 in CNI_ARGS to let plugins skip keys they do not know")
    return out


def runtime_args(raw: str) -> list[tuple[str, str]]:
    """A runtime's CNI_ARGS text as ordered pairs (code 4 when malformed).

    cnitool's rules, a little wider: each piece is ``KEY=VALUE`` with a non-empty key and
    value; the value may itself hold '=' (split at the first); empty pieces (a trailing ';')
    are skipped. Pairs are passed on as given, repeated keys included: whether a plugin
    accepts them is the plugin's side (:func:`load_cni_args`).
    """
    pairs = []
    for piece in raw.split(";"):
        if not piece:
            continue
        key, sep, value = piece.partition("=")
        if not sep or not key or not value:
            raise CNIError(INVALID_ENV, f"invalid CNI_ARGS pair {piece!r}",
                           "CNI_ARGS must be KEY=VALUE pairs separated by ';', each with a non-empty key "
                           "and value")
        pairs.append((key, value))
    return pairs
