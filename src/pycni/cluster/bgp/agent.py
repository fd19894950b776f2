"""The agent's BGP half: ``pycni node --mode bgp`` keeps BIRD's configuration equal to what etcd
says and BIRD running; routing between nodes is then BIRD's (the agent still blackholes its own
blocks, as in the other modes).

:class:`BgpDriver` is what :class:`pycni.cluster.node.Agent` calls: ``load`` at every full read,
``event`` for each watch event, ``update`` after each convergence (re-render; reload BIRD with
``birdc configure`` only when the text changed) and ``tick`` every pass of its loop (a BIRD of
ours that died is started again, with graceful restart recovery).
"""

from __future__ import annotations

import os
import time

from pycni.cluster.model import bgp_node_as, bgp_node_json
from pycni.record import record
from pycni.spec.errors import invalid_config

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from pycni.cluster.kv import KVStore
    from pycni.cluster.node import ClusterView

# (the BIRD and configuration modules are imported by the driver, not at `pycni`'s parser build:
# ``subprocess`` alone costs every pycni command some 4 ms)

DEFAULT_STATE_DIR = "/run/pycni/bgp"  # BIRD's files go in <this>/<node name>/
DEFAULT_HOLD = 90
DEFAULT_RESTART = 120
SUPERVISE_SECONDS = 1.0
# While a restarted BIRD recovers, the agent holds a copy of each route it had installed, at a
# metric just worse than BIRD's (see BgpDriver._hold): BIRD 2 ends its recovery as soon as its
# sessions are up, and prunes what a peer has not re-sent by then.
RTPROT_PYCNI_HOLD = 95
BIRD_METRIC = 32  # the kernel protocols' metric (render's), so the held copies at 33 lose to BIRD's


@record
class BgpOptions:
    as_number: int = 0          # 0: the cluster's (``pycni bgp config --as-number``)
    state_dir: str = DEFAULT_STATE_DIR
    hold: int = DEFAULT_HOLD
    restart: int = DEFAULT_RESTART
    own_bird: bool = True       # False: the operator runs BIRD on our files (docs/cluster.md)


def add_arguments(sp: argparse.ArgumentParser) -> None:
    """``pycni node``'s flags for ``--mode bgp`` (and ``pycni bgp status``'s state directory)."""
    sp.add_argument("--as-number", type=int, default=0,
                    help="bgp mode: this node's AS (default: the cluster's, `pycni bgp config`, 64512)")
    add_state_dir_argument(sp)
    sp.add_argument("--bgp-hold-time", type=int, default=DEFAULT_HOLD,
                    help=f"bgp mode: BGP hold time in seconds, keepalive a third of it (default {DEFAULT_HOLD})")
    sp.add_argument("--bgp-restart-time", type=int, default=DEFAULT_RESTART,
                    help="bgp mode: how long peers keep this node's routes while its BIRD restarts "
                         f"(graceful restart; default {DEFAULT_RESTART})")
    sp.add_argument("--bird", choices=("own", "external"), default="own",
                    help="bgp mode: start and supervise BIRD (own, default), or only write its configuration "
                         "and reload the BIRD the operator runs on it (external)")


def add_state_dir_argument(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--bgp-state-dir", default=DEFAULT_STATE_DIR,
                    help=f"where BIRD's files live, one directory per node (default {DEFAULT_STATE_DIR})")


def options(ns: argparse.Namespace) -> BgpOptions:
    """Validated bgp-mode options; CNIError 7 naming the flag."""
    if ns.as_number and not 0 < ns.as_number < 1 << 32:
        raise invalid_config(f"invalid --as-number {ns.as_number}", "an AS number is 1..4294967295")
    if not 3 <= ns.bgp_hold_time <= 65535:
        raise invalid_config(f"invalid --bgp-hold-time {ns.bgp_hold_time}", "BGP allows 3..65535 seconds")
    if not 1 <= ns.bgp_restart_time <= 4095:
        raise invalid_config(f"invalid --bgp-restart-time {ns.bgp_restart_time}", "1..4095 seconds")
    if not os.path.isabs(ns.bgp_state_dir):
        raise invalid_config(f"invalid --bgp-state-dir {ns.bgp_state_dir!r}", "give an absolute path")
    return BgpOptions(as_number=ns.as_number, state_dir=ns.bgp_state_dir, hold=ns.bgp_hold_time,
                      restart=ns.bgp_restart_time, own_bird=ns.bird == "own")


def state_dir(base: str, node: str) -> str:
    return os.path.join(base, node)


class BgpDriver:
    """BIRD's configuration and process for one node's agent."""

    def __init__(self, opts: BgpOptions, prefix: str, node: str, log: Any) -> None:
        import shutil

        from pycni.cluster.bgp.bird import Bird
        from pycni.cluster.bgp.config import BgpState, Timers

        if shutil.which("bird") is None or shutil.which("birdc") is None:
            raise invalid_config("bgp mode needs BIRD 2 (bird and birdc on PATH)", "install Debian's bird2")
        self.opts, self.node, self.log = opts, node, log
        self.state = BgpState(prefix)
        self.bird = Bird(state_dir(opts.state_dir, node), own=opts.own_bird)
        self.text = self.bird.current()  # an agent restarted on a running BIRD reloads nothing
        self.timers = Timers.from_hold(opts.hold, opts.restart)
        self.kv: KVStore | None = None
        self.next_check = 0.0
        self.failed = ""  # the last BIRD failure logged (once until it changes)
        self.hold_until = 0.0  # held copies of BIRD's routes go at this time (0: none held)
        self.hold_settled = 0.0  # ... or this long after every session is back
        if _held_routes():
            self.hold_until = time.monotonic() + opts.restart  # left by an agent killed while holding

    def load(self, kv: KVStore) -> None:
        """A full read of ``P/bgp/``."""
        self.kv = kv
        self.state.load(kv)

    def event(self, type_: str, key: str, value: str) -> bool:
        if type_ == "DELETE":
            return self.state.delete(key)
        return self.state.put(key, value)

    def update(self, view: ClusterView) -> None:
        """Render; when the text changed, write it and reload (or start) BIRD. A BIRD refusal is
        logged and retried at the next update."""
        from pycni.cluster.bgp.bird import BirdError
        from pycni.cluster.bgp.config import desired, render

        want = desired(view, self.state, self.node, self.opts.as_number)
        self._publish(want.as_number)
        text = render(want, self.timers, self.bird.log)
        if text == self.text and (not self.bird.own or self.bird.pid()):
            return
        try:
            if text != self.text:
                self.bird.write(text)
                self.text = text
                self.log(f"bgp: BIRD configuration written ({len(want.announce)} prefixes announced: "
                         f"{', '.join(want.announce) or 'none'}; sessions: "
                         f"{', '.join(f'{s.kind} {s.peer} {s.address}' for s in want.sessions) or 'none'})"
                         + "".join(f"; skipped {s}" for s in want.skipped))
                if not self.bird.own or self.bird.pid():
                    self.log(f"bgp: birdc configure: {self.bird.configure()}")
                    return
            self._ensure_running()
        except BirdError as e:
            self._failure(str(e))

    def tick(self) -> None:
        """Start our BIRD again if it died (at most once per second)."""
        now = time.monotonic()
        if not self.bird.own or now < self.next_check or not self.text:
            return
        self.next_check = now + SUPERVISE_SECONDS
        from pycni.cluster.bgp.bird import BirdError

        try:
            self._ensure_running()
        except BirdError as e:
            self._failure(str(e))
        if self.hold_until:
            self._release(now)

    def _ensure_running(self) -> None:
        if not self.bird.own or self.bird.pid():
            return
        recover = self.bird.started_before()
        if recover:
            self._hold()
        pid = self.bird.start(recover=recover)
        self.failed = ""
        self.log(f"bgp: BIRD started (pid {pid}, {self.bird.dir}"
                 + (", graceful restart recovery: BIRD was running before)" if recover else ")"))

    def _hold(self) -> None:
        """Copy every route the dead BIRD left in the kernel (proto bird) at metric + 1, ours
        (proto 95): when the new BIRD prunes one a peer has not re-sent yet, traffic takes the copy."""
        from pycni.net import route
        from pycni.net.nl import RTPROT_BIRD
        from pycni.spec.errors import CNIError

        held = 0
        for r in route.list_routes():
            if r.proto != RTPROT_BIRD or r.gw is None:
                continue
            try:
                route.replace_route(r.dst, gw=r.gw, dev=r.oif, proto=RTPROT_PYCNI_HOLD, priority=r.priority + 1)
                held += 1
            except CNIError as e:
                self.log(f"bgp: FAILED holding {r.dst} via {r.gw}: {e.msg}: {e.details}")
        self.hold_until = time.monotonic() + self.opts.restart
        self.hold_settled = 0.0
        self.log(f"bgp: holding {held} routes of the previous BIRD (proto {RTPROT_PYCNI_HOLD}) while it recovers")

    def _release(self, now: float) -> None:
        """Drop the held copies once every session has been back for a hold time (the peers have
        re-sent their routes by then), or after the restart time."""
        from pycni.cluster.bgp.bird import BirdError

        if not self.hold_settled:
            try:
                if all(p.state == "Established" for p in self.bird.status()):
                    self.hold_settled = now + min(self.timers.hold, self.opts.restart)
            except BirdError:
                pass
        if now < self.hold_until and not (self.hold_settled and now >= self.hold_settled):
            return
        from pycni.net import route

        gone = 0
        for r in _held_routes():
            gone += route.del_route(r.dst, gw=r.gw, proto=RTPROT_PYCNI_HOLD, priority=r.priority)
        self.hold_until = self.hold_settled = 0.0
        self.log(f"bgp: released {gone} held routes (BIRD recovered)")

    def _failure(self, msg: str) -> None:
        if msg != self.failed:
            self.failed = msg
            self.log(f"bgp: FAILED {msg}")

    def _publish(self, as_number: int) -> None:
        """``P/bgp/nodes/<me>``: the AS this node runs with (the other nodes peer with it only once
        it is there: it also says this node speaks BGP)."""
        if self.kv is None or self.state.node_as.get(self.node) == as_number:
            return
        key = self.state.keys.bgp_node(self.node)
        self.kv.put(key, bgp_node_json(as_number))
        self.state.node_as[self.node] = bgp_node_as(bgp_node_json(as_number))


def _held_routes() -> list[Any]:
    from pycni.net import route

    return [r for r in route.list_routes() if r.proto == RTPROT_PYCNI_HOLD]
