"""Long-lived iptables-restore sessions (the daemon's): same effects and errors as a process per call."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from netns_util import Namespace

from pycni.net import iptables, restore_session, tools


@pytest.fixture
def sessions() -> Iterator[None]:
    if not restore_session._is_nft(restore_session.find_tool("iptables-restore")):
        pytest.skip("iptables-restore is not iptables-nft here: sessions are not used with it")
    iptables.keep_sessions()
    try:
        yield
    finally:
        iptables.keep_sessions(False)
        restore_session.close_idle()


def _restore_pids() -> set[int]:
    """This process's iptables-restore children, less the one-shot ones left to end alone."""
    tools.reap_children()
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if "(iptables-restor)" in stat and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                out.add(int(pid))
    return out - set(tools._unwaited)


def test_one_process_serves_many_commits(host_ns: Namespace, sessions: None) -> None:
    with host_ns.enter():
        iptables.restore("*nat\n:PFS-A - [0:0]\n-A PFS-A -p tcp -m multiport --dports 80,81 -j RETURN\nCOMMIT\n")
        [pid] = _restore_pids()
        for i in range(5):
            iptables.restore(f"*nat\n-A PFS-A -p udp --dport {1000 + i} -j RETURN\nCOMMIT\n")
        iptables.restore("*nat\n-D PFS-A -p udp --dport 1002 -j RETURN\nCOMMIT\n")
        assert _restore_pids() == {pid}
        rules = iptables.list_rules("nat", "PFS-A")
    assert len(rules) == 5 and not any("1002" in r for r in rules)
    assert restore_session.count() == 1


def test_refused_block_is_atomic_and_reported_as_one_shot(host_ns: Namespace, sessions: None) -> None:
    """A refused block commits nothing, reports the block's own line, and the next call gets a new process."""
    with host_ns.enter():
        iptables.restore("*nat\n:PFS-B - [0:0]\nCOMMIT\n")
        [first] = _restore_pids()
        bad = "*nat\n:PFS-C - [0:0]\n-A PFS-C -j NOSUCHTARGET\nCOMMIT\n"
        with pytest.raises(iptables.IptablesError) as e:
            iptables.restore(bad)
        iptables.keep_sessions(False)
        with pytest.raises(iptables.IptablesError) as one_shot:
            iptables.restore(bad)
        iptables.keep_sessions()
        assert "line: 4" in e.value.details  # the block's own line, not the process's
        assert (e.value.msg, e.value.details, e.value.exit_status, e.value.code) == \
            (one_shot.value.msg, one_shot.value.details, one_shot.value.exit_status, one_shot.value.code)
        assert not iptables.chain_exists("nat", "PFS-C")
        with pytest.raises(iptables.IptablesError) as e:  # a rule that is not there: as portmap's DEL sees it
            iptables.restore("*nat\n-D PFS-B -j RETURN\nCOMMIT\n")
        assert e.value.not_found
        iptables.restore("*nat\n-A PFS-B -j RETURN\nCOMMIT\n")
        assert first not in _restore_pids()
        assert len(iptables.list_rules("nat", "PFS-B")) == 1


def test_sees_what_other_processes_changed(host_ns: Namespace, sessions: None) -> None:
    """Another writer (the Go plugins, a one-shot call) changes the table between two commits."""
    with host_ns.enter():
        iptables.restore("*nat\n:PFS-D - [0:0]\nCOMMIT\n")
        iptables.run(["-t", "nat", "-A", "PFS-D", "-p", "tcp", "-j", "ACCEPT"])
        iptables.run(["-t", "nat", "-N", "PFS-E"])
        iptables.restore("*nat\n-D PFS-D -p tcp -j ACCEPT\n-A PFS-E -j RETURN\nCOMMIT\n")
        assert iptables.list_rules("nat", "PFS-D") == []
        iptables.run(["-t", "nat", "-F", "PFS-E"])
        iptables.run(["-t", "nat", "-X", "PFS-E"])
        iptables.restore("*nat\n-N PFS-E\nCOMMIT\n")  # deleted elsewhere: creating it again works
        assert iptables.chain_exists("nat", "PFS-E")


def test_one_session_per_namespace_and_idle_ones_end(netns_factory: object, sessions: None) -> None:
    a, b = netns_factory(), netns_factory()  # type: ignore[operator]
    for ns in (a, b, a):
        with ns.enter():
            iptables.restore("*nat\n-A OUTPUT -p tcp --dport 9 -j RETURN\nCOMMIT\n")
    assert restore_session.count() == 2 and len(_restore_pids()) == 2
    assert restore_session.close_idle(3600) == 0
    assert restore_session.close_idle() == 2
    assert _restore_pids() == set()  # ended and reaped
    for ns in (a, b):
        assert ns.run(["iptables", "-t", "nat", "-S", "OUTPUT"]).stdout.count("--dport 9") == (2 if ns is a else 1)


def test_line_numbers_are_the_blocks_own() -> None:
    assert restore_session.Session._renumber("iptables-restore: line 12 failed: x\n", 9) == \
        "iptables-restore: line 3 failed: x\n"
    assert restore_session.Session._renumber("Error occurred at line: 7\n", 3) == "Error occurred at line: 4\n"
    assert restore_session.Session._renumber("no number here, online 5", 5) == "no number here, online 5"


def test_where_restore_does_not_echo_each_restore_is_a_process(host_ns: Namespace, sessions: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore that does not echo the comment a session starts with: sessions turn off, restores
    still work (an empty line stands in for the comment: it is skipped without an echo)."""
    monkeypatch.setattr(restore_session, "_HELLO", b"\n")
    monkeypatch.setattr(restore_session, "_START_SECONDS", 0.2)
    monkeypatch.setattr(restore_session, "_off_reason", "")
    with host_ns.enter():
        iptables.restore("*nat\n:PFS-F - [0:0]\nCOMMIT\n")
        assert restore_session._off_reason and _restore_pids() == set()
        iptables.restore("*nat\n-A PFS-F -j RETURN\nCOMMIT\n")
        assert len(iptables.list_rules("nat", "PFS-F")) == 1


def test_session_answers_when_the_commit_is_done(host_ns: Namespace, sessions: None) -> None:
    """The echo after a block is the answer: each call returns with its rules committed, as
    another process sees them, and its output carries nothing of it."""
    with host_ns.enter():
        for i in range(20):
            iptables.restore(f"*nat\n:PFS-I{i} - [0:0]\n-A PFS-I{i} -j RETURN\n-A POSTROUTING -j PFS-I{i}\nCOMMIT\n")
            assert iptables.run(["-t", "nat", "-S", f"PFS-I{i}"]).count("-j RETURN") == 1
        [pid] = _restore_pids()
    assert restore_session.count() == 1 and len(_restore_pids()) == 1 and pid


def _wait_gone(pids: set[int]) -> set[int]:
    """The pids among ``pids`` still alive (not reaped yet counts as alive) after up to 30 s."""
    import time

    deadline = time.monotonic() + 30
    while pids and time.monotonic() < deadline:
        tools.reap_children()
        pids = {p for p in pids if os.path.exists(f"/proc/{p}")}
        time.sleep(0.05)
    return pids


def test_one_shot_restore_is_committed_when_it_returns_and_its_process_ends_alone(host_ns: Namespace) -> None:
    """A one-shot call (no sessions) returns once the commit is read as done; the process it
    started is not waited for, ends by itself, and the next call reaps it."""
    if not restore_session._is_nft(restore_session.find_tool("iptables-restore")):
        pytest.skip("iptables-restore is not iptables-nft here: one-shot restores wait for the process")
    with host_ns.enter():
        iptables.restore("*nat\n:PFS-G - [0:0]\n-A PFS-G -p tcp --dport 7 -j RETURN\nCOMMIT\n")
        assert len(iptables.list_rules("nat", "PFS-G")) == 1  # committed before restore() returned
        first = set(tools._unwaited)
        iptables.restore("*nat\n-A PFS-G -p udp --dport 7 -j RETURN\nCOMMIT\n")
        assert len(iptables.list_rules("nat", "PFS-G")) == 2
        with pytest.raises(iptables.IptablesError) as e:  # refused: the process's own message and status
            iptables.restore("*nat\n-A PFS-G -j NOSUCHTARGET\nCOMMIT\n")
        assert "line" in e.value.details and e.value.exit_status != 0
        assert len(iptables.list_rules("nat", "PFS-G")) == 2
        with pytest.raises(iptables.IptablesError) as gone:
            iptables.restore("*nat\n-D PFS-G -j RETURN\nCOMMIT\n")
        assert gone.value.not_found
    assert restore_session.count() == 0  # nothing kept
    assert _wait_gone(first | set(tools._unwaited)) == set()


def test_one_shot_restore_without_the_echo_waits_for_the_exit(host_ns: Namespace,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No echo after the block (an empty line stands in for the comment): the answer is the
    process's exit, waited for, with the same message and status as a process run alone."""
    if not restore_session._is_nft(restore_session.find_tool("iptables-restore")):
        pytest.skip("iptables-restore is not iptables-nft here: one-shot restores wait for the process")
    monkeypatch.setattr(restore_session.Session, "_mark", lambda self: b"\n")
    with host_ns.enter():
        iptables.restore("*nat\n:PFS-H - [0:0]\n-A PFS-H -j RETURN\nCOMMIT\n")
        assert len(iptables.list_rules("nat", "PFS-H")) == 1
        bad = "*nat\n-A PFS-H -j NOSUCHTARGET\nCOMMIT\n"
        with pytest.raises(iptables.IptablesError) as e:
            iptables.restore(bad)
        with pytest.raises(iptables.IptablesError) as plain:  # a process run and waited for
            iptables._exec(["iptables-restore", "-w", "30", "--noflush"], bad, 5)
        assert (e.value.details, e.value.exit_status) == (plain.value.details, plain.value.exit_status)
    assert _restore_pids() == set()  # each one exited and was reaped
