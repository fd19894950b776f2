"""An ADD aimed at the plugin's own namespace is refused before the handler touches anything."""

from __future__ import annotations

import json

from pycni.skel import CmdArgs, Plugin, dispatch
from pycni.spec.types import Result


def test_own_netns_refused_before_handler_runs() -> None:
    called: list[str] = []

    def add(args: CmdArgs) -> Result:
        called.append(args.netns)
        return Result()

    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/proc/thread-self/ns/net",
           "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
    conf = json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "t"}).encode()
    out = dispatch(Plugin(add=add), env, conf)
    assert out.exit_code == 1 and json.loads(out.stdout)["code"] == 8
    assert called == []
    out = dispatch(Plugin(add=add), dict(env, CNI_NETNS_OVERRIDE="1"), conf)
    assert out.exit_code == 0 and called == ["/proc/thread-self/ns/net"]
