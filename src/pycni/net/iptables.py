"""iptables / ip6tables through their commands, for plugins whose ``backend`` asks for them.

Every call waits for the xtables lock (``-w``) so concurrent plugin invocations queue rather
than fail. Commands act in the calling thread's network namespace (processes forked inside
:func:`pycni.net.netns.enter` inherit it). Where one round trip will do, use :func:`restore`
(``iptables-restore --noflush``), which applies a whole table's changes atomically.
Stdlib only.
"""

from __future__ import annotations

import os

from pycni.net.tools import ToolTimeout, find_tool, run_tool
from pycni.spec.errors import IO_FAILURE, TRY_AGAIN, CNIError

TYPE_CHECKING = False  # true for mypy only (see pycni.record)
if TYPE_CHECKING:
    from collections.abc import Sequence

    from pycni.lockfile import flocked

LOCK_WAIT_SECONDS = "30"
_NOT_FOUND = ("No chain/target/match by that name", "does a matching rule exist", "doesn't exist", "does not exist",
              "No such file or directory", "Bad rule (does a matching rule exist")


class IptablesError(CNIError):
    """An iptables command failed; ``stderr`` is the tool's own explanation."""

    def __init__(self, code: int, msg: str, stderr: str, exit_status: int) -> None:
        super().__init__(code, msg, stderr.strip())
        self.stderr = stderr
        self.exit_status = exit_status

    @property
    def not_found(self) -> bool:
        return any(s in self.stderr for s in _NOT_FOUND)

    @property
    def chain_exists(self) -> bool:
        return "Chain already exists" in self.stderr


def locked() -> flocked:
    """Hold our lock across several iptables commands (threads and processes).

    For read-check-write sequences (e.g. "add the shared jump unless present"): iptables' -w
    only makes single commands wait for each other. iptables state is per network namespace,
    so is the lock: :func:`pycni.net.netns.locked` on the calling thread's namespace, which
    leaves no file on the machine (a lock file under /run/pycni was written by every masquerade
    ADD, even one in a throwaway namespace).
    """
    from pycni.lockfile import flocked

    # netns.locked()'s lock, taken without importing the namespace module: a DEL that finds
    # nothing to remove (containerd's RemovePodSandbox, no netns) loads no namespace code
    return flocked("/proc/thread-self/ns/net")


def _binary(ipv6: bool, restore: bool = False) -> str:
    base = "ip6tables" if ipv6 else "iptables"
    return f"{base}-restore" if restore else base


def _exec(cmd: list[str], stdin: str | None, code: int) -> str:
    try:
        status, out, err = run_tool(cmd, stdin, timeout=90)
    except FileNotFoundError:
        raise IptablesError(IO_FAILURE, f"{cmd[0]} command not found",
                            "install the iptables package or choose the nftables backend", 127) from None
    except ToolTimeout:
        raise IptablesError(TRY_AGAIN, f"{cmd[0]} timed out", "the xtables lock was not released in time",
                            -1) from None
    if status != 0:
        raise _failure(cmd, status, err or out, code)
    return out


def _failure(cmd: list[str], status: int, err: str, code: int) -> IptablesError:
    if status == 4 or "Resource temporarily unavailable" in err or "xtables lock" in err:
        code = TRY_AGAIN
    shown = " ".join(_sh_quote(a) for a in cmd)
    return IptablesError(code, f"{shown} failed", err, status)


_SH_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-")


def _sh_quote(arg: str) -> str:
    """``shlex.quote(arg)``, whose module imports re: an expected failure (a rule to delete is
    not there) formats this message on every DEL."""
    if arg and all(c in _SH_SAFE for c in arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def run(args: Sequence[str], ipv6: bool = False, *, code: int = IO_FAILURE) -> str:
    """Run one ``iptables``/``ip6tables`` command (with ``-w``); return its stdout."""
    return _exec([_binary(ipv6), "-w", LOCK_WAIT_SECONDS, *args], None, code)


# Set by the daemon (keep_sessions): --noflush restores go to long-lived iptables-restore
# processes (pycni.net.restore_session) instead of one process per call.
_sessions = False


def keep_sessions(on: bool = True) -> None:
    """Have this process's ``--noflush`` restores reuse long-lived processes (a daemon's choice:
    a one-shot plugin keeps none; its restore is left only to finish its exit, see
    :func:`pycni.net.restore_session.apply_once`)."""
    global _sessions
    _sessions = on


def restore(text: str, ipv6: bool = False, *, noflush: bool = True, code: int = IO_FAILURE) -> None:
    """Apply ``iptables-save`` formatted ``text`` in one atomic commit per table."""
    cmd = [_binary(ipv6, restore=True), "-w", LOCK_WAIT_SECONDS]
    if noflush:
        cmd.append("--noflush")
        from pycni.net import restore_session

        try:
            if (restore_session.apply if _sessions else restore_session.apply_once)(cmd[0], text):
                return
        except restore_session.Failed as e:
            raise _failure(cmd, e.status, e.stderr, code) from None
        except TimeoutError:
            raise IptablesError(TRY_AGAIN, f"{cmd[0]} timed out", "the restore did not finish in time",
                                -1) from None
    _exec(cmd, text, code)


def restore_quote(arg: str) -> str:
    """``arg`` quoted for an iptables-restore line (double quotes, backslash escapes)."""
    if arg and not any(c in arg for c in " \t\"'\\"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rule_line(op: str, chain: str, rule: Sequence[str]) -> str:
    """One iptables-restore line: ``-A CHAIN args...``."""
    return " ".join([op, chain, *(restore_quote(a) for a in rule)])


def rule_exists(table: str, chain: str, rule: Sequence[str], ipv6: bool = False) -> bool:
    try:
        run(["-t", table, "-C", chain, *rule], ipv6)
    except IptablesError as e:
        if e.exit_status in (1, 2) or e.not_found:
            return False
        raise
    return True


def list_rules(table: str, chain: str, ipv6: bool = False) -> list[str]:
    """The ``-S`` lines of ``chain`` (without its ``-N``/``-P`` header); [] when it is missing."""
    try:
        out = run(["-t", table, "-S", chain], ipv6)
    except IptablesError as e:
        if e.not_found or e.exit_status == 1:
            return []
        raise
    return [line for line in out.splitlines() if line.startswith("-A ")]


def chain_exists(table: str, chain: str, ipv6: bool = False) -> bool:
    """Whether ``chain`` exists in ``table``: asked of the kernel without an exec where iptables
    is iptables-nft (:mod:`pycni.net.probe`), else of the tool."""
    from pycni.net import probe

    if probe.iptables_chain_exists(table, chain, ipv6) is False:
        return False
    try:
        run(["-t", table, "-n", "-L", chain], ipv6)
    except IptablesError as e:
        if e.not_found or e.exit_status == 1:
            return False
        raise
    return True


def delete_rule(table: str, chain: str, rule: Sequence[str], ipv6: bool = False) -> None:
    """Delete ``rule``; a missing rule or chain is not an error (DEL is idempotent)."""
    try:
        run(["-t", table, "-D", chain, *rule], ipv6)
    except IptablesError as e:
        if not (e.not_found or e.exit_status in (1, 2)):
            raise


def delete_chain(table: str, chain: str, ipv6: bool = False) -> None:
    """Flush and delete ``chain``; a missing chain is not an error."""
    for op in ("-F", "-X"):
        try:
            run(["-t", table, op, chain], ipv6)
        except IptablesError as e:
            if not e.not_found:
                raise
            return


def split_rule(line: str) -> list[str]:
    """An ``-S`` line as arguments, without its leading ``-A CHAIN``."""
    # shlex is slow (~30 µs a line): only quoted lines (comments) need it.
    if any(c in line for c in "\"'\\"):
        parts = _split_double_quoted(line)
        if parts is None:
            import shlex  # imports re: only for what iptables does not print

            parts = shlex.split(line)
        return _strip_append(parts)
    return _strip_append(line.split())


def _split_double_quoted(line: str) -> list[str] | None:
    """``shlex.split(line)`` for what ``-S`` prints: words and double-quoted strings in which ``\\``
    escapes ``"`` and ``\\``; None for anything else (single quotes, a backslash outside quotes,
    an unterminated quote). Saves a quoted line (a rule comment) the import of re with shlex."""
    parts: list[str] = []
    cur: list[str] = []
    quoted = in_word = False
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if quoted:
            if c == "\\" and i + 1 < n and line[i + 1] in "\"\\":
                cur.append(line[i + 1])
                i += 1
            elif c == '"':
                quoted = False
            else:
                cur.append(c)
        elif c == '"':
            quoted = in_word = True
        elif c in " \t\r\n":
            if in_word:
                parts.append("".join(cur))
                cur, in_word = [], False
        elif c in "'\\":
            return None
        else:
            cur.append(c)
            in_word = True
        i += 1
    if quoted:
        return None
    if in_word:
        parts.append("".join(cur))
    return parts


def _strip_append(parts: list[str]) -> list[str]:
    return parts[2:] if parts[:1] == ["-A"] else parts


# Long option spellings iptables prints in their short form (``-S`` output), for canonical().
_ALIASES = {"--source": "-s", "--destination": "-d", "--protocol": "-p", "--jump": "-j", "--goto": "-g",
            "--match": "-m", "--in-interface": "-i", "--out-interface": "-o", "--destination-ports": "--dports",
            "--source-ports": "--sports", "--destination-port": "--dport", "--source-port": "--sport"}
_ANY = ("0.0.0.0/0", "::/0")


def _with_prefix(addr: str) -> str:
    if "/" in addr:
        return addr
    return addr + ("/128" if ":" in addr else "/32")


def canonical(rule: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """``rule``'s arguments in a form that does not depend on how they were spelt, so a rule as
    written compares equal to the same rule as ``-S`` prints it (which reorders ``-s``/``-d``/``-p``,
    loads ``-m tcp`` implicitly, writes ``127.0.0.1/32`` and leaves out ``-s 0.0.0.0/0``).

    Lets a check compare a whole chain's listing at once instead of one ``-C`` process per rule.
    """
    groups: list[list[str]] = []
    negate = False
    for arg in rule:
        if arg == "!":
            negate = True
        elif arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
            groups.append([("!" if negate else "") + _ALIASES.get(arg, arg)])
            negate = False
        elif groups:
            groups[-1].append(arg)
        else:
            groups.append([arg])
    out = []
    for g in groups:
        flag = g[0]
        if flag == "-m":
            continue  # a match module is implied by its options
        if flag in ("-s", "-d", "!-s", "!-d") and len(g) == 2:
            if flag in ("-s", "-d") and g[1] in _ANY:
                continue
            g[1] = _with_prefix(g[1])
        elif flag == "-p" and len(g) == 2:
            g[1] = g[1].lower()
        out.append(tuple(g))
    return tuple(sorted(out))


# Binaries found usable, by identity: see usable().
_usable: set[tuple[bool, str, int, int, int]] = set()


def _binary_identity(ipv6: bool) -> tuple[bool, str, int, int, int] | None:
    """The command's resolved file (device, inode, mtime): changes if iptables is replaced or
    its alternative switched (legacy / nft)."""
    path = find_tool(_binary(ipv6))
    try:
        st = os.stat(path)
    except OSError:
        return None
    return ipv6, path, st.st_dev, st.st_ino, st.st_mtime_ns


def usable(ipv6: bool = False, *, quick: bool = False) -> bool:
    """Whether this iptables family works here (binary present, nat table reachable).

    ``quick``: for a choice made before anything is tried (ipMasq's default backend, asked on
    every one-shot bridge ADD): iptables-nft whose kernel side answers counts as usable without
    running it. Ask without ``quick`` after a failure, to know whether to fall back.

    A yes is remembered for the process (the daemon) as long as the binary stays the same:
    asking means listing a nat chain, and iptables-nft reads the whole nat table for that,
    which grows with every container. Both things it depends on are the host's, not a
    namespace's (the tool, and kernel support for the nat table), so one answer holds in
    every namespace. A no is never remembered.
    """
    ident = _binary_identity(ipv6)
    if ident is not None and ident in _usable:
        return True
    if not _sessions:
        # iptables-nft answered by the kernel in one netlink request instead of a process listing
        # the nat table (one per ADD of bridge or portmap, ~10 ms of CPU): with ``quick`` any
        # answer about the nat table will do (nf_tables works), otherwise its POSTROUTING chain
        # must be there (iptables has worked in this namespace). Not remembered: it trusts the
        # binary without running it. Not in the daemon (sessions): there the thorough yes is
        # asked once and remembered, and closing the probe's socket would wait for the kernel to
        # release what sessions deleted.
        from pycni.net import probe

        if probe.iptables_is_nft(ipv6):
            family = "ip6" if ipv6 else "ip"
            if quick and probe.nft_object_exists(family, "nat") is not None:
                return True
            if probe.nft_object_exists(family, "nat", "POSTROUTING") is True:
                return True
    try:
        run(["-t", "nat", "-S", "OUTPUT"], ipv6)
    except IptablesError:
        return False
    if ident is not None:
        _usable.add(ident)
    return True
