"""The pycni daemon: runs plugin handlers in-process with imports and netlink warm.

Each connection is one plugin invocation forwarded by a shim (see :mod:`pycni.shim`). The
daemon learns the caller's pid from the socket's peer credentials and performs the request in
that process's network namespace, so a plugin behaves exactly as if it had run in the shim.
Requests run concurrently on threads (netns switches are per-thread), but never two for the
same attachment (container ID and interface) at once; a failing request becomes an error
reply, never a dead daemon.
Only root and the daemon's own user may connect.

Operating rules (docs/daemon.md): one daemon per socket, claimed with an flock on
``<socket>.lock`` and never taken over from a daemon that answers; every read from a client is
bounded in time; a stop lets requests in flight finish within a bound; worker processes never
outlive the main one.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager, nullcontext

from pycni.daemon import protocol
from pycni.daemon.options import READ_TIMEOUT, STOP_TIMEOUT
from pycni.net import netns
from pycni.plugins.registry import PLUGIN_MODULES, load
from pycni.shim import run_delegate
from pycni.skel import Outcome, Plugin, dispatch
from pycni.spec.errors import INTERNAL, INVALID_ENV, IO_FAILURE, TRY_AGAIN, CNIError
from pycni.unixsock import AlreadyServing, Refused, listen, socket_answers, unlisten
from pycni.unixsock import activated_socket as _activated_socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from pycni.daemon.metrics import DaemonMetrics

log = logging.getLogger("pycni.daemon")
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

STOP_GRACE = 1.0      # seconds a connection still sending its request gets once stopping
_POLL = 0.25          # how often a blocked read looks at the stop flag
MAX_CONNECTIONS = 512  # per process: beyond this a connection is answered "try again" at once
EXIT_REFUSED = 3      # exit status of a daemon that refuses to start (see docs/daemon.md)
# Capabilities every request needs: setns into the caller's namespace, then links, addresses,
# routes, sysctls and firewall rules there.
NEEDED_CAPS = ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN"))
PR_SET_PDEATHSIG = 1


class ContainerLocks:
    """One lock per container ID, created on demand and dropped when unused."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users <= 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class StripedFileLocks:
    """Per-container exclusion across worker processes: flock on one of ``stripes`` files.

    A container ID hashes to a stripe, so two containers rarely share one (and if they do, they
    are merely serialised). flock locks belong to an open file description, so threads of one
    process exclude each other too. The file count is bounded, nothing is ever unlinked while
    in use (unlinking lock files races with flock).
    """

    def __init__(self, directory: str, stripes: int = 256) -> None:
        self.directory, self.stripes = directory, stripes

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        import zlib

        from pycni.lockfile import flocked

        with flocked(os.path.join(self.directory, f"{zlib.crc32(key.encode()) % self.stripes:03d}.lock"),
                     create=True):
            yield


class SocketClaim:
    """Who serves a socket path: an exclusive flock on ``<socket>.lock``, held for the daemon's life.

    Worker processes inherit the descriptor, so the claim lasts until the last of them is gone
    (even if the main process was killed). The file holds the owner's pid for messages and is
    removed on release; since removing a lock file races with a newcomer that opened it just
    before, :meth:`try_acquire` keeps a lock only on the file that is still at the path.
    """

    def __init__(self, socket_path: str) -> None:
        self.path = socket_path + ".lock"
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        while True:
            # O_NOFOLLOW: the pid is written into it, so a planted symlink must not redirect that
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            if _same_file(fd, self.path):
                break
            os.close(fd)  # released and removed by its previous owner meanwhile: take the new file
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        """The pid written by the current owner ("?" when unknown)."""
        try:
            with open(self.path) as f:
                return f.read().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._fd is None:
            return
        if _same_file(self._fd, self.path):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _already_serving(path: str) -> Refused:
    return Refused(f"another pycni daemon already serves {path} (one daemon per socket): stop it first, "
                   "or give this one another --socket")


class Daemon:
    """Serves forwarded plugin invocations on a unix socket."""

    def __init__(self, socket_path: str = protocol.DEFAULT_SOCKET, preload: bool = True,
                 read_timeout: float = READ_TIMEOUT, stop_timeout: float = STOP_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.socket_path = socket_path
        self.read_timeout, self.stop_timeout = read_timeout, stop_timeout
        self.max_connections = max_connections
        self._busy = False
        self._lingering: list[tuple[float, socket.socket]] = []  # turned away, closed a moment later
        self.locks = ContainerLocks()
        self.plugins: dict[str, Plugin] = {}
        self._plugins_guard = threading.Lock()
        self._stop = threading.Event()
        self._stopping_at: float | None = None
        self._sock: socket.socket | None = None
        self._owned: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket file we bound
        self._claim: SocketClaim | None = None
        self._active: set[threading.Thread] = set()
        self._active_guard = threading.Lock()
        self.process_locks: StripedFileLocks | None = None  # set when serving with worker processes
        self.metrics: DaemonMetrics | None = None  # set by run() with --metrics-address
        self.metrics_server: WSGIServer | None = None  # the main process's; workers close their copy
        if preload:
            self.preload()

    def preload(self) -> None:
        """Import every plugin (and with them the net/ layer) once, up front."""
        for name in PLUGIN_MODULES:
            try:
                self._plugin(name)
            except Exception as e:  # noqa: BLE001 - a plugin that fails to import is reported per request
                log.warning("plugin %s not preloaded: %s", name, e)

    def _plugin(self, name: str) -> Plugin:
        with self._plugins_guard:
            plugin = self.plugins.get(name)
            if plugin is None:
                plugin = load(name)
                self.plugins[name] = plugin
            return plugin

    # ---- owning the socket -----------------------------------------------------------------
    def claim(self, wait: float | None = None) -> None:
        """Claim the socket path (see :class:`SocketClaim`); :class:`Refused` when it is someone else's.

        A socket that answers belongs to a live daemon and is never taken over. The claim closes
        the race between two daemons starting together; a claim still held by a daemon that no
        longer answers (its workers finishing their last requests) is waited for, up to
        ``wait`` seconds (by default a stop's bound and a little more).
        """
        if self._claim is not None:
            return
        path = self.socket_path
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            # pycni's own runtime directory is made (as systemd's RuntimeDirectory would); any other
            # must exist: a mistyped --socket must not leave directories behind on the root file system
            if directory != os.path.dirname(protocol.DEFAULT_SOCKET):
                raise Refused(f"the socket's directory {directory} does not exist: create it first, or give "
                              f"--socket a path in an existing directory (only pycni's own "
                              f"{os.path.dirname(protocol.DEFAULT_SOCKET)} is created)")
            os.makedirs(directory, mode=0o755, exist_ok=True)
        if socket_answers(path):
            raise _already_serving(path)
        self._take_claim(self.stop_timeout + 5 if wait is None else wait, probe=True)

    def bind(self) -> None:
        """Claim the socket path (unless :meth:`claim` did) and listen on it.

        A stale socket (one that refuses connections: its daemon was killed) is replaced; the
        inode bound is remembered so that only that socket is ever removed.
        """
        path = self.socket_path
        self.claim()
        try:
            if socket_answers(path) is False:
                log.info("replacing the stale socket %s", path)
            self._sock, self._owned = listen(path, 0o600)  # pycni.unixsock: the one careful listener
        except AlreadyServing:
            self._release()
            raise _already_serving(path) from None
        except BaseException:
            self._release()
            raise

    def adopt(self, sock: socket.socket) -> None:
        """Serve a listening socket passed by systemd (socket activation): never re-bound or removed."""
        name = sock.getsockname()
        if isinstance(name, str) and name:
            self.socket_path = name
        self._take_claim(self.stop_timeout + 5, probe=False)  # held: our predecessor's workers finishing
        self._sock, self._owned = sock, None
        log.info("pycni daemon: serving %s passed by systemd (socket activation)", self.socket_path)

    def _take_claim(self, wait: float, probe: bool) -> None:
        claim = SocketClaim(self.socket_path)
        deadline = time.monotonic() + wait
        while not claim.try_acquire():
            if probe and socket_answers(self.socket_path):
                raise _already_serving(self.socket_path)
            if time.monotonic() >= deadline:
                raise Refused(f"pycni daemon pid {claim.holder()} still holds {claim.path} without answering on "
                              f"{self.socket_path}; wait for it to exit (or kill it) and start again")
            time.sleep(0.1)
        self._claim = claim

    def _unlisten(self) -> None:
        """Take no more connections: close the listening socket, remove its path if it is still ours."""
        if unlisten(self._sock, self.socket_path, self._owned) is False:
            log.warning("%s was replaced by another socket meanwhile; leaving it", self.socket_path)
        self._sock, self._owned = None, None

    def _release(self) -> None:
        """Give up the claim and the per-container lock files (after every worker has exited)."""
        if self.process_locks is not None:
            import shutil

            shutil.rmtree(self.process_locks.directory, ignore_errors=True)
            self.process_locks = None
        if self.metrics is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR") == self.socket_path + ".metrics":
            import shutil

            shutil.rmtree(self.socket_path + ".metrics", ignore_errors=True)
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    # ---- serving ---------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve in this process until :meth:`stop`; then let requests in flight finish and let go."""
        self._accept_loop()
        self._unlisten()
        left = self.drain()
        if left:
            log.warning("%d request(s) still running after %g s; exiting anyway", left, self.stop_timeout)
        self._release()
        log.info("pycni daemon stopped")

    def _accept_loop(self) -> None:
        if self._sock is None:
            self.bind()
        assert self._sock is not None
        self._sock.settimeout(0.5)
        log.info("pycni daemon listening on %s (pid %d)", self.socket_path, os.getpid())
        while not self._stop.is_set():
            if self._lingering:
                self._close_lingering()
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            with self._active_guard:
                busy = len(self._active) >= self.max_connections
                if not busy:
                    t = threading.Thread(target=self._serve_conn, args=(conn,), daemon=True)
                    self._active.add(t)
            if busy:
                self._turn_away(conn)
                continue
            if self._busy:
                log.info("pycni daemon pid %d: taking connections again", os.getpid())
                self._busy = False
            try:
                t.start()
            except RuntimeError as e:  # no thread to be had (limits): this one client is turned away
                with self._active_guard:
                    self._active.discard(t)
                self._turn_away(conn, str(e))
        self._close_lingering(everything=True)
        log.info("pycni daemon pid %d: no longer accepting", os.getpid())

    def _turn_away(self, conn: socket.socket, why: str = "") -> None:
        """Answer "try again" without reading the request (on the accepting thread: never blocks long)."""
        if not self._busy:
            log.warning("pycni daemon pid %d: %s; answering new connections \"try again\"", os.getpid(),
                        why or f"{self.max_connections} connections open")
            self._busy = True
        outcome = _error_outcome(CNIError(TRY_AGAIN, "pycni daemon is busy",
                                          why or f"{self.max_connections} connections open; retry"))
        try:
            conn.settimeout(0.1)
            conn.sendall(protocol.encode_reply(outcome.exit_code, outcome.stdout, outcome.stderr))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()
            return
        # Closed now, the client's request (sent just after connecting) would meet a closed
        # socket and the client a broken pipe instead of this answer: close it a second later.
        if len(self._lingering) < self.max_connections:
            self._lingering.append((time.monotonic() + 1.0, conn))
        else:
            conn.close()

    def _close_lingering(self, everything: bool = False) -> None:
        now, keep = time.monotonic(), []
        for deadline, conn in self._lingering:
            if everything or now >= deadline:
                conn.close()
            else:
                keep.append((deadline, conn))
        self._lingering = keep

    def serve_workers(self, workers: int) -> None:
        """Serve from ``workers`` forked processes sharing the listening socket (one GIL each).

        Plugin work in the daemon is mostly waiting on the kernel and on nft/iptables, but the
        Python part of many concurrent requests would queue on one GIL; forked workers (warm:
        they inherit the preloaded imports) spread it over the CPUs. Per-container exclusion
        then needs a cross-process lock (:class:`StripedFileLocks`, files beside the socket).
        The parent only supervises: it restarts a worker that dies; on stop it stops listening,
        has the workers finish their requests (bounded), and removes the socket and lock files.
        Workers never outlive it: the kernel sends them SIGTERM when it dies
        (``PR_SET_PDEATHSIG``), and a pipe whose only writer is the parent reaches end-of-file
        then, which covers a parent that dies before a new worker has asked for the signal.
        """
        if workers <= 1:
            self.serve_forever()
            return
        if self._sock is None:
            self.bind()
        self.process_locks = StripedFileLocks(self.socket_path + ".locks")
        parent = os.getpid()
        lifeline_r, lifeline_w = os.pipe()
        children: set[int] = set()

        def spawn() -> None:
            pid = os.fork()
            if pid == 0:  # worker
                code = 0
                try:
                    os.close(lifeline_w)
                    self._work(parent, lifeline_r)
                except BaseException:  # noqa: BLE001 - a worker never returns into the parent's code
                    log.exception("worker failed")
                    code = 1
                finally:
                    os._exit(code)
            children.add(pid)

        try:
            for _ in range(workers):
                spawn()
            log.info("pycni daemon: %d workers on %s", workers, self.socket_path)
            while not self._stop.is_set():
                time.sleep(0.2)  # not Event.wait: the SIGTERM handler sets that event on this thread
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    children.discard(pid)
                    if self.metrics is not None:
                        from prometheus_client import multiprocess

                        multiprocess.mark_process_dead(pid)  # its in-flight gauge no longer counts
                    if not self._stop.is_set():
                        log.warning("worker %d exited (status %#x); starting another", pid, status)
                        spawn()
        finally:
            self._unlisten()
            os.close(lifeline_w)  # workers see end-of-file: stop (SIGTERM follows for good measure)
            os.close(lifeline_r)
            self._stop_workers(children)
            self._release()
            log.info("pycni daemon stopped")

    def _stop_workers(self, children: set[int]) -> None:
        """SIGTERM, then up to ``stop_timeout`` (and a little) for their requests, then SIGKILL."""
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.stop_timeout + 2
        while children and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                children.discard(pid)
            else:
                time.sleep(0.05)
        for pid in children:
            log.warning("worker %d did not stop in time; killing it", pid)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def _work(self, parent: int, lifeline: int) -> None:
        """A worker's life: serve until stopped or orphaned, finish requests in flight (bounded)."""
        self._owned = None  # the socket file is the parent's to remove
        if self.metrics_server is not None:  # the main process serves the metrics
            self.metrics_server.socket.close()
            self.metrics_server = None
        _signal_on_parent_death(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        threading.Thread(target=self._watch_lifeline, args=(lifeline, parent), daemon=True).start()
        if os.getppid() != parent:  # died before the signal was asked for
            self.stop()
        self._accept_loop()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        left = self.drain()
        if left:
            log.warning("worker %d: %d request(s) still running after %g s; exiting anyway",
                        os.getpid(), left, self.stop_timeout)

    def _watch_lifeline(self, fd: int, parent: int) -> None:
        try:
            while os.read(fd, 1):  # nothing is ever written: this returns b"" when the parent is gone
                pass
        except OSError:
            pass
        if os.getppid() != parent:
            log.warning("worker %d: the main process is gone; stopping", os.getpid())
        self.stop()

    def drain(self, timeout: float | None = None) -> int:
        """Wait for requests in flight (after stop), ``stop_timeout`` in all; how many still run."""
        deadline = time.monotonic() + (self.stop_timeout if timeout is None else timeout)
        with self._active_guard:
            threads = list(self._active)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in threads)

    def stop(self) -> None:
        """Stop accepting; safe from a signal handler."""
        if self._stopping_at is None:
            self._stopping_at = time.monotonic()
        self._stop.set()

    # ---- one connection --------------------------------------------------------------------
    def _serve_conn(self, conn: socket.socket) -> None:
        try:
            pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            outcome: Outcome | None = None
            try:
                body = self._read_request(conn)
            except TimeoutError as e:
                log.warning("pid %d: %s", pid, e)
                outcome = _error_outcome(CNIError(TRY_AGAIN, str(e), "the request was not run; retry"))
            except (ValueError, ConnectionError) as e:
                log.warning("malformed request from pid %d: %s", pid, e)
                outcome = _error_outcome(CNIError(INVALID_ENV, "malformed daemon request", str(e)))
            else:
                if body is None:  # connected and closed without a word: a liveness probe
                    return
            if uid not in (0, os.getuid()):
                log.warning("refused connection from uid %d (pid %d)", uid, pid)
                outcome = _error_outcome(CNIError(INVALID_ENV, "permission denied",
                                                  "only root or the daemon's user may use the pycni daemon"))
            elif outcome is None and body is not None:
                try:
                    name, stdin, env = protocol.decode_request(body)
                except (ValueError, UnicodeDecodeError) as e:
                    log.warning("malformed request from pid %d: %s", pid, e)
                    outcome = _error_outcome(CNIError(INVALID_ENV, "malformed daemon request", str(e)))
                else:
                    outcome = self.handle(name, env, stdin, pid)
            assert outcome is not None
            conn.settimeout(self.read_timeout)  # a client that never reads its reply does not hold us
            conn.sendall(protocol.encode_reply(outcome.exit_code, outcome.stdout, outcome.stderr))
        except Exception as e:  # noqa: BLE001 - one broken client must not take the daemon down
            log.warning("request failed: %s: %s", type(e).__name__, e)
        finally:
            conn.close()
            with self._active_guard:
                self._active.discard(threading.current_thread())

    def _read_request(self, conn: socket.socket) -> bytes | None:
        """The request's body; None when the peer closed before sending anything.

        The whole request must arrive within ``read_timeout`` (TimeoutError otherwise), and
        within :data:`STOP_GRACE` of a stop: a client that connects and never sends, or sends
        slowly, holds a thread only that long and never holds up a shutdown.
        """
        deadline = time.monotonic() + self.read_timeout
        header = self._recv(conn, 4, deadline, eof_ok=True)
        if not header:
            return None
        length = int.from_bytes(header, "big")
        if length > protocol.MAX_FRAME:
            raise ValueError(f"frame of {length} bytes exceeds the {protocol.MAX_FRAME}-byte limit")
        return self._recv(conn, length, deadline)

    def _recv(self, conn: socket.socket, n: int, deadline: float, eof_ok: bool = False) -> bytes:
        """Exactly ``n`` bytes by ``deadline`` (b"" when ``eof_ok`` and the peer closed before the first)."""
        chunks: list[bytes] = []
        got = 0
        while got < n:
            now, end = time.monotonic(), deadline
            stopping = self._stopping_at
            if stopping is not None:
                end = min(end, stopping + STOP_GRACE)
            if now >= end:
                if stopping is not None:
                    raise TimeoutError("pycni daemon is stopping")
                raise TimeoutError(f"request not received within {self.read_timeout:g} s")
            conn.settimeout(min(end - now, _POLL))
            try:
                chunk = conn.recv(min(n - got, 1 << 20))
            except TimeoutError:
                continue
            if not chunk:
                if eof_ok and not chunks:
                    return b""
                raise ConnectionError("peer closed the connection mid-frame")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def handle(self, name: str, env: dict[str, str], stdin: bytes, peer_pid: int) -> Outcome:
        """Run one invocation in the network namespace of process ``peer_pid``."""
        if name not in PLUGIN_MODULES:
            return _error_outcome(CNIError(INVALID_ENV, "malformed daemon request", f"unknown plugin {name!r}"))
        env = dict(env)
        # A request from a plugin this daemon is already serving (a delegate it had to exec,
        # e.g. one of ours called by a Go plugin) must not wait for its parent's container lock.
        nested = env.get("PYCNI_IN_DAEMON") == "1"
        env["PYCNI_IN_DAEMON"] = "1"
        try:
            plugin = self._plugin(name)
        except Exception as e:  # noqa: BLE001
            return _error_outcome(CNIError(INTERNAL, f"plugin {name} failed to load", str(e)))
        # Pin the caller's namespace now: the pid could exit and be reused while we wait.
        try:
            ns_fd = os.open(f"/proc/{peer_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            return _error_outcome(CNIError(IO_FAILURE, "cannot find the caller's network namespace", str(e)))
        try:
            # One attachment at a time (container ID and interface): go-cni runs the loopback
            # network ("lo") and the pod's network ("eth0") of one sandbox at once, as separate
            # plugin processes would run; serialising them would make loopback wait for the
            # whole main chain. ADD and DEL of the same attachment still never overlap.
            container = env.get("CNI_CONTAINERID") or ""
            key = f"{container}\0{env.get('CNI_IFNAME', '')}" if container else ""
            locked = key and not nested
            lock = self.locks.hold(key) if locked else nullcontext()
            plock = self.process_locks.hold(key) if locked and self.process_locks else nullcontext()
            with lock, plock, netns.enter(f"/proc/self/fd/{ns_fd}"):
                started = time.perf_counter()
                if self.metrics is None:
                    outcome = dispatch(plugin, env, stdin, runner=run_delegate)
                else:
                    with self.metrics.in_flight.track_inprogress():
                        outcome = dispatch(plugin, env, stdin, runner=run_delegate)
                    self.metrics.observe(name, env.get("CNI_COMMAND", ""), outcome.exit_code == 0,
                                         time.perf_counter() - started)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s %s (pid %d): exit %d in %.1f ms", name, env.get("CNI_COMMAND"), container, peer_pid,
                          outcome.exit_code, (time.perf_counter() - started) * 1000)
            return outcome
        except CNIError as e:
            return _error_outcome(e)
        except Exception as e:  # noqa: BLE001
            return _error_outcome(CNIError(INTERNAL, str(e) or type(e).__name__, "pycni daemon"))
        finally:
            os.close(ns_fd)


def _error_outcome(err: CNIError) -> Outcome:
    return Outcome(1, (err.to_json() + "\n").encode())


def _signal_on_parent_death(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as e:  # the lifeline pipe still stops this worker
        log.warning("worker %d: prctl(PR_SET_PDEATHSIG) failed: %s", os.getpid(), e)


def missing_capabilities() -> list[str]:
    """The capabilities a daemon needs (:data:`NEEDED_CAPS`) that this process lacks."""
    try:
        with open("/proc/self/status") as f:
            effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return []  # cannot tell: the first request will say what is wrong
    return [name for bit, name in NEEDED_CAPS if not effective >> bit & 1]


def activated_socket(environ: MutableMapping[str, str]) -> socket.socket | None:
    """The listening socket systemd passed, or None (:func:`pycni.unixsock.activated_socket`)."""
    return _activated_socket(environ, "the pycni socket unit")


def run(opts: argparse.Namespace) -> int:
    """Serve in the foreground until SIGTERM/SIGINT.

    0 after a clean shutdown, 1 when it cannot listen, :data:`EXIT_REFUSED` when it refuses to
    start (another daemon serves the socket, or it lacks the privileges every request needs).
    """
    missing = missing_capabilities()
    if missing:
        sys.stderr.write(
            f"pycni daemon: refusing to start without {' and '.join(missing)} (uid {os.geteuid()}): every "
            "request enters its caller's network namespace and changes links, addresses, routes and firewall "
            "rules there, which needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). Run it as root, e.g. with the "
            "systemd units in docs/daemon.md; without a daemon the plugin shims run plugins themselves.\n")
        return EXIT_REFUSED
    logging.basicConfig(filename=opts.log_file, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if opts.debug:
        log.setLevel(logging.DEBUG)
    daemon = Daemon(opts.socket, preload=False, read_timeout=opts.read_timeout, stop_timeout=opts.stop_timeout)
    # Only a flag is set here, so a signal during start-up just makes the serving loop end at once.
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    try:
        inherited = activated_socket(os.environ)
        if inherited is not None:
            daemon.adopt(inherited)
        else:
            daemon.claim()  # refuse at once if the socket is served: before the imports
            if not opts.no_preload:
                daemon.preload()
            daemon.bind()  # the socket appears when the daemon is ready to serve it
    except Refused as e:
        sys.stderr.write(f"pycni daemon: {e}\n")
        if opts.log_file:  # said once on stderr already when that is the log
            log.error("not starting: %s", e)
        return EXIT_REFUSED
    except OSError as e:
        sys.stderr.write(f"pycni daemon: cannot listen on {opts.socket}: {e}\n")
        return 1
    if inherited is not None and not opts.no_preload:
        daemon.preload()
    workers = opts.workers if opts.workers is not None else (os.cpu_count() or 1)
    if opts.metrics_address is not None:
        try:
            start_metrics(daemon, opts.metrics_address, workers)
        except OSError as e:
            sys.stderr.write(f"pycni daemon: cannot serve metrics on {opts.metrics_address[0]}:"
                             f"{opts.metrics_address[1]}: {e.strerror or e}\n")
            daemon._unlisten()
            daemon._release()
            return 1
    from pycni.net import nft

    # nftables in-process: no fork/exec per transaction, and the socket close that waits out the
    # kernel's reclaim of each transaction happens off the request path (see pycni.net.nftlib).
    if not nft.use_library():
        log.info("libnftables not found: nftables changes run the nft command")
    if not opts.no_restore_sessions:
        from pycni.net import iptables

        # The reference's iptables layout without a process per call: restores go to long-lived
        # iptables-restore processes, one per network namespace in use (pycni.net.restore_session).
        iptables.keep_sessions()
    try:
        daemon.serve_workers(workers)
    finally:
        if daemon.metrics_server is not None:
            daemon.metrics_server.shutdown()
    return 0


def start_metrics(daemon: Daemon, address: tuple[str, int], workers: int) -> None:
    """Count the daemon's calls and serve them at http://ADDRESS/metrics (before any fork: with
    worker processes, in prometheus_client's multi-process mode in ``<socket>.metrics/``)."""
    from pycni import metrics
    from pycni.daemon.metrics import DaemonMetrics

    if workers > 1:
        metrics.multiprocess_dir(daemon.socket_path + ".metrics")
    daemon.metrics = DaemonMetrics()
    daemon.metrics_server = metrics.serve(address, metrics.registry(multiprocess=workers > 1))
    log.info("pycni daemon: metrics at http://%s:%d/metrics", *address)


def main(argv: list[str] | None = None) -> int:
    from pycni.daemon.options import add_arguments

    parser = argparse.ArgumentParser(prog="pycni daemon", description="Serve pycni plugins in-process.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
