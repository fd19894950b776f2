"""Undo steps for a half-done change, so a failed ADD leaves nothing behind. Stdlib only.

One way for every plugin: push the undo of each change right after making it; when the
``with`` body raises, the steps run newest first and the original error propagates. A step
that itself fails is skipped (the first error is the one worth reporting), so every other
step still runs::

    with Rollback() as undo:
        res = ipam.add(conf, args); undo.push(ipam.delete, conf, args)
        ...   # anything that raises from here undoes the IPAM reservation
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType
    from typing import Any


class Rollback:
    """Undo steps run newest first when the ``with`` body raises; forgotten when it succeeds."""

    def __init__(self) -> None:
        self._steps: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def push(self, fn: Callable[..., Any], *fn_args: Any) -> None:
        """Undo with ``fn(*fn_args)`` if the block fails."""
        self._steps.append((fn, fn_args))

    def run(self) -> None:
        """Run every step now, newest first, each failure ignored; then forget them.

        For a caller that decides to undo without raising (the ``with`` exit calls this).
        """
        steps, self._steps = self._steps, []
        for fn, fn_args in reversed(steps):
            try:
                fn(*fn_args)
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass

    def __enter__(self) -> Rollback:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.run()
        self._steps.clear()


__all__ = ["Rollback"]
