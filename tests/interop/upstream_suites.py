"""Run the reference plugins' own Ginkgo suites against plugin *executables* (ours or Go's).

The suites of containernetworking/plugins (v1.1.1, the version Debian ships) call the Go
handlers directly (``cmdAdd(args)``). This tool copies a checkout of that source (with its
``vendor/``, so the build is offline) to a scratch directory, rewrites each call of
``cmdAdd``/``cmdDel``/``cmdCheck`` in the chosen packages' ``*_test.go`` into an exec of the
plugin executable — same stdin, same CNI_* environment, its stdout relayed to the suite, an
error answer turned into ``errors.New(msg)`` — compiles the suites and runs them.

Nothing of the reference is kept in this repository: the source is the caller's checkout
(``--src``), e.g. ``git clone -b v1.1.1 https://github.com/containernetworking/plugins``.

Every suite runs in a private network and mount namespace (``unshare --net --mount``) with
tmpfs over /var/run/netns and the CNI state directories, so the namespaces, bridges and
files the suites make never reach the machine. The executables run with
``CNI_NETNS_OVERRIDE=1``: the v1.1.1 suites sometimes pass the plugin's own namespace as
CNI_NETNS, which cni's skel refuses since v1.1.2 (and ours always). A non-empty CNI_ARGS gets
``IgnoreUnknown=1`` first, as runtimes send it: an executable's delegated IPAM plugin inherits
CNI_ARGS (the suite's in-process call sets none), and would refuse the suite's ``MAC=...``.
Specs that set the Go handler's package variables (bridge's ``debugPostIPAMError``) cannot
reach an executable and are skipped. Suites that make ``dummy`` links (macvlan, host-device,
sbr) need the ``dummy`` kernel module.

    python tests/interop/upstream_suites.py --src ~/plugins-v1.1.1 bridge static ptp
    python tests/interop/upstream_suites.py --src ~/plugins-v1.1.1 --exe-dir /usr/lib/cni bridge

Prints each package's Ginkgo summary and the specs that failed; exit status 1 when any did.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# package directory (under the source root) of each plugin type whose suite drives cmdAdd/cmdDel/cmdCheck
PACKAGES = {
    "bridge": "plugins/main/bridge", "ptp": "plugins/main/ptp", "host-device": "plugins/main/host-device",
    "macvlan": "plugins/main/macvlan", "ipvlan": "plugins/main/ipvlan", "vlan": "plugins/main/vlan",
    "static": "plugins/ipam/static", "host-local": "plugins/ipam/host-local", "sbr": "plugins/meta/sbr",
    "tuning": "plugins/meta/tuning", "bandwidth": "plugins/meta/bandwidth", "portmap": "plugins/meta/portmap",
    "firewall": "plugins/meta/firewall", "vrf": "plugins/meta/vrf",
}
PRIVATE_DIRS = ["/var/run/netns", "/var/lib/cni", "/run/cni", "/etc/cni", "/opt/cni"]
# Specs that need the Go handler in-process (they set its package variables), left out by default.
GO_INTERNAL = {"bridge": "checks ip release in case of error"}
CALL = re.compile(r"\bcmd(Add|Del|Check)\((\w[\w.]*)\)")

SHIM = '''package %(package)s

// Written by pycni's tests/interop/upstream_suites.py: the suite's cmdAdd/cmdDel/cmdCheck
// calls exec the plugin executable named by $PYCNI_UPSTREAM_EXE instead.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
)

func pycniExec(command string, args *skel.CmdArgs) error {
	exe := os.Getenv("PYCNI_UPSTREAM_EXE")
	path := args.Path
	if path == "" {
		path = os.Getenv("CNI_PATH")
	}
	cniArgs := args.Args
	if cniArgs != "" && !strings.Contains(cniArgs, "IgnoreUnknown=") {
		cniArgs = "IgnoreUnknown=1;" + cniArgs
	}
	cmd := exec.Command(exe)
	cmd.Stdin = bytes.NewReader(args.StdinData)
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + args.ContainerID,
		"CNI_NETNS=" + args.Netns, "CNI_IFNAME=" + args.IfName, "CNI_ARGS=" + cniArgs,
		"CNI_PATH=" + path, "PATH=" + os.Getenv("PATH"), "CNI_NETNS_OVERRIDE=1", "PYCNI_SOCKET=off"}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		var answer struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(out.Bytes(), &answer) == nil && answer.Msg != "" {
			return errors.New(answer.Msg)
		}
		return fmt.Errorf("%%s %%s: %%v: %%s", exe, command, err, out.String())
	}
	_, err := os.Stdout.Write(out.Bytes())
	return err
}
'''


def rewrite(pkg_dir: str) -> int:
    """Turn the handler calls of the package's tests into execs; the number of calls rewritten."""
    count, package = 0, ""
    for name in sorted(os.listdir(pkg_dir)):
        if not name.endswith("_test.go"):
            continue
        path = os.path.join(pkg_dir, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new, n = CALL.subn(lambda m: f'pycniExec("{m.group(1).upper()}", {m.group(2)})', text)
        if n:
            count += n
            package = package or re.search(r"^package (\w+)", text, re.M).group(1)  # type: ignore[union-attr]
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
    if count:
        with open(os.path.join(pkg_dir, "zz_pycni_exec_test.go"), "w", encoding="utf-8") as f:
            f.write(SHIM % {"package": package})
    return count


def run_suite(root: str, plugin: str, exe_dir: str, focus: str, skip: str, timeout: int) -> tuple[bool, str]:
    """Compile and run one package's suite; (passed, its output)."""
    pkg = os.path.join(root, PACKAGES[plugin])
    if not rewrite(pkg):
        return False, f"{plugin}: no cmdAdd/cmdDel/cmdCheck call in its suite: nothing to run against executables\n"
    env = dict(os.environ, GOFLAGS="-mod=vendor", GOCACHE=os.path.join(root, ".gocache"), CGO_ENABLED="0")
    binary = os.path.join(root, f"{plugin}.test")
    build = subprocess.run(["go", "test", "-c", "-o", binary, f"./{PACKAGES[plugin]}"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=timeout)
    if build.returncode != 0:
        return False, f"{plugin}: the suite does not compile:\n{build.stdout}{build.stderr}"
    flags = ["-ginkgo.noColor", "-ginkgo.succinct"]
    if focus:
        flags.append(f"-ginkgo.focus={focus}")
    skip = "|".join(x for x in (skip, GO_INTERNAL.get(plugin, "")) if x)
    if skip:
        flags.append(f"-ginkgo.skip={skip}")
    mounts = "; ".join(f"mkdir -p {d} && mount -t tmpfs rf-private {d}" for d in PRIVATE_DIRS)
    script = f'{mounts}; ip link set lo up; exec "$0" "$@"'
    run_env = dict(os.environ, PATH=f"{exe_dir}{os.pathsep}{os.environ.get('PATH', '/usr/sbin:/usr/bin')}",
                   PYCNI_UPSTREAM_EXE=os.path.join(exe_dir, plugin), TMPDIR=os.path.join(root, ".tmp"))
    os.makedirs(run_env["TMPDIR"], exist_ok=True)
    proc = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", script,
                           binary, *flags], cwd=pkg, env=run_env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode == 0, proc.stdout + proc.stderr


def summary(plugin: str, output: str) -> str:
    """The Ginkgo counts and the failed specs' names."""
    lines = [f"== {plugin}"]
    for line in output.splitlines():
        if re.match(r"(Ran \d+ of \d+ Specs|FAIL!|SUCCESS!)", line):
            lines.append(line)
        elif (m := re.search(r"(\d+/\d+ specs) .*(SUCCESS!|FAIL!)", line)) is not None:  # a succinct one-liner
            lines.append(f"{m.group(1)} {m.group(2)}")
    if len(lines) == 1:
        lines.append("no Ginkgo summary: see the log (--keep)")
    lines += [f"   {line.strip()}" for line in output.splitlines() if line.startswith("[Fail]")]
    return "\n".join(lines)


def install_ours(target: str) -> str:
    """Our executables (every plugin type) in ``target``, running this checkout in-process."""
    from pycni.install_plugins import install

    install(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plugins", nargs="*", default=["bridge", "ptp", "host-device", "static", "sbr"],
                        help=f"plugin types whose suites to run (known: {', '.join(sorted(PACKAGES))})")
    parser.add_argument("--src", required=True, help="a containernetworking/plugins v1.1.1 checkout (with vendor/)")
    parser.add_argument("--exe-dir", default="", help="the executables to test (default: ours, installed afresh)")
    parser.add_argument("--focus", default="", help="Ginkgo focus regexp")
    parser.add_argument("--skip", default="", help="Ginkgo skip regexp")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy and print where it is")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per suite")
    opts = parser.parse_args(argv)
    unknown = [p for p in opts.plugins if p not in PACKAGES]
    if unknown:
        parser.error(f"no suite known for {unknown}")
    if not os.path.isdir(os.path.join(opts.src, "vendor")):
        parser.error(f"{opts.src} has no vendor/ directory: give a v1.1.1 checkout of containernetworking/plugins")
    scratch = tempfile.mkdtemp(prefix="rf-upstream-")
    root = os.path.join(scratch, "src")
    shutil.copytree(opts.src, root, ignore=shutil.ignore_patterns(".git"))
    exe_dir = opts.exe_dir or install_ours(os.path.join(scratch, "bin"))
    failed = False
    try:
        for plugin in opts.plugins:
            ok, output = run_suite(root, plugin, os.path.abspath(exe_dir), opts.focus, opts.skip, opts.timeout)
            failed |= not ok
            with open(os.path.join(scratch, f"{plugin}.log"), "w", encoding="utf-8") as f:
                f.write(output)
            print(summary(plugin, output), flush=True)
    finally:
        if opts.keep:
            print(f"scratch copy and logs: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
