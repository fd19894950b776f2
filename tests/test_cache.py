"""The result cache: libcni's layout and cniCacheV1 format, read and written by both runtimes.

The interop tests build a small Go program against the Go libcni 1.1.2 on this machine
(Debian's golang-github-appc-cni-dev) and let each runtime read, CHECK and DEL what the
other cached. Plugins are the recording fakes of test_runtime_chain; nothing touches the
network.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_runtime_chain import Env, write_fake_plugin

from pycni.runtime import cache as K
from pycni.runtime.conf import go_json
from pycni.spec.errors import DECODE_FAILURE, IO_FAILURE, CNIError

GO_LIBCNI = "/usr/share/gocode/src/github.com/containernetworking/cni/libcni"

GO_TOOL = r"""package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containernetworking/cni/libcni"
)

// tool add|get|check|del CONFDIR CACHEDIR BINDIR NETWORK CONTAINERID IFNAME NETNS ARGSJSON CAPSJSON
// tool conf CONFDIR NETWORK: what LoadConfList finds
func main() {
	a := os.Args[1:]
	if a[0] == "conf" {
		list, err := libcni.LoadConfList(a[1], a[2])
		must(err)
		plugins := []string{}
		for _, p := range list.Plugins {
			plugins = append(plugins, string(p.Bytes))
		}
		must(json.NewEncoder(os.Stdout).Encode(map[string]interface{}{"name": list.Name,
			"cniVersion": list.CNIVersion, "disableCheck": list.DisableCheck, "bytes": string(list.Bytes),
			"plugins": plugins}))
		return
	}
	rt := &libcni.RuntimeConf{ContainerID: a[5], IfName: a[6], NetNS: a[7]}
	must(json.Unmarshal([]byte(a[8]), &rt.Args))
	must(json.Unmarshal([]byte(a[9]), &rt.CapabilityArgs))
	list, err := libcni.LoadConfList(a[1], a[4])
	must(err)
	cn := libcni.NewCNIConfigWithCacheDir([]string{a[3]}, a[2], nil)
	ctx := context.Background()
	switch a[0] {
	case "add":
		res, err := cn.AddNetworkList(ctx, list, rt)
		must(err)
		must(res.Print())
	case "check":
		must(cn.CheckNetworkList(ctx, list, rt))
	case "del":
		must(cn.DelNetworkList(ctx, list, rt))
	case "get":
		res, err := cn.GetNetworkListCachedResult(list, rt)
		must(err)
		conf, newRt, err := cn.GetNetworkListCachedConfig(list, rt)
		must(err)
		out := map[string]interface{}{"result": res, "config": string(conf)}
		if newRt != nil {
			out["args"], out["caps"] = newRt.Args, newRt.CapabilityArgs
		}
		must(json.NewEncoder(os.Stdout).Encode(out))
	}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
"""


@pytest.fixture(scope="session")
def go_tool(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Go libcni program, built once per session (skipped where Go or libcni is missing)."""
    return build_go_tool(tmp_path_factory)


def build_go_tool(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not shutil.which("go") or not os.path.isdir(GO_LIBCNI):
        pytest.skip("needs golang-go and golang-github-appc-cni-dev")
    d = tmp_path_factory.mktemp("golibcni")
    (d / "main.go").write_text(GO_TOOL)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode", GOCACHE=str(d / "gocache"),
               GOFLAGS="", CGO_ENABLED="0")
    proc = subprocess.run(["go", "build", "-o", str(d / "tool"), "main.go"], cwd=d, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return str(d / "tool")


ARGS = [["K8S_POD_NAME", "web"], ["IgnoreUnknown", "1"]]
CAPS = {"mac": "aa:bb:cc:dd:ee:ff", "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}


def go(tool: str, e: Env, verb: str, cid: str = "ctr1", ifname: str = "eth0", netns: str = "/var/run/netns/x",
       check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([tool, verb, str(e.conf), str(e.cache), str(e.bin), "fakenet", cid, ifname, netns,
                           json.dumps(ARGS), json.dumps(CAPS)],
                          env=dict(os.environ, FAKE_LOG=str(e.log)), capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_file_layout_and_format(env: Env) -> None:
    net = env.network()
    res = env.rt.add(net, "ctr1", "/var/run/netns/x", "eth0", args=[tuple(a) for a in ARGS], capability_args=CAPS)
    path = env.cache / "results" / "fakenet-ctr1-eth0"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    raw = path.read_bytes()
    obj = json.loads(raw)
    assert list(obj) == ["kind", "containerId", "config", "ifName", "networkName", "netns", "cniArgs",
                         "capabilityArgs", "result"]  # cachedInfo's field order
    assert obj["kind"] == "cniCacheV1" and obj["containerId"] == "ctr1" and obj["ifName"] == "eth0"
    assert obj["networkName"] == "fakenet" and obj["netns"] == "/var/run/netns/x"
    assert base64.b64decode(obj["config"]) == (env.conf / "10-fake.conflist").read_bytes() == net.bytes
    assert obj["cniArgs"] == ARGS and obj["capabilityArgs"] == CAPS
    assert obj["result"] == res.to_dict()
    assert b"\n" not in raw and b": " not in raw  # compact, as Go writes it
    assert [e.container_id for e in K.list_entries(str(env.cache))] == ["ctr1"]


def test_entry_round_trip_and_empty_fields(tmp_path: Path) -> None:
    e = K.CacheEntry("n", "c", "eth0", config=b"\x00\xffbytes")
    data = e.to_json()
    assert json.loads(data) == {"kind": "cniCacheV1", "containerId": "c", "config": "AP9ieXRlcw==", "ifName": "eth0",
                                "networkName": "n"}  # omitempty fields left out, as Go does
    back = K.parse_entry(data)
    assert (back.network_name, back.container_id, back.ifname, back.config) == ("n", "c", "eth0", b"\x00\xffbytes")
    assert back.result is None and back.cni_args == [] and not back.legacy


def test_legacy_bare_result_file_is_read(env: Env) -> None:
    net = env.network(version="0.4.0")
    path = env.cache / "results" / "fakenet-ctr1-eth0"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cniVersion": "0.4.0", "interfaces": [{"name": "old"}],
                                "ips": [{"version": "4", "address": "10.1.0.5/16"}]}))
    res = env.rt.get_cached_result(net, "ctr1", "eth0")
    assert res is not None and [i.name for i in res.interfaces] == ["old"] and res.cni_version == "0.4.0"
    with pytest.raises(CNIError) as e:
        env.rt.get_cached_config(net, "ctr1", "eth0")
    assert e.value.code == DECODE_FAILURE
    assert env.rt.cached_attachments() == []  # GetCachedAttachments skips legacy files too


def test_cached_result_converted_to_config_version(env: Env) -> None:
    net = env.network(version="0.4.0")
    K.write_entry(str(env.cache), K.CacheEntry("fakenet", "ctr1", "eth0", result={
        "cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/16"}]}))
    res = env.rt.get_cached_result(net, "ctr1", "eth0")
    assert res is not None and res.cni_version == "0.4.0"
    assert res.to_dict()["ips"][0]["version"] == "4"


@pytest.mark.parametrize("content", ["{broken", '{"kind":"cniCacheV1","config":"%%%"}', "[]",
                                     '{"kind":"cniCacheV1","result":[1]}'])
def test_corrupt_entries_are_decode_errors(env: Env, content: str) -> None:
    net = env.network()
    path = env.cache / "results" / "fakenet-ctr1-eth0"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(CNIError) as e:
        env.rt.get_cached_config(net, "ctr1", "eth0") if "kind" in content else env.rt.get_cached_result(
            net, "ctr1", "eth0")
    assert e.value.code == DECODE_FAILURE and str(path) in e.value.msg
    assert env.rt.cached_attachments() == []


def test_cache_path_needs_all_names_and_missing_entries(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as e:
        K.cache_file(str(tmp_path), "net", "", "eth0")
    assert e.value.code == IO_FAILURE and "container ID" in e.value.details
    assert K.read_entry(str(tmp_path), "net", "c", "eth0") is None
    assert K.delete_entry(str(tmp_path), "net", "c", "eth0") is False
    assert K.list_entries(str(tmp_path / "nope")) == []


def test_list_entries_filters_by_container_exactly(tmp_path: Path) -> None:
    for net, cid, ifname in (("n", "a", "eth0"), ("n", "a-b", "eth0"), ("m-a", "b", "eth1"), ("n", "ab", "e")):
        K.write_entry(str(tmp_path), K.CacheEntry(net, cid, ifname, result={"cniVersion": "1.0.0"}))
    assert sorted((e.network_name, e.container_id) for e in K.list_entries(str(tmp_path), "a")) == [("n", "a")]
    assert len(K.list_entries(str(tmp_path))) == 4


def test_unwritable_cache_dir_is_io_error(env: Env) -> None:
    blocker = env.tmp / "file"
    blocker.write_text("")
    env.rt.cache_dir = str(blocker)
    with pytest.raises(CNIError) as e:
        env.rt.add(env.network(), "ctr1", "/ns", "eth0")
    # refused before any plugin runs: the in-flight marker lives in the cache dir too
    assert e.value.code == IO_FAILURE and "in flight" in e.value.msg and str(blocker) in e.value.details
    assert env.calls() == []


# ---- interop with the Go libcni --------------------------------------------------------------

def no_empty_dns(obj: Any) -> Any:
    """libcni 1.1.2 writes an empty ``"dns": {}`` into 1.0.0 results; newer libcni and pycni omit it."""
    if isinstance(obj, (bytes, str)):
        t = obj.decode() if isinstance(obj, bytes) else obj
        return t.replace(',"dns":{}', "").replace('"dns":{},', "")
    return {k: v for k, v in obj.items() if not (k == "dns" and v == {})}


def _calls_summary(calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["plugin"], c["command"]) for c in calls]


def test_go_libcni_reads_checks_and_deletes_our_cache(env: Env, go_tool: str) -> None:
    net = env.network()
    res = env.rt.add(net, "ctr1", "/var/run/netns/x", "eth0", args=[tuple(a) for a in ARGS], capability_args=CAPS)
    ours = env.calls()
    got = json.loads(go(go_tool, env, "get").stdout)
    assert no_empty_dns(got["result"]) == res.to_dict()
    assert got["config"].encode() == net.bytes
    assert got["args"] == ARGS and got["caps"] == CAPS
    go(go_tool, env, "check")
    checks = env.calls()
    assert _calls_summary(checks) == [("p1", "CHECK"), ("p2", "CHECK"), ("p3", "CHECK")]
    assert no_empty_dns(checks[0]["conf"]["prevResult"]) == res.to_dict()
    go(go_tool, env, "del")
    assert _calls_summary(env.calls()) == [("p3", "DEL"), ("p2", "DEL"), ("p1", "DEL")]
    assert not (env.cache / "results" / "fakenet-ctr1-eth0").exists()
    # the same ADD through Go sends each plugin the very same stdin bytes we sent
    go(go_tool, env, "add")
    assert [no_empty_dns(c["stdin"]) for c in env.calls()] == [c["stdin"] for c in ours]


def test_we_read_check_and_delete_go_cache(env: Env, go_tool: str) -> None:
    net = env.network()
    go_result = json.loads(go(go_tool, env, "add").stdout)
    env.calls()
    go_file = (env.cache / "results" / "fakenet-ctr1-eth0").read_bytes()
    res = env.rt.get_cached_result(net, "ctr1", "eth0")
    assert res is not None and res.to_dict() == no_empty_dns(go_result)
    cfg = env.rt.get_cached_config(net, "ctr1", "eth0")
    assert cfg is not None
    config, rt = cfg
    assert config == net.bytes and rt.args == [tuple(a) for a in ARGS] and rt.capability_args == CAPS
    (att,) = env.rt.cached_attachments("ctr1")
    assert (att.network, att.ifname, att.netns) == ("fakenet", "eth0", "")  # libcni 1.1.2 caches no netns
    env.rt.check(net, "ctr1", "/var/run/netns/x", "eth0", args=[tuple(a) for a in ARGS], capability_args=CAPS)
    assert all(c["conf"]["prevResult"] == no_empty_dns(go_result) for c in env.calls())
    # our own ADD writes the same file Go wrote, but for the netns field libcni 1.1.2 lacks
    env.rt.delete(net, "ctr1", "/var/run/netns/x", "eth0")
    assert _calls_summary(env.calls()) == [("p3", "DEL"), ("p2", "DEL"), ("p1", "DEL")]
    assert not (env.cache / "results" / "fakenet-ctr1-eth0").exists()
    env.rt.add(net, "ctr1", "/var/run/netns/x", "eth0", args=[tuple(a) for a in ARGS], capability_args=CAPS)
    ours = json.loads((env.cache / "results" / "fakenet-ctr1-eth0").read_bytes())
    assert ours.pop("netns") == "/var/run/netns/x"
    assert go_json(ours).decode() == no_empty_dns(go_file)


def test_fake_plugin_helper_is_executable(tmp_path: Path) -> None:
    p = write_fake_plugin(tmp_path, "x")
    proc = subprocess.run([str(p)], input=b"{}", env={"CNI_COMMAND": "VERSION", "FAKE_LOG": str(tmp_path / "l")},
                          capture_output=True)
    assert proc.returncode == 0 and "1.0.0" in json.loads(proc.stdout)["supportedVersions"]
