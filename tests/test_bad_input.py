"""Bad input for every plugin, one-shot and through a daemon, in a sandbox (issue: reliability).

tests/badinput.py makes the inputs (seeded: PYCNI_FUZZ_SEED, printed; PYCNI_FUZZ_ONESHOT and
PYCNI_FUZZ_DAEMON bound how many run each way) and runs them inside a throwaway host namespace
with private mount and PID namespaces and every file system read-only but the test's own
directory. For each input: exit 1 with the spec's error JSON and a code allowed for that
mutation, no traceback, no hang, and nothing changed in either namespace or the state dirs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import badinput
import pytest
from netns_util import Namespace

from pycni.install_plugins import install
from pycni.plugins.registry import PLUGIN_MODULES

SEED = int(os.environ.get(badinput.SEED_ENV, badinput.DEFAULT_SEED))
ONESHOT = int(os.environ.get("PYCNI_FUZZ_ONESHOT", "500"))  # one-shot inputs (a Python start each)
DAEMON = int(os.environ.get("PYCNI_FUZZ_DAEMON", "100000"))  # inputs through the daemon (all by default)

# Inputs that find a defect not fixed here: input id (or an id prefix naming a family of inputs) ->
# the defect. Each is an xfail(strict=True) below: every input it names must still fail.
KNOWN: dict[str, str] = {}


def known(case_id: str) -> str:
    """The known defect this input finds, or ''."""
    return next((why for prefix, why in KNOWN.items() if case_id == prefix or case_id.startswith(prefix)), "")


def run_sandbox(host: Namespace, ctr: Namespace, data: Path, plugin_dir: str, cases: list[dict[str, Any]],
                vias: list[str], *, go: bool = False, jobs: int = 1, batch: int = 60) -> list[dict[str, Any]]:
    """Run ``cases`` in the sandbox inside ``host``; the results, one per case and way."""
    job = {"data": str(data), "ctr": ctr.path, "ctr_name": ctr.name, "plugin_dir": plugin_dir, "cases": cases,
           "vias": vias, "go": go, "jobs": jobs, "batch": batch}
    (data / "job.json").write_text(json.dumps(job))
    cmd = ["ip", "netns", "exec", host.name, "unshare", "--mount", "--pid", "--fork", "--mount-proc",
           sys.executable, "-S", badinput.__file__, "sandbox", str(data / "job.json")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if proc.stderr:
        print(proc.stderr)
    return json.loads((data / "results.json").read_text())  # type: ignore[no-any-return]


def make_cases(plugins: list[str], data: Path, ctr: Namespace, host: Namespace, plugin_dir: str,
               oneshot: int, daemon: int, seed: int) -> list[dict[str, Any]]:
    """Every plugin's inputs, each marked with the ways it runs (a seeded sample when over budget)."""
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []
    for plugin in plugins:
        cases += badinput.generate(plugin, str(data), ctr.path, host.path, plugin_dir, rng, daemon=daemon > 0)
    nul = [c for c in cases if "NUL" in c["id"] and c["id"].split(":", 1)[1].startswith("env:")]
    normal = [c for c in cases if c not in nul]
    pick_one = set(id(c) for c in rng.sample(normal, min(oneshot, len(normal))))
    pick_d = set(id(c) for c in rng.sample(cases, min(daemon, len(cases))))
    for c in cases:
        c["vias"] = [v for v, picked in (("oneshot", id(c) in pick_one), ("daemon", id(c) in pick_d)) if picked]
        c["known"] = bool(known(c["id"]))
    return [c for c in cases if c["vias"]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    from netns_util import have_root, new_namespace

    if not have_root():
        pytest.skip("network namespaces need root")
    print(f"bad-input seed {SEED} (set {badinput.SEED_ENV} to change it)")
    data = tmp_path_factory.mktemp("fuzz")
    plugin_dir = str(tmp_path_factory.mktemp("fuzz-bin"))
    install(plugin_dir)
    host, ctr = new_namespace("pycni-fz"), new_namespace("pycni-fz")
    try:
        cases = make_cases(sorted(PLUGIN_MODULES), data, ctr, host, plugin_dir, ONESHOT, DAEMON, SEED)
        out = run_sandbox(host, ctr, data, plugin_dir, cases, ["oneshot", "daemon"])
    finally:
        ctr.delete()
        host.delete()
    counts = {v: sum(r["via"] == v for r in out) for v in ("oneshot", "daemon")}
    print(f"bad inputs run: {counts}")
    return out


def _failures(results: list[dict[str, Any]], keep: Callable[[dict[str, Any]], bool]) -> list[str]:
    return [f"{r['via']} {r['id']}: {v}" for r in results if keep(r) and not known(r["id"])
            and not badinput.kernel_lacks(r) and (v := badinput.verdict(r))]


@pytest.mark.parametrize("via", ["oneshot", "daemon"])
@pytest.mark.parametrize("plugin", sorted(PLUGIN_MODULES))
def test_bad_input_refused_and_changes_nothing(results: list[dict[str, Any]], plugin: str, via: str) -> None:
    mine = [r for r in results if r["plugin"] == plugin and r["via"] == via]
    assert mine, f"no input ran for {plugin} {via}"
    lacking = {m for r in mine if (m := badinput.kernel_lacks(r))}
    if lacking:
        print(f"{plugin}: {sum(bool(badinput.kernel_lacks(r)) for r in mine)} inputs reached link creation, "
              f"not judged: {', '.join(sorted(lacking))}")
    bad = _failures(mine, lambda r: True)
    assert not bad, f"{len(bad)} of {len(mine)} inputs:\n" + "\n".join(bad[:40])


if KNOWN:  # defined only while there is a known defect: no placeholder test that skips
    @pytest.mark.parametrize("case_id", [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=v))
                                         for k, v in KNOWN.items()])
    def test_known_defects(results: list[dict[str, Any]], case_id: str) -> None:
        """Passes (so fails the suite, strict) once every input of a known defect is refused cleanly."""
        ran = [r for r in results if r["id"] == case_id or r["id"].startswith(case_id)]
        if not ran:
            pytest.skip(f"{case_id} not sampled with seed {SEED}")
        still = [f"{r['via']} {r['id']}: {v}" for r in ran if (v := badinput.verdict(r))]
        assert not still, f"{KNOWN[case_id]}: {still[:5]}"


def test_generator_covers_every_key_and_mutation(tmp_path: Path) -> None:
    """Every plugin has a key table and a base config; every kind of mutation is produced."""
    rng = random.Random(SEED)
    for plugin in PLUGIN_MODULES:
        cases = badinput.generate(plugin, str(tmp_path), "/run/netns/c", "/run/netns/h", "/bin", rng, daemon=True)
        kinds = {c["id"].split(":")[1] for c in cases}
        want = {"type", "trunc", "version", "env"} | ({"prev"} if plugin not in badinput.IPAM_DIRECT else set())
        assert want <= kinds, (plugin, kinds)
        for key in {**badinput.COMMON, **badinput.KEYS[plugin]}:
            if key == "ipam.type" and plugin in badinput.IPAM_DIRECT:
                continue  # called directly, an IPAM plugin does not read its own type
            assert any(c["id"].startswith(f"{plugin}:type:{key}=") for c in cases), (plugin, key)
        if plugin in badinput.HAS_GC:
            assert any(":gc:" in c["id"] for c in cases), plugin
