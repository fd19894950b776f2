"""Two runtimes behind one face for tests: pycni.runtime and the Go libcni (gocnitool).

Both run their plugins from inside a throwaway host namespace, read the network from a conf
dir and keep their cache in a temporary directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from netns_util import Namespace


class Runtime:
    name = ""

    def add(self, cid: str, ctr: Namespace, ifname: str = "eth0", cap: dict[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def check(self, cid: str, ctr: Namespace, ifname: str = "eth0") -> None:
        raise NotImplementedError

    def delete(self, cid: str, ctr: Namespace, ifname: str = "eth0", cap: dict[str, Any] | None = None) -> None:
        raise NotImplementedError


class PycniRuntime(Runtime):
    name = "pycni"

    def __init__(self, host: Namespace, conf_dir: Path, network: str, plugin_path: list[str], cache_dir: Path) -> None:
        from pycni.runtime import CNI

        self.host = host
        self.rt = CNI(conf_dir=str(conf_dir), plugin_path=plugin_path, cache_dir=str(cache_dir),
                      env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin"), "PYCNI_SOCKET": "off"})
        self.net = self.rt.load_network(network)

    def add(self, cid: str, ctr: Namespace, ifname: str = "eth0", cap: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.host.enter():
            return self.rt.add(self.net, cid, ctr.path, ifname, capability_args=cap).to_dict()

    def check(self, cid: str, ctr: Namespace, ifname: str = "eth0") -> None:
        with self.host.enter():
            self.rt.check(self.net, cid, ctr.path, ifname)

    def delete(self, cid: str, ctr: Namespace, ifname: str = "eth0", cap: dict[str, Any] | None = None) -> None:
        with self.host.enter():
            self.rt.delete(self.net, cid, ctr.path, ifname, capability_args=cap)


class GoRuntime(Runtime):
    name = "go-libcni"

    def __init__(self, tool: str, host: Namespace, conf_dir: Path, network: str, plugin_path: list[str],
                 cache_dir: Path) -> None:
        self.tool, self.host = tool, host
        self.base = [tool, "-confdir", str(conf_dir), "-net", network, "-path", ":".join(plugin_path),
                     "-cachedir", str(cache_dir)]

    def _run(self, verb: str, cid: str, ctr: Namespace, ifname: str, cap: dict[str, Any] | None) -> str:
        cmd = [*self.base, "-cid", cid, "-netns", ctr.path, "-ifname", ifname]
        if cap:
            cmd += ["-cap", json.dumps(cap)]
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin"), "PYCNI_SOCKET": "off"}
        proc = self.host.run([*cmd, verb], check=False, env=env)
        if proc.returncode != 0:
            raise AssertionError(f"gocnitool {verb} failed: {proc.stdout} {proc.stderr}")
        return proc.stdout

    def add(self, cid: str, ctr: Namespace, ifname: str = "eth0", cap: dict[str, Any] | None = None) -> dict[str, Any]:
        return json.loads(self._run("add", cid, ctr, ifname, cap))

    def check(self, cid: str, ctr: Namespace, ifname: str = "eth0") -> None:
        self._run("check", cid, ctr, ifname, None)

    def delete(self, cid: str, ctr: Namespace, ifname: str = "eth0", cap: dict[str, Any] | None = None) -> None:
        self._run("del", cid, ctr, ifname, cap)


def write_conflist(conf_dir: Path, network: str, plugins: list[dict[str, Any]], version: str = "1.0.0") -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / f"10-{network}.conflist").write_text(
        json.dumps({"cniVersion": version, "name": network, "plugins": plugins}, indent=2))
