"""plugin_util.run drives a plugin three ways — in-process dispatch, the installed executable, and
pycni's runtime — and each way gives the same answer (same Outcome shape, same result, same error)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import plugin_util
from netns_util import Namespace
from plugin_util import each_way


def _conf(data_dir: str, **ipam: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "ar-harness", "type": "host-local",
            "ipam": {"type": "host-local", "subnet": "10.231.7.0/29", "dataDir": data_dir, **ipam}}


@each_way
def test_host_local_add_check_del(via: str, plugin_dir: str, host_ns: Namespace, container_ns: Namespace,
                                  tmp_path: Path) -> None:
    data = str(tmp_path / "ipam")
    conf = _conf(data)
    kw = {"via": via, "host": host_ns, "cni_path": plugin_dir, "container_id": "ar-c1", "netns": container_ns,
          "cache_dir": str(tmp_path / "cache")}
    out = plugin_util.run("host-local", "ADD", conf, **kw)
    result = plugin_util.ok(out)
    assert [ip["address"] for ip in result["ips"]] == ["10.231.7.2/29"], result
    assert result["cniVersion"] == "1.0.0"
    held = os.listdir(os.path.join(data, "ar-harness"))
    assert "10.231.7.2" in held
    check_conf = conf if via == "runtime" else {**conf, "prevResult": result}  # the runtime adds it from its cache
    assert plugin_util.run("host-local", "CHECK", check_conf, **kw).exit_code == 0
    assert plugin_util.run("host-local", "DEL", conf, **kw).exit_code == 0
    assert "10.231.7.2" not in os.listdir(os.path.join(data, "ar-harness"))


@each_way
def test_refusal_is_the_same_error_json(via: str, plugin_dir: str, host_ns: Namespace, container_ns: Namespace,
                                       tmp_path: Path) -> None:
    conf = _conf(str(tmp_path / "ipam"), subnet="10.231.7.0/33")
    out = plugin_util.run("host-local", "ADD", conf, via=via, host=host_ns, cni_path=plugin_dir,
                          container_id="ar-c2", netns=container_ns, cache_dir=str(tmp_path / "cache"))
    e = plugin_util.err(out)
    assert out.exit_code == 1 and e["code"] == 7 and "10.231.7.0/33" in json.dumps(e), e
    store = tmp_path / "ipam" / "ar-harness"
    # nothing reserved (the runtime undoes a failed ADD with a DEL, which leaves host-local's lock file)
    assert not store.exists() or set(os.listdir(store)) <= {"lock"}
