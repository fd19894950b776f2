"""Configuration loading as libcni does it: file forms, lookup order, spec 1.1 keys, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cache import build_go_tool

from pycni.runtime import conf as C
from pycni.spec.errors import DECODE_FAILURE, INCOMPATIBLE_VERSION, INVALID_CONFIG, CNIError


def write(d: Path, name: str, obj: Any) -> Path:
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def conflist(name: str = "net1", version: str = "1.0.0", plugins: Any = None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"cniVersion": version, "name": name,
                         "plugins": plugins if plugins is not None else [{"type": "bridge", "bridge": "br0"}]}
    d.update(extra)
    return d


def test_conflist_loads_with_all_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "10-a.conflist", conflist(
        plugins=[{"type": "bridge", "capabilities": {"portMappings": False, "mac": True}},
                 {"type": "portmap", "capabilities": {"portMappings": True}}],
        disableCheck=True, disableGC="TRUE"))
    nl = C.load_network(str(tmp_path), "net1")
    assert nl.name == "net1" and nl.cni_version == "1.0.0" and nl.path == str(path)
    assert [p.type for p in nl.plugins] == ["bridge", "portmap"]
    assert nl.disable_check is True and nl.disable_gc is True and nl.load_only_inlined_plugins is False
    assert nl.plugins[0].enabled_capabilities() == ["mac"]
    assert nl.bytes == path.read_bytes()  # the file's bytes, cached as the config on ADD
    # plugin bytes are Go's re-marshalling: compact, keys sorted
    assert nl.plugins[1].bytes == b'{"capabilities":{"portMappings":true},"type":"portmap"}'


def test_lexical_order_first_match_wins_across_duplicates(tmp_path: Path) -> None:
    write(tmp_path, "20-b.conflist", conflist(plugins=[{"type": "second"}]))
    write(tmp_path, "10-a.conflist", conflist(plugins=[{"type": "first"}]))
    write(tmp_path, "05-other.conflist", conflist(name="other"))
    assert C.load_network(str(tmp_path), "net1").plugins[0].type == "first"
    scanned = C.scan(str(tmp_path))
    assert [Path(f.path).name for f in scanned] == ["05-other.conflist", "10-a.conflist", "20-b.conflist"]
    assert [f.shadowed for f in scanned] == [False, False, True]


def test_conflist_wins_over_legacy_conf_of_same_name(tmp_path: Path) -> None:
    write(tmp_path, "00-legacy.conf", {"cniVersion": "0.4.0", "name": "net1", "type": "legacy"})
    write(tmp_path, "99-list.conflist", conflist(plugins=[{"type": "listed"}]))
    assert C.load_network(str(tmp_path), "net1").plugins[0].type == "listed"


@pytest.mark.parametrize("ext", [".conf", ".json"])
def test_legacy_single_plugin_file_converted_to_list(tmp_path: Path, ext: str) -> None:
    write(tmp_path, "x.conflist", conflist(name="unrelated"))
    write(tmp_path, f"10-legacy{ext}", {"cniVersion": "0.3.1", "name": "old", "type": "bridge",
                                        "ipam": {"type": "host-local", "subnet": "10.1.0.0/16"}})
    nl = C.load_network(str(tmp_path), "old")
    assert nl.name == "old" and nl.cni_version == "0.3.1" and len(nl.plugins) == 1
    assert nl.plugins[0].type == "bridge" and nl.plugins[0].raw["ipam"]["subnet"] == "10.1.0.0/16"
    # the list bytes are what libcni's ConfListFromConf marshals (compact, sorted keys)
    assert json.loads(nl.bytes) == {"cniVersion": "0.3.1", "name": "old", "plugins": [nl.plugins[0].raw]}
    assert nl.bytes.startswith(b'{"cniVersion":"0.3.1","name":"old","plugins":[{"cniVersion"')


def test_not_found_and_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert e.value.code == INVALID_CONFIG and "no net configurations found" in e.value.msg
    assert str(tmp_path) in e.value.msg
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path / "missing"), "net1")
    assert e.value.code == INVALID_CONFIG
    write(tmp_path, "a.conflist", conflist(name="other"))
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert e.value.code == INVALID_CONFIG and 'no net configuration with name "net1"' in e.value.msg
    write(tmp_path, "b.conf", {"name": "other2", "type": "x"})
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert 'no net configuration with name "net1"' in e.value.msg


def test_directories_and_other_extensions_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "dir.conflist").mkdir()
    write(tmp_path, "net.conflist.bak", "garbage")
    write(tmp_path, "README", "garbage")
    write(tmp_path, "z.conflist", conflist())
    assert C.load_network(str(tmp_path), "net1").plugins[0].type == "bridge"


@pytest.mark.parametrize("text, code, words", [
    ("{not json", DECODE_FAILURE, "invalid JSON"),
    ("[1, 2]", DECODE_FAILURE, "expected a JSON object"),
    (json.dumps({"cniVersion": "1.0.0", "plugins": [{"type": "x"}]}), INVALID_CONFIG, "no name"),
    (json.dumps({"name": 5, "plugins": [{"type": "x"}]}), INVALID_CONFIG, "'name' must be a string"),
    (json.dumps({"name": "n", "cniVersion": 1, "plugins": [{"type": "x"}]}), INVALID_CONFIG, "cniVersion"),
    (json.dumps({"name": "n", "plugins": []}), INVALID_CONFIG, "no plugins in list"),
    (json.dumps({"name": "n", "plugins": {"type": "x"}}), INVALID_CONFIG, "'plugins' must be a list"),
    (json.dumps({"name": "n", "plugins": [{"bridge": "x"}]}), INVALID_CONFIG, "missing 'type'"),
    (json.dumps({"name": "n", "plugins": [{"type": "../../bin/sh"}]}), INVALID_CONFIG, "not a path"),
    (json.dumps({"name": "n", "plugins": [{"type": "x", "capabilities": {"a": "yes"}}]}), INVALID_CONFIG,
     "capabilities"),
    (json.dumps({"name": "n", "disableCheck": "maybe", "plugins": [{"type": "x"}]}), INVALID_CONFIG,
     "disableCheck"),
    (json.dumps({"name": "n"}), INVALID_CONFIG, "no plugin configs found"),
    (json.dumps({"name": "n", "loadOnlyInlinedPlugins": True}), INVALID_CONFIG, "no 'plugins' list"),
])
def test_bad_conflist_errors_name_the_file(tmp_path: Path, text: str, code: int, words: str) -> None:
    path = write(tmp_path, "10-bad.conflist", text)
    write(tmp_path, "20-good.conflist", conflist(name="good"))
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "good")  # as libcni: a broken earlier file stops the lookup
    assert e.value.code == code
    assert str(path) in e.value.msg
    assert words in str(e.value)
    # listing reports the broken file and still shows the good one
    items = {Path(f.path).name: f for f in C.scan(str(tmp_path))}
    assert items["10-bad.conflist"].error is not None and items["10-bad.conflist"].error.code == code
    assert items["20-good.conflist"].network is not None and items["20-good.conflist"].error is None


def test_bad_network_name_rejected_when_loaded(tmp_path: Path) -> None:
    path = write(tmp_path, "a.conflist", conflist(name="bad/name"))
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "bad/name")
    assert e.value.code == INVALID_CONFIG and str(path) in e.value.msg


def test_legacy_conf_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "a.conf", {"name": "n", "cniVersion": "0.4.0"})
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "n")
    assert e.value.code == INVALID_CONFIG and "missing 'type'" in str(e.value) and str(path) in e.value.msg


@pytest.mark.parametrize("version, versions, expected", [
    ("0.4.0", ["0.3.1", "1.0.0", "1.1.0"], "1.1.0"),
    ("1.0.0", ["0.3.1", "0.4.0"], "1.0.0"),           # cniVersion counts as a candidate
    ("", ["0.3.1", "9.0.0", "1.0.0"], "1.0.0"),        # versions newer than ours are skipped
    ("1.1.0", [], "1.1.0"),
])
def test_cni_versions_picks_highest_supported(tmp_path: Path, version: str, versions: list[str],
                                              expected: str) -> None:
    write(tmp_path, "a.conflist", conflist(version=version, cniVersions=versions))
    nl = C.load_network(str(tmp_path), "net1")
    assert nl.cni_version == expected and nl.cni_versions == versions


def test_cni_versions_errors(tmp_path: Path) -> None:
    write(tmp_path, "a.conflist", conflist(version="", cniVersions=["7.0.0"]))
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert e.value.code == INCOMPATIBLE_VERSION and "7.0.0" in e.value.details
    write(tmp_path, "a.conflist", conflist(cniVersions=["one"]))
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert e.value.code == INVALID_CONFIG and "'one'" in e.value.details
    write(tmp_path, "a.conflist", conflist(cniVersions="1.0.0"))
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert e.value.code == INVALID_CONFIG and "cniVersions" in e.value.details


def test_missing_version_means_010(tmp_path: Path) -> None:
    d = conflist()
    del d["cniVersion"]
    write(tmp_path, "a.conflist", d)
    assert C.load_network(str(tmp_path), "net1").cni_version == "0.1.0"


def test_plugins_aggregated_from_sibling_folder(tmp_path: Path) -> None:
    write(tmp_path, "10-net1.conflist", conflist(version="1.1.0", plugins=[{"type": "bridge"}]))
    write(tmp_path, "net1/20-tuning.conf", {"type": "tuning", "capabilities": {"mac": True}})
    write(tmp_path, "net1/10-portmap.conf", {"type": "portmap"})
    write(tmp_path, "net1/ignored.json", {"type": "not-a-conf"})
    nl = C.load_network(str(tmp_path), "net1")
    assert [p.type for p in nl.plugins] == ["bridge", "portmap", "tuning"]
    assert nl.plugins[2].path == str(tmp_path / "net1" / "20-tuning.conf")


def test_plugins_only_from_sibling_folder(tmp_path: Path) -> None:
    write(tmp_path, "10-net1.conflist", {"cniVersion": "1.1.0", "name": "net1"})
    write(tmp_path, "net1/a.conf", {"type": "bridge"})
    assert [p.type for p in C.load_network(str(tmp_path), "net1").plugins] == ["bridge"]


def test_load_only_inlined_plugins_ignores_folder(tmp_path: Path) -> None:
    write(tmp_path, "10-net1.conflist", conflist(version="1.1.0", loadOnlyInlinedPlugins=True))
    write(tmp_path, "net1/a.conf", {"type": "tuning"})
    assert [p.type for p in C.load_network(str(tmp_path), "net1").plugins] == ["bridge"]


def test_bad_plugin_in_sibling_folder_names_that_file(tmp_path: Path) -> None:
    write(tmp_path, "10-net1.conflist", conflist(version="1.1.0"))
    bad = write(tmp_path, "net1/a.conf", {"notype": 1})
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert e.value.code == INVALID_CONFIG and str(bad) in e.value.msg


def test_conflist_from_bytes_without_file(tmp_path: Path) -> None:
    nl = C.conflist_from_bytes(json.dumps(conflist()))
    assert nl.path == "" and nl.plugins[0].type == "bridge"
    single = C.conf_from_bytes(b'{"name":"n","type":"bridge","cniVersion":"0.4.0"}')
    assert single.name == "n" and single.cni_version == "0.4.0"


def test_go_json_escapes_like_go() -> None:
    assert C.go_json({"a": "<&>", "b": [1, {"d": 1, "c": 2}]}) == b'{"a":"\\u003c\\u0026\\u003e","b":[1,{"d":1,"c":2}]}'
    assert C.go_json(C.sorted_keys({"b": 1, "a": {"z": 1, "y": 2}})) == b'{"a":{"y":2,"z":1},"b":1}'


def test_conflist_saved_as_conf_gets_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "10-wrong.conf", conflist())
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "net1")
    assert e.value.code == INVALID_CONFIG and str(path) in e.value.msg and "*.conflist" in e.value.details


def test_invalid_name_never_names_a_folder(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    write(tmp_path, "evil.conf", "{not json")  # would break the load if '../' were followed
    write(tmp_path / "conf", "a.conflist", conflist(name="..", version="1.1.0"))
    write(tmp_path / "conf", "b.conflist", conflist(name="good"))
    assert C.load_network(str(tmp_path / "conf"), "good").name == "good"
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path / "conf"), "..")
    assert e.value.code == INVALID_CONFIG and "network name" in e.value.msg


# ---- differential: the Go libcni 1.1.2 finds the same network, with the same bytes --------------

@pytest.fixture(scope="module")
def go_tool(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A program running the Go libcni's LoadConfList (built from test_cache's source)."""
    return build_go_tool(tmp_path_factory)


@pytest.mark.parametrize("files, name", [
    ({"20-b.conflist": conflist(plugins=[{"type": "second"}]),
      "10-a.conflist": conflist(plugins=[{"type": "first", "z": 1, "a": {"y": "<&>", "b": [2, 1]}}],
                                disableCheck=True)}, "net1"),
    ({"x.conflist": conflist(name="other"), "20-z.json": {"cniVersion": "0.3.1", "name": "old", "type": "b"},
      "10-legacy.conf": {"cniVersion": "0.4.0", "name": "old", "type": "bridge", "ipam": {"type": "host-local",
                                                                                         "subnet": "10.0.0.0/8"}}},
     "old"),
    ({"a.conf": {"name": "nov", "type": "ptp"}}, "nov"),
])
def test_same_result_as_go_libcni(tmp_path: Path, go_tool: str, files: dict[str, Any], name: str) -> None:
    import subprocess

    for fname, obj in files.items():
        write(tmp_path, fname, obj)
    proc = subprocess.run([go_tool, "conf", str(tmp_path), name], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    go = json.loads(proc.stdout)
    nl = C.load_network(str(tmp_path), name)
    assert nl.name == go["name"] and nl.disable_check == go["disableCheck"]
    assert nl.cni_version == (go["cniVersion"] or "0.1.0")  # libcni keeps "", we say 0.1.0
    assert nl.bytes.decode() == go["bytes"]
    assert [p.bytes.decode() for p in nl.plugins] == go["plugins"]


def test_non_json_constants_rejected_as_go_does(tmp_path: Path) -> None:
    path = write(tmp_path, "a.conflist", '{"name": "n", "plugins": [{"type": "x", "mtu": NaN}]}')
    with pytest.raises(CNIError) as e:
        C.load_network(str(tmp_path), "n")
    assert e.value.code == DECODE_FAILURE and str(path) in e.value.msg and "NaN" in e.value.details
    with pytest.raises(CNIError) as e:
        C.go_json({"x": float("inf")})
    assert e.value.code == DECODE_FAILURE
