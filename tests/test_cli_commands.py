"""The CLI's informational commands: doctor, --dry-run, profiles, --help, --version."""

from __future__ import annotations


def test_doctor_names_every_check_and_the_tier(root_runner):
    result = root_runner.run("doctor")
    assert result.returncode == 0, result.stderr
    for check in ("bwrap", "bwrap-userns", "bwrap-options", "landlock", "seccomp", "no_new_privs", "close_range"):
        assert f" {check} " in result.stdout, check
    assert "tier: KernelFull" in result.stdout
    assert "grant /usr: execute, read_file, read_dir" in result.stdout


def test_dry_run_prints_the_plan_and_runs_nothing(root_runner, tmp_path):
    marker = tmp_path / "ran"
    result = root_runner.run("run", "--dry-run", "--workdir", str(tmp_path), "--", "touch", str(marker))
    assert result.returncode == 0, result.stderr
    for fragment in ("tier: KernelFull", "bwrap argv: bwrap ", "landlock: ABI", "seccomp:", "mode: allowlist",
                     f"--bind {tmp_path} {tmp_path}"):
        assert fragment in result.stdout, fragment
    assert not marker.exists()


def test_profiles_list_and_show(root_runner, tmp_path):
    listing = root_runner.run("profiles")
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[0].startswith("standard") and "strict" in listing.stdout
    custom = tmp_path / "mine.toml"
    custom.write_text('extends = "strict"\ndescription = "mine"\n[run]\ntimeout = 5\n')
    shown = root_runner.run("profiles", "show", str(custom))
    assert shown.returncode == 0, shown.stderr
    assert 'description = "mine"' in shown.stdout and "timeout = 5" in shown.stdout
    assert 'ro_binds = ["/usr"]' in shown.stdout  # inherited from strict


def test_help_and_version(root_runner):
    assert root_runner.run("--version").stdout.startswith("sbx ")
    top = root_runner.run("--help")
    assert top.returncode == 0 and "commands:" in top.stdout
    run_help = root_runner.run("run", "--help")
    for flag in ("--profile", "--workdir", "--ro-bind", "--bind", "--share-net", "--setenv", "--timeout", "--tier",
                 "--allow-degraded", "--preserve-fd", "--exe-sha256", "--dry-run", "--verbose"):
        assert flag in run_help.stdout, flag


def test_the_readme_documents_every_flag_profile_key_and_error_code():
    from pathlib import Path

    import sandbox.errors as errors
    from sandbox.cli import COMMANDS
    from sandbox.profile import SCHEMA

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name, (_, _, options) in COMMANDS.items():
        assert f"sbx {name}" in readme, name
        for option in options:
            assert f"`{option.name}" in readme, option.name
    for table, keys in SCHEMA.items():
        for key in keys:
            assert key in readme, (table, key)
            if table:
                assert f"[{table}]" in readme, table
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SandboxError)]
    for cls in classes:
        if cls is not errors.SandboxError:
            assert f"`{cls.code}`" in readme, cls.code
    for status in ("124", "125", "126", "127", "128+N"):
        assert f"| {status} |" in readme, status
