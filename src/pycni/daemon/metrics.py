"""What ``pycni daemon --metrics-address`` exports: the plugin calls it serves (docs/metrics.md).

Built only when the flag is given (prometheus_client stays off the daemon's default imports);
with worker processes every worker counts into prometheus_client's multi-process files and the
main process serves their sum (:func:`pycni.metrics.multiprocess_dir`).
"""

from __future__ import annotations

from pycni.metrics import LATENCY_BUCKETS

SUCCESS, ERROR = "success", "error"


class DaemonMetrics:
    """The daemon's metrics: calls by plugin, command and result, their latency, calls in flight."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.calls = Counter("pycni_daemon_plugin_calls", "Plugin calls the daemon served, by plugin, CNI "
                             "command and result (success, or error: the plugin answered a CNI error)",
                             ["plugin", "command", "result"])
        self.duration = Histogram("pycni_daemon_plugin_call_duration_seconds", "Time the daemon took to run a "
                                  "plugin call, from its request read to its answer, by plugin and command",
                                  ["plugin", "command"], buckets=LATENCY_BUCKETS)
        self.in_flight = Gauge("pycni_daemon_plugin_calls_in_flight", "Plugin calls running now",
                               multiprocess_mode="livesum")

    def observe(self, plugin: str, command: str, ok: bool, seconds: float) -> None:
        command = command or "NONE"
        self.calls.labels(plugin, command, SUCCESS if ok else ERROR).inc()
        self.duration.labels(plugin, command).observe(seconds)
