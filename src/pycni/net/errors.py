"""Where kernel errors become CNI errors: the one mapping point of the ``pycni.net`` layer.

Plugins never see an ``OSError`` or a netlink exception from a kernel refusal; every
``pycni.net`` function that asks the kernel for a change wraps the request in
:class:`kernel_errors`, which turns the refusal into ``CNIError(INTERNAL, failure, why)``
(the Go reference reports such failures as code 999 too). Anything else — a bug, a
``CNIError`` already raised — passes through untouched. Stdlib only.

    with kernel_errors(f"failed to add IP addr {addr} to {name!r}", ignore=(errno.EEXIST,)):
        sock.addr("add", **kw)
"""

from __future__ import annotations

from pycni.spec.errors import INTERNAL, CNIError

TYPE_CHECKING = False  # not typing's: this module is on plugins' one-shot start path
if TYPE_CHECKING:
    from types import TracebackType


def netlink_errno(exc: BaseException) -> int | None:
    """The errno of a netlink refusal (:class:`pycni.net.nl.NetlinkError`, or any OSError), else None."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    if isinstance(exc, OSError):
        return exc.errno
    return None


def is_netlink_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a kernel refusal (to report as a CNIError) rather than a bug."""
    return isinstance(exc, OSError)  # pycni.net.nl.NetlinkError is one


class kernel_errors:  # noqa: N801 - used like contextlib.suppress
    """Context manager: a kernel refusal in the body becomes ``CNIError(code, failure, ...)``.

    ``ignore``: errnos that mean "already so" (EEXIST on add, ENODEV on delete): the body stops
    there and the block succeeds; :attr:`ignored` then holds the errno, so a caller can tell.
    ``details`` replaces the kernel's message in the error (default: the kernel's message).
    """

    __slots__ = ("failure", "details", "code", "ignore", "ignored")

    def __init__(self, failure: str, details: str = "", *, ignore: tuple[int, ...] = (),
                 code: int = INTERNAL) -> None:
        self.failure = failure
        self.details = details
        self.code = code
        self.ignore = ignore
        self.ignored: int | None = None

    def __enter__(self) -> kernel_errors:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None or isinstance(exc, CNIError) or not is_netlink_error(exc):
            return False
        err = netlink_errno(exc)
        if err is not None and err in self.ignore:
            self.ignored = err
            return True
        raise CNIError(self.code, self.failure, self.details or str(exc)) from None


__all__ = ["kernel_errors", "is_netlink_error", "netlink_errno"]
