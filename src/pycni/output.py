"""How every list and show verb of ``pycni`` prints: one set of formats, one way.

A table by default (the columns a person reads first), ``-o wide`` (the table with more
columns), ``-o json`` (a JSON array of objects: every field, machine-readable), ``-o yaml`` (the
same objects as YAML). A verb describes its rows once — a list of dicts, the columns to show
and the extra ones for wide — and calls :func:`emit`.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Sequence
    from typing import Any, TextIO

FORMATS = ("wide", "json", "yaml")

if TYPE_CHECKING:
    from collections.abc import Callable

    Column = str | Callable[[dict[str, Any]], Any]


def add_output_argument(parser: argparse.ArgumentParser, what: str = "rows") -> None:
    """``-o/--output {wide,json,yaml}`` on a list or show verb."""
    parser.add_argument("-o", "--output", choices=FORMATS, default=None,
                        help=f"how to print the {what}: a table by default; wide: more columns; "
                             "json or yaml: every field")


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, three spaces apart, no trailing blanks."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "(none)"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value)
    return str(value)


def emit(fmt: str | None, items: Sequence[dict[str, Any]], columns: Sequence[tuple[str, Column]],
         wide: Sequence[tuple[str, Column]] = (), out: TextIO | None = None, empty: str = "") -> None:
    """Print ``items`` as ``fmt`` asks. ``columns`` and ``wide`` are (HEADER, field) pairs: the
    table's columns, and those ``-o wide`` adds; a field is a key of the item or a function of it
    (a cell made for people, say "3 (12%)"). json and yaml print every field of every item. With
    no item, a table prints nothing on stdout and ``empty`` (if given) on stderr, so a script
    reading stdout sees no rows, as with json's ``[]``."""
    out = out or sys.stdout
    if not items and fmt in (None, "wide") and empty:
        sys.stderr.write(empty + "\n")
        return
    if fmt == "json":
        import json

        out.write(json.dumps(list(items), indent=2, sort_keys=True) + "\n")
        return
    if fmt == "yaml":
        import yaml

        out.write(yaml.safe_dump(list(items), sort_keys=True, default_flow_style=False))
        return
    cols = list(columns) + (list(wide) if fmt == "wide" else [])
    rows = [[h for h, _ in cols]] + [[cell(f(item) if callable(f) else item.get(f)) for _, f in cols]
                                     for item in items]
    out.write(table(rows) + "\n")


def emit_stream(fmt: str | None, items: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str]],
                widths: Sequence[int], wide: Sequence[tuple[str, str]] = (), wide_widths: Sequence[int] = (),
                out: TextIO | None = None) -> None:
    """Print ``items`` as they come (a verb that follows, e.g. ``pycni flows --follow``): a table
    with a header and fixed column ``widths`` (a longer cell pushes its line only), one JSON
    object a line for json (JSON Lines: a stream has no end to close an array with), one YAML
    document each for yaml. Each line is flushed as it is printed."""
    out = out or sys.stdout
    cols = list(columns) + (list(wide) if fmt == "wide" else [])
    sizes = list(widths) + (list(wide_widths) if fmt == "wide" else [])

    def line(cells: Sequence[str]) -> str:
        return "   ".join(c.ljust(w) for c, w in zip(cells, sizes, strict=True)).rstrip() + "\n"

    if fmt not in ("json", "yaml"):
        out.write(line([h for h, _ in cols]))
        out.flush()
    for item in items:
        if fmt == "json":
            import json

            out.write(json.dumps(item, sort_keys=True) + "\n")
        elif fmt == "yaml":
            import yaml

            out.write("---\n" + yaml.safe_dump(item, sort_keys=True, default_flow_style=False))
        else:
            out.write(line([cell(item.get(f)) for _, f in cols]))
        out.flush()


# Exit statuses, the same for every verb (docs/api.md "Exit status"): 0 done (and the answer is
# yes), EXIT_ERROR with one line ``pycni: <msg> (code N)`` on stderr, EXIT_USAGE for a command line
# argparse refused (with the verb's usage), EXIT_NO when the command worked and its answer is no
# (`policy why` DENIED, `node status` not in sync, `ipam check` inconsistent).
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO = 3
