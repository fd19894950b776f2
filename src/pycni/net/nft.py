"""nftables through the ``nft`` command: one ``nft -f -`` transaction per call, JSON listings.

The kernel applies a script atomically: either every command in it takes effect or none does,
so a failed ADD leaves nothing half-made. Commands run in the calling thread's network
namespace (a process forked inside :func:`pycni.net.netns.enter` inherits it). Stdlib only.
"""

from __future__ import annotations

from pycni.net.tools import SYSTEM_DIRS, ToolTimeout, find_tool, run_tool
from pycni.spec.errors import IO_FAILURE, TRY_AGAIN, CNIError

TYPE_CHECKING = False  # true for mypy only (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["SYSTEM_DIRS", "find_tool"]  # re-exported: they lived here first

NFT = "nft"
# knftables' limit, which the Go reference applies to its comments; the kernel allows 128 bytes.
COMMENT_MAX = 128
# nft's stderr when the object a command names does not exist.
_NOT_FOUND = ("No such file or directory", "does not exist")
_BUSY = ("Resource temporarily unavailable", "Interrupted system call")
# the failures callers decide by (NftError's properties; some are expected, on teardown and takeover)
OUTCOMES = (*_NOT_FOUND, "File exists", *_BUSY)
_in_process = False  # see use_library()


class NftError(CNIError):
    """An ``nft`` command failed; ``stderr`` is nft's own explanation."""

    def __init__(self, code: int, msg: str, stderr: str) -> None:
        super().__init__(code, msg, stderr.strip())
        self.stderr = stderr

    @property
    def not_found(self) -> bool:
        return any(s in self.stderr for s in _NOT_FOUND)

    @property
    def exists(self) -> bool:
        return "File exists" in self.stderr

    @property
    def interrupted(self) -> bool:
        """The kernel's answer was cut short because the ruleset changed while it was read
        (NLM_F_DUMP_INTR, which nft reports as EINTR): asking again is the remedy."""
        return "Interrupted system call" in self.stderr

    @property
    def overlaps(self) -> bool:
        """An interval element overlapping one already in its set (nft's own check)."""
        return "overlaps with an existing" in self.stderr


def use_library(enabled: bool = True) -> bool:
    """Run nftables in-process through libnftables from now on (the daemon does); whether it can."""
    global _in_process
    if enabled:
        from pycni.net import nftlib

        enabled = nftlib.available()
    _in_process = enabled
    return enabled


def _exec(args: list[str], stdin: str | None, what: str, code: int) -> str:
    done = None
    if _in_process:
        from pycni.net import nftlib

        done = nftlib.run(args, stdin)
    if done is not None:
        status, out, err = done
    else:
        status, out, err = _exec_tool(args, stdin, what)
    if status != 0:
        err = err or out
        if any(s in err for s in _BUSY):
            code = TRY_AGAIN
        raise NftError(code, f"nftables {what} failed", err)
    return out


def _exec_tool(args: list[str], stdin: str | None, what: str) -> tuple[int, str, str]:
    try:
        return run_tool([NFT, *args], stdin, timeout=60)
    except FileNotFoundError:
        raise NftError(IO_FAILURE, "nft command not found",
                       "install the nftables package (the nft binary) or choose the iptables backend") from None
    except ToolTimeout:
        raise NftError(TRY_AGAIN, f"nft timed out during {what}", "nft did not answer within 60s") from None


def run(script: str, *, code: int = IO_FAILURE, what: str = "transaction") -> None:
    """Apply ``script`` as one atomic transaction (``nft -f -``); raise :class:`NftError` on failure."""
    _exec(["-f", "-"], script, what, code)


def list_json(*args: str, missing_ok: bool = False) -> dict[str, Any]:
    """``nft -j list <args>`` parsed; with ``missing_ok`` a missing object lists as empty.

    With ``missing_ok``, a table or chain listing whose table or chain does not exist is answered
    without running nft (:mod:`pycni.net.probe`): DELs look for the layout they did not make (the
    nftables one under the iptables default, and back), and that is the usual answer. Not with
    libnftables in-process (the daemon): its socket stays open, whereas closing the probe's
    socket waits for the kernel to release what earlier commits deleted (6-8 ms after a
    restore session's DEL: a session never closes its own socket to pay it there).
    """
    if missing_ok and not _in_process and len(args) in (3, 4) \
            and args[0] == ("table" if len(args) == 3 else "chain"):
        from pycni.net import probe

        if probe.nft_object_exists(*args[1:]) is False:
            return {"nftables": []}
    try:
        out = _exec(["-j", "list", *args], None, f"list {' '.join(args)}", IO_FAILURE)
    except NftError as e:
        if missing_ok and e.not_found:
            return {"nftables": []}
        raise
    from pycni import jsonlite

    try:
        data = jsonlite.loads(out) if out.strip() else {"nftables": []}
    except ValueError as e:
        raise NftError(IO_FAILURE, "cannot parse nft JSON output", str(e)) from None
    if not isinstance(data, dict):
        raise NftError(IO_FAILURE, "cannot parse nft JSON output", f"expected an object, got {out[:200]!r}")
    return data


def objects(listing: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The ``kind`` objects ("rule", "chain", "set", "map", "table", ...) of a JSON listing."""
    return [item[kind] for item in listing.get("nftables", []) if isinstance(item, dict) and kind in item]


def rules(listing: dict[str, Any]) -> list[dict[str, Any]]:
    return objects(listing, "rule")


def table_exists(family: str, table: str) -> bool:
    return bool(objects(list_json("table", family, table, missing_ok=True), "table"))


def chain_exists(family: str, table: str, chain: str) -> bool:
    return bool(objects(list_json("chain", family, table, chain, missing_ok=True), "chain"))


def quote(text: str, limit: int = COMMENT_MAX) -> str:
    """``text`` as an nft string literal: nft strings cannot escape quotes, so drop them."""
    clean = "".join(ch for ch in text if ch not in '"\\\n\r')
    return '"' + clean.encode()[:limit].decode(errors="ignore") + '"'
