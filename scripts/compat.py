#!/usr/bin/env python3
"""Compatibility benchmark: CPython's own test suite, under bare bwrap and under sbx strict.

    .venv/bin/python scripts/compat.py                   # the default set of modules
    .venv/bin/python scripts/compat.py test_socket ...   # chosen modules
    .venv/bin/python scripts/compat.py --json

Both settings see the same filesystem view (strict's binds, namespaces and tmpfs mounts,
the same uid, the same environment): "bare" runs the test runner directly under bwrap
with strict's arguments; "sbx" runs it through ``sbx run --profile strict``, adding stage 2
(rlimits, no_new_privs, Landlock, seccomp). Every test that passes bare but not under sbx
is reported with the first line of its failure: those are sbx's cost in compatibility.
The tests come from the distribution (Debian/Ubuntu: libpython3.X-testsuite). Nothing here
is asserted by the test suite except through ``compare``, on a small subset.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

from sandbox import Sandbox  # the installed sbx: run this with the venv's python
from sandbox.launch import bare_argv, prepare

PYTHON = "/usr/bin/python3"
DEFAULT_MODULES = ["test_selectors", "test_socketserver", "test_asyncio.test_sock_lowlevel",
                   "test_asyncio.test_server", "test_asyncio.test_streams", "test_os", "test_subprocess",
                   "test_signal", "test_socket", "test_sqlite3", "test_tarfile", "test_pathlib", "test_shutil",
                   "test_tempfile", "test_getpass", "test_pwd", "test_grp", "test_locale", "test_ssl"]


def testsuite_missing() -> str | None:
    probe = subprocess.run([PYTHON, "-I", "-c", "import test.test_selectors"], capture_output=True)
    if probe.returncode == 0:
        return None
    version = subprocess.run([PYTHON, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    return f"libpython{version}-testsuite"


def runner_argv(modules: list[str], junit: str) -> list[str]:
    return [PYTHON, "-m", "test", "-q", "--junit-xml", junit, *modules]


def run_bare(sandbox: Sandbox, modules: list[str], workdir: str) -> dict[str, str]:
    """bwrap with strict's arguments and descriptors, the test runner in place of stage 2."""
    junit = os.path.join(workdir, "bare.xml")
    command = ["/usr/bin/env", "-i", *[f"{k}={v}" for k, v in sandbox.plan(["true"]).env.items()],
               *runner_argv(modules, junit)]
    plan = sandbox.plan(command)
    prepared = prepare(plan, sandbox.capabilities.bwrap_path, sandbox._bpf)  # descriptors only: stage 2 never runs
    try:
        argv = bare_argv(prepared, sandbox.capabilities.bwrap_path, command)
        subprocess.run(argv, pass_fds=prepared.pass_fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={}, timeout=3600)
    finally:
        prepared.discard()
    return results(junit)


def run_sbx(sandbox: Sandbox, modules: list[str], workdir: str) -> dict[str, str]:
    junit = os.path.join(workdir, "sbx.xml")
    sandbox.run(runner_argv(modules, junit), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
    return results(junit)


def results(junit: str) -> dict[str, str]:
    """test id -> "pass", "skip", or "fail: <first line of the message>"."""
    try:
        tree = ElementTree.parse(junit)
    except (OSError, ElementTree.ParseError):
        return {}
    out = {}
    for case in tree.iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            text = (failure.get("message") or failure.text or "").strip().splitlines()
            out[name] = "fail: " + (text[0] if text else "")
        elif case.find("skipped") is not None:
            out[name] = "skip"
        else:
            out[name] = "pass"
    return out


def compare(modules: list[str], workdir: str | None = None) -> dict:
    """Run both settings and report counts and every sbx-only failure with its cause."""
    scratch = workdir or tempfile.mkdtemp(prefix="sbx-compat-")
    try:
        sandbox = Sandbox("strict", scratch)
        bare = run_bare(sandbox, modules, scratch)
        boxed = run_sbx(sandbox, modules, scratch)
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    only_sbx = {name: boxed.get(name, "missing") for name, result in bare.items()
                if result == "pass" and boxed.get(name) != "pass"}
    return {"modules": modules, "bare_passed": sum(r == "pass" for r in bare.values()),
            "sbx_passed": sum(r == "pass" for r in boxed.values()), "tests": len(bare),
            "sbx_only_failures": dict(sorted(only_sbx.items()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", default=DEFAULT_MODULES)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    missing = testsuite_missing()
    if missing:
        print(f"sbx: error: compat: CPython's test suite is not installed\nsbx: remedy: apt-get install {missing}",
              file=sys.stderr)
        return 125
    report = compare(args.modules)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['tests']} tests in {len(report['modules'])} modules: "
          f"bare bwrap passed {report['bare_passed']}, sbx strict passed {report['sbx_passed']}")
    for name, cause in report["sbx_only_failures"].items():
        print(f"  sbx only: {name}: {cause}")
    if not report["sbx_only_failures"]:
        print("  no test fails only under sbx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
