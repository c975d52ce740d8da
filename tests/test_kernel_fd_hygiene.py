"""fd hygiene and preserved files, on both kernel tiers, as root and as uid 65534.

Every case first proves the tier it ran at (``sbx run --verbose``) and is paired with a
positive control: the same probe without sbx sees the leaked descriptor.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest
from conftest import FD7, SYSTEM_PYTHON, hold_fd, parse_json_line, probe_source, verbose_tier, with_fds

TIER_ARGS = {
    "KernelFull": [],
    "KernelSeccompOnly": ["--tier", "KernelSeccompOnly", "--allow-degraded"],
}
HOSTNAME = open("/etc/hostname").read()[:64]


LEAK_FD = 57  # stage 2 tests hold it in this process, where pytest may own fd 7


@pytest.fixture
def leaked_fd():
    hold_fd(LEAK_FD)
    yield LEAK_FD
    os.close(LEAK_FD)


def probe_argv() -> list[str]:
    return ["python3", "-I", "-S", "-c", probe_source("fdprobe")]


def test_this_host_resolves_kernel_full(runner):
    result = runner.run("doctor", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["tier"] == "KernelFull", data["checks"]
    assert data["landlock_abi"] >= 1


@pytest.fixture(scope="module")
def unguarded_child_sees_fd7():
    """Positive control gating the leak tests (an error, not a pass, when it fails): the
    same probe without sbx sees the leaked fd 7 and reads it."""
    out = subprocess.run(with_fds(FD7, [SYSTEM_PYTHON, "-I", "-S", "-c", probe_source("fdprobe")]),
                         capture_output=True, text=True, check=True)
    seen = parse_json_line(out.stdout)
    assert 7 in seen["fds"] and seen["first_bytes"]["7"] == HOSTNAME, seen


@pytest.mark.parametrize("tier", TIER_ARGS)
def test_leaked_fd7_is_not_visible(runner, tier, unguarded_child_sees_fd7):
    workdir = runner.workdir()
    result = runner.run("run", "--verbose", *TIER_ARGS[tier], "--workdir", str(workdir), "--", *probe_argv(),
                        fds=FD7)
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == tier
    assert parse_json_line(result.stdout)["fds"] == [0, 1, 2]


@pytest.mark.parametrize("tier", TIER_ARGS)
def test_preserved_fd7_keeps_its_number_and_reads(runner, tier):
    workdir = runner.workdir()
    result = runner.run("run", "--verbose", *TIER_ARGS[tier], "--workdir", str(workdir), "--preserve-fd", "7",
                        "--", *probe_argv(), fds=FD7)
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == tier
    seen = parse_json_line(result.stdout)
    assert seen["fds"] == [0, 1, 2, 7]
    assert seen["first_bytes"]["7"] == HOSTNAME


def test_preserving_a_closed_fd_is_a_clear_error(runner):
    result = runner.run("run", "--workdir", str(runner.workdir()), "--preserve-fd", "9", "--", "true",
                        fds="exec 9<&-")
    assert result.returncode == 125
    first = result.stderr.splitlines()[0]
    assert first.startswith("sbx: error: preserved-fd: ")
    assert "preserved file descriptor 9" in first
    assert os.strerror(errno.EBADF) in first
    assert "Traceback" not in result.stderr


# Stage 2's own hygiene, with the leak delivered past Popen's close_fds straight to bwrap
# (or to stage 2 on EnvironmentOnly): this is the step that closes the window in which
# another thread's spawn inherits a descriptor made inheritable for a different child.

STAGE2_TIERS = ["KernelFull", "KernelSeccompOnly", "EnvironmentOnly"]


def _run_with_leak(tier: str, preserve: tuple[int, ...], workdir: str) -> tuple[dict, object]:
    from sandbox import Sandbox
    from sandbox.launch import prepare

    sandbox = Sandbox("strict", workdir, tier=tier, allow_degraded=True)
    plan = sandbox.plan(probe_argv(), preserve)
    prepared = prepare(plan, sandbox.capabilities.bwrap_path, sandbox._bpf)
    try:
        out = subprocess.run(prepared.argv, pass_fds=(*prepared.pass_fds, LEAK_FD), env={},
                             capture_output=True, text=True, timeout=60)
    finally:
        prepared.discard()
    assert out.returncode == 0, out.stderr
    return parse_json_line(out.stdout), plan


@pytest.fixture(params=STAGE2_TIERS)
def stage2_tier(request, leaked_fd, tmp_path_factory):
    """Positive control gating the stage 2 hygiene test at each tier: preserved, the same
    leaked descriptor does reach the command through the same path."""
    tier = request.param
    seen, plan = _run_with_leak(tier, (leaked_fd,), str(tmp_path_factory.mktemp("control")))
    assert plan.tier.name == tier
    assert seen["fds"] == [0, 1, 2, leaked_fd] and seen["first_bytes"][str(leaked_fd)] == HOSTNAME, seen
    return tier


def test_stage2_hygiene_drops_a_descriptor_bwrap_inherited(stage2_tier, tmp_path):
    seen, plan = _run_with_leak(stage2_tier, (), str(tmp_path))
    assert plan.tier.name == stage2_tier
    assert seen["fds"] == [0, 1, 2]
