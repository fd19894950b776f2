"""The suite's hermeticity guard: what a test run changed on the machine it ran on.

A plugin's defaults point at the machine's real directories (/var/lib/cni/networks, /run/cni,
/run/pycni ...), so a test that forgets one setting (an ``ipam`` override without ``dataDir``)
writes there, and a test that forgets its namespace changes the machine's network. Nothing
else notices: the test passes, the next run behaves differently. conftest.py takes a
:func:`snapshot` once before the whole run and once after (in the xdist controller, or the
only process) and fails the run with :func:`describe` of the difference.

A snapshot is a set of lines per section; volatile parts (counters, lifetimes, dates) are
left out so that only what a test could have made or removed shows. Sections: files under each guarded
directory, links, addresses, routes, rules, forwarding sysctls, qdiscs, the nftables ruleset,
and iptables-save / ip6tables-save (nft and legacy) by table.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess

# The machine's CNI state: a test's state lives in temp dirs, never here.
GUARDED_DIRS = ("/etc/cni", "/opt/cni", "/var/lib/cni", "/run/cni", "/run/pycni")

Snapshot = dict[str, set[str]]


def _run(cmd: list[str]) -> str | None:
    """stdout of ``cmd``; None when the tool is missing (that section is then not compared)."""
    if shutil.which(cmd[0]) is None:
        return None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return proc.stdout if proc.returncode == 0 else None


def _files(root: str) -> set[str]:
    lines: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        try:  # a file made and removed again inside an existing directory changes only its mtime
            lines.add(f"{dirpath}/ (mtime {os.lstat(dirpath).st_mtime_ns})")
        except OSError:
            continue
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    lines.add(f"{path} -> {os.readlink(path)}")
                elif stat.S_ISREG(st.st_mode) and st.st_size <= 1 << 20:
                    with open(path, "rb") as f:
                        digest = hashlib.sha256(f.read()).hexdigest()[:16]
                    lines.add(f"{path} ({st.st_size} bytes, sha256 {digest})")
                else:
                    lines.add(f"{path} ({stat.filemode(st.st_mode)}, {st.st_size} bytes, mtime {st.st_mtime_ns})")
            except OSError:
                continue  # removed while we walked
    return lines


def _ip_json(*args: str) -> list[dict[str, object]]:
    out = _run(["ip", "-j", *args])
    try:
        return json.loads(out) if out else []
    except ValueError:
        return []


def _links() -> set[str]:
    lines = set()
    for link in _ip_json("-d", "link", "show"):
        info = link.get("linkinfo") or {}
        kind = info.get("info_kind", "") if isinstance(info, dict) else ""
        up = "UP" in (link.get("flags") or [])  # type: ignore[operator]
        lines.add(f"{link.get('ifname')} type={link.get('link_type')} kind={kind} mtu={link.get('mtu')} "
                  f"master={link.get('master', '-')} mac={link.get('address', '-')} up={up}")
    return lines


def _addresses() -> set[str]:
    lines = set()
    for link in _ip_json("addr", "show"):
        for a in link.get("addr_info") or []:  # type: ignore[attr-defined]
            lines.add(f"{link.get('ifname')} {a.get('local')}/{a.get('prefixlen')}")
    return lines


def _routes() -> set[str]:
    lines = set()
    for family in ("-4", "-6"):
        for r in _ip_json(family, "route", "show", "table", "all"):
            if r.get("type") == "multicast":
                continue
            lines.add(" ".join(f"{k}={r.get(k)}" for k in ("table", "type", "dst", "dev", "gateway", "protocol",
                                                            "metric", "prefsrc") if r.get(k) is not None))
    return lines


def _rules() -> set[str]:
    lines = set()
    for family in ("-4", "-6"):
        for r in _ip_json(family, "rule", "show"):
            lines.add(f"{family} " + json.dumps(r, sort_keys=True))
    return lines


_NFT_VOLATILE = re.compile(r"counter packets \d+ bytes \d+|expires \S+|used \d+ bytes")


def _nft() -> set[str] | None:
    out = _run(["nft", "list", "ruleset"])
    if out is None:
        return None
    # A line is only meaningful with its table and chain, so prefix each with them.
    lines, where = set(), ["", ""]
    for raw in out.splitlines():
        line = _NFT_VOLATILE.sub("", raw).strip()
        if not line or line == "}":
            continue
        if line.startswith("table "):
            where = [line.rstrip(" {"), ""]
        elif line.startswith(("chain ", "set ", "map ")):
            where[1] = line.rstrip(" {")
        lines.add(f"{where[0]} / {where[1]}: {line}" if where[1] else f"{where[0]}: {line}")
    return lines


_XT_COUNTERS = re.compile(r"\s*\[\d+:\d+\]$")


def _xtables(tool: str) -> set[str] | None:
    out = _run([tool])
    if out is None:
        return None
    lines, table = set(), ""
    for raw in out.splitlines():
        if raw.startswith("#") or raw == "COMMIT":
            continue
        if raw.startswith("*"):
            table = raw[1:]
            continue
        lines.add(f"{table}: {_XT_COUNTERS.sub('', raw)}")
    return lines


def _qdiscs() -> set[str] | None:
    out = _run(["tc", "-j", "qdisc", "show"])
    try:
        found = json.loads(out) if out else None
    except ValueError:
        return None
    if found is None:
        return None
    return {" ".join(f"{k}={q.get(k)}" for k in ("dev", "kind", "handle", "parent", "root") if q.get(k) is not None)
            for q in found}


# What a gateway plugin turns on in the namespace it runs in.
SYSCTLS = ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv4/conf/all/rp_filter")


def _sysctls() -> set[str]:
    lines = set()
    for name in SYSCTLS:
        try:
            with open(f"/proc/sys/{name}") as f:
                lines.add(f"{name.replace('/', '.')} = {f.read().strip()}")
        except OSError:
            continue
    return lines


def netns_names() -> set[str]:
    """The named network namespaces (``ip netns list``) on the machine now."""
    out = _run(["ip", "netns", "list"]) or ""
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def snapshot(dirs: tuple[str, ...] = GUARDED_DIRS) -> Snapshot:
    """What the machine (the calling thread's network namespace, and ``dirs``) holds now, by section."""
    snap: Snapshot = {f"files under {d}": _files(d) for d in dirs}
    snap.update({"links": _links(), "addresses": _addresses(), "routes": _routes(), "ip rules": _rules(),
                 "sysctls": _sysctls()})
    for name, lines in (("nftables ruleset", _nft()), ("qdiscs", _qdiscs()),
                        ("iptables-save", _xtables("iptables-save")),
                        ("ip6tables-save", _xtables("ip6tables-save")),
                        ("iptables-legacy-save", _xtables("iptables-legacy-save")),
                        ("ip6tables-legacy-save", _xtables("ip6tables-legacy-save"))):
        if lines is not None:
            snap[name] = lines
    return snap


def describe(before: Snapshot, after: Snapshot, limit: int = 20) -> list[str]:
    """The difference, one line per change, grouped by section (empty when nothing changed)."""
    out: list[str] = []
    for section in before.keys() & after.keys():
        added, removed = sorted(after[section] - before[section]), sorted(before[section] - after[section])
        if not added and not removed:
            continue
        out.append(f"{section}:")
        changes = [f"  + {x}" for x in added] + [f"  - {x}" for x in removed]
        out += changes[:limit]
        if len(changes) > limit:
            out.append(f"  ... and {len(changes) - limit} more")
    return out
