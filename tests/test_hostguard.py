"""The suite's hermeticity guard (tests/hostguard.py) sees each kind of change a test could leave.

Run against a throwaway namespace and a temp dir standing for the machine's network and CNI
directories: conftest.py takes the same snapshots of the real ones around the whole run.
"""

from __future__ import annotations

from pathlib import Path

import hostguard
from netns_util import Namespace


def test_guard_names_every_change(host_ns: Namespace, tmp_path: Path) -> None:
    state = tmp_path / "var-lib-cni"
    (state / "networks").mkdir(parents=True)
    (state / "networks" / "keep").write_text("x")
    host_ns.run(["ip", "link", "add", "ncg0", "type", "bridge"])
    with host_ns.enter():
        before = hostguard.snapshot((str(state),))
        assert hostguard.describe(before, hostguard.snapshot((str(state),))) == []  # stable when nothing changes
        (state / "networks" / "refnet").mkdir()
        (state / "networks" / "refnet" / "10.77.0.1").write_text("ctr\neth0")
        (state / "networks" / "keep").write_text("y")
        (state / "gone").mkdir()  # made and removed again: only the directory's mtime says so
        (state / "gone").rmdir()
        host_ns.run(["ip", "link", "add", "ncg1", "type", "bridge"])
        host_ns.run(["ip", "addr", "add", "10.1.2.3/24", "dev", "ncg0"])
        host_ns.run(["ip", "link", "set", "ncg0", "up"])
        host_ns.run(["ip", "rule", "add", "from", "10.1.2.3", "table", "7"])
        host_ns.run(["nft", "add", "table", "inet", "ncguard"])
        host_ns.run(["iptables", "-t", "nat", "-N", "NCGUARD"])
        host_ns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        host_ns.run(["tc", "qdisc", "add", "dev", "ncg0", "root", "handle", "1:", "htb"])
        report = "\n".join(hostguard.describe(before, hostguard.snapshot((str(state),))))
    for expected in (f"+ {state}/networks/refnet/10.77.0.1", f"+ {state}/networks/refnet/", f"- {state}/ (mtime",
                     f"- {state}/networks/keep (1 bytes", "+ ncg1 type=ether kind=bridge",
                     "+ ncg0 10.1.2.3/24", "dst=10.1.2.0/24 dev=ncg0", '"src": "10.1.2.3"',
                     "+ table inet ncguard", "nat: :NCGUARD -", "+ net.ipv4.ip_forward = 1",
                     "+ dev=ncg0 kind=htb handle=1: root=True"):
        assert expected in report, (expected, report)
