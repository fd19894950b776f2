"""pycni.net.tools.run_tool: the subprocess-free runner of iptables/nft (same contract as subprocess.run)."""

from __future__ import annotations

import os
import time

import pytest

from pycni.net.tools import ToolTimeout, find_tool, run_tool


def test_status_streams_and_stdin() -> None:
    status, out, err = run_tool(["sh", "-c", "cat; echo oops >&2; exit 3"], "hello\n")
    assert (status, out, err) == (3, "hello\n", "oops\n")


def test_large_input_and_output_do_not_deadlock() -> None:
    text = "x" * 1_000_000 + "\n"
    status, out, err = run_tool(["sh", "-c", "cat; cat /proc/self/status >&2"], text)
    assert status == 0 and out == text and "Name:" in err


def test_no_stdin_is_dev_null() -> None:
    assert run_tool(["sh", "-c", "cat"])[:2] == (0, "")


def test_signal_gives_negative_status() -> None:
    assert run_tool(["sh", "-c", "kill -TERM $$"])[0] == -15


def test_missing_tool_raises_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        run_tool(["pycni-no-such-tool"])
    assert find_tool("pycni-no-such-tool") == "pycni-no-such-tool"


def test_timeout_kills_the_tool() -> None:
    t = time.monotonic()
    with pytest.raises(ToolTimeout):
        run_tool(["sleep", "30"], timeout=0.3)
    assert time.monotonic() - t < 20


def test_finds_tools_outside_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert os.path.isabs(find_tool("sh"))
    assert run_tool(["sh", "-c", "echo ok"])[1] == "ok\n"


@pytest.mark.parametrize("line", [
    '-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD',
    '-A X -m comment --comment "a \\"b\\" c\\\\d" -j Y', '-A X --comment "" -j Y', '-A X --comment "a\\qb"',
    '-A X --comment a"b c"d', "-A X 'single' -j Y", '-A X "unterminated', "-A X a\\ b", "-A X -j Y",
])
def test_iptables_split_rule_is_shlex(line: str) -> None:
    """split_rule reads iptables' double-quoted comments without shlex (and re), with shlex's result."""
    import shlex

    from pycni.net.iptables import split_rule

    try:
        want: object = shlex.split(line)[2:]
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e)):
            split_rule(line)
    else:
        assert split_rule(line) == want
