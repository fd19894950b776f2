"""An ADD aimed at the plugin's own namespace is refused before the handler touches anything."""

from __future__ import annotations

import json

from plugin_util import run

from pycni.skel import CmdArgs, Plugin
from pycni.spec.types import Result


def test_own_netns_refused_before_handler_runs() -> None:
    called: list[str] = []

    def add(args: CmdArgs) -> Result:
        called.append(args.netns)
        return Result()

    own = {"container_id": "c", "netns": "/proc/thread-self/ns/net", "cni_path": "/nonexistent"}
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "t"}
    out = run(Plugin(add=add), "ADD", conf, **own)
    assert out.exit_code == 1 and json.loads(out.stdout)["code"] == 8
    assert called == []
    out = run(Plugin(add=add), "ADD", conf, **own, CNI_NETNS_OVERRIDE="1")
    assert out.exit_code == 0 and called == ["/proc/thread-self/ns/net"]
