"""The README and docs/ say what the code does: their commands parse, and the runnable ones run.

Every ``pycni ...`` line of every sh block in README.md and docs/*.md is parsed by pycni's own
argument parser (an option that is renamed or dropped fails here); the README's namespace-safe
example runs as written on this machine and must leave nothing behind; the plugin-install and
CLI blocks run as written in a throwaway host (private mounts, its own network namespace).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import hostguard
import pytest
from netns_util import have_root

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VENV_BIN = os.path.dirname(sys.executable)


def sh_blocks(path: Path) -> list[str]:
    """The sh blocks, and plain blocks that are a pycni synopsis (docs/api.md's)."""
    text = path.read_text()
    return re.findall(r"```sh\n(.*?)```", text, re.S) + re.findall(r"```\n(pycni .*?)```", text, re.S)


def block(path: Path, marker: str) -> str:
    (found,) = [b for b in sh_blocks(path) if marker in b]
    return found


def pycni_commands(script: str) -> list[list[str]]:
    """The argv (after ``pycni``) of each pycni command in ``script``: joined continuation lines,
    split at ; && || |, with `ip netns exec NS`, `env K=V` and paths in front of pycni dropped."""
    found = []
    text = script.replace("\\\n", " ")
    for line in text.splitlines():
        if line.lstrip().startswith(("{", '"')):  # a heredoc's JSON
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        cmd: list[str] = []
        redirect = False
        for w in [*words, ";"]:
            if redirect or re.fullmatch(r"\d?>>?&?\d?|<", w):  # a redirection and its target
                redirect = w in (">", ">>", "<", "2>", "1>") and not redirect
                continue
            if w in (";", "&&", "||", "|", "&") or w.endswith(";"):
                if w.endswith(";") and w != ";":
                    cmd.append(w[:-1])
                while cmd:
                    if cmd[:3] == ["ip", "netns", "exec"]:
                        cmd = cmd[4:]
                    elif cmd[0] == "env" or ("=" in cmd[0] and not cmd[0].startswith("-")):
                        cmd = cmd[1:]
                    else:
                        break
                if cmd and os.path.basename(cmd[0]) == "pycni":
                    found.append(_synopsis_example(cmd[1:]))
                cmd = []
            else:
                cmd.append(w)
    return found


def _synopsis_example(argv: list[str]) -> list[str]:
    """A usage line made an example: optional ``[...]`` parts dropped, ``a|b`` taken as ``a``."""
    out, depth, alternative = [], 0, 0  # alternative: 1 in a (a | b) group's first branch, 2 after it
    for w in argv:
        if not w.startswith("[") and not depth:
            w = re.sub(r"\[.*\]$", "", w)  # URL[,URL...]
        depth += w.count("[") - w.count("]") if w.startswith("[") or depth else 0
        if depth or w.startswith("[") or w.endswith("]") or w == "...":
            continue
        if w.startswith("("):
            alternative, w = 1, w[1:]
        if alternative:
            closes = w.endswith(")")
            keep = alternative == 1 and w not in ("|", ")")
            if w == "|":
                alternative = 2
            if closes:
                alternative = 0
            if not keep:
                continue
            w = w.rstrip(")")
        out.append(w.split("|")[0] if "|" in w and not w.startswith("-") else w)
    return out


def test_every_pycni_command_in_the_docs_parses() -> None:
    from pycni import demo
    from pycni.cli import _parser

    parser = _parser()
    seen = 0
    for doc in DOCS:
        for script in sh_blocks(doc):
            for argv in pycni_commands(script):
                seen += 1
                try:
                    if argv[:1] == ["demo"]:
                        demo_argv = argv[1:][1:] if argv[1:2] == ["--"] else argv[1:]
                        demo.main_parser().parse_args(demo_argv)
                    else:
                        parser.parse_args(argv)
                except SystemExit as e:
                    pytest.fail(f"{doc.name}: `pycni {shlex.join(argv)}` is refused by pycni's parser ({e})")
    assert seen > 20, seen


def test_docs_use_no_sudo_and_name_scripts_that_exist() -> None:
    """Debian has no sudo by default (everything here runs as root), and every script named exists."""
    for doc in DOCS:
        for script in sh_blocks(doc):
            assert not re.search(r"(^|[;&|]\s*)sudo ", script, re.M), (doc.name, script)
        for name in re.findall(r"(?:bash )?scripts/([\w.-]+)", doc.read_text()):
            assert (REPO / "scripts" / name).exists(), (doc.name, name)


@pytest.mark.skipif(not have_root(), reason="the example creates network namespaces: needs root")
def test_namespace_safe_example_runs_as_written_and_leaves_nothing() -> None:
    script = block(REPO / "README.md", "mktemp")
    tag = f"pycni-t-doc{uuid.uuid4().hex[:6]}"  # not try-host/try-ctr: other runs may use them meanwhile
    script = script.replace("try-host", f"{tag}-h").replace("try-ctr", f"{tag}-c")
    links = {"links", "addresses", "routes", "ip rules"}
    before = {k: v for k, v in hostguard.snapshot().items() if k.startswith("files") or k in links}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}, cwd=REPO)
    after = {k: v for k, v in hostguard.snapshot().items() if k.startswith("files") or k in links}
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 received" in proc.stdout, proc.stdout
    assert hostguard.describe(before, after) == [], "the namespace-safe example changed the machine"
    assert tag not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.skipif(not have_root(), reason="a throwaway host needs root")
def test_install_and_cli_blocks_run_in_a_throwaway_host(tmp_path: Path) -> None:
    """README's "As plugins for any runtime" then "The CLI" blocks, as written, from the clone, on
    a host whose /opt/cni, /var/lib/cni and /run are scratch (they write there)."""
    from runtime_host import RuntimeHost

    readme = REPO / "README.md"
    script = "\n".join([f"cd {shlex.quote(str(REPO))}", block(readme, "# every plugin"),
                        block(readme, "pycni list")])
    # .venv/bin/pycni in the blocks is the clone's venv: this test's interpreter may live elsewhere
    script = script.replace(".venv/bin/pycni", f"{VENV_BIN}/pycni")
    host = RuntimeHost(tmp_path)
    try:
        proc = host.run(["bash", "-euo", "pipefail", "-c", script], check=False, timeout=300,
                        env={"PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    finally:
        host.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"cniVersion": "1.0.0"' in proc.stdout and re.search(r"^pycni-demo\s+1\.0\.0\s", proc.stdout, re.M), \
        proc.stdout
    assert "is valid" in proc.stdout, proc.stdout


def test_readme_names_every_package_setup_installs() -> None:
    setup = (REPO / "scripts" / "setup").read_text()
    packages = " ".join(re.findall(r"^\s*APT_PACKAGES\+?=\(([^)]*)\)", setup, re.M)).split()
    assert "podman" in packages and "iproute2" in packages, packages
    readme = (REPO / "README.md").read_text()
    assert [p for p in packages if p not in readme] == []


def test_cluster_demo_help_offers_only_what_it_takes() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "cluster_demo.py"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "--keep" not in proc.stdout and "--mode" in proc.stdout, proc


@pytest.mark.skipif(not have_root(), reason="a throwaway host needs root")
def test_daemon_block_runs_in_a_throwaway_host(tmp_path: Path) -> None:
    """docs/daemon.md's first two lines as written: shims into /opt/cni/bin, then `pycni daemon` in
    the foreground on its default socket, which the shims then use; SIGTERM stops it cleanly.
    (The third line writes /var/log, which a throwaway host does not make private: parsed only.)"""
    import json
    import signal
    import time

    from runtime_host import RuntimeHost

    install, daemon = [line.split("#")[0].strip() for line in block(REPO / "docs" / "daemon.md",
                                                                     "pycni daemon").splitlines()[:2]]
    assert install.startswith("pycni install-plugins") and daemon == "pycni daemon"
    env = {"PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    host = RuntimeHost(tmp_path)
    try:
        host.run(["sh", "-c", install], env=env)
        served = host.popen(["sh", "-c", f"echo $$ > /run/doc-daemon.pid; exec {daemon}"], tmp_path / "daemon.log",
                            env=env)
        deadline = time.monotonic() + 120
        while host.run(["test", "-S", "/run/pycni/pycni.sock"], check=False).returncode != 0:
            assert served.poll() is None and time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
            time.sleep(0.1)
        conf = json.dumps({"cniVersion": "1.0.0", "name": "docnet", "ipam": {
            "type": "host-local", "subnet": "10.66.0.0/24", "dataDir": "/run/doc-ipam"}})
        call = dict(env, CNI_COMMAND="ADD", CNI_CONTAINERID="doc1", CNI_NETNS="/nonexistent", CNI_IFNAME="eth0",
                    CNI_PATH="/opt/cni/bin")
        added = host.run(["/opt/cni/bin/host-local"], input=conf, env=call)
        assert json.loads(added.stdout)["ips"][0]["address"] == "10.66.0.2/24"
        host.run(["/opt/cni/bin/host-local"], input=conf, env=dict(call, CNI_COMMAND="DEL"))
        # the daemon itself (nsenter, the Popen, waits for it and exits with its status)
        host.run(["sh", "-c", f"kill -{signal.SIGTERM.name[3:]} $(cat /run/doc-daemon.pid)"])
        assert served.wait(timeout=60) == 0, (tmp_path / "daemon.log").read_text()
    finally:
        host.close()


@pytest.mark.skipif(not have_root(), reason="the walk-through makes network namespaces: needs root")
def test_cluster_walk_through_runs_as_written(tmp_path: Path) -> None:
    """docs/cluster.md's three-node walk-through, its checks and its tear-down, as written: only the
    namespace names (made pc33-*) and the state directory (a temporary one) differ."""
    from etcd_util import etcd_available

    if not etcd_available():
        pytest.skip("needs etcd (scripts/setup --test)")
    doc = REPO / "docs" / "cluster.md"
    tag = f"pc33-{uuid.uuid4().hex[:4]}"

    def ours(script: str) -> str:
        script = script.replace("W=/tmp/walk", f"W={shlex.quote(str(tmp_path / 'walk'))}")
        script = re.sub(r"\bunderlay\b(?!-)", f"{tag}u", script)
        script = re.sub(r"\bnode(\$i|[123])\b", rf"{tag}n\1", script)
        return re.sub(r"\bpod(\$i|[123])\b", rf"{tag}p\1", script)

    walk, check, down = (ours(block(doc, marker)) for marker in ("W=/tmp/walk", "ip route show proto 94",
                                                                  "kill $(cat $W/pids)"))
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    run = "set -euo pipefail\nW=" + shlex.quote(str(tmp_path / "walk")) + "\n"
    try:
        up = subprocess.run(["bash", "-c", walk], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stdout.count('"address"') == 3, up.stdout
        ep = "EP=http://10.231.0.1:2379,http://10.231.0.2:2379,http://10.231.0.3:2379\n"
        seen = subprocess.run(["bash", "-c", run + ep + check], capture_output=True, text=True, timeout=120, env=env)
        assert seen.returncode == 0, seen.stdout + seen.stderr
        assert "2 received" in seen.stdout and ": programmed" in seen.stdout, seen.stdout
        assert f"{tag}n1" in seen.stdout and "enforced" in seen.stdout, seen.stdout  # node status: policy on
    finally:
        gone = subprocess.run(["bash", "-c", run.replace("set -euo pipefail\n", "") + down], capture_output=True,
                              text=True, timeout=120, env=env)
        left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(tag)]
        for name in left:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert gone.returncode == 0 and left == [], gone.stdout + gone.stderr


def test_every_yaml_policy_in_the_docs_is_accepted() -> None:
    """The NetworkPolicy examples (```yaml blocks) read and validate as `pycni policy apply` reads them."""
    from pycni.cluster.policy.model import PolicyError, parse_policies

    seen = 0
    for doc in DOCS:
        for text in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S):
            if "NetworkPolicy" not in text:
                continue
            try:
                seen += len(parse_policies(text))
            except PolicyError as e:
                pytest.fail(f"{doc.name}: a policy example is refused: {e}\n{text}")
    assert seen >= 3, seen
