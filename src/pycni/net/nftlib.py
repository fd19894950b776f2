"""nftables in-process through libnftables (ctypes), for the daemon.

Why: every nftables transaction leaves work for the kernel to reclaim after an RCU grace
period, and closing a netfilter netlink socket waits for that work to finish. An ``nft``
process closes its socket when it exits, so each ``nft -f -`` costs ~10 ms of waiting on
top of its fork and exec, and more on a busy host. The daemon instead keeps one libnftables
context per network namespace open while it is in use, so a port-mapping transaction takes
1-2 ms, and frees it once idle, from a background thread (a call arriving just then waits).

A held context pins its namespace (its socket lives there), so contexts idle for
:data:`IDLE_SECONDS` are released. libnftables keeps some global state, so every call into it
is serialised by one lock; transactions in one namespace serialise in the kernel anyway.
When the library cannot be loaded, :func:`run` returns None and the caller execs ``nft``.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

LIBRARY = "libnftables.so.1"
IDLE_SECONDS = 2.0
OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_load_failed = False
_contexts: dict[tuple[int, int], list[float | int]] = {}  # netns (dev, ino) -> [ctx, last used]
_reaper: threading.Thread | None = None


def _forget_in_child() -> None:
    """After fork (the daemon forks its workers): the parent's contexts, lock and reaper are not ours."""
    global _lock, _reaper
    _lock = threading.Lock()
    _contexts.clear()
    _reaper = None


os.register_at_fork(after_in_child=_forget_in_child)


def _load() -> ctypes.CDLL | None:
    global _lib, _load_failed
    if _lib is None and not _load_failed:
        try:
            lib = ctypes.CDLL(LIBRARY)
        except OSError:
            _load_failed = True
            return None
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        lib.nft_ctx_new.restype, lib.nft_ctx_new.argtypes = vp, [ctypes.c_uint32]
        lib.nft_ctx_free.restype, lib.nft_ctx_free.argtypes = None, [vp]
        lib.nft_ctx_buffer_output.argtypes = lib.nft_ctx_buffer_error.argtypes = [vp]
        lib.nft_ctx_get_output_buffer.restype = lib.nft_ctx_get_error_buffer.restype = cp
        lib.nft_ctx_get_output_buffer.argtypes = lib.nft_ctx_get_error_buffer.argtypes = [vp]
        lib.nft_ctx_output_set_flags.restype, lib.nft_ctx_output_set_flags.argtypes = None, [vp, ctypes.c_uint]
        lib.nft_run_cmd_from_buffer.restype, lib.nft_run_cmd_from_buffer.argtypes = ctypes.c_int, [vp, cp]
        _lib = lib
    return _lib


def available() -> bool:
    return _load() is not None


def _netns_key() -> tuple[int, int]:
    st = os.stat("/proc/thread-self/ns/net")
    return st.st_dev, st.st_ino


def _context(lib: ctypes.CDLL) -> int:
    """The calling thread's namespace's context (made here, so its socket lives there). Under _lock."""
    global _reaper
    key = _netns_key()
    entry = _contexts.get(key)
    if entry is None:
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            raise MemoryError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        entry = _contexts[key] = [ctx, 0.0]
    entry[1] = time.monotonic()
    if _reaper is None:
        _reaper = threading.Thread(target=_reap_idle, name="pycni-nft-reaper", daemon=True)
        _reaper.start()
    return int(entry[0])


def run(args: list[str], stdin: str | None) -> tuple[int, str, str] | None:
    """``nft <args>`` in-process: (exit status, stdout, stderr), or None when this cannot do it.

    Handles the two forms pycni uses, ``-f -`` with the script on stdin and ``-j list ...``."""
    if args == ["-f", "-"] and stdin is not None:
        command, flags = stdin, 0
    elif len(args) > 2 and args[:2] == ["-j", "list"] and stdin is None:
        command, flags = " ".join(args[1:]), OUTPUT_JSON
    else:
        return None
    lib = _load()
    if lib is None:
        return None
    with _lock:
        ctx = _context(lib)
        lib.nft_ctx_output_set_flags(ctx, flags)
        status = lib.nft_run_cmd_from_buffer(ctx, command.encode())
        out = lib.nft_ctx_get_output_buffer(ctx) or b""
        err = lib.nft_ctx_get_error_buffer(ctx) or b""
        lib.nft_ctx_output_set_flags(ctx, 0)
    error = err.decode(errors="replace")
    if status and stdin is not None:
        error = _script_error(stdin, error)
    return (1 if status else 0), out.decode(errors="replace"), error


def _script_error(script: str, error: str) -> str:
    """A failed script's message as ``nft -f -`` words it. libnftables (1.0.6) quotes a buffer's
    first line under every error, whatever line it is on ("syntax error, unexpected newline / add
    table inet t" for a bad third line). A failure callers decide by (:data:`pycni.net.nft.OUTCOMES`:
    absent, exists, busy; some expected on teardown and takeover) keeps its first line only, with
    no exec; any other — the script itself is wrong, never a hot path — is worded by ``nft
    --check`` (nothing applied), which names the line and quotes it."""
    from pycni.net.nft import NFT, OUTCOMES

    lines = error.splitlines()
    if lines and any(s in lines[0] for s in OUTCOMES):
        return lines[0] + "\n"
    from pycni.net.tools import ToolTimeout, run_tool

    try:
        status, out, checked = run_tool([NFT, "--check", "-f", "-"], script, timeout=60)
    except (FileNotFoundError, ToolTimeout):
        return error
    return (checked or out or error) if status != 0 else error


def release_idle(max_idle: float = IDLE_SECONDS) -> int:
    """Free contexts unused for ``max_idle`` seconds (all of them with 0); how many were freed."""
    lib = _load()
    if lib is None:
        return 0
    freed = 0
    with _lock:
        now = time.monotonic()
        for key, (ctx, used) in list(_contexts.items()):
            if now - used >= max_idle:
                del _contexts[key]
                lib.nft_ctx_free(int(ctx))  # closes the socket: waits out pending reclaim, here
                freed += 1
    return freed


def _reap_idle() -> None:
    while True:
        time.sleep(IDLE_SECONDS / 2)
        release_idle()
