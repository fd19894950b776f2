"""One container interface's DHCP lease: acquire it, keep it (T1 renew, T2 rebind, re-acquire
after expiry) on a thread of its own, release it on DEL. Stdlib only.

Every network operation enters the container's namespace by path for the calling thread only
(``pycni.net.netns.enter``), so many leases run side by side in one daemon. When the namespace
or the interface disappears (a container gone without DEL), maintenance ends quietly.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections.abc import Callable
from functools import partial

from pycni import ipaddr
from pycni.net import netns
from pycni.plugins.ipam.dhcp import client as C
from pycni.record import record
from pycni.spec.errors import INVALID_ENV, IO_FAILURE, TRY_AGAIN, CNIError, invalid_config

TYPE_CHECKING = False  # not typing's: importing typing costs a one-shot plugin ~4 ms (see pycni.record)
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("pycni.dhcp")

RESEND_FAST_DELAY = 2.0  # the reference retries a few times quickly, then backs off from 4 s
RESEND_FAST_MAX = 4
RESEND_DELAY0 = 4.0
SCOPE_LINK = 253


@record(frozen=True)
class Timing:
    """The daemon's -timeout, -resendmax and -resendtimeout, in seconds."""

    timeout: float = 10.0
    resend_max: float = 62.0
    resend_timeout: float = 208.0


class Gone(Exception):
    """The container's namespace or interface no longer exists (``error`` says which, code 4)."""

    def __init__(self, error: CNIError) -> None:
        super().__init__(str(error))
        self.error = error


class Stopped(Exception):
    """The lease was stopped while waiting."""


def _backoff(attempt: int, resend_max: float) -> float:
    if attempt < RESEND_FAST_MAX:
        base = RESEND_FAST_DELAY
    else:
        base = min(RESEND_DELAY0 * 2 ** (attempt - RESEND_FAST_MAX), resend_max)
    return max(0.2, base + random.uniform(-1.0, 1.0))


class Lease:
    """A lease held for ``key`` (the client id: containerID/network/ifname)."""

    def __init__(self, key: str, container_id: str, network: str, netns_path: str, ifname: str,
                 opts: C.ClientOptions, timing: Timing,
                 on_gone: Callable[[Lease], None] | None = None) -> None:
        self.key = key
        self.container_id = container_id
        self.network = network
        self.netns_path = netns_path
        self.ifname = ifname
        self.opts = opts
        self.timing = timing
        self.on_gone = on_gone
        self.binding: C.Binding | None = None
        self.renew_at = self.rebind_at = self.expire_at = 0.0
        self.renewals = 0
        self._release_wanted = True
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ---- one exchange inside the container's namespace ----------------------------------------
    def _in_netns(self, fn: Callable[[C.Transport], C.Binding | None], link_up: bool = False) -> C.Binding | None:
        try:
            with netns.enter(self.netns_path):
                try:
                    if link_up:  # before the socket exists: a packet socket bound to a down link is dead
                        C.set_link_up(self.ifname)
                    with C.Transport(self.ifname) as t:
                        return fn(t)
                except OSError as e:
                    if e.errno in (errno.ENODEV, errno.ENXIO):
                        raise Gone(CNIError(INVALID_ENV, f"interface {self.ifname!r} not found",
                                            f"no interface {self.ifname!r} in netns {self.netns_path}")) from None
                    raise
        except CNIError as e:  # the namespace cannot be entered: it is gone
            raise Gone(e) from None

    def _commit(self, binding: C.Binding) -> None:
        ack = binding.ack
        lease_time = ack.seconds_option(51)
        if lease_time is None:
            lease_time = 3600
        infinite = lease_time == 0xFFFFFFFF
        t2 = ack.seconds_option(59)
        if t2 is None or t2 > lease_time:
            t2 = lease_time * 85 // 100
        t1 = ack.seconds_option(58)
        if t1 is None or t1 > t2:
            t1 = lease_time // 2
        now = time.monotonic()
        with self._lock:
            self.binding = binding
            far = now + 10 * 365 * 86400
            self.expire_at = far if infinite else now + lease_time
            self.rebind_at = far if infinite else now + t2
            self.renew_at = far if infinite else now + t1

    # ---- acquisition (on the ADD request's thread) ----------------------------------------------
    def acquire(self) -> None:
        """Get a lease, resending with the reference's backoff until -resendtimeout; code 11 on failure."""
        deadline = time.monotonic() + self.timing.resend_timeout
        last = ""
        tries = 0
        while True:
            try:
                budget = min(self.timing.timeout, max(deadline - time.monotonic(), 0.5))
                binding = self._in_netns(partial(C.acquire, opts=self.opts, timeout=budget), link_up=True)
                assert binding is not None
                self._commit(binding)
                self._check_binding(binding)
                log.info("%s: lease acquired: %s from %s, expires in %.0fs", self.key, binding.address,
                         binding.server_ip, self.expire_at - time.monotonic())
                return
            except Gone as e:
                raise e.error from None
            except (C.DHCPTimeout, C.DHCPNak) as e:
                last = str(e)
            except OSError as e:
                raise CNIError(IO_FAILURE, f"DHCP on {self.ifname} failed: {e.strerror or e}",
                               f"netns {self.netns_path}, interface {self.ifname}") from None
            tries += 1
            left = deadline - time.monotonic()
            if left <= 0:
                break
            log.info("%s: %s; retrying", self.key, last)
            if self._stop.wait(min(_backoff(tries, self.timing.resend_max), left)):
                raise CNIError(TRY_AGAIN, "lease acquisition cancelled", self.key)
        raise CNIError(TRY_AGAIN, f"no DHCP lease for {self.ifname}: no answer from a DHCP server",
                       f"{last} after {tries} attempt(s) in {self.timing.resend_timeout:g}s; check that a "
                       "DHCP server serves the network this interface is attached to, then retry")

    def _check_binding(self, binding: C.Binding) -> None:
        """Refuse (and give back) a lease we cannot turn into a result."""
        if binding.ack.subnet_mask is None:
            self._release()
            raise invalid_config("DHCP option Subnet Mask not found in DHCPACK",
                                 f"the server {binding.server_ip} must send option 1 (subnet-mask)")

    # ---- maintenance (own thread) ---------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._maintain, name=f"lease {self.key}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def _maintain(self) -> None:
        try:
            self._loop()
        except Gone as e:
            log.info("%s: %s; stopping lease maintenance", self.key, e)
            self._stop.set()
            if self.on_gone:
                self.on_gone(self)
        except Stopped:
            pass
        except Exception:  # noqa: BLE001 - a lease thread must never die silently
            log.exception("%s: lease maintenance failed", self.key)
        finally:
            if self._stop.is_set() and self.binding is not None and self._release_wanted:
                self._release()

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            now = time.monotonic()
            binding = self.binding
            assert binding is not None
            try:
                if now < self.renew_at:
                    self._sleep(self.renew_at - now)
                    continue
                # when the current state (RENEWING until T2, REBINDING until expiry) ends
                state_end = self.rebind_at if now < self.rebind_at else self.expire_at
                new = self._in_netns(self._exchange_for(binding, now))
                assert new is not None
                if new.address != binding.address:
                    log.warning("%s: server gave %s instead of %s; the interface still carries the old one",
                                self.key, new.address, binding.address)
                self._commit(new)
                self.renewals += 1
                failures = 0
                log.info("%s: lease renewed (%s), expires in %.0fs", self.key, new.address,
                         self.expire_at - time.monotonic())
            except (C.DHCPTimeout, C.DHCPNak, OSError) as e:  # OSError: e.g. the link is down for now
                failures += 1
                log.info("%s: %s", self.key, e)
                now = time.monotonic()
                if isinstance(e, C.DHCPNak):  # the address is no longer ours: start over
                    self.renew_at = self.rebind_at = self.expire_at = now
                if now >= self.expire_at:  # INIT after expiry or a NAK: back off as on ADD
                    self._sleep(_backoff(failures, self.timing.resend_max))
                elif now < state_end:
                    # RFC 2131 4.4.5: retry after half the time left in this state (at most -resendmax)
                    self._sleep(min(max((state_end - now) / 2, 1.0), state_end - now, self.timing.resend_max))
                # else the state ran out during the attempt: go straight on to the next one

    def _exchange_for(self, binding: C.Binding, now: float) -> Callable[[C.Transport], C.Binding]:
        """What to send now: RENEWING before T2, REBINDING before expiry, then INIT again."""
        timeout = self.timing.timeout
        if now < self.rebind_at:
            log.info("%s: renewing lease", self.key)
            return lambda t: C.renew(t, self.opts, binding, timeout)
        if now < self.expire_at:
            log.info("%s: no renewal by T2, rebinding", self.key)
            return lambda t: C.renew(t, self.opts, binding, timeout, rebind=True)
        log.warning("%s: lease on %s expired, acquiring again", self.key, binding.address)
        return lambda t: C.acquire(t, self.opts, timeout, requested=binding.address)

    def _sleep(self, seconds: float) -> None:
        if self._stop.wait(max(seconds, 0.0)):
            raise Stopped

    def _release(self) -> None:
        binding = self.binding
        assert binding is not None
        try:
            self._in_netns(lambda t: C.release(t, self.opts, binding))
            log.info("%s: released %s", self.key, binding.address)
        except Gone as e:
            try:
                C.release_routed(self.opts, binding)
                log.info("%s: released %s (sent from the daemon's namespace: %s)", self.key, binding.address, e)
            except OSError as e2:
                log.warning("%s: cannot release %s: %s; and from the daemon's namespace: %s; the server "
                            "keeps it until it expires", self.key, binding.address, e, e2)
        except OSError as e:
            log.warning("%s: failed to send DHCPRELEASE: %s", self.key, e)

    def stop(self, release: bool = True, wait: float = 10.0) -> None:
        """End maintenance; send DHCPRELEASE unless told not to (daemon shutdown keeps leases)."""
        self._release_wanted = release
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait)
        elif self._thread is None and release and self.binding is not None:
            self._release()

    # ---- the CNI view ------------------------------------------------------------------------
    def result(self, cni_version: str, priority: int = 0) -> dict[str, Any]:
        """The lease as a 1.1.0 result dict: address, gateway, routes, DNS."""
        binding = self.binding
        assert binding is not None
        ack = binding.ack
        mask = ack.subnet_mask
        assert mask is not None
        net = ipaddr.IPv4Network(f"0.0.0.0/{mask}")
        ipconf: dict[str, Any] = {"address": f"{binding.address}/{net.prefixlen}"}
        routers = ack.routers
        if routers:
            ipconf["gateway"] = str(routers[0])
        routes: list[dict[str, Any]] = []
        with_scope = cni_version == "1.1.0"
        classless = ack.classless_routes()
        if classless:  # RFC 3442: option 121 wins over option 33 and the router
            for dst, gw in classless:
                route: dict[str, Any] = {"dst": str(dst)}
                if int(gw):
                    route["gw"] = str(gw)
                elif with_scope:
                    route["scope"] = SCOPE_LINK
                routes.append(route)
        else:
            routes = [{"dst": str(dst), "gw": str(gw)} for dst, gw in ack.static_routes()]
            if routers:
                routes.append({"dst": "0.0.0.0/0", "gw": str(routers[0])})
        if priority:
            for r in routes:
                r["priority"] = priority
        dns: dict[str, Any] = {}
        if ack.dns_servers:
            dns["nameservers"] = [str(s) for s in ack.dns_servers]
        if ack.domain_name:
            dns["domain"] = ack.domain_name
        if ack.domain_search:
            dns["search"] = ack.domain_search
        return {"cniVersion": "1.1.0", "ips": [ipconf], "routes": routes, "dns": dns}

    def held(self) -> bool:
        return self.binding is not None and time.monotonic() < self.expire_at
