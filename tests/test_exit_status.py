"""The README's exit-status table, row by row, through the CLI."""

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


@pytest.fixture
def failing_bwrap():
    """A bwrap that passes the host probes (it runs the real one) but fails a real launch
    (bwrap's options arrive by --args only then) with status 1, before stage 2 starts:
    exactly a setup failure that must not pass for the command's own status 1."""
    import shutil
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp(prefix="sbx-bwrap-stub-", dir="/tmp"))
    directory.chmod(0o755)  # run as root, sbx starts bwrap as uid 65534: it must reach the stub
    stub = directory / "bwrap"
    stub.write_text('#!/bin/sh\ncase " $* " in *" --args "*) echo "bwrap: stub refuses" >&2; exit 1;; esac\n'
                    'exec /usr/bin/bwrap "$@"\n')
    stub.chmod(0o755)
    yield str(stub)
    shutil.rmtree(directory, ignore_errors=True)


def test_bwrap_setup_failure_is_125_not_the_commands_1(root_runner, tmp_path, failing_bwrap):
    cache = tmp_path / "cache"
    work = tmp_path / "work"
    work.mkdir()
    stubbed = root_runner.replace(env={**root_runner.env, "SBX_BWRAP": failing_bwrap,
                                                    "SBX_CACHE_DIR": str(cache)})
    # Control: through the same stub, the host probes pass (the tier is KernelFull) and a
    # command that exits 1 by itself is reported as 1.
    doctor = stubbed.run("doctor")
    assert "tier: KernelFull" in doctor.stdout, doctor.stdout
    result = stubbed.run("run", "--workdir", str(work), "--", "sh", "-c", "exit 1")
    assert result.returncode == 125, result.stderr
    assert "sbx: error: setup: bubblewrap could not set up the sandbox (exit status 1" in result.stderr
    assert "bwrap: stub refuses" in result.stderr
    plain = root_runner.run("run", "--workdir", str(work), "--", "sh", "-c", "exit 1")
    assert plain.returncode == 1 and "sbx: error" not in plain.stderr


def test_the_library_reports_what_bwrap_said(tmp_path, failing_bwrap, monkeypatch):
    from sandbox import Sandbox, SetupError

    monkeypatch.setenv("SBX_BWRAP", failing_bwrap)
    monkeypatch.setenv("SBX_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(SetupError) as error:
        Sandbox("strict", work).run(["true"], capture_output=True)
    assert "bwrap: stub refuses" in str(error.value)


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
