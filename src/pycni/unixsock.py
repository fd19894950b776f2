"""The one way pycni listens on a Unix socket: the main daemon and the dhcp daemon. Stdlib only.

What it guarantees, because both daemons run as root beside runtimes that trust the path:

- Nothing but a socket is ever removed: a regular file, a directory or a symlink at the path
  is refused (:class:`Refused`), never unlinked.
- A socket that answers belongs to a live daemon and is never taken over; one that refuses
  connections (its daemon died) is replaced.
- The socket appears at its path already listening and with its final mode: it is bound under
  umask 0177 at a private name beside the path, chmod'ed, put in listen state, then linked to
  the path (``link`` fails if the path was taken meanwhile: no replacing a racing daemon's).
  A client that sees the path can connect at once — no "connection refused" window.
- The inode bound is remembered, and :func:`unlisten` removes the path only while it is still
  that inode (a successor may have replaced it).
- A socket passed by systemd (``LISTEN_PID``/``LISTEN_FDS``) is validated: exactly one, a
  listening unix stream socket; the variables are removed so nothing this process runs sees them.
"""

from __future__ import annotations

import os
import socket
import stat

TYPE_CHECKING = False  # not typing's: see pycni.record
if TYPE_CHECKING:
    from collections.abc import MutableMapping

SD_LISTEN_FDS_START = 3
BACKLOG = 128


class Refused(Exception):
    """Not listening: the message says why and what to do instead."""


class AlreadyServing(Refused):
    """Something already listens on the path."""


def socket_answers(path: str) -> bool | None:
    """True when something listens on ``path``, False for a stale socket, None when there is none.

    :class:`Refused` when the path is not a socket, or is one this process may not use: neither
    is ours to replace.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        raise Refused(f"{path} exists and is not a socket; not touching it (remove it, or choose another path)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return False
    except FileNotFoundError:
        return None
    except PermissionError:
        raise Refused(f"{path} is a socket this user may not connect to; not replacing it") from None
    except (TimeoutError, BlockingIOError):
        return True  # a full backlog: someone listens, just not fast enough
    finally:
        probe.close()
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def listen(path: str, mode: int = 0o600) -> tuple[socket.socket, tuple[int, int]]:
    """A socket listening at ``path`` with ``mode``, and the (st_dev, st_ino) it holds there.

    :class:`AlreadyServing` when something answers there, :class:`Refused` when the path is not
    a socket; a stale socket is replaced. OSError for anything else (no such directory, no
    permission).
    """
    if socket_answers(path):
        raise AlreadyServing(f"something already listens on {path}")
    try:
        stale: os.stat_result | None = os.lstat(path)  # a socket: socket_answers refuses anything else
    except FileNotFoundError:
        stale = None
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(3).hex()}")
    if len(tmp.encode()) > 107:  # sun_path holds 108 bytes with the NUL: bind the path itself
        tmp = ""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound = ""
    try:
        if stale is not None and not tmp:
            _remove_stale(path, stale)
        old = os.umask(0o177)
        try:
            sock.bind(tmp or path)
        finally:
            os.umask(old)
        bound = tmp or path
        os.chmod(bound, mode)
        sock.listen(BACKLOG)
        if tmp:
            if stale is not None:
                _remove_stale(path, stale)
            try:
                os.link(tmp, path)  # no clobbering: fails when someone bound the path meanwhile
            except FileExistsError:
                raise AlreadyServing(f"something else bound {path} while this one started") from None
            os.unlink(tmp)
            bound = path
        st = os.lstat(path)
    except BaseException:
        sock.close()
        if bound:
            _unlink_quietly(bound)
        raise
    return sock, (st.st_dev, st.st_ino)


def _remove_stale(path: str, seen: os.stat_result) -> None:
    """Unlink the stale socket ``seen`` at ``path``, only if the path still holds that very inode."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or not stat.S_ISSOCK(now.st_mode):
        raise AlreadyServing(f"{path} was replaced while this one started")
    os.unlink(path)


def unlisten(sock: socket.socket | None, path: str, owned: tuple[int, int] | None) -> bool | None:
    """Close ``sock`` and remove ``path`` if it still holds the inode ``owned``.

    True when removed, False when another socket replaced it meanwhile (left alone), None when
    there was nothing of ours to remove (a systemd socket: ``owned`` is None).
    """
    if sock is not None:
        sock.close()
    if owned is None:
        return None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if (st.st_dev, st.st_ino) != owned:
        return False
    os.unlink(path)
    return True


def activated_socket(environ: MutableMapping[str, str], unit: str = "the socket unit") -> socket.socket | None:
    """The listening socket systemd passed (``LISTEN_PID``/``LISTEN_FDS``, fd 3), or None.

    The variables are meant for this process only (``LISTEN_PID``), so they are removed before
    anything is executed; :class:`Refused` when what was passed is not one listening unix socket.
    """
    if environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = environ.get("LISTEN_FDS", "0")
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(key, None)
    if count == "0":
        return None
    if count != "1":
        raise Refused(f"systemd passed {count} sockets (LISTEN_FDS); {unit} must have exactly one ListenStream=")
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError as e:
        raise Refused(f"the socket systemd passed (fd {SD_LISTEN_FDS_START}) is unusable: {e}") from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        raise Refused(f"the socket systemd passed is not a listening unix stream socket ({unit} needs "
                      "ListenStream=/path and Accept=no)")
    os.set_inheritable(SD_LISTEN_FDS_START, False)
    return sock
