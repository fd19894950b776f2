"""Running the command-line tools that net/ drives (iptables, iptables-restore, nft, tc).

Why not :mod:`subprocess`: importing it (with signal, threading, selectors, locale, warnings)
and :mod:`shutil` for ``which`` (with fnmatch, bz2, lzma) costs a one-shot plugin more CPU
than the tool it runs (measured with ``python -X importtime``; see bench/plugins.py). A tool
call needs none of it: ``posix_spawn`` with the three standard streams redirected, one
``poll`` loop feeding stdin and draining stdout and stderr, ``waitpid``. The child starts in
the calling thread's network namespace, as a forked one does. Stdlib only, imports next to
nothing.
"""

from __future__ import annotations

import os

# Runtimes do not always pass PATH to plugins; look where distributions put these tools too.
SYSTEM_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/local/bin")
_CHUNK = 65536


# Children this process does not wait for (a restore whose commit is read as done, a link
# deletion's helper once the link is unlisted): their exits are the kernel's deferred
# teardown, off the caller's time. Reaped here when they have exited, or by whoever inherits
# them when this (one-shot) process ends first.
_unwaited: list[int] = []


def forget_child(pid: int) -> None:
    """Leave child ``pid`` to finish on its own (reaped by a later :func:`reap_children`)."""
    reap_children()
    _unwaited.append(pid)


def reap_children() -> None:
    """Reap the children left by :func:`forget_child` that have exited (no zombies pile up in a
    long-lived process)."""
    for pid in list(_unwaited):
        try:
            done = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            done = True
        if done:
            try:
                _unwaited.remove(pid)
            except ValueError:  # another thread reaped it first
                pass


class ToolTimeout(Exception):
    """The tool did not finish in time (it has been killed and reaped)."""


def find_tool(name: str) -> str:
    """The path of a command-line tool: on PATH, else in the usual system directories."""
    if os.sep in name:
        return name
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for d in (*dirs, *SYSTEM_DIRS):
        path = os.path.join(d, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return name  # let exec fail with the usual "not found"


def run_tool(argv: list[str], stdin: str | None = None, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run ``argv`` (``argv[0]`` looked up by :func:`find_tool`); (exit status, stdout, stderr).

    Like ``subprocess.run(..., input=stdin, capture_output=True, text=True, timeout=...)``: the
    status is negative for a signal, stdin is /dev/null when ``stdin`` is None, SIGPIPE and
    SIGXFSZ are at their defaults in the child. FileNotFoundError (or another OSError) when
    the tool cannot be started; :class:`ToolTimeout` when it outlives ``timeout``.
    """
    import _signal
    import select
    import time

    path = find_tool(argv[0])
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if stdin is not None else (-1, -1)
    actions: list[tuple[object, ...]] = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    if in_r >= 0:
        actions.append((os.POSIX_SPAWN_DUP2, in_r, 0))
    else:
        actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
    try:
        pid = os.posix_spawn(path, [path, *argv[1:]], os.environ, file_actions=actions,
                             setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ))
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, in_r):
            if fd >= 0:
                os.close(fd)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    data = memoryview((stdin or "").encode())
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    if in_w >= 0:
        if data:
            os.set_blocking(in_w, False)
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = -1
    open_fds = set(chunks) | ({in_w} if in_w >= 0 else set())
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pid = -1
                raise ToolTimeout(f"{argv[0]} did not finish within {timeout:g}s")
            for fd, _events in poller.poll(left * 1000):
                if fd == in_w:
                    try:
                        data = data[os.write(in_w, data[:_CHUNK]):]
                    except BrokenPipeError:
                        data = data[:0]  # the tool stopped reading: its status tells why
                    except BlockingIOError:
                        continue
                    if not data:
                        poller.unregister(in_w)
                        open_fds.discard(in_w)
                        os.close(in_w)
                        in_w = -1
                    continue
                chunk = os.read(fd, _CHUNK)
                if chunk:
                    chunks[fd].append(chunk)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    os.close(fd)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        pid = -1
    finally:
        for fd in open_fds:
            os.close(fd)
        if pid > 0:  # interrupted: leave no zombie behind
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
    return (status, b"".join(chunks[out_r]).decode(errors="replace"),
            b"".join(chunks[err_r]).decode(errors="replace"))
