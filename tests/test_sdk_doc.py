"""The sample plugin in docs/sdk.md runs as written (so the SDK page stays true)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

from plugin_util import answer, run

DOC = Path(__file__).resolve().parent.parent / "docs" / "sdk.md"


def _sample() -> Any:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    module = types.ModuleType("dns_override_sample")
    sys.modules[module.__name__] = module  # @record resolves nothing by name, but keep it importable
    exec(compile(code.group(1), str(DOC), "exec"), module.__dict__)
    return module


def _run(plugin: Any, command: str, conf: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return answer(run(plugin, command, conf, cni_path="/nonexistent", container_id="c1", netns="/proc/1/ns/net",
                      CNI_NETNS_OVERRIDE="1"))


def test_sample_plugin_add_check_del_gc_status() -> None:
    plugin = _sample().PLUGIN
    prev = {"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.2/24"}]}
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "dns-override", "nameservers": ["10.1.0.53"],
            "prevResult": prev}
    rc, result = _run(plugin, "ADD", conf)
    assert rc == 0 and result["dns"] == {"nameservers": ["10.1.0.53"]}, result
    assert _run(plugin, "CHECK", {**conf, "prevResult": result}) == (0, {})
    rc, e = _run(plugin, "CHECK", conf)
    assert rc == 1 and e["code"] == 999
    assert _run(plugin, "DEL", conf) == (0, {})
    assert _run(plugin, "STATUS", conf) == (0, {})
    assert _run(plugin, "GC", {**conf, "cni.dev/valid-attachments": []}) == (0, {})
    assert _run(plugin, "GC", conf)[1]["code"] == 7  # no valid-attachments list
    rc, e = _run(plugin, "ADD", {**conf, "nameservers": [1]})
    assert rc == 1 and e["code"] == 7 and "nameservers[0]" in e["msg"]
    rc, e = _run(plugin, "ADD", {k: v for k, v in conf.items() if k != "prevResult"})
    assert rc == 1 and e["code"] == 7 and e["msg"] == "Required prevResult missing"


def test_sample_plugin_runs_as_an_executable_through_the_runtime(tmp_path: Path) -> None:
    """As the doc says to use it: saved as an executable on CNI_PATH, chained after loopback, run by
    `pycni add/check/del` (it used to define main() and never call it: code 6 from the runtime)."""
    import json
    import os
    import subprocess

    from netns_util import have_root, new_namespace

    if not have_root() or not os.path.exists("/usr/lib/cni/loopback"):
        import pytest

        pytest.skip("needs root (a throwaway namespace) and the Go loopback plugin")
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "dns-override"
    exe.write_text(f"#!{sys.executable}\n" + code.group(1))
    exe.chmod(0o755)
    (tmp_path / "net.d").mkdir()
    (tmp_path / "net.d" / "dns.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "dns", "plugins": [{"type": "loopback"},
                                                         {"type": "dns-override", "nameservers": ["10.1.0.53"]}]}))
    env = {"PATH": os.environ["PATH"], "NETCONFPATH": str(tmp_path / "net.d"),
           "CNI_PATH": f"{bindir}:/usr/lib/cni", "CNI_IFNAME": "lo"}
    ctr = new_namespace(prefix="pc33")
    try:
        def pycni(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "pycni", *args, ctr.path, "--cache-dir",
                                   str(tmp_path / "cache")], env=env, capture_output=True, text=True, timeout=60)

        added = pycni("add", "dns")
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout)["dns"] == {"nameservers": ["10.1.0.53"]}
        assert pycni("check", "dns").returncode == 0
        assert pycni("del", "dns").returncode == 0
    finally:
        ctr.delete()
