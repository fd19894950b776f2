"""The pycni daemon: runs plugin handlers in-process with imports and netlink warm.

Each connection is one plugin invocation forwarded by a shim (see :mod:`pycni.shim`). The
daemon learns the caller's pid from the socket's peer credentials and performs the request in
that process's network namespace, so a plugin behaves exactly as if it had run in the shim.
Requests run concurrently on threads (netns switches are per-thread), but never two for the
same container at once; a failing request becomes an error reply, never a dead daemon.
Only root and the daemon's own user may connect.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from pycni.daemon import protocol
from pycni.net import netns
from pycni.plugins.registry import PLUGIN_MODULES
from pycni.skel import Outcome, Plugin, dispatch
from pycni.spec.errors import INTERNAL, INVALID_ENV, IO_FAILURE, CNIError

log = logging.getLogger("pycni.daemon")
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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


class Daemon:
    """Serves forwarded plugin invocations on a unix socket."""

    def __init__(self, socket_path: str = protocol.DEFAULT_SOCKET, preload: bool = True) -> None:
        self.socket_path = socket_path
        self.locks = ContainerLocks()
        self.plugins: dict[str, Plugin] = {}
        self._plugins_guard = threading.Lock()
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._active: set[threading.Thread] = set()
        self._active_guard = threading.Lock()
        self.process_locks: StripedFileLocks | None = None  # set when serving with worker processes
        if preload:
            self._preload()

    def _preload(self) -> None:
        """Import every plugin (and with them pyroute2) once, up front."""
        for name in PLUGIN_MODULES:
            try:
                self._plugin(name)
            except Exception as e:  # noqa: BLE001 - a plugin that fails to import is reported per request
                log.warning("plugin %s not preloaded: %s", name, e)

    def _plugin(self, name: str) -> Plugin:
        with self._plugins_guard:
            plugin = self.plugins.get(name)
            if plugin is None:
                plugin = importlib.import_module(PLUGIN_MODULES[name]).PLUGIN
                self.plugins[name] = plugin
            return plugin

    # ---- serving ---------------------------------------------------------------------------
    def bind(self) -> None:
        os.makedirs(os.path.dirname(self.socket_path) or ".", mode=0o755, exist_ok=True)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        sock.listen(128)
        self._sock = sock

    def serve_forever(self) -> None:
        """Accept and serve in this process until :meth:`stop`; then remove the socket."""
        self._accept_loop()
        self._close()

    def _accept_loop(self) -> None:
        if self._sock is None:
            self.bind()
        assert self._sock is not None
        self._sock.settimeout(0.5)
        log.info("pycni daemon listening on %s (pid %d)", self.socket_path, os.getpid())
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            conn.settimeout(None)
            t = threading.Thread(target=self._serve_conn, args=(conn,), daemon=True)
            with self._active_guard:
                self._active.add(t)
            t.start()

    def serve_workers(self, workers: int) -> None:
        """Serve from ``workers`` forked processes sharing the listening socket (one GIL each).

        Plugin work in the daemon is mostly waiting on the kernel and on nft/iptables, but the
        Python part of many concurrent requests would queue on one GIL; forked workers (warm:
        they inherit the preloaded imports) spread it over the CPUs. Per-container exclusion
        then needs a cross-process lock (:class:`StripedFileLocks`). The parent only
        supervises: it restarts a worker that dies, and on stop terminates them, waits for
        their requests to finish, and removes the socket.
        """
        import shutil
        import tempfile

        if workers <= 1:
            self.serve_forever()
            return
        if self._sock is None:
            self.bind()
        lock_dir = tempfile.mkdtemp(prefix="pycni-daemon-locks-")
        self.process_locks = StripedFileLocks(lock_dir)
        children: set[int] = set()

        def spawn() -> None:
            pid = os.fork()
            if pid == 0:  # worker
                code = 0
                try:
                    self._accept_loop()
                    left = self.drain()
                    if left:
                        log.warning("%d request(s) still running at exit", left)
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
                self._stop.wait(0.2)
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    children.discard(pid)
                    if not self._stop.is_set():
                        log.warning("worker %d exited (status %#x); starting another", pid, status)
                        spawn()
        finally:
            for pid in children:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            for pid in list(children):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            self._close()
            shutil.rmtree(lock_dir, ignore_errors=True)

    def drain(self, timeout: float = 30.0) -> int:
        """Wait for requests in flight (after stop); return how many are still running."""
        with self._active_guard:
            threads = list(self._active)
        for t in threads:
            t.join(timeout)
        return sum(t.is_alive() for t in threads)

    def stop(self) -> None:
        self._stop.set()

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        log.info("pycni daemon stopped")

    def _serve_conn(self, conn: socket.socket) -> None:
        try:
            pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if uid not in (0, os.getuid()):
                log.warning("refused connection from uid %d (pid %d)", uid, pid)
                try:  # read (and ignore) the request: closing on unread data would reset the reply
                    conn.settimeout(5)
                    protocol.recv_frame(conn)
                except (OSError, ValueError):
                    pass
                outcome = _error_outcome(CNIError(INVALID_ENV, "permission denied",
                                                  "only root or the daemon's user may use the pycni daemon"))
            else:
                try:
                    name, stdin, env = protocol.decode_request(protocol.recv_frame(conn))
                except (ValueError, UnicodeDecodeError) as e:
                    log.warning("malformed request from pid %d: %s", pid, e)
                    outcome = _error_outcome(CNIError(INVALID_ENV, "malformed daemon request", str(e)))
                else:
                    outcome = self.handle(name, env, stdin, pid)
            conn.sendall(protocol.encode_reply(outcome.exit_code, outcome.stdout, outcome.stderr))
        except Exception as e:  # noqa: BLE001 - one broken client must not take the daemon down
            log.warning("request failed: %s: %s", type(e).__name__, e)
        finally:
            conn.close()
            with self._active_guard:
                self._active.discard(threading.current_thread())

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
            key = env.get("CNI_CONTAINERID") or ""
            locked = key and not nested
            lock = self.locks.hold(key) if locked else nullcontext()
            plock = self.process_locks.hold(key) if locked and self.process_locks else nullcontext()
            with lock, plock, netns.enter(f"/proc/self/fd/{ns_fd}"):
                started = time.perf_counter()
                outcome = dispatch(plugin, env, stdin)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s %s (pid %d): exit %d in %.1f ms", name, env.get("CNI_COMMAND"), key, peer_pid,
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


def run(opts: argparse.Namespace) -> int:
    """Serve in the foreground until SIGTERM/SIGINT; 0 after a clean shutdown, 1 when it cannot listen."""
    logging.basicConfig(filename=opts.log_file, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if opts.debug:
        log.setLevel(logging.DEBUG)
    daemon = Daemon(opts.socket, preload=not opts.no_preload)
    from pycni.net import nft

    # nftables in-process: no fork/exec per transaction, and the socket close that waits out the
    # kernel's reclaim of each transaction happens off the request path (see pycni.net.nftlib).
    if not nft.use_library():
        log.info("libnftables not found: nftables changes run the nft command")
    workers = opts.workers if opts.workers is not None else (os.cpu_count() or 1)
    try:
        daemon.bind()
    except OSError as e:
        sys.stderr.write(f"pycni daemon: cannot listen on {opts.socket}: {e}\n")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    daemon.serve_workers(workers)
    left = daemon.drain()
    if left:
        log.warning("%d request(s) still running at exit", left)
    return 0


def main(argv: list[str] | None = None) -> int:
    from pycni.daemon.options import add_arguments

    parser = argparse.ArgumentParser(prog="pycni daemon", description="Serve pycni plugins in-process.")
    add_arguments(parser)
    return run(parser.parse_args(argv))
