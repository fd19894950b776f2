"""net.nft and net.iptables: the command wrappers, in a throwaway namespace."""

from __future__ import annotations

import os
import threading

import pytest
from netns_util import Namespace

from pycni.net import iptables, nft, probe
from pycni.spec.errors import INVALID_CONFIG, IO_FAILURE


# ---- nft -------------------------------------------------------------------------------------
def test_nft_run_and_list(host_ns: Namespace) -> None:
    with host_ns.enter():
        nft.run("add table inet t\nadd chain inet t c\nadd rule inet t c tcp dport 22 accept comment \"hi\"\n")
        listing = nft.list_json("chain", "inet", "t", "c")
        assert nft.chain_exists("inet", "t", "c") and nft.table_exists("inet", "t")
        assert not nft.chain_exists("inet", "t", "nope") and not nft.table_exists("inet", "nope")
        assert nft.list_json("table", "inet", "nope", missing_ok=True) == {"nftables": []}
    [rule] = nft.rules(listing)
    assert rule["comment"] == "hi" and rule["chain"] == "c"
    assert "tcp dport 22 accept" in host_ns.run(["nft", "list", "ruleset"]).stdout


def test_nft_transaction_is_atomic(host_ns: Namespace) -> None:
    with host_ns.enter():
        with pytest.raises(nft.NftError) as e:
            nft.run("add table inet t\nadd chain inet t c\nadd rule inet t c frobnicate\n", code=INVALID_CONFIG)
    assert e.value.code == INVALID_CONFIG
    assert "frobnicate" in e.value.details  # nft's own message reaches the caller
    assert "table" not in host_ns.run(["nft", "list", "ruleset"]).stdout


def test_nft_errors_classified(host_ns: Namespace) -> None:
    with host_ns.enter():
        with pytest.raises(nft.NftError) as e:
            nft.run("delete table inet nope\n")
        assert e.value.not_found and e.value.code == IO_FAILURE
        with pytest.raises(nft.NftError) as e:
            nft.list_json("table", "inet", "nope")
        assert e.value.not_found
        nft.run("add table inet t\nadd map inet t m { type inet_service : verdict; }\nadd chain inet t a\n"
                "add chain inet t b\nadd element inet t m { 1 : jump a }\n")
        with pytest.raises(nft.NftError) as e:
            nft.run("add element inet t m { 1 : jump b }\n")
        assert e.value.exists


def test_nft_quote() -> None:
    assert nft.quote('a "b" c') == '"a b c"'
    assert nft.quote("x\ny\\") == '"xy"'
    assert len(nft.quote("é" * 100)) <= 130  # 128 bytes plus the quotes, never a split character
    nft.quote("é" * 100).encode()


def test_find_tool_without_path() -> None:
    assert nft.find_tool("nft").endswith("/nft")
    assert nft.find_tool("no-such-tool-xyz") == "no-such-tool-xyz"


def test_nft_acts_in_the_calling_threads_namespace(host_ns: Namespace, netns_factory) -> None:  # type: ignore[no-untyped-def]
    other = netns_factory()
    done = threading.Event()

    def in_other() -> None:
        with other.enter():
            nft.run("add table ip other_table\n")
        done.set()

    th = threading.Thread(target=in_other)
    with host_ns.enter():
        th.start()
        nft.run("add table ip host_table\n")
        th.join()
    assert done.is_set()
    assert "host_table" in host_ns.run(["nft", "list", "tables"]).stdout
    assert "other_table" not in host_ns.run(["nft", "list", "tables"]).stdout
    assert "other_table" in other.run(["nft", "list", "tables"]).stdout


# ---- iptables --------------------------------------------------------------------------------
@pytest.mark.parametrize("v6", [False, True])
def test_iptables_rule_helpers(host_ns: Namespace, v6: bool) -> None:
    net = "fd00::/64" if v6 else "10.0.0.0/8"
    rule = ["-d", net, "-m", "comment", "--comment", 'name: "x" id: "y"', "-j", "RETURN"]
    with host_ns.enter():
        assert iptables.usable(v6)
        assert not iptables.chain_exists("nat", "TESTCHAIN", v6)
        iptables.run(["-t", "nat", "-N", "TESTCHAIN"], v6)
        assert iptables.chain_exists("nat", "TESTCHAIN", v6)
        assert not iptables.rule_exists("nat", "TESTCHAIN", rule, v6)
        iptables.run(["-t", "nat", "-A", "TESTCHAIN", *rule], v6)
        assert iptables.rule_exists("nat", "TESTCHAIN", rule, v6)
        [line] = iptables.list_rules("nat", "TESTCHAIN", v6)
        assert iptables.split_rule(line)[-2:] == ["-j", "RETURN"]
        # An -S line read back deletes the same rule (quoting survives the round trip).
        iptables.delete_rule("nat", "TESTCHAIN", iptables.split_rule(line), v6)
        assert iptables.list_rules("nat", "TESTCHAIN", v6) == []
        iptables.delete_rule("nat", "TESTCHAIN", rule, v6)  # missing rule: fine
        iptables.delete_chain("nat", "TESTCHAIN", v6)
        iptables.delete_chain("nat", "TESTCHAIN", v6)  # missing chain: fine
        assert not iptables.chain_exists("nat", "TESTCHAIN", v6)
        assert iptables.list_rules("nat", "TESTCHAIN", v6) == []


def test_iptables_restore_quoting_and_atomicity(host_ns: Namespace) -> None:
    comment = 'a "quoted" \\ comment'
    text = "\n".join(["*nat", ":QCHAIN - [0:0]",
                      iptables.rule_line("-A", "QCHAIN", ["-m", "comment", "--comment", comment, "-j", "RETURN"]),
                      "COMMIT", ""])
    with host_ns.enter():
        iptables.restore(text)
        [line] = iptables.list_rules("nat", "QCHAIN")
        assert iptables.split_rule(line)[3] == comment
        bad = "*nat\n:QCHAIN2 - [0:0]\n-A QCHAIN2 -j NOSUCHTARGET\nCOMMIT\n"
        with pytest.raises(iptables.IptablesError) as e:
            iptables.restore(bad)
        assert e.value.details
        assert not iptables.chain_exists("nat", "QCHAIN2")  # nothing of the failed commit remains


def test_iptables_error_has_command_and_stderr(host_ns: Namespace) -> None:
    with host_ns.enter():
        with pytest.raises(iptables.IptablesError) as e:
            iptables.run(["-t", "nat", "-A", "NOSUCHCHAIN", "-j", "ACCEPT"])
    assert e.value.code == IO_FAILURE
    assert "iptables" in e.value.msg and "NOSUCHCHAIN" in e.value.msg
    assert e.value.not_found or "does not exist" in e.value.details


def test_iptables_usable_remembers_yes_per_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A yes is asked once per binary (asking lists the nat table); a no is asked every time."""
    calls: list[bool] = []
    answers = {"ok": True}

    def fake_run(args: list[str], ipv6: bool = False, **_: object) -> str:
        calls.append(ipv6)
        if not answers["ok"]:
            raise iptables.IptablesError(IO_FAILURE, "iptables failed", "can't initialize iptables table `nat'", 3)
        return ""

    ident = {"v": (False, "/nonexistent/iptables", 1, 2, 3)}  # not iptables-nft: asked with a command
    monkeypatch.setattr(iptables, "run", fake_run)
    monkeypatch.setattr(iptables, "_binary_identity", lambda ipv6: (ipv6, *ident["v"][1:]))
    monkeypatch.setattr(iptables, "_usable", set())
    answers["ok"] = False
    assert not iptables.usable() and not iptables.usable()
    assert len(calls) == 2
    answers["ok"] = True
    assert iptables.usable() and iptables.usable() and iptables.usable()
    assert len(calls) == 3
    assert iptables.usable(True)  # the other family is its own question
    assert len(calls) == 4
    ident["v"] = (False, "/nonexistent/iptables", 1, 99, 3)  # replaced (e.g. legacy <-> nft): asked again
    assert iptables.usable()
    assert len(calls) == 5
    monkeypatch.setattr(iptables, "_binary_identity", lambda ipv6: None)  # binary not found: never cached
    assert iptables.usable() and iptables.usable()
    assert len(calls) == 7


def test_canonical_matches_rules_as_listed(host_ns: Namespace) -> None:
    """A rule as a plugin writes it and as `-S` prints it back compare equal (CHECK relies on it)."""
    rules = [["-p", "tcp", "--dport", "8080", "-s", "127.0.0.1", "-j", "ACCEPT"],
             ["-m", "comment", "--comment", 'dnat name: "n" id: "c"', "-m", "multiport", "-p", "tcp",
              "--destination-ports", "80,81", "-j", "RETURN"],
             ["!", "-d", "224.0.0.0/4", "-s", "0.0.0.0/0", "-j", "MASQUERADE"],
             ["-p", "udp", "--dport", "53", "-d", "10.0.0.1", "-j", "DNAT", "--to-destination", "10.1.0.2:53"]]
    with host_ns.enter():
        iptables.run(["-t", "nat", "-N", "T"])
        for r in rules:
            iptables.run(["-t", "nat", "-A", "T", *r])
        listed = [iptables.split_rule(line) for line in iptables.list_rules("nat", "T")]
    assert listed != rules  # iptables reorders and rewrites them ...
    assert [iptables.canonical(r) for r in listed] == [iptables.canonical(r) for r in rules]  # ... canonically equal
    assert iptables.canonical(["-s", "10.0.0.1", "-j", "X"]) != iptables.canonical(["-s", "10.0.0.2", "-j", "X"])


def test_table_present_asks_the_kernel(host_ns: Namespace) -> None:
    """The netlink check that spares a DEL an nft process agrees with nft itself."""
    with host_ns.enter():
        assert probe.nft_object_exists("inet", "pf_t") is False
        assert nft.list_json("table", "inet", "pf_t", missing_ok=True) == {"nftables": []}
        assert nft.list_json("chain", "inet", "pf_t", "c", missing_ok=True) == {"nftables": []}
        nft.run("add table inet pf_t\nadd chain inet pf_t c\n")
        assert probe.nft_object_exists("inet", "pf_t") is True
        assert probe.nft_object_exists("ip", "pf_t") is False and probe.nft_object_exists("ip6", "pf_t") is False
        assert nft.objects(nft.list_json("chain", "inet", "pf_t", "c", missing_ok=True), "chain")
        assert nft.list_json("chain", "inet", "pf_t", "nope", missing_ok=True) == {"nftables": []}
        iptables.run(["-t", "nat", "-N", "PF-X"])  # iptables-nft makes table ip nat
        assert probe.nft_object_exists("ip", "nat") is True
    assert probe.nft_object_exists("nosuchfamily", "x") is None


def test_iptables_nft_usable_without_a_process(host_ns: Namespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quick yes (ipMasq's default backend): iptables-nft where nf_tables answers a netlink
    request, without an iptables process."""
    ident = iptables._binary_identity(False)
    if ident is None or os.path.basename(os.path.realpath(ident[1])) != "xtables-nft-multi":
        pytest.skip("iptables here is not iptables-nft")

    def no_run(*_: object, **__: object) -> str:
        raise AssertionError("ran an iptables process")

    monkeypatch.setattr(iptables, "run", no_run)
    monkeypatch.setattr(iptables, "_usable", set())
    with host_ns.enter():
        assert iptables.usable(quick=True) and iptables.usable(True, quick=True)


def test_probe_answers_the_same_with_other_threads_and_closes_its_socket(host_ns: Namespace) -> None:
    """With other threads (the daemon) a probe's netfilter socket is closed on a thread of its own
    (the close can wait out the kernel's deferred release of earlier commits): the answer is the
    same, and the socket is closed all the same."""
    import threading
    import time

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with host_ns.enter():
            before = len(os.listdir("/proc/self/fd"))
            assert probe.nft_object_exists("inet", "pf_th") is False
            nft.run("add table inet pf_th\nadd chain inet pf_th c\n")
            assert probe.nft_object_exists("inet", "pf_th") is True
            assert probe.nft_object_exists("inet", "pf_th", "c") is True
            assert probe.nft_object_exists("inet", "pf_th", "nope") is False
            deadline = time.monotonic() + 10
            while len(os.listdir("/proc/self/fd")) > before and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(os.listdir("/proc/self/fd")) <= before
    finally:
        stop.set()
        other.join()
