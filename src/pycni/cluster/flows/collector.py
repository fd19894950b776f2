"""The collector: a thread that reads the NFLOG group and feeds the flow ring through the resolver.

Why a thread of the agent and not a process: the resolver's answers (which policy a chain is,
which pod an address is) live in the agent's memory, and a dictionary lookup per flow is all
they should cost. The reader is opened by :meth:`Collector.start`, in the caller's thread (so a
busy group or a missing permission is the caller's error, at start) and in ``netns`` when one
is given (tests, benches); the thread only reads.
"""

from __future__ import annotations

import sys
import threading

from pycni.cluster.flows.model import DENIED, Ring, parse_prefix, to_flow

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pycni.cluster.flows.model import Flow, Resolver
    from pycni.net.nflog import LoggedPacket, NflogReader

DEFAULT_GROUP = 36  # the NFLOG group the policy engine logs to (docs/flows.md)
READ_TIMEOUT = 0.5  # how long a read waits: the longest stop() waits for the thread


class FlowMetrics:
    """The flow metrics (docs/metrics.md), on ``registry`` (prometheus_client's global one by
    default; a test passes its own). Built only where metrics are served: prometheus_client stays
    off every other path."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter

        reg = REGISTRY if registry is None else registry
        self.dropped = Counter("pycni_policy_dropped_packets", "Packets policy dropped and logged, by the "
                               "endpoint they were to or from (namespace, pod) and the policy or reason that "
                               "decided (rate-limited in the kernel: a lower bound under a flood)",
                               ["namespace", "pod", "policy"], registry=reg)
        self.logged = Counter("pycni_flows_logged", "Flows kept in the flow ring (allowed and denied)", registry=reg)
        self.rate_limited = Counter("pycni_flows_rate_limited", "Flows read but not kept: over the ring's "
                                    "per-second rate", registry=reg)

    def drop(self, flow: Flow) -> None:
        namespace, sep, pod = flow.endpoint.partition("/")
        if not sep:
            namespace, pod = "", flow.endpoint
        self.dropped.labels(namespace, pod, flow.policy or flow.reason).inc()


class Collector:
    """Reads NFLOG ``group`` into ``ring`` until :meth:`stop`. Counters: ``packets`` read,
    ``foreign`` (a prefix not ours: another tool's rule logging to the group)."""

    def __init__(self, ring: Ring, resolver: Resolver, group: int = DEFAULT_GROUP, netns: str | None = None,
                 metrics: FlowMetrics | None = None) -> None:
        self.ring = ring
        self.resolver = resolver
        self.group = group
        self.netns = netns
        self.metrics = metrics
        self.packets = 0
        self.foreign = 0
        self.errors = 0
        self._reader: NflogReader | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind the group and start reading. OSError (``nflog.GroupBusy`` when another reader
        holds the group, EPERM without CAP_NET_ADMIN) when it cannot."""
        from pycni.net.nflog import NflogReader

        if self.netns:
            from pycni.net.netns import enter

            with enter(self.netns):
                self._reader = NflogReader(self.group)
        else:
            self._reader = NflogReader(self.group)
        self._thread = threading.Thread(target=self._run, name=f"flows-nflog-{self.group}", daemon=True)
        self._thread.start()

    @property
    def overruns(self) -> int:
        """Reads that found the kernel had dropped log messages (the socket's buffer was full)."""
        return self._reader.overruns if self._reader is not None else 0

    def _run(self) -> None:
        reader = self._reader
        assert reader is not None
        while not self._stop.is_set():
            try:
                packets = reader.read(READ_TIMEOUT)
            except OSError as e:
                if self._stop.is_set():
                    return
                self.errors += 1  # a kernel hiccup: say it once a time and keep reading
                sys.stderr.write(f"pycni: flows: reading NFLOG group {self.group} failed: {e}\n")
                self._stop.wait(1.0)
                continue
            for packet in packets:
                self.ingest(packet)

    def ingest(self, packet: LoggedPacket) -> Flow | None:
        """One logged packet into the ring (the flow kept, or None: not ours, or over the rate)."""
        self.packets += 1
        parsed = parse_prefix(packet.prefix)
        if parsed is None:
            self.foreign += 1
            return None
        seq = self.ring.admit()
        metrics = self.metrics
        if seq is None:
            if metrics is not None:
                metrics.rate_limited.inc()
                if parsed[0] == DENIED:
                    flow = to_flow(packet, self.resolver)
                    if flow is not None:
                        metrics.drop(flow)
            return None
        flow = to_flow(packet, self.resolver, seq)
        if flow is None:
            return None
        self.ring.add(flow)
        if metrics is not None:
            metrics.logged.inc()
            if flow.verdict == DENIED:
                metrics.drop(flow)
        return flow

    def stop(self) -> None:
        """Stop the thread (within a read's timeout), unbind the group, wake the followers."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(READ_TIMEOUT * 4 + 1)
            self._thread = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.ring.close()
