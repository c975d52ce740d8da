"""Bad input gets one 'sbx: error:' line with a code, one remedy line, exit 125, no traceback."""

from __future__ import annotations

import pytest


def assert_clean_error(result, code: str, *fragments: str) -> None:
    assert result.returncode == 125, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"sbx: error: {code}: "), lines
    assert lines[-1].startswith("sbx: remedy: "), lines
    assert len(lines) == 2, lines
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("args, code, fragments", [
    (["run", "--no-such-flag", "--", "true"], "usage", ["--no-such-flag"]),
    (["run"], "usage", ["no command"]),
    (["run", "--preserve-fd", "seven", "--", "true"], "usage", ["seven"]),
    (["run", "--timeout", "-1", "--", "true"], "usage", []),
    (["run", "--tier", "Kernelish", "--", "true"], "usage", ["Kernelish"]),
    (["run", "--workdir", "/nonexistent-sbx", "--", "true"], "workdir", ["/nonexistent-sbx"]),
    ([], "usage", ["no command"]),
    (["run", "--verbose=yes", "--", "true"], "usage", ["--verbose"]),
    (["run", "--workdir"], "usage", ["--workdir"]),
    (["run", "--bind", "/nonexistent-sbx", "--", "true"], "bind", ["/nonexistent-sbx"]),
    (["run", "--setenv", "NOVALUE", "--", "true"], "usage", ["NOVALUE"]),
    (["run", "--preserve-fd", "1", "--", "true"], "usage", ["0, 1 and 2"]),
    (["run", "--preserve-fd", "99999999999", "--", "true"], "usage", ["99999999999"]),
    (["verify", "--output", "/nonexistent-sbx/record.md"], "usage", ["/nonexistent-sbx/record.md"]),
    (["run", "--profile", "/nonexistent/p.toml", "--", "true"], "profile", ["/nonexistent/p.toml"]),
    (["profiles", "show"], "usage", []),
    (["nonsense"], "usage", []),
])
def test_bad_invocations(root_runner, tmp_path, args, code, fragments):
    assert_clean_error(root_runner.run(*args, cwd=tmp_path), code, *fragments)


def test_workdir_root_is_refused(root_runner):
    assert_clean_error(root_runner.run("run", "--workdir", "/", "--", "true"), "workdir", "/")


@pytest.mark.parametrize("body, fragments", [
    ('extends = "strict"\n\n[filesystem]\nbogus = 1\n', ["bad.toml:4", "bogus"]),
    ('extends = "strict"\n[rlimits]\nnofile = "many"\n', ["bad.toml:3", "nofile"]),
    ('extends = "strict"\n[seccomp\n', ["TOML syntax error", "line 2"]),
    ('tier_floor = "Strongest"\n', ["bad.toml:1", "tier_floor"]),
    ('extends = "no-such-parent"\n', ["no-such-parent"]),
    ('extends = "bad.toml"\n', ["cycle"]),
    ('[seccomp]\nallow = ["not_a_syscall_sbx"]\n', ["not_a_syscall_sbx"]),
])
def test_broken_profiles(root_runner, tmp_path, body, fragments):
    profile = tmp_path / "bad.toml"
    profile.write_text(body)
    result = root_runner.run("run", "--profile", str(profile), "--workdir", str(tmp_path), "--", "true")
    assert_clean_error(result, "profile", *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]  # nothing left behind


def test_tier_above_the_host_is_refused(root_runner, tmp_path, monkeypatch):
    env = dict(root_runner.env, SBX_BWRAP="/nonexistent/bwrap", SBX_CACHE_DIR=str(tmp_path / "cache"))
    from conftest import Runner

    no_bwrap = Runner("nobwrap", root_runner.python, env, root_runner.import_root)
    assert_clean_error(no_bwrap.run("run", "--tier", "KernelFull", "--workdir", str(tmp_path), "--", "true"),
                       "tier", "KernelFull", "KernelNoNamespaces")  # no bwrap: Landlock and seccomp remain
    assert_clean_error(no_bwrap.run("run", "--workdir", str(tmp_path), "--", "true"),
                       "tier-below-floor", "KernelFull")


def test_allow_degraded_warns_on_every_run(root_runner, tmp_path):
    for _ in range(2):
        result = root_runner.run("run", "--tier", "KernelSeccompOnly", "--allow-degraded", "--workdir",
                                 str(tmp_path), "--", "true")
        assert result.returncode == 0
        assert "sbx: warning: running at KernelSeccompOnly, below profile 'strict'" in result.stderr


def test_forced_tier_below_floor_without_opt_in_is_refused(root_runner, tmp_path):
    result = root_runner.run("run", "--tier", "KernelSeccompOnly", "--workdir", str(tmp_path), "--", "true")
    assert_clean_error(result, "tier-below-floor", "KernelSeccompOnly")
