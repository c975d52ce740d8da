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
    names = [line.split()[0] for line in listing.stdout.splitlines()]
    assert names[:3] == ["container", "standard", "strict"], names
    assert "floor KernelNoNamespaces" in listing.stdout.splitlines()[0]
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


def readme_table_rows(readme: str, heading: str) -> list[list[str]]:
    """The cells of every row of the first table after ``heading`` (header rows dropped)."""
    section = readme[readme.index(heading):]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return [r for r in rows[2:]]  # header and separator


def backticked(cell: str) -> list[str]:
    return cell.split("`")[1::2]


def test_the_readme_documents_every_flag_profile_key_and_error_code():
    """Exact sets, parsed from the README's tables: a row missing, or one for something the
    code does not have, fails."""
    from pathlib import Path

    import sandbox.errors as errors
    from sandbox.cli import COMMANDS
    from sandbox.profile import SCHEMA

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    run_flags = {backticked(row[0])[0].split()[0] for row in readme_table_rows(readme, "### `sbx run")}
    assert run_flags == {o.name for o in COMMANDS["run"][2]}
    for name in ("doctor", "verify"):
        heading = next(line for line in readme.splitlines() if line.startswith(f"### `sbx {name}"))
        assert {o.name for o in COMMANDS[name][2]} == {w.strip("[]") for w in heading.split() if w.startswith("[--")}
    documented = set()
    for row in readme_table_rows(readme, "| key | type | meaning (default) |"):
        first, *more = backticked(row[0])
        table, keys = (first[1:first.index("]")], first[first.index("]") + 1:].split()) if first.startswith("[") \
            else (None, [first])
        documented |= {(table, k) for k in [*keys, *more]}
    assert documented == {(table, key) for table, keys in SCHEMA.items() for key in keys}
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SandboxError)
               and c is not errors.SandboxError]
    codes = {backticked(row[0])[0] for row in readme_table_rows(readme, "## Error codes")}
    assert codes == {c.code for c in classes} | {"timeout", "bootstrap"}  # those two are printed, not raised
    statuses = {row[0] for row in readme_table_rows(readme, "## Exit status")}
    assert statuses == {"the command's own", "128+N", "124", "125", "126", "127"}
