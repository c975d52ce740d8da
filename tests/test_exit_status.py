"""DESIGN.md's exit-status table, row by row, through the CLI."""

from __future__ import annotations

import os
import time

import pytest


@pytest.fixture
def run(root_runner, tmp_path):
    def go(*args, **kwargs):
        return root_runner.run("run", "--workdir", str(tmp_path), *args, **kwargs)
    return go


def test_the_commands_own_status(run):
    assert run("--", "sh", "-c", "exit 0").returncode == 0
    assert run("--", "sh", "-c", "exit 7").returncode == 7
    assert run("--", "sh", "-c", "exit 1").returncode == 1  # not confused with bwrap failing


def test_killed_by_signal_is_128_plus_n(run):
    assert run("--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    assert run("--", "sh", "-c", "kill -KILL $$").returncode == 128 + 9


def test_timeout_is_124_and_kills_the_whole_sandbox(run, tmp_path):
    marker = tmp_path / "grandchild-alive"
    start = time.monotonic()
    result = run("--timeout", "1", "--", "sh", "-c",
                 f"(sleep 3; touch {marker}) & (setsid sh -c 'sleep 3; touch {marker}.2' &) ; sleep 30")
    assert result.returncode == 124
    assert "timeout" in result.stderr
    assert time.monotonic() - start < 10
    time.sleep(3.5)
    assert not marker.exists() and not os.path.exists(f"{marker}.2"), "a grandchild outlived the timeout"


def test_sbx_errors_are_125(run):
    result = run("--profile", "no-such-profile", "--", "true")
    assert result.returncode == 125
    assert result.stderr.startswith("sbx: error: profile: ")


def test_bwrap_setup_failure_is_125_not_the_commands_1(run):
    result = run("--ro-bind", "/nonexistent-sbx-path", "--", "true")
    assert result.returncode == 125


def run_script(run, tmp_path, first_line: str, mode: int):
    script = tmp_path / "script.sh"
    script.write_text(f"{first_line}\necho hi\n")
    script.chmod(mode)
    return run("--", str(script))


def test_not_executable_is_126(run, tmp_path):
    result = run_script(run, tmp_path, "#!/bin/sh", 0o644)
    assert result.returncode == 126
    assert "sbx: error: command-not-executable:" in result.stderr


def test_not_found_is_127(run):
    result = run("--", "definitely-not-a-command-sbx")
    assert result.returncode == 127
    assert "sbx: error: command-not-found:" in result.stderr


def test_a_script_whose_interpreter_is_missing_is_126(run, tmp_path):
    result = run_script(run, tmp_path, "#!/nonexistent/interpreter", 0o755)
    assert result.returncode == 126
    assert "interpreter or loader is not visible" in result.stderr
