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
