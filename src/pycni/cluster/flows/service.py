"""What the node agent starts for flows: the ring, the collector and the query server, together.

Why one object: the agent (``pycni node``) should plug flows in with a few lines —
:func:`add_arguments` on its parser, ``FlowService.from_args(args, resolver, metrics)`` and
``start()`` once its policy engine can resolve, ``stop()`` at exit (docs/flows.md, "For the
policy engine").
"""

from __future__ import annotations

from pycni.cluster.flows.collector import DEFAULT_GROUP, Collector, FlowMetrics
from pycni.cluster.flows.model import Ring
from pycni.cluster.flows.server import DEFAULT_SOCKET, FlowServer

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from pycni.cluster.flows.model import Resolver

DEFAULT_CAPACITY = 10_000
DEFAULT_RATE = 1_000.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--flows-socket``, ``--flows-group``, ``--flows-capacity``, ``--flows-rate`` on the agent."""
    parser.add_argument("--flows-socket", default=DEFAULT_SOCKET, metavar="PATH",
                        help=f"where `pycni flows` asks this agent for recent flows (default {DEFAULT_SOCKET}); "
                             "'' turns flow collection off")
    parser.add_argument("--flows-group", type=int, default=DEFAULT_GROUP, metavar="N",
                        help=f"the NFLOG group the policy rules log to (default {DEFAULT_GROUP})")
    parser.add_argument("--flows-capacity", type=int, default=DEFAULT_CAPACITY, metavar="N",
                        help=f"how many recent flows are kept (default {DEFAULT_CAPACITY}; the oldest go first)")
    parser.add_argument("--flows-rate", type=float, default=DEFAULT_RATE, metavar="PER_SECOND",
                        help=f"at most this many flows a second are kept (default {DEFAULT_RATE:g}); the rest "
                             "are counted in pycni_flows_rate_limited_total")


class FlowService:
    """The ring, its collector and its server; :meth:`start` and :meth:`stop` all three."""

    def __init__(self, resolver: Resolver, socket_path: str = DEFAULT_SOCKET, group: int = DEFAULT_GROUP,
                 capacity: int = DEFAULT_CAPACITY, rate: float = DEFAULT_RATE, metrics: FlowMetrics | None = None,
                 netns: str | None = None) -> None:
        self.ring = Ring(capacity, rate)
        self.collector = Collector(self.ring, resolver, group, netns=netns, metrics=metrics)
        self.server = FlowServer(socket_path, self.ring)

    @classmethod
    def from_args(cls, args: argparse.Namespace, resolver: Resolver, metrics: FlowMetrics | None = None
                  ) -> FlowService | None:
        """From :func:`add_arguments`' flags (None when ``--flows-socket ''`` turns flows off);
        ``metrics``: the counters to count into (the agent's, made with its --metrics-address
        registry: pycni.cluster.metrics.AgentMetrics.flows)."""
        if not args.flows_socket:
            return None
        return cls(resolver, args.flows_socket, args.flows_group, args.flows_capacity, args.flows_rate, metrics)

    def start(self) -> None:
        """Bind the NFLOG group, then listen; on failure nothing is left running."""
        self.collector.start()
        try:
            self.server.start()
        except BaseException:
            self.collector.stop()
            raise

    def stop(self) -> None:
        self.collector.stop()
        self.server.stop()
