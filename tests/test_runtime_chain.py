"""The runtime's chain mechanics, against tiny fake plugins that record what they were given.

Each fake plugin is a Python script on a temporary CNI_PATH. It appends one JSON line per
call (command, CNI_* environment, stdin bytes) to ``$FAKE_LOG`` and, on ADD, answers with
its prevResult plus one interface named after itself. No namespaces needed: nothing here
touches the network.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pycni.runtime import CNI, GCAttachment, NetworkConfigList, conflist_from_bytes
from pycni.runtime.cache import cache_file
from pycni.spec.errors import (
    INCOMPATIBLE_VERSION,
    INVALID_CONFIG,
    INVALID_ENV,
    PLUGIN_NOT_AVAILABLE,
    UNKNOWN_CONTAINER,
    CNIError,
)

FAKE_PLUGIN = r'''#!{python} -IS
import json, os, sys
stdin = sys.stdin.buffer.read()
env = {k: v for k, v in os.environ.items() if k.startswith("CNI_")}
me = os.path.basename(sys.argv[0])
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"plugin": me, "command": env.get("CNI_COMMAND"), "env": env,
                        "stdin": stdin.decode()}) + "\n")
command = env.get("CNI_COMMAND")
conf = json.loads(stdin) if stdin.strip() else {}
if command == "VERSION":
    print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": conf.get("supported") or
                      os.environ.get("FAKE_VERSIONS", "0.3.1,0.4.0,1.0.0,1.1.0").split(",")}))
    sys.exit(0)
fail = conf.get("fail", {})
if command in fail:
    print(json.dumps({"cniVersion": conf.get("cniVersion"), "code": fail[command], "msg": me + " says no",
                      "details": "because the test said so"}))
    sys.exit(1)
if command == "ADD":
    version = conf.get("resultVersion") or conf["cniVersion"]
    res = conf.get("prevResult") or {"ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1"}]}
    res = dict(res, cniVersion=version)
    res["interfaces"] = list(res.get("interfaces", [])) + [{"name": me}]
    if version in ("0.3.0", "0.3.1", "0.4.0"):
        res["ips"] = [dict(ip, version="4") for ip in res.get("ips", [])]
    else:
        res["ips"] = [{k: v for k, v in ip.items() if k != "version"} for ip in res.get("ips", [])]
    print(json.dumps(res))
'''


def write_fake_plugin(bin_dir: Path, name: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    p = bin_dir / name
    p.write_text(FAKE_PLUGIN.replace("{python}", sys.executable))
    p.chmod(0o755)
    return p


class Env:
    """A runtime over fake plugins p1..p3 with its own conf dir, cache dir and call log."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.conf = tmp / "conf"
        self.conf.mkdir()
        self.cache = tmp / "cache"
        self.log = tmp / "calls.jsonl"
        for name in ("p1", "p2", "p3"):
            write_fake_plugin(self.bin, name)
        self.rt = CNI(conf_dir=str(self.conf), plugin_path=[str(tmp / "nothing-here"), str(self.bin)],
                      cache_dir=str(self.cache), env={"FAKE_LOG": str(self.log), "PATH": os.environ["PATH"]})

    def network(self, plugins: list[dict[str, Any]] | None = None, version: str = "1.0.0",
                **extra: Any) -> NetworkConfigList:
        d = {"cniVersion": version, "name": "fakenet", **extra,
             "plugins": plugins if plugins is not None else [
                 {"type": "p1", "capabilities": {"portMappings": True, "mac": False}},
                 {"type": "p2", "runtimeConfig": {"stale": 1}, "capabilities": {"mac": True}},
                 {"type": "p3"}]}
        (self.conf / "10-fake.conflist").write_text(json.dumps(d))
        return self.rt.load_network("fakenet")

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = [json.loads(line) for line in self.log.read_text().splitlines()]
        self.log.unlink()
        for c in out:
            c["conf"] = json.loads(c["stdin"]) if c["stdin"].strip() else {}
        return out


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


CAPS = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}], "mac": "aa:bb:cc:dd:ee:ff",
        "bandwidth": {"ingressRate": 1}}


def test_add_threads_prev_result_and_builds_runtime_config(env: Env) -> None:
    net = env.network()
    res = env.rt.add(net, "ctr1", "/var/run/netns/x", "eth1", args=[("K8S_POD_NAME", "web"), ("IgnoreUnknown", "1")],
                     capability_args=CAPS)
    calls = env.calls()
    assert [(c["plugin"], c["command"]) for c in calls] == [("p1", "ADD"), ("p2", "ADD"), ("p3", "ADD")]
    for c in calls:
        assert c["env"]["CNI_CONTAINERID"] == "ctr1" and c["env"]["CNI_NETNS"] == "/var/run/netns/x"
        assert c["env"]["CNI_IFNAME"] == "eth1" and c["env"]["CNI_ARGS"] == "K8S_POD_NAME=web;IgnoreUnknown=1"
        assert c["env"]["CNI_PATH"] == f"{env.tmp / 'nothing-here'}:{env.bin}"
        assert c["conf"]["name"] == "fakenet" and c["conf"]["cniVersion"] == "1.0.0"
    p1, p2, p3 = (c["conf"] for c in calls)
    assert "prevResult" not in p1
    assert p1["runtimeConfig"] == {"portMappings": CAPS["portMappings"]}  # only enabled, only declared
    assert p2["runtimeConfig"] == {"mac": CAPS["mac"]}  # replaces the file's runtimeConfig
    assert "runtimeConfig" not in p3
    assert [i["name"] for i in p2["prevResult"]["interfaces"]] == ["p1"]
    assert [i["name"] for i in p3["prevResult"]["interfaces"]] == ["p1", "p2"]
    # stdin is what libcni would send: compact JSON, sorted keys
    assert calls[0]["stdin"].startswith('{"capabilities":{"mac":false,"portMappings":true},"cniVersion":"1.0.0",')
    assert [i.name for i in res.interfaces] == ["p1", "p2", "p3"] and res.cni_version == "1.0.0"
    assert str(res.ips[0].address) == "10.0.0.2/24"
    cached = env.rt.get_cached_result(net, "ctr1", "eth1")
    assert cached is not None and cached.to_dict() == res.to_dict()


def test_prev_result_converted_to_config_version(env: Env) -> None:
    net = env.network([{"type": "p1", "resultVersion": "0.4.0"}, {"type": "p2"}], version="1.0.0")
    res = env.rt.add(net, "ctr1", "/ns", "eth0")
    p2 = env.calls()[1]["conf"]
    assert p2["prevResult"]["cniVersion"] == "1.0.0"
    assert "version" not in p2["prevResult"]["ips"][0]  # the 1.0.0 shape
    assert res.cni_version == "1.0.0"


def test_del_runs_reverse_with_cached_result_and_drops_cache(env: Env) -> None:
    net = env.network()
    env.rt.add(net, "ctr1", "/ns", "eth0", capability_args=CAPS)
    env.calls()
    path = cache_file(str(env.cache), "fakenet", "ctr1", "eth0")
    assert os.path.exists(path)
    env.rt.delete(net, "ctr1", "/ns", "eth0", capability_args=CAPS)
    calls = env.calls()
    assert [(c["plugin"], c["command"]) for c in calls] == [("p3", "DEL"), ("p2", "DEL"), ("p1", "DEL")]
    for c in calls:
        assert [i["name"] for i in c["conf"]["prevResult"]["interfaces"]] == ["p1", "p2", "p3"]
    assert calls[2]["conf"]["runtimeConfig"] == {"portMappings": CAPS["portMappings"]}
    assert not os.path.exists(path)
    # a second DEL is fine and runs the plugins without a prevResult
    env.rt.delete(net, "ctr1", "/ns", "eth0")
    calls = env.calls()
    assert [c["plugin"] for c in calls] == ["p3", "p2", "p1"]
    assert all("prevResult" not in c["conf"] for c in calls)


def test_del_with_unreadable_cache_still_deletes(env: Env) -> None:
    net = env.network()
    path = Path(cache_file(str(env.cache), "fakenet", "ctr1", "eth0"))
    path.parent.mkdir(parents=True)
    path.write_text("{broken")
    env.rt.delete(net, "ctr1", "", "eth0")
    assert [c["plugin"] for c in env.calls()] == ["p3", "p2", "p1"]
    assert not path.exists()


def test_del_before_040_gets_no_prev_result(env: Env) -> None:
    net = env.network(version="0.3.1")
    env.rt.add(net, "ctr1", "/ns", "eth0")
    env.calls()
    env.rt.delete(net, "ctr1", "/ns", "eth0")
    assert all("prevResult" not in c["conf"] for c in env.calls())


def test_check_in_order_with_cached_result(env: Env) -> None:
    net = env.network()
    env.rt.add(net, "ctr1", "/ns", "eth0")
    env.calls()
    env.rt.check(net, "ctr1", "/ns", "eth0")
    calls = env.calls()
    assert [(c["plugin"], c["command"]) for c in calls] == [("p1", "CHECK"), ("p2", "CHECK"), ("p3", "CHECK")]
    assert all(len(c["conf"]["prevResult"]["interfaces"]) == 3 for c in calls)


def test_check_refusals(env: Env) -> None:
    net = env.network()
    with pytest.raises(CNIError) as e:  # never added: spec says runtimes must not CHECK
        env.rt.check(net, "ctr1", "/ns", "eth0")
    assert e.value.code == UNKNOWN_CONTAINER and "ADD" in e.value.details
    net = env.network(version="0.3.1")
    env.rt.add(net, "ctr1", "/ns", "eth0")
    env.calls()
    with pytest.raises(CNIError) as e:
        env.rt.check(net, "ctr1", "/ns", "eth0")
    assert e.value.code == INCOMPATIBLE_VERSION and "CHECK" in e.value.msg
    net = env.network(disableCheck=True)
    env.rt.check(net, "ctr1", "/ns", "eth0")  # a no-op, even with nothing cached
    assert env.calls() == []


def test_add_failure_wraps_plugin_error_deletes_the_chain_and_caches_nothing(env: Env) -> None:
    net = env.network([{"type": "p1"}, {"type": "p2", "fail": {"ADD": 117}}, {"type": "p3"}])
    with pytest.raises(CNIError) as e:
        env.rt.add(net, "ctr1", "/ns", "eth0")
    assert e.value.code == 117
    assert e.value.msg == 'plugin type="p2" failed (add): p2 says no'
    assert e.value.details == "because the test said so"
    calls = env.calls()
    # The chain is DELeted in reverse before the error returns (as CRI runtimes do), with what
    # p1 had made as prevResult, so a retry starts from nothing.
    assert [(c["plugin"], c["command"]) for c in calls] == [
        ("p1", "ADD"), ("p2", "ADD"), ("p3", "DEL"), ("p2", "DEL"), ("p1", "DEL")]
    assert all(c["conf"]["prevResult"]["interfaces"] == [{"name": "p1"}] for c in calls[2:])
    assert env.rt.get_cached_result(net, "ctr1", "eth0") is None
    assert not os.listdir(env.cache / "pycni-adding")  # no in-flight marker left


def test_add_failure_whose_clean_up_fails_caches_the_partial_result(env: Env) -> None:
    net = env.network([{"type": "p1", "fail": {"DEL": 11}}, {"type": "p2", "fail": {"ADD": 117}}, {"type": "p3"}])
    with pytest.raises(CNIError) as e:
        env.rt.add(net, "ctr1", "/ns", "eth0")
    assert e.value.code == 117 and "p2 says no" in e.value.msg
    assert "cleaning up after the failed ADD also failed" in e.value.details and "p1 says no" in e.value.details
    cached = env.rt.get_cached_result(net, "ctr1", "eth0")
    assert cached is not None and [i.name for i in cached.interfaces] == ["p1"]
    env.calls()
    net = env.network([{"type": "p1"}, {"type": "p2"}, {"type": "p3"}])
    env.rt.delete(net, "ctr1", "/ns", "eth0")  # the retry finds what is left and succeeds
    assert [c["plugin"] for c in env.calls()] == ["p3", "p2", "p1"]
    assert env.rt.get_cached_result(net, "ctr1", "eth0") is None


def test_del_failure_runs_every_plugin_reports_all_and_keeps_cache(env: Env) -> None:
    net = env.network([{"type": "p1", "fail": {"DEL": 11}}, {"type": "p2"}, {"type": "p3", "fail": {"DEL": 5}}])
    env.rt.add(net, "ctr1", "/ns", "eth0")
    env.calls()
    with pytest.raises(CNIError) as e:
        env.rt.delete(net, "ctr1", "/ns", "eth0")
    assert e.value.code == 5  # the first failure's code (p3 runs first)
    assert 'type="p3" failed (delete)' in e.value.msg and 'type="p1" failed (delete)' in e.value.msg
    assert [c["plugin"] for c in env.calls()] == ["p3", "p2", "p1"]
    assert env.rt.get_cached_result(net, "ctr1", "eth0") is not None


def test_gc_keeps_an_attachment_whose_add_is_in_flight(env: Env) -> None:
    from pycni.runtime import cache

    net = env.network(version="1.1.0")
    env.rt.add(net, "done", "/ns", "eth0")
    env.rt.add(net, "busy", "/ns", "eth0")  # a cache entry from an earlier life, being re-added now
    env.calls()
    with cache.adding(str(env.cache), "fakenet", "busy", "eth0"):
        env.rt.gc(net, [])
    calls = env.calls()
    assert [(c["plugin"], c["command"], c["env"].get("CNI_CONTAINERID")) for c in calls if c["command"] == "DEL"] \
        == [("p3", "DEL", "done"), ("p2", "DEL", "done"), ("p1", "DEL", "done")]
    gcs = [c for c in calls if c["command"] == "GC"]
    assert all(c["conf"]["cni.dev/valid-attachments"] == [{"containerID": "busy", "ifname": "eth0"}] for c in gcs)
    assert [a.container_id for a in env.rt.cached_attachments()] == ["busy"]
    assert cache.in_flight(str(env.cache)) == set()


def test_in_flight_marker_of_a_dead_add_is_stale(env: Env, tmp_path: Path) -> None:
    import subprocess

    from pycni.runtime import cache

    code = ("import os, sys; from pycni.runtime import cache\n"
            f"with cache.adding({str(env.cache)!r}, 'fakenet', 'dead', 'eth0'):\n"
            "    os.kill(os.getpid(), 9)\n")
    subprocess.run([sys.executable, "-c", code], check=False)
    assert len(os.listdir(env.cache / "pycni-adding")) == 1
    assert cache.in_flight(str(env.cache)) == set()  # nobody holds it: stale, and removed
    assert os.listdir(env.cache / "pycni-adding") == []


def test_missing_plugin_fails_before_anything_runs(env: Env) -> None:
    net = env.network([{"type": "p1"}, {"type": "nosuch"}])
    with pytest.raises(CNIError) as e:
        env.rt.add(net, "ctr1", "/ns", "eth0")
    assert e.value.code == INVALID_CONFIG and "nosuch" in e.value.msg
    assert env.calls() == []


@pytest.mark.parametrize("cid, ifname, code", [
    ("", "eth0", UNKNOWN_CONTAINER), ("../x", "eth0", INVALID_ENV), ("c1", "", INVALID_ENV),
    ("c1", "a/b", INVALID_ENV), ("c1", "x" * 16, INVALID_ENV)])
def test_bad_attachment_identifiers(env: Env, cid: str, ifname: str, code: int) -> None:
    net = env.network()
    with pytest.raises(CNIError) as e:
        env.rt.add(net, cid, "/ns", ifname)
    assert e.value.code == code
    with pytest.raises(CNIError):
        env.rt.delete(net, cid, "/ns", ifname)
    assert env.calls() == []


def test_single_plugin_config_operations(env: Env) -> None:
    from pycni.runtime import conf_from_bytes

    net = conf_from_bytes(b'{"cniVersion":"0.4.0","name":"solo","type":"p1","capabilities":{"mac":true}}')
    res = env.rt.add(net, "c1", "/ns", "eth0", capability_args={"mac": "x"})
    assert [i.name for i in res.interfaces] == ["p1"]
    (call,) = env.calls()
    assert call["conf"]["runtimeConfig"] == {"mac": "x"} and call["conf"]["name"] == "solo"
    cfg = env.rt.get_cached_config(net, "c1", "eth0")
    assert cfg is not None and cfg[0] == net.bytes and cfg[1].capability_args == {"mac": "x"}
    env.rt.check(net, "c1", "/ns", "eth0")
    env.rt.delete(net, "c1", "/ns", "eth0")
    assert [c["command"] for c in env.calls()] == ["CHECK", "DEL"]
    assert env.rt.get_cached_config(net, "c1", "eth0") is None


def test_gc_deletes_stale_attachments_and_passes_valid_ones(env: Env) -> None:
    net = env.network(version="1.1.0")
    env.rt.add(net, "keep", "/ns/keep", "eth0")
    env.rt.add(net, "stale", "/ns/stale", "eth0", args={"A": "b"}, capability_args={"portMappings": [1]})
    other = conflist_from_bytes(json.dumps({"cniVersion": "1.1.0", "name": "othernet",
                                            "plugins": [{"type": "p1"}]}))
    env.rt.add(other, "stale", "/ns/stale", "eth0")
    env.calls()
    env.rt.gc(net, [GCAttachment("keep", "eth0")])
    calls = env.calls()
    dels = [c for c in calls if c["command"] == "DEL"]
    assert [c["plugin"] for c in dels] == ["p3", "p2", "p1"]
    assert all(c["env"]["CNI_CONTAINERID"] == "stale" and c["env"]["CNI_NETNS"] == "/ns/stale" for c in dels)
    assert dels[0]["env"]["CNI_ARGS"] == "A=b" and dels[2]["conf"]["runtimeConfig"] == {"portMappings": [1]}
    gcs = [c for c in calls if c["command"] == "GC"]
    assert [c["plugin"] for c in gcs] == ["p1", "p2", "p3"]
    for c in gcs:
        assert c["conf"]["cni.dev/valid-attachments"] == [{"containerID": "keep", "ifname": "eth0"}]
        assert c["conf"]["cni.dev/attachments"] == c["conf"]["cni.dev/valid-attachments"]
        assert "CNI_CONTAINERID" not in c["env"] and "prevResult" not in c["conf"]
    assert {(a.network, a.container_id) for a in env.rt.cached_attachments()} == {
        ("fakenet", "keep"), ("othernet", "stale")}
    assert [a.container_id for a in env.rt.cached_attachments("stale")] == ["stale"]


def test_gc_without_valid_list_and_old_versions(env: Env) -> None:
    net = env.network(version="1.0.0")
    env.rt.add(net, "a", "/ns", "eth0")
    env.calls()
    env.rt.gc(net)  # as cnitool: nothing is valid; 1.0.0 plugins get DEL but no GC
    assert [c["command"] for c in env.calls()] == ["DEL", "DEL", "DEL"]
    assert env.rt.cached_attachments() == []
    net = env.network(version="1.1.0")
    env.rt.gc(net)
    gcs = env.calls()
    assert [c["command"] for c in gcs] == ["GC", "GC", "GC"]
    assert all("cni.dev/valid-attachments" not in c["conf"] for c in gcs)  # as libcni; ours refuse it


def test_gc_disabled_and_errors_collected(env: Env) -> None:
    net = env.network(version="1.1.0", disableGC=True)
    env.rt.add(net, "a", "/ns", "eth0")
    env.calls()
    env.rt.gc(net)
    assert env.calls() == []
    net = env.network([{"type": "p1", "fail": {"GC": 5}}, {"type": "p2", "fail": {"GC": 100}}], version="1.1.0")
    with pytest.raises(CNIError) as e:
        env.rt.gc(net, [])
    assert e.value.code == 5
    assert 'type="p1" failed (gc)' in e.value.msg and 'type="p2" failed (gc)' in e.value.msg
    assert [c["plugin"] for c in env.calls() if c["command"] == "GC"] == ["p1", "p2"]


def test_status(env: Env) -> None:
    net = env.network(version="1.1.0")
    env.rt.status(net)
    assert [(c["plugin"], c["command"]) for c in env.calls()] == [("p1", "STATUS"), ("p2", "STATUS"),
                                                                  ("p3", "STATUS")]
    net = env.network([{"type": "p1"}, {"type": "p2", "fail": {"STATUS": 50}}, {"type": "p3"}], version="1.1.0")
    with pytest.raises(CNIError) as e:
        env.rt.status(net)
    assert e.value.code == PLUGIN_NOT_AVAILABLE and 'type="p2" failed (status)' in e.value.msg
    assert [c["plugin"] for c in env.calls()] == ["p1", "p2"]
    env.rt.status(env.network(version="1.0.0"))  # STATUS is 1.1: nothing to ask
    assert env.calls() == []


def test_validate(env: Env) -> None:
    net = env.network()
    assert env.rt.validate(net) == ["mac", "portMappings"]
    assert all(c["command"] == "VERSION" for c in env.calls())
    env.rt.env = dict(env.rt.env or {}, FAKE_VERSIONS="0.3.1")
    with pytest.raises(CNIError) as e:
        env.rt.validate(net)
    assert e.value.code == INCOMPATIBLE_VERSION and 'does not support config version "1.0.0"' in e.value.msg
    assert e.value.msg.count("does not support") == 3  # every plugin's problem, together
    with pytest.raises(CNIError) as e:
        env.rt.validate(env.network([{"type": "nosuch"}], version="0.3.1"))
    assert e.value.code == INVALID_CONFIG and "nosuch" in e.value.msg
    assert env.rt.version_info("p1")["supportedVersions"] == ["0.3.1"]


def test_plugins_run_with_base_env_and_cni_vars_replaced(env: Env) -> None:
    env.rt.env = {"FAKE_LOG": str(env.log), "CNI_ARGS": "STALE=1", "CNI_IFNAME": "stale"}
    env.rt.add(env.network([{"type": "p1"}]), "c", "/ns", "eth0")
    (call,) = env.calls()
    assert "CNI_ARGS" not in call["env"] and call["env"]["CNI_IFNAME"] == "eth0"


# ---- the API for real: Go plugins run from inside a "host" namespace ---------------------------

@pytest.mark.skipif(not os.path.exists("/usr/lib/cni/bridge"), reason="needs containernetworking-plugins")
def test_api_runs_plugins_in_calling_threads_netns(tmp_path: Path, host_ns: Any, container_ns: Any) -> None:
    import subprocess

    conf = tmp_path / "net.d"
    conf.mkdir()
    (conf / "a.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "apinet",
        "plugins": [{"type": "bridge", "bridge": "pycniapi0", "isGateway": True,
                     "ipam": {"type": "host-local", "subnet": "10.124.0.0/24", "dataDir": str(tmp_path / "ipam")}},
                    {"type": "tuning", "capabilities": {"mac": True}, "dataDir": str(tmp_path / "tuning")}]}))
    rt = CNI(conf_dir=str(conf), plugin_path=["/usr/lib/cni"], cache_dir=str(tmp_path / "cache"))
    net = rt.load_network("apinet")
    with host_ns.enter():
        res = rt.add(net, "ctr1", container_ns.path, "eth0", capability_args={"mac": "0a:58:0a:7c:00:99"})
        rt.check(net, "ctr1", container_ns.path, "eth0")
    assert str(res.ips[0].address) == "10.124.0.2/24"
    link = json.loads(container_ns.run(["ip", "-j", "link", "show", "eth0"]).stdout)[0]
    assert link["address"] == "0a:58:0a:7c:00:99"  # tuning got runtimeConfig.mac
    assert host_ns.run(["ip", "link", "show", "pycniapi0"]).returncode == 0
    root = subprocess.run(["ip", "link", "show", "pycniapi0"], capture_output=True)
    assert root.returncode != 0  # the bridge is in the host namespace, not the machine's
    with host_ns.enter():
        rt.delete(net, "ctr1", container_ns.path, "eth0")
    assert container_ns.run(["ip", "link", "show", "eth0"], check=False).returncode != 0
    assert rt.cached_attachments() == []


def test_args_accepted_as_cni_args_text(env: Env) -> None:
    net = env.network([{"type": "p1"}])
    env.rt.add(net, "c", "/ns", "eth0", args="A=1;B=x=y;")
    (call,) = env.calls()
    assert call["env"]["CNI_ARGS"] == "A=1;B=x=y"
    with pytest.raises(CNIError) as e:
        env.rt.add(net, "c", "/ns", "eth0", args="A=1;oops")
    assert e.value.code == INVALID_ENV and "'oops'" in e.value.msg
