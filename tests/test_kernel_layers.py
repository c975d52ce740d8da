"""Landlock and seccomp inside the sandbox, on both kernel tiers, as root and as uid 65534."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile

import pytest
from conftest import SYSTEM_PYTHON, parse_json_line, probe_source, verbose_tier, with_fds

TIER_ARGS = {
    "KernelFull": [],
    "KernelSeccompOnly": ["--tier", "KernelSeccompOnly", "--allow-degraded"],
}
REFUSED = {errno.EPERM, errno.ENOSYS, errno.EACCES}


@pytest.fixture
def secret_dir():
    directory = tempfile.mkdtemp(prefix="sbx-landlock-", dir="/var/tmp")
    os.chmod(directory, 0o755)
    with open(os.path.join(directory, "secret"), "w") as f:
        f.write("behind a directory fd\n")
    os.chmod(os.path.join(directory, "secret"), 0o644)
    yield directory
    shutil.rmtree(directory)


def _read_through_dir_fd(runner, tier, directory):
    return runner.run("run", "--verbose", *TIER_ARGS[tier], "--workdir", str(runner.workdir()),
                      "--preserve-fd", "8", "--", "cat", "/proc/self/fd/8/secret",
                      fds=f"exec 8<{directory}")


@pytest.fixture
def dir_fd_reads_through_without_landlock(runner, secret_dir):
    """Positive control gating the Landlock test: without Landlock (KernelSeccompOnly) the
    same read through the same preserved directory fd succeeds."""
    result = _read_through_dir_fd(runner, "KernelSeccompOnly", secret_dir)
    assert verbose_tier(result.stderr) == "KernelSeccompOnly"
    assert result.returncode == 0 and result.stdout == "behind a directory fd\n", result.stderr
    return secret_dir


def test_landlock_stops_a_preserved_directory_fd(runner, dir_fd_reads_through_without_landlock):
    result = _read_through_dir_fd(runner, "KernelFull", dir_fd_reads_through_without_landlock)
    assert verbose_tier(result.stderr) == "KernelFull"
    assert result.returncode != 0
    assert "behind a directory fd" not in result.stdout
    assert "Permission denied" in result.stderr


@pytest.fixture(scope="module")
def unsandboxed_syscalls():
    """Positive control: outside the sandbox the kernel itself answers each call."""
    out = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", probe_source("syscalls")],
                         capture_output=True, text=True, check=True)
    return parse_json_line(out.stdout)


@pytest.mark.parametrize("profile", ["strict", "standard"])
@pytest.mark.parametrize("tier", TIER_ARGS)
def test_seccomp_denies_dangerous_calls_and_lets_required_ones_through(runner, tier, profile,
                                                                        unsandboxed_syscalls):
    result = runner.run("run", "--verbose", "--profile", profile, *TIER_ARGS[tier], "--workdir",
                        str(runner.workdir()), "--", "python3", "-I", "-S", "-c", probe_source("syscalls"))
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == tier
    inside = parse_json_line(result.stdout)
    for name, answer in inside["denied"].items():
        assert answer["result"] == -1 and answer["errno"] in REFUSED, (name, answer)
        outside = unsandboxed_syscalls["denied"][name]
        # The control: run as root, the kernel answers differently (EINVAL, EFAULT, EBADF,
        # ESRCH, a new socket...), so the refusal above came from the filter.
        assert (outside["result"], outside["errno"]) != (answer["result"], answer["errno"]), name
    for name, answer in inside["required"].items():
        assert answer == unsandboxed_syscalls["required"][name], name
        assert answer["errno"] not in REFUSED, name


@pytest.fixture(scope="module")
def status_outside_has_no_filter():
    """Positive control gating the status test: the same cat outside sbx shows Seccomp 0."""
    out = subprocess.run(with_fds(":", ["cat", "/proc/self/status"]), capture_output=True, text=True, check=True)
    status = dict(line.split(":\t", 1) for line in out.stdout.splitlines() if ":\t" in line)
    assert status["Seccomp"].strip() == "0" and status["NoNewPrivs"].strip() == "0", status


@pytest.mark.parametrize("tier", TIER_ARGS)
def test_status_shows_seccomp_no_new_privs_and_no_capabilities(runner, tier, status_outside_has_no_filter):
    result = runner.run("run", "--verbose", *TIER_ARGS[tier], "--workdir", str(runner.workdir()), "--",
                        "cat", "/proc/self/status")
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == tier
    status = dict(line.split(":\t", 1) for line in result.stdout.splitlines() if ":\t" in line)
    assert status["Seccomp"].strip() == "2"
    assert status["NoNewPrivs"].strip() == "1"
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0
