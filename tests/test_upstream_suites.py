"""tests/interop/upstream_suites.py's rewrite of the reference's suites (the run itself needs the
reference's source and is described in docs/plugins.md)."""

from __future__ import annotations

from pathlib import Path

from interop.upstream_suites import GO_INTERNAL, PACKAGES, rewrite

SUITE = '''package main

func (t *tester) cmdAddTest(tc testCase) {
	r, raw, err := testutils.CmdAddWithArgs(args, func() error {
		return cmdAdd(args)
	})
	err = testutils.CmdCheckWithArgs(t.args, func() error { return cmdCheck(t.args) })
	err = testutils.CmdDelWithArgs(args, func() error { return cmdDel(args) })
	cmdAddDelTest(originalNS, targetNS, tc, dataDir)
}
'''


def test_handler_calls_become_execs(tmp_path: Path) -> None:
    (tmp_path / "bridge_test.go").write_text(SUITE)
    (tmp_path / "bridge.go").write_text("package main\n\nfunc cmdAdd(args *skel.CmdArgs) error { return nil }\n")
    assert rewrite(str(tmp_path)) == 3
    text = (tmp_path / "bridge_test.go").read_text()
    assert 'return pycniExec("ADD", args)' in text and 'pycniExec("CHECK", t.args)' in text
    assert 'pycniExec("DEL", args)' in text and "cmdAddDelTest(originalNS" in text  # helpers stay
    assert "func cmdAdd(" in (tmp_path / "bridge.go").read_text()  # the plugin itself is untouched
    shim = (tmp_path / "zz_pycni_exec_test.go").read_text()
    assert shim.startswith("package main\n") and "CNI_NETNS_OVERRIDE=1" in shim and "IgnoreUnknown=1;" in shim


def test_a_suite_without_handler_calls_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "loopback_test.go").write_text("package main_test\n\nvar p = gexec.Build(\"x\")\n")
    assert rewrite(str(tmp_path)) == 0
    assert not (tmp_path / "zz_pycni_exec_test.go").exists()


def test_known_packages() -> None:
    assert PACKAGES["bridge"] == "plugins/main/bridge" and PACKAGES["static"] == "plugins/ipam/static"
    assert set(GO_INTERNAL) <= set(PACKAGES)
