"""Long-lived ``iptables-restore --noflush`` processes, so the daemon writes the reference's
iptables layout without starting a process per plugin call.

Why: a portmap or ipMasq ADD/DEL is one ``iptables-restore`` transaction, and under the daemon
that process was most of the call. Most of its wall time is not starting it: when an
nf_tables netlink socket that deleted rules or chains is closed, the close waits for the
kernel's deferred release (measured 8-19 ms a DEL, twice per cycle). A process that stays,
keeps its socket and commits each ``COMMIT`` block as it comes, pays neither.

What makes it sound: iptables-nft's restore commits every ``*table ... COMMIT`` block when
it reads the ``COMMIT`` line, checks the ruleset generation at each commit (and re-reads what
changed under it, so another process's rules, the Go plugins' for instance, are seen), and on
any failure prints ``line N failed`` and exits without committing that block. A success prints
nothing, so each block is followed by a comment line, which a restore run with ``-v`` echoes
to its output when it reaches it: lines are handled in order, so the echo comes only after
the commit before it is done. The answer is that echo, or the process's exit (a failure);
it is waited for on the output pipe (poll), so it is read the moment it is written. (An
earlier reading polled ``/proc/<pid>/wchan`` with growing pauses: up to 2 ms late, which
with 1,000 containers' chains, where a commit takes 3-5 ms, was a growth of its own.)

Only for iptables-nft (``(nf_tables)`` in ``--version``): the legacy restore holds the xtables
lock for its whole life. Kept sessions are for where :func:`pycni.net.iptables.keep_sessions`
was called (the daemon). A session lives in one network namespace (it pins it while it lives),
is reused by calls in that namespace, and ends after :data:`IDLE_SECONDS` unused, or when its
owner process exits (its stdin reaches end of file). A restore that does not echo a comment
when a session starts turns sessions off in this process (every call then runs a process).

A one-shot plugin uses the same reading of the answer without keeping anything
(:func:`apply_once`): one process per commit, its input closed at once, and once the echo
says the commit is done the process is not waited for. Its exit is the socket close
that waits for the kernel's deferred release — paid in the background, no longer inside the
plugin call or under the plugin's iptables lock (that wait was most of a one-shot portmap
call, and under 32 parallel ADDs the lock queued every call behind it). The kernel finishes
that release on its own; a later commit's socket close waits for it as before. The process
exits within milliseconds and is reaped by whoever inherits it (init, or the runtime's
subreaper) — or by this process (:func:`pycni.net.tools.reap_children`). Without the echo
the answer is its exit, waited for.
Stdlib only.
"""

from __future__ import annotations

import _thread
import os
import time

from pycni.net.tools import find_tool, forget_child

IDLE_SECONDS = 5.0
WAIT_SECONDS = 90.0  # as long as a one-shot restore may take (pycni.net.iptables)
_START_SECONDS = 2.0  # a new process must have echoed its first comment by then, or sessions are off here
_HELLO = b"#pycni-restore\n"  # the first line a session is sent: its echo says the process reads and echoes

_lock = _thread.allocate_lock()  # not threading's: one-shot calls import this module too
_off_reason = ""  # why sessions cannot work on this machine (set once, then every call execs)
_idle: dict[tuple[object, ...], list[Session]] = {}
_reaper_pid = 0
_nft_binaries: dict[tuple[str, int, int, int], bool] = {}


class Failed(Exception):
    """The block was refused: the process has exited; ``status`` and ``stderr`` are its own."""

    def __init__(self, status: int, stderr: str) -> None:
        super().__init__(stderr)
        self.status = status
        self.stderr = stderr


class Session:
    """One ``iptables-restore --noflush`` process in the calling thread's network namespace."""

    def __init__(self, path: str, key: tuple[object, ...]) -> None:
        import _signal

        self.key = key
        self.lines = 0  # lines sent so far: its error messages count from its start
        self.used = time.monotonic()
        in_r, self._in = os.pipe()
        self._err, err_w = os.pipe()
        try:
            self.pid = os.posix_spawn(path, [path, "-v", "-w", "30", "--noflush"], os.environ,
                                      file_actions=[(os.POSIX_SPAWN_DUP2, in_r, 0),
                                                    (os.POSIX_SPAWN_DUP2, err_w, 1),
                                                    (os.POSIX_SPAWN_DUP2, err_w, 2)],
                                      setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ))
        except BaseException:
            os.close(self._in)
            os.close(self._err)
            raise
        finally:
            os.close(in_r)
            os.close(err_w)
        self.status: int | None = None
        self._acks = 0  # comment lines sent after blocks: each one's echo is awaited
        self._ended = False  # its output reached end of file: the process has exited or is exiting
        self._said: list[bytes] = []  # what it printed so far (read as it comes: a full pipe would stall it)
        os.set_blocking(self._err, False)

    def _await(self, mark: bytes, deadline: float) -> bool:
        """Read its output until the line ``mark`` (True) or its end, i.e. its exit (False)."""
        import select

        poller = select.poll()
        poller.register(self._err, select.POLLIN)
        seen = b""
        while True:
            if self._read_output():
                seen = b"".join(self._said)
                if seen.startswith(mark) or b"\n" + mark in seen:
                    return True
            elif self._ended:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(kill=True)
                raise TimeoutError("iptables-restore did not finish in time")
            poller.poll(left * 1000)

    def _mark(self) -> bytes:
        self._acks += 1
        return b"#pycni-ack %d\n" % self._acks

    def started(self) -> bool:
        """Did the new process echo the comment it was sent (False: sessions cannot work here)?"""
        try:
            self._write(_HELLO)
            self.lines += _HELLO.count(b"\n")
            if self._await(_HELLO, time.monotonic() + _START_SECONDS):
                self._said = []
                return True
            return False
        except TimeoutError:
            return False  # killed and reaped by _await

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._in, view):]
        except BrokenPipeError:
            pass  # it exited part-way: its status and message say why

    def apply(self, text: str, last: bool = False) -> None:
        """Commit ``text`` (whole ``*table ... COMMIT`` blocks); :class:`Failed` when refused.
        ``last``: its input ends after ``text`` (it exits once done; see :func:`apply_once`)."""
        mark = self._mark()
        data = text.encode() + mark
        self._write(data)
        if last:
            os.close(self._in)
            self._in = -1
        ok = self._await(mark, time.monotonic() + WAIT_SECONDS)
        base = self.lines
        self.lines += data.count(b"\n")
        self.used = time.monotonic()
        if ok:
            self._said = []  # a success's chatter (warnings) is not kept
            return
        # Its output ended: it has exited (or is exiting). Without the echo a success is exit 0.
        self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        said = self._drain()
        if self.status != 0:
            raise Failed(self.status, self._renumber(said, base))

    def _read_output(self) -> bool:
        """Take what it printed so far; whether there was anything new."""
        got = False
        while True:
            try:
                chunk = os.read(self._err, 65536)
            except BlockingIOError:
                return got
            if not chunk:
                self._ended = True
                return got
            self._said.append(chunk)
            got = True

    def _drain(self) -> str:
        """All it printed (it has exited: the pipe ends)."""
        if not self._ended:
            os.set_blocking(self._err, True)
            self._read_output()
        said, self._said = b"".join(self._said), []
        return said.decode(errors="replace")

    @staticmethod
    def _renumber(msg: str, base: int) -> str:
        """``line N`` / ``line: N`` as the block's own line number, as a one-shot restore reports it."""
        out, rest = [], msg
        while "line" in rest:
            head, _, rest = rest.partition("line")
            sep = rest[:len(rest) - len(rest.lstrip(": "))]
            rest = rest[len(sep):]
            digits = len(rest) - len(rest.lstrip("0123456789"))
            out.append(head + "line" + sep)
            if digits and sep and not (head and head[-1].isalnum()):
                out.append(str(max(int(rest[:digits]) - base, 1)))
                rest = rest[digits:]
        return "".join(out) + rest

    def _close_pipes(self) -> None:
        for fd in (self._in, self._err):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._in = self._err = -1

    def close(self, kill: bool = False) -> None:
        """End the process: end of input (it exits at once), or SIGKILL; reap it."""
        self._close_pipes()
        if self.status is None:
            if kill:
                try:
                    os.kill(self.pid, 9)
                except ProcessLookupError:
                    pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.status = -9 if kill else 0

    def detach(self) -> None:
        """End of input, and not waited for: its exit (the socket close and the kernel's deferred
        release it waits for) happens after this call returns."""
        self._close_pipes()
        if self.status is None:
            forget_child(self.pid)


def _is_nft(path: str) -> bool:
    """iptables-nft (per resolved file, remembered): only its restore commits per block without a lock."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    ident = (path, st.st_dev, st.st_ino, st.st_mtime_ns)
    known = _nft_binaries.get(ident)
    if known is None:
        from pycni.net.probe import xtables_is_nft

        named = xtables_is_nft(path)  # its --version (a process) only when the name does not say
        if named is not None:
            known = _nft_binaries[ident] = named
            return known
        from pycni.net.tools import run_tool

        try:
            status, out, err = run_tool([path, "--version"], timeout=10)
        except (OSError, Exception):  # noqa: BLE001 - anything odd: no sessions with it
            status, out, err = 1, "", ""
        known = _nft_binaries[ident] = status == 0 and "nf_tables" in out + err
    return known


def _netns_key() -> tuple[int, int]:
    st = os.stat("/proc/thread-self/ns/net")
    return st.st_dev, st.st_ino


def apply(binary: str, text: str) -> bool:
    """Commit ``text`` through a session in the calling thread's namespace; False when sessions
    are not usable for it (the caller runs a process of its own instead). :class:`Failed` when
    the input is refused (nothing of the failing block was committed)."""
    global _off_reason
    if _off_reason:
        return False
    path = find_tool(binary)
    if not _is_nft(path):
        return False
    key = (path, _netns_key())
    with _lock:
        pool = _idle.get(key) or []
        session = pool.pop() if pool else None
    if session is None:
        session = Session(path, key)
        if not session.started():
            session.close(kill=True)
            _off_reason = f"{path} -v did not echo a comment line as expected"
            return False
        _start_reaper()
    try:
        session.apply(text)
    except BaseException:
        session.close(kill=session.status is None)
        raise
    if session.status is not None:  # it answered by exiting (no echo): done, and gone
        session.close()
        return True
    with _lock:
        _idle.setdefault(key, []).append(session)
    return True


def apply_once(binary: str, text: str) -> bool:
    """Commit ``text`` through a process of its own, not waited for once its echo says the
    commit is done (see the module's docstring); False for legacy iptables (the caller runs the
    process and waits for it as before). :class:`Failed` when the input is refused (its process
    has exited and was reaped)."""
    path = find_tool(binary)
    if not _is_nft(path):
        return False
    session = Session(path, ())
    try:
        session.apply(text, last=True)
    except BaseException:
        session.close(kill=session.status is None)
        raise
    if session.status is None:
        session.detach()
    else:
        session.close()  # answered by its exit, already reaped
    return True


def _start_reaper() -> None:
    """One thread per process (a forked worker starts its own) closes sessions left idle."""
    global _reaper_pid
    with _lock:
        if _reaper_pid == os.getpid():
            return
        _reaper_pid = os.getpid()
    import threading

    threading.Thread(target=_reap, name="pycni-restore-reaper", daemon=True).start()


def _reap() -> None:
    while True:
        time.sleep(1.0)
        close_idle(IDLE_SECONDS)


def close_idle(idle: float = 0.0) -> int:
    """Close the sessions unused for ``idle`` seconds (all of them with 0); how many closed."""
    now = time.monotonic()
    stale: list[Session] = []
    with _lock:
        for key, pool in list(_idle.items()):
            keep = [s for s in pool if now - s.used < idle]
            stale += [s for s in pool if now - s.used >= idle]
            if keep:
                _idle[key] = keep
            else:
                del _idle[key]
    for s in stale:
        s.close()
    return len(stale)


def count() -> int:
    """Sessions alive and idle in this process (for tests and the profile)."""
    with _lock:
        return sum(len(p) for p in _idle.values())
