"""Shared fixtures: where probes live, how to run sbx as root and as an unprivileged user.

Kernel-property tests never skip: this host kind resolves to KernelFull as root and as
uid 65534, so a test that cannot run here fails. Everything the unprivileged user runs
(interpreter, package copy, probes, workdirs) lives under /tmp, which that uid can reach.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from sandbox.harness import SYSTEM_PYTHON, UNPRIV_UID  # noqa: F401 (re-exported for the tests)
from sandbox.harness import User as Runner  # the one harness, shared with sbx verify

REPO = Path(__file__).resolve().parent.parent  # the checkout: README, scripts, sources
# The suite tests the installed sbx (scripts/test runs pytest with -I): its compiled stage 2
# exists only there.


def fresh_dir_with(prefix: str, files: dict[str, tuple[str, int]], parent: str = "/var/tmp") -> Path:
    """A new directory (0755) under ``parent`` holding ``files``: name -> (text, mode).
    The caller removes it (shutil.rmtree)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o755)
    for name, (text, mode) in files.items():
        (path / name).write_text(text)
        (path / name).chmod(mode)
    return path


def _shared_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session", autouse=True)
def neutral_cwd():
    """Run the suite from a scratch directory, not the checkout: sbx refuses to make its own
    installation (the checkout) a writable workdir, and commands default to the cwd."""
    path = _shared_dir("sbx-cwd-")
    previous = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(previous)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def root_runner() -> Runner:
    from sandbox.integrity import import_root

    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    return Runner("root", sys.executable, env, import_root())


@pytest.fixture(scope="session")
def unpriv_runner() -> Runner:
    """sbx as uid 65534: a copy of the package and its one needed dependency under /tmp."""
    assert os.geteuid() == 0, "the unprivileged half of the suite needs root to switch users"
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed for the unprivileged tests"
    from sandbox.verify import stage_package_copy

    home = stage_package_copy(_shared_dir("sbx-unpriv-"))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    yield Runner("nobody", SYSTEM_PYTHON, env, str(home), uid=UNPRIV_UID)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(params=["root", "nobody"])
def runner(request, root_runner) -> Runner:
    """Both users, for the key kernel-property tests."""
    if request.param == "root":
        return root_runner
    return request.getfixturevalue("unpriv_runner")


def probe_source(name: str) -> str:
    from sandbox.probes_src import source

    return source(name)


def parse_json_line(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"the probe printed no JSON: {stdout!r}"
    return json.loads(lines[-1])


def verbose_tier(stderr: str) -> str:
    """The tier a ``sbx run --verbose`` reported it ran at."""
    for line in stderr.splitlines():
        if line.startswith("sbx: tier "):
            return line.split()[2]
    raise AssertionError(f"sbx did not report its tier: {stderr!r}")


FD7 = "exec 7</etc/hostname"


def with_fds(redirection: str, argv: list[str]) -> list[str]:
    return ["/bin/sh", "-c", f'{redirection}; exec "$@"', "sh", *argv]


def hold_fd(number: int, path: str = "/etc/hostname", flags: int = os.O_RDONLY) -> int:
    """Open ``path`` as exactly descriptor ``number``, inheritable, in this process.

    The number must be free: pytest's own capture uses low descriptors.
    """
    import fcntl

    try:
        fcntl.fcntl(number, fcntl.F_GETFD)
    except OSError:
        pass
    else:
        raise AssertionError(f"descriptor {number} is already in use in the test process")
    fd = os.open(path, flags)
    if fd != number:
        os.dup2(fd, number, inheritable=True)
        os.close(fd)
    os.set_inheritable(number, True)
    return number


# Reads each path in argv[1], writes each in argv[2] (comma-separated); prints what
# happened to each, as JSON. Shared by the filesystem tests of every tier.
ACCESS_PROBE = r"""
import json, os, sys
out = {"read": {}, "write": {}}
for path in filter(None, sys.argv[1].split(",")):
    try:
        with open(path, "rb") as f:
            f.read(1)
        out["read"][path] = "ok"
    except OSError as exc:
        out["read"][path] = exc.strerror
for path in filter(None, sys.argv[2].split(",")):
    try:
        with open(path, "w") as f:
            f.write("sbx was here\n")
        out["write"][path] = "ok"
    except OSError as exc:
        out["write"][path] = exc.strerror
print(json.dumps(out))
"""
