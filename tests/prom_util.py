"""A real Prometheus server (Debian's ``prometheus``) for tests, and its query API: it runs
inside a test's network namespace, scrapes the targets it is given every second and keeps its
data in a temporary directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from netns_util import Namespace

PROM_PORT = 9090
WAIT = 60.0


def http(ns: Namespace, url: str, method: str = "GET") -> tuple[int, str]:
    with ns.enter():
        req = urllib.request.Request(url, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


def query(ns: Namespace, promql: str) -> float | None:
    """The single value of an instant query, None when it has no sample yet."""
    status, body = http(ns, f"http://127.0.0.1:{PROM_PORT}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if status != 200:
        return None
    result = json.loads(body)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def wait_value(ns: Namespace, promql: str, want: float) -> None:
    deadline = time.monotonic() + WAIT
    got: float | None = None
    while time.monotonic() < deadline:
        got = query(ns, promql)
        if got == want:
            return
        time.sleep(0.5)
    raise AssertionError(f"{promql} = {got}, want {want}")


def wait_above(ns: Namespace, promql: str, than: float) -> None:
    """Wait until the query's single value exceeds ``than`` (a counter that must move)."""
    deadline = time.monotonic() + WAIT
    got: float | None = None
    while time.monotonic() < deadline:
        got = query(ns, promql)
        if got is not None and got > than:
            return
        time.sleep(0.5)
    raise AssertionError(f"{promql} = {got}, want more than {than}")


class Prometheus:
    """Debian's prometheus in ``ns``, scraping ``targets`` every second, its data in ``tmp``."""

    def __init__(self, ns: Namespace, tmp: Path, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise AssertionError("prometheus is not installed: scripts/setup --test installs it")
        tmp.mkdir(parents=True, exist_ok=True)
        conf = tmp / "prometheus.yml"
        conf.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                        "scrape_configs:\n"
                        f"  - job_name: pycni\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n")
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns.name, binary, f"--config.file={conf}",
                                      f"--storage.tsdb.path={tmp / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{PROM_PORT}"],
                                     stdout=subprocess.DEVNULL, stderr=self.log.open("w"), start_new_session=True)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                if http(ns, f"http://127.0.0.1:{PROM_PORT}/-/ready")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
