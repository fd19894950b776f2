"""The waits for the kernel in a bridge ADD re-check soon, within the reference's bounds.

settle_addresses (IPv6 DAD, as Go's SettleAddresses) and bridge's wait for its host port used
to sleep 50 ms whenever the first look found the address tentative or the port down; both now
re-check after 1 ms, doubling, and keep the reference's overall bounds. No timing is asserted:
the pauses asked for are recorded."""

from __future__ import annotations

import pytest

from pycni import ipaddr
from pycni.net import addr
from pycni.plugins.main import bridge
from pycni.spec.errors import CNIError


class _Clock:
    """time.monotonic and time.sleep for net.addr: sleeping advances the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def _addrs(tentative: bool) -> list[addr.Addr]:
    return [addr.Addr(address=ipaddr.ip_interface("fd10::3/64"), index=2,
                      flags=addr.IFA_F_TENTATIVE if tentative else 0)]


def test_settle_rechecks_after_a_millisecond_doubling_to_50(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    looks = iter([True] * 8 + [False])
    monkeypatch.setattr(addr, "time", clock)
    monkeypatch.setattr(addr, "list_addrs", lambda name, family=None: _addrs(next(looks)))
    addr.settle_addresses("eth0", timeout=5.0)
    assert clock.pauses == [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05]


def test_settle_still_gives_up_at_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(addr, "time", clock)
    monkeypatch.setattr(addr, "list_addrs", lambda name, family=None: _addrs(True))
    with pytest.raises(CNIError, match="still has tentative addresses after 5.0s"):
        addr.settle_addresses("eth0", timeout=5.0)
    assert clock.now >= 5.0 and max(clock.pauses) == 0.05


def test_bridge_port_wait_keeps_the_reference_bound() -> None:
    waits = bridge.PORT_UP_RETRIES_MS
    assert waits[0] == 0  # the first look at once
    assert sum(waits) == 0 + 50 + 500 + 1000 + 1000  # the reference's retries: 2.55 s in all
    assert sum(waits[:waits.index(500)]) == 50  # its first 50 ms as re-checks after 1, 2, 4, ... ms
    assert list(waits[1:4]) == [1, 2, 4]
