"""The bad-input generator of tests/test_bad_input.py against the Go reference plugins and ours.

A one-off comparison for docs/reliability.md, not a CI assertion: the same seeded inputs for every
plugin type both implement (Go's from /usr/lib/cni, ours as installed one-shot executables), each
side in its own sandbox (throwaway host namespace, private mount and PID namespaces, read-only /),
and a count per side of refusals with the spec's error JSON, other failures, inputs accepted,
tracebacks or panics, hangs and inputs that left state. Run as root:

    .venv/bin/python bench/badinput_go.py [--seed N] [--limit N] [--plugins a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]

import badinput  # noqa: E402
from netns_util import new_namespace  # noqa: E402
from test_bad_input import run_sandbox  # noqa: E402

from pycni.install_plugins import install  # noqa: E402
from pycni.plugins.registry import PLUGIN_MODULES  # noqa: E402

GO_DIR = "/usr/lib/cni"


def counts(results: list[dict[str, Any]]) -> dict[str, int]:
    batches = [r for r in results if r.get("batch")]
    results = [r for r in results if not r.get("batch")]
    c = {"inputs": len(results), "refused (error JSON)": 0, "failed without error JSON": 0, "accepted": 0,
         "tracebacks/panics": 0, "hangs": 0, "left state": 0, "code outside the allowed set": 0,
         "batches that left state no single input did again": len(batches)}
    for r in results:
        if r.get("hang"):
            c["hangs"] += 1
            continue
        if r.get("rc") == 0:
            c["accepted"] += 1
        elif r.get("spec_json"):
            c["refused (error JSON)"] += 1
            c["code outside the allowed set"] += r.get("code") not in r["codes"]
        else:
            c["failed without error JSON"] += 1
        c["tracebacks/panics"] += bool(r.get("trace"))
        c["left state"] += bool(r.get("changed") or r.get("batch_changed"))
    return c


def run_side(plugin_dir: str, plugins: list[str], seed: int, limit: int, go: bool) -> list[dict[str, Any]]:
    data = Path(tempfile.mkdtemp(prefix="pycni-badinput-"))
    host, ctr = new_namespace("pycni-bg"), new_namespace("pycni-bg")
    try:
        rng = random.Random(seed)
        cases: list[dict[str, Any]] = []
        for p in plugins:
            cases += badinput.generate(p, str(data), ctr.path, host.path, plugin_dir, rng)
        if len(cases) > limit:
            cases = random.Random(seed).sample(cases, limit)
        for c in cases:
            c["vias"] = ["oneshot"]
        return run_sandbox(host, ctr, data, plugin_dir, cases, ["oneshot"], go=go)
    finally:
        ctr.delete()
        host.delete()
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=int(os.environ.get(badinput.SEED_ENV, badinput.DEFAULT_SEED)))
    ap.add_argument("--limit", type=int, default=100_000, help="at most this many inputs a side (seeded sample)")
    ap.add_argument("--plugins", help="comma-separated types (default: every type both implement)")
    ap.add_argument("--json", help="write every result here")
    opts = ap.parse_args()
    if os.geteuid() != 0:
        print("badinput_go: needs root (network namespaces)", file=sys.stderr)
        return 1
    both = sorted(p for p in PLUGIN_MODULES if os.path.exists(os.path.join(GO_DIR, p)))
    plugins = opts.plugins.split(",") if opts.plugins else both
    ours_dir = tempfile.mkdtemp(prefix="pycni-badinput-bin-")
    try:
        install(ours_dir)
        print(f"seed {opts.seed}; plugins {', '.join(plugins)}", flush=True)
        sides = {"Go (/usr/lib/cni)": run_side(GO_DIR, plugins, opts.seed, opts.limit, True),
                 "pycni one-shot": run_side(ours_dir, plugins, opts.seed, opts.limit, False)}
    finally:
        shutil.rmtree(ours_dir, ignore_errors=True)
    table = {name: counts(res) for name, res in sides.items()}
    names = list(table)
    print(f"\n| | {' | '.join(names)} |\n|---|{'---|' * len(names)}")
    for key in table[names[0]]:
        print(f"| {key} | {' | '.join(str(table[n][key]) for n in names)} |")
    for name, res in sides.items():
        print(f"\n{name}: inputs not refused cleanly, by plugin and mutation")
        tally: dict[str, int] = {}
        for r in res:
            if r.get("hang") or r.get("rc") == 0 or r.get("trace") or r.get("changed") or r.get("batch_changed"):
                kind = ":".join(r["id"].split(":")[:2])
                tally[kind] = tally.get(kind, 0) + 1
        for kind, n in sorted(tally.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {n:4d} {kind}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(sides, f)
    return 0


def table_from(path: str) -> None:
    """The table again from a --json file (``python bench/badinput_go.py --table FILE``)."""
    with open(path) as f:
        sides = json.load(f)
    table = {name: counts(res) for name, res in sides.items()}
    names = list(table)
    print(f"| | {' | '.join(names)} |\n|---|{'---|' * len(names)}")
    for key in table[names[0]]:
        print(f"| {key} | {' | '.join(str(table[n][key]) for n in names)} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table_from(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
