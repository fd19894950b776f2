"""The periodic check of the policy table against the kernel, off the event path (docs/policy.md,
"The engine"): the nf_tables generation id answers "nothing was committed since ours" without
reading anything back; when something was, the table is read back by a child process and the
whole difference written in one transaction — unless a commit of ours came after the read, then
the snapshot is thrown away (not even unmarshalled) and the next check reads again. Real kernel,
throwaway namespaces (prefix psc).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from netns_util import Namespace, have_root, new_namespace

from pycni.cluster.model import Keys, PodMeta, WorkloadEndpoint
from pycni.cluster.policy.agent import PolicyEnforcer
from pycni.cluster.policy.nftsync import (
    GENERATIONS,
    Comparison,
    Op,
    Readback,
    Writer,
    batch,
    diff_script,
    read_table,
)
from pycni.cluster.policy.workload import TABLE

pytestmark = pytest.mark.skipif(not have_root(), reason="needs root (network namespaces)")

KEYS = Keys("/psc")


def _policy(name: str, ns: str, app: str) -> str:
    return json.dumps({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"podSelector": {"matchLabels": {"app": app}},
                                "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "web"}}}],
                                             "ports": [{"port": "http"}]}]}})


def _endpoint(enf: PolicyEnforcer, k: int, node: str = "node1") -> None:
    ep = WorkloadEndpoint(node=node, network="podnet", namespace="ns", pod=f"p{k}", container_id=f"c{k}",
                          ifname="eth0", interface_name=f"rtdpsc{k:08x}", ip_networks=[f"10.97.0.{k + 1}/32"])
    enf.event("PUT", KEYS.pod("ns", f"p{k}"),
              PodMeta(labels={"app": f"a{k % 3}", "tier": "web"}, ports=[("http", 80, "TCP")]).to_json())
    enf.event("PUT", KEYS.endpoint(node, "podnet", f"c{k}", "eth0"), ep.to_json())


@pytest.fixture
def node() -> Iterator[tuple[Namespace, PolicyEnforcer]]:
    """A namespace whose policy table an enforcer (strict) has programmed: 6 pods, 3 policies."""
    from pycni.net import nft

    ns = new_namespace("psc-rec")
    try:
        with ns.enter():
            nft.use_library()  # (as the agent runs it; undone below: it is the process's mode)
            enf = PolicyEnforcer(KEYS, "node1", lambda m: None, strict=True)
            enf.loaded = True
            for k in range(6):
                _endpoint(enf, k)
            for j in range(3):
                enf.event("PUT", KEYS.policy("ns", f"pol{j}"), _policy(f"pol{j}", "ns", f"a{j}"))
            assert enf.apply()
            yield ns, enf
    finally:
        nft.use_library(False)
        ns.delete()


def _settle(enf: PolicyEnforcer) -> None:
    """Poll a running read-back until it is taken (the agent's watch loop does this between events)."""
    deadline = time.monotonic() + 120
    while enf.poll_kernel() is not None:
        assert time.monotonic() < deadline, "the read-back did not finish"
        time.sleep(0.02)


def _as_wanted(enf: PolicyEnforcer) -> bool:
    return diff_script(read_table(), enf.index.desired()) == ""


def test_generation_id_answers_when_nothing_else_committed(node: tuple[Namespace, PolicyEnforcer]) -> None:
    _ns, enf = node
    w = enf.writer
    assert w.clean is not None and w.unchanged()
    enf.check_kernel()
    assert enf.readback is None and w.skips == 1  # nothing read back
    # our own commit keeps it known (it was the only one since)
    _endpoint(enf, 10)
    assert enf.apply() and w.clean is not None and w.unchanged()
    # anyone's commit, even to another table, makes it unknown: the check reads the table back
    from pycni.net import nft

    nft.run("add table inet psc_foreign\n")
    assert not w.unchanged()
    reads, writes = w.reads, enf.writes
    enf.check_kernel()
    assert enf.readback is not None
    _settle(enf)
    assert w.reads == reads + 1 and w.clean is not None and w.unchanged()
    assert enf.writes == writes  # (the snapshot was the mirror: nothing sent)


def test_periodic_check_repairs_a_hand_edit(node: tuple[Namespace, PolicyEnforcer]) -> None:
    """Elements, a chain's rules and a map entry changed by hand are put back by the check, in one
    transaction, with the index untouched."""
    _ns, enf = node
    from pycni.net import nft

    want = enf.index.desired()
    chain = sorted(c for c in want.chains if want.chains[c])[0]
    iface = sorted(want.covered)[0]
    nft.run(f'delete element inet {TABLE} covered {{ "{iface}" }}\n'
            f"flush chain inet {TABLE} {chain}\n"
            f'delete element inet {TABLE} ingress {{ "{sorted(want.ingress)[0]}" }}\n')
    assert not _as_wanted(enf)
    writes = enf.writes
    enf.check_kernel()
    _settle(enf)
    assert enf.writes == writes + 1 and _as_wanted(enf)
    assert enf.writer.unchanged()  # (ours was the only commit since the read)


def test_a_deleted_table_is_made_again(node: tuple[Namespace, PolicyEnforcer]) -> None:
    _ns, enf = node
    from pycni.net import nft

    nft.run(f"delete table inet {TABLE}\n")
    enf.check_kernel()
    _settle(enf)
    assert _as_wanted(enf)


def test_a_read_back_older_than_our_commit_is_discarded(node: tuple[Namespace, PolicyEnforcer]) -> None:
    """A snapshot taken before a commit of ours does not show it: diffing against it would undo or
    repeat our change. It is thrown away and the table read again."""
    _ns, enf = node
    from pycni.net import nft

    nft.run(f"flush chain inet {TABLE} {sorted(c for c in enf.index.desired().chains)[0]}\n")  # (a foreign edit)
    enf.check_kernel()
    rb = enf.readback
    assert rb is not None
    rb.thread.join(120)
    _endpoint(enf, 11)  # our commit after the snapshot
    assert enf.apply()
    assert enf.poll_kernel() is None  # discarded, left to the next check (no reader after reader in a burst)
    assert enf.discarded == 1 and enf.readback is None and not _as_wanted(enf)
    enf.check_kernel()  # the next periodic check
    _settle(enf)
    assert _as_wanted(enf) and enf.discarded == 1


def test_a_read_back_after_our_commit_is_used(node: tuple[Namespace, PolicyEnforcer]) -> None:
    """A snapshot read at a generation after our last commit shows it, even though that commit came
    after the check began (the writer's count moved)."""
    _ns, enf = node
    from pycni.net import nft

    enf.check_kernel()  # (nothing foreign yet: answered by the generation id)
    assert enf.readback is None
    _endpoint(enf, 12)
    assert enf.apply()
    nft.run("add table inet psc_foreign\n")
    rb = Readback(TABLE, enf.writer.commits - 1)  # as if begun before our commit, read after it
    enf.readback = rb
    _settle(enf)
    assert enf.discarded == 0 and rb.at is not None and _as_wanted(enf)


def test_a_read_back_is_compared_a_part_at_a_time(node: tuple[Namespace, PolicyEnforcer]) -> None:
    """Taking a snapshot holds no event up for more than one part's work: each step compares one
    part (with no time budget); a commit of ours between two steps drops the snapshot."""
    _ns, enf = node
    from pycni.net import nft

    nft.run("add table inet psc_foreign\n")
    enf.check_kernel()
    rb = enf.readback
    assert rb is not None
    rb.thread.join(120)
    parts = list(rb.parts())
    assert [kind for kind, _ in parts][:1] == ["head"] and {"chains", "sets"} <= {kind for kind, _ in parts}
    comparison = Comparison(enf.writer, rb)
    steps = 0
    while (verdict := comparison.step(0)) is None:
        steps += 1
    assert verdict == "equal" and steps == len(parts)
    comparison = Comparison(enf.writer, rb)
    assert comparison.step(0) is None  # (the head)
    _endpoint(enf, 13)
    assert enf.apply()  # our commit between two steps
    assert comparison.step(0) == "stale"


def test_usable_follows_the_generations() -> None:
    w = Writer()
    from pycni.cluster.policy.nftsync import Kernel

    w.mirror = Kernel()
    w.commits, w.committed_at = 5, 100
    assert w.usable(90, 5)  # no commit of ours since it began
    assert not w.usable(None, 5)  # a commit came during the dumps
    assert w.usable(100, 4) and w.usable(101, 4)  # read at or after our last commit
    assert not w.usable(99, 4)
    w.committed_at = GENERATIONS - 1  # the counter wraps
    assert w.usable(0, 4) and w.usable(GENERATIONS - 1, 4) and not w.usable(GENERATIONS - 2, 4)
    w.committed_at = None  # our commit's generation unknown: only a read begun after it will do
    assert not w.usable(0, 4)
    w.mirror = None  # a refusal since: the next write reads the kernel itself
    assert not w.usable(90, 5)


def test_element_only_changes_go_as_one_netlink_batch(node: tuple[Namespace, PolicyEnforcer]) -> None:
    """A new pod's transaction (elements only) skips libnftables; the kernel ends as wanted, and the
    generation stays known (the batch is one commit)."""
    _ns, enf = node
    w = enf.writer
    batches = w.netlink_batches
    _endpoint(enf, 21)
    assert enf.apply()
    assert w.netlink_batches == batches + 1 and _as_wanted(enf) and w.unchanged()
    enf.event("DELETE", KEYS.endpoint("node1", "podnet", "c21", "eth0"), "")
    assert enf.apply() and _as_wanted(enf)


def test_a_policy_change_goes_as_one_netlink_batch(node: tuple[Namespace, PolicyEnforcer]) -> None:
    """A new policy (its chains and rules, a new verdict chain, map elements moved) and then its
    deletion (chains deleted) skip libnftables too; the kernel ends as wanted each time."""
    _ns, enf = node
    w = enf.writer
    batches, reads = w.netlink_batches, w.reads
    enf.event("PUT", KEYS.policy("ns", "pol9"), _policy("pol9", "ns", "a1"))
    script, _ = w.write(*enf.index.collect())
    assert "add chain" in script and "add rule" in script
    assert w.netlink_batches == batches + 1 and _as_wanted(enf) and w.unchanged()
    enf.event("DELETE", KEYS.policy("ns", "pol9"), "")
    script, _ = w.write(*enf.index.collect())
    assert "delete chain" in script
    assert w.netlink_batches == batches + 2 and _as_wanted(enf) and w.reads == reads


def test_a_refused_batch_applies_nothing(node: tuple[Namespace, PolicyEnforcer]) -> None:
    from pycni.net.nft import NftError
    from pycni.net.nftdump import Generation

    ops = [Op("add", "element", "covered", ("rtdpscnew",)), Op("delete", "element", "covered", ("rtdpscnone",))]
    refused = batch(ops)
    assert refused is not None
    w = Writer()
    w.generation = Generation()
    with pytest.raises(NftError):
        w._commit_batch(refused)
    kernel = read_table()
    assert kernel is not None and "rtdpscnew" not in kernel.covered
    first_fails = batch(ops[::-1])  # (only the last message asks for an acknowledgement)
    assert first_fails is not None
    with pytest.raises(NftError):
        w._commit_batch(first_fails)
    kernel = read_table()
    assert kernel is not None and "rtdpscnew" not in kernel.covered
    good = batch(ops[:1])
    assert good is not None
    good.commit(w.generation.socket())  # (the socket still answers)
    kernel = read_table()
    assert kernel is not None and "rtdpscnew" in kernel.covered


@pytest.mark.parametrize("name, text", [
    ("covered", "rtd0123456789a"), ("s_abc_4", "10.1.2.3"), ("s_abc_6", "fd00::1"),
    ("np_abc_4", "10.1.2.3 . tcp . 8080"), ("np_abc_6", "fd00::2 . udp . 53"), ("np_abc_4", "10.0.0.1 . sctp . 9")])
def test_element_keys_encode_as_they_are_read_back(name: str, text: str) -> None:
    from pycni.cluster.policy.nftsync import _key_bytes, _key_text

    key = _key_bytes(name, text)
    assert key is not None and _key_text(name, key) == text.strip('"')


def test_what_the_batch_does_not_encode_goes_through_libnftables() -> None:
    ok = batch([Op("add", "element", "ingress", (("rtda", "jump v_1"), ("rtdb", "drop"))),
                Op("delete", "element", "egress", ("rtdc",)), Op("add", "element", "s_x_4", ("10.0.0.1", "10.0.0.2")),
                Op("add", "chain", "v_2", ("ns/p ingress",)), Op("add", "rule", "v_2", ("jump p_1_in",)),
                Op("add", "set", "np_x_6", ("ipv6_addr . inet_proto . inet_service",)),
                Op("flush", "chain", "v_3"), Op("delete", "chain", "v_3"), Op("delete", "set", "s_y_4")])
    assert ok is not None and len(ok.messages) == 9
    assert batch([Op("add", "table")]) is None  # (made once, by libnftables)
    assert batch([Op("add", "element", "ingress", ("rtda",))]) is None  # (a map element needs a verdict)
    assert batch([Op("add", "element", "odd", ("1",))]) is None
    assert batch([Op("add", "set", "x_4", ("ipv4_addr . ether_addr",))]) is None
    assert batch([Op("add", "rule", "v_2", ("ip saddr != { 10.0.0.1, 10.0.0.2 } accept",))]) is not None
    assert batch([Op("add", "rule", "v_2", ("counter accept",))]) is None
