"""Long-lived iptables-restore sessions (the daemon's): same effects and errors as a process per call."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from netns_util import Namespace

from pycni.net import iptables, restore_session


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
    return out


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


def test_where_a_session_cannot_be_read_each_restore_is_a_process(host_ns: Namespace, sessions: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No usable /proc/<pid>/wchan (a restricted /proc): sessions turn off, restores still work."""
    monkeypatch.setattr(restore_session.Session, "_waiting_for_input", lambda self: False)
    monkeypatch.setattr(restore_session, "_START_SECONDS", 0.2)
    monkeypatch.setattr(restore_session, "_off_reason", "")
    with host_ns.enter():
        iptables.restore("*nat\n:PFS-F - [0:0]\nCOMMIT\n")
        assert restore_session._off_reason and _restore_pids() == set()
        iptables.restore("*nat\n-A PFS-F -j RETURN\nCOMMIT\n")
        assert len(iptables.list_rules("nat", "PFS-F")) == 1
