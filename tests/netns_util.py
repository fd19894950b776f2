"""Throwaway network namespaces for tests: one plays the host, others play containers.

Nothing here touches the machine's own namespace: every namespace is created with a unique
``pycni-t-`` name and deleted at teardown (links inside die with it).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from pycni.net import netns as _netns

NETNS_DIR = "/var/run/netns"
# A file where every namespace made here is listed (set by conftest.py for the whole run).
NETNS_LOG_ENV = "PYCNI_TEST_NETNS_LOG"


@dataclass
class Namespace:
    name: str

    @property
    def path(self) -> str:
        return f"{NETNS_DIR}/{self.name}"

    def run(self, cmd: Sequence[str], check: bool = True, input: str | bytes | None = None,
            env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command inside this namespace (``ip netns exec``)."""
        text_input = input.decode() if isinstance(input, bytes) else input
        proc = subprocess.run(["ip", "netns", "exec", self.name, *cmd], input=text_input, env=env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} in {self.name} failed ({proc.returncode}):\n"
                                 f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def enter(self):  # type: ignore[no-untyped-def]
        """Context manager: the calling thread (and processes it forks) run in this namespace."""
        return _netns.enter(self.path)

    def delete(self) -> None:
        """Unmount the namespace; the kernel destroys it (and its links) later, in a work queue."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def wait_link_gone(self, dev: str, timeout: float = 10.0) -> None:
        """Wait until link ``dev`` no longer exists here, or fail.

        The host end of a veth whose peer was in a deleted namespace goes only when the kernel
        destroys that namespace, asynchronously after ``delete`` (Go's plugins leave it to the
        kernel too), so a test asserting it is gone has to wait for that.
        """
        tries = max(1, int(timeout * 10))
        self.run(["sh", "-c", f"for i in $(seq {tries}); do ip link show dev {dev} >/dev/null 2>&1 || exit 0; "
                              "sleep 0.1; done; exit 1"])

    def wait_dad(self, dev: str | None = None, tries: int = 100) -> None:
        """Wait (0.1 s a try) until no IPv6 address here (on ``dev``) is tentative, or fail.

        Right after an ADD the host-side addresses are still in duplicate address detection,
        and until it ends the host cannot resolve neighbours over them (Go's plugins alike).
        """
        where = f"dev {dev} " if dev else ""
        self.run(["sh", "-c", f"for i in $(seq {tries}); do [ -z \"$(ip -6 addr show {where}tentative)\" ] "
                              "&& exit 0; sleep 0.1; done; exit 1"])


def new_namespace(prefix: str = "pycni-t") -> Namespace:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    log = os.environ.get(NETNS_LOG_ENV)
    if log:  # the suite's guard (tests/hostguard.py) names the ones a run leaves behind
        with open(log, "a") as f:
            f.write(name + "\n")
    ns = Namespace(name)
    ns.run(["ip", "link", "set", "lo", "up"])
    return ns


def have_root() -> bool:
    return os.geteuid() == 0
