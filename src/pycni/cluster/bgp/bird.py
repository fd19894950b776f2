"""BIRD 2 on one node: its files, starting and watching it, ``birdc``, and what its status says.

Everything lives in one state directory of pycni's (``bird.conf``, the control socket
``bird.ctl``, ``bird.pid``, ``bird.log``), never the distribution's /etc/bird or /run/bird, so
BIRD run by pycni and one run by the operator for other purposes never meet. BIRD daemonizes
itself (its own session): an agent killed, even by SIGKILL, leaves it routing, and the agent
started again adopts it by its pid file and control socket.
"""

from __future__ import annotations

import os
import subprocess

from pycni.record import field, record

BIRD = "bird"
BIRDC = "birdc"
BIRDC_TIMEOUT = 10.0


class BirdError(Exception):
    """BIRD could not be started, or refused a configuration, or did not answer."""


@record
class PeerStatus:
    """One BGP session as BIRD reports it."""

    protocol: str
    peer: str = ""
    kind: str = ""
    address: str = ""
    as_number: int = 0
    state: str = ""
    since: str = ""
    imported: int = 0
    exported: int = 0
    info: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.peer, "kind": self.kind, "protocol": self.protocol, "address": self.address,
                "asNumber": self.as_number, "state": self.state, "since": self.since,
                "routesImported": self.imported, "routesExported": self.exported, "info": self.info}


class Bird:
    """One BIRD: the one pycni runs (``own``) or the operator's, configured through the same files."""

    def __init__(self, state_dir: str, own: bool = True) -> None:
        self.dir = state_dir
        self.own = own
        self.conf = os.path.join(state_dir, "bird.conf")
        self.ctl = os.path.join(state_dir, "bird.ctl")
        self.pidfile = os.path.join(state_dir, "bird.pid")
        self.log = os.path.join(state_dir, "bird.log")

    # -- files --

    def current(self) -> str:
        """The configuration on disk ('' when none)."""
        try:
            with open(self.conf, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return ""

    def write(self, text: str) -> None:
        """Check ``text`` with ``bird -p`` and put it in place atomically; BirdError with BIRD's
        complaint when it refuses it (the file in place is left as it was)."""
        from pycni.statefile import write_bytes

        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        new = self.conf + ".new"
        write_bytes(new, text.encode(), mode=0o644, dir_mode=0o755, durable=False,
                    failure="failed to write BIRD's configuration")
        proc = subprocess.run([BIRD, "-p", "-c", new], capture_output=True, text=True, timeout=BIRDC_TIMEOUT)
        if proc.returncode != 0:
            raise BirdError(f"BIRD refuses the configuration: {(proc.stderr or proc.stdout).strip()}")
        os.replace(new, self.conf)

    # -- the process --

    def pid(self) -> int:
        """BIRD's pid when it runs (its pid file names a live ``bird``), else 0."""
        try:
            with open(self.pidfile, encoding="ascii") as f:
                pid = int(f.read().strip() or 0)
            with open(f"/proc/{pid}/comm", encoding="ascii") as f:
                return pid if pid > 0 and f.read().strip() == "bird" else 0
        except (OSError, ValueError):
            return 0

    def started_before(self) -> bool:
        """Whether a BIRD of ours ran here before (it left its pid file): a restart, not a first start."""
        return os.path.exists(self.pidfile)

    def start(self, recover: bool) -> int:
        """Start BIRD on the configuration in place (``-R``: graceful restart recovery, keeping the
        kernel's routes and the peers' until its sessions are back); returns its pid."""
        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        cmd = [BIRD, "-c", self.conf, "-s", self.ctl, "-P", self.pidfile] + (["-R"] if recover else [])
        errlog = os.path.join(self.dir, "bird.start.log")
        with open(errlog, "wb") as err:
            # BIRD forks into the background itself; the foreground process exits once it parsed
            # the configuration (its status says whether that worked)
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=BIRDC_TIMEOUT,
                                  start_new_session=True)
        if proc.returncode != 0:
            with open(errlog, encoding="utf-8", errors="replace") as f:
                raise BirdError(f"bird exited with status {proc.returncode}: {f.read().strip()}")
        import time

        deadline = time.monotonic() + BIRDC_TIMEOUT
        while time.monotonic() < deadline:
            pid = self.pid()
            if pid and os.path.exists(self.ctl):
                return pid
            time.sleep(0.05)
        raise BirdError(f"bird started but wrote no pid file or control socket in {self.dir}")

    # -- birdc --

    def birdc(self, *command: str) -> str:
        """One ``birdc`` command over the control socket; its output without the banner."""
        try:
            proc = subprocess.run([BIRDC, "-s", self.ctl, *command], stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=BIRDC_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise BirdError(f"birdc {' '.join(command)}: no answer in {BIRDC_TIMEOUT:g}s") from None
        except FileNotFoundError:
            raise BirdError("birdc is not installed (Debian's bird2)") from None
        out = proc.stdout
        if proc.returncode != 0 or "Unable to connect" in out + proc.stderr:
            raise BirdError(f"birdc {' '.join(command)} ({self.ctl}): {(proc.stderr + out).strip()}")
        lines = out.splitlines()
        if lines and lines[0].startswith("BIRD ") and lines[0].endswith("ready."):
            lines = lines[1:]
        return "\n".join(lines)

    def configure(self) -> str:
        """``birdc configure``: BIRD reloads the file in place (sessions whose settings did not
        change stay up). BirdError with BIRD's words when it refuses."""
        out = self.birdc("configure")
        if "Reconfigur" not in out:
            raise BirdError(f"birdc configure: {out.strip()}")
        return out.strip().splitlines()[-1]

    def status(self) -> list[PeerStatus]:
        return parse_protocols(self.birdc("show", "protocols", "all"))


def parse_protocols(text: str) -> list[PeerStatus]:
    """The BGP sessions of ``birdc show protocols all`` (with ``timeformat protocol iso long``:
    'since' is a date and a time)."""
    out: list[PeerStatus] = []
    cur: PeerStatus | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("Name "):
            continue
        if not line[0].isspace():
            parts = line.split()
            cur = None
            if len(parts) >= 4 and parts[1] == "BGP":
                since = " ".join(parts[4:6]) if len(parts) >= 6 and parts[5][:1].isdigit() else " ".join(parts[4:5])
                info = " ".join(parts[6:] if len(parts) >= 6 and parts[5][:1].isdigit() else parts[5:])
                cur = PeerStatus(protocol=parts[0], state=parts[3], since=since, info=info)
                out.append(cur)
            continue
        if cur is None:
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "Description":
            cur.kind, _, cur.peer = value.partition(" ")
        elif key == "BGP state":
            cur.state = value
        elif key == "Neighbor address":
            cur.address = value
        elif key == "Neighbor AS":
            cur.as_number = int(value) if value.isdigit() else 0
        elif key == "Routes":
            # "1 imported, 2 exported, 1 preferred" (one line per channel: summed)
            for part in value.split(","):
                n, _, what = part.strip().partition(" ")
                if n.isdigit() and what == "imported":
                    cur.imported += int(n)
                elif n.isdigit() and what == "exported":
                    cur.exported += int(n)
        elif key == "Last error":
            cur.extra["lastError"] = value
    for p in out:
        if p.state != "Established" and "lastError" in p.extra and not p.info:
            p.info = p.extra["lastError"]
    return out
