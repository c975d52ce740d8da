"""The filesystem view under attack: symlinks, `//`, mount order, system directories,
bounded tmpfs, listing in strict, nproc. As root and as uid 65534, at KernelFull, each
with a positive control: the same attempt succeeding where it should."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import SYSTEM_PYTHON, fresh_dir_with, verbose_tier

FULL = ["--verbose"]
SECCOMP_ONLY = ["--verbose", "--tier", "KernelSeccompOnly", "--allow-degraded"]


def refused(result, code: str, *fragments: str) -> None:
    assert result.returncode == 125, (result.returncode, result.stdout, result.stderr)
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith(f"sbx: error: {code}: "), result.stderr
    for fragment in fragments:
        assert fragment in first, (fragment, first)
    assert "sbx: remedy: " in result.stderr and "Traceback" not in result.stderr


def ran_full(result) -> None:
    assert verbose_tier(result.stderr) == "KernelFull", result.stderr


def as_user(runner, argv, **kw):
    if runner.uid is not None:
        argv = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.uid}", "--clear-groups", "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, **kw)


@pytest.fixture
def secret(runner):
    """A host file outside every bind that the runner's user can read outside sbx."""
    directory = fresh_dir_with("sbx-view-secret-", {"secret": ("host secret\n", 0o644)})
    yield directory / "secret"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def profiles_dir(runner):
    path = Path(tempfile.mkdtemp(prefix="sbx-view-profiles-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def profile(directory: Path, name: str, body: str) -> str:
    path = directory / f"{name}.toml"
    path.write_text('extends = "strict"\n' + body)
    path.chmod(0o644)
    return str(path)


def test_a_symlink_planted_by_an_earlier_sandbox_never_redirects_a_bind(runner, secret):
    work = runner.workdir()
    plant = runner.run("run", "--workdir", str(work), "--", "sh", "-c",
                       f"ln -s {secret} data && ln -s {secret.parent} dir")
    assert plant.returncode == 0, plant.stderr
    # Control: the planted link leads to the secret, which this user can read outside sbx.
    assert os.path.realpath(work / "data") == str(secret)
    assert as_user(runner, ["cat", str(work / "data")]).stdout == "host secret\n"
    for flag in ("--ro-bind", "--bind"):
        result = runner.run("run", "--workdir", str(work), flag, str(work / "data"), "--", "cat", str(work / "data"))
        refused(result, "bind", "symlink")
        assert "host secret" not in result.stdout
    assert os.path.realpath(work / "dir") == str(secret.parent)
    refused(runner.run("run", "--workdir", str(work / "dir"), "--", "true"), "workdir", "symlink")


def test_double_slash_and_dot_dot_cannot_reach_a_system_directory(runner):
    marker = f"sbx-view-{os.getpid()}-{runner.label}"
    for args in (["--workdir", "//etc"], ["--workdir", "/tmp/../etc"], ["--bind", "//usr"],
                 ["--bind", "/usr/share"], ["--bind", "/var"]):
        result = runner.run("run", *args, "--", "sh", "-c", f"touch /etc/{marker} /usr/{marker} /usr/share/{marker}")
        refused(result, "workdir" if args[0] == "--workdir" else "bind", "system directory")
    assert not any(os.path.exists(f"{d}/{marker}") for d in ("/etc", "/usr", "/usr/share"))
    # Control: the same command with a project workdir runs (and cannot write those either).
    control = runner.run("run", *FULL, "--workdir", str(runner.workdir()), "--", "sh", "-c", "touch ok")
    assert control.returncode == 0, control.stderr
    ran_full(control)


def test_a_read_only_bind_inside_the_workdir_stays_read_only(runner):
    work = runner.workdir()
    as_user(runner, ["mkdir", str(work / "ro")], check=True)
    result = runner.run("run", *FULL, "--workdir", str(work), "--ro-bind", str(work / "ro"), "--", "sh", "-c",
                        "touch written; touch ro/written 2>/dev/null || echo refused")
    assert result.returncode == 0, result.stderr
    ran_full(result)
    assert (work / "written").exists()  # control: the workdir itself is writable
    assert result.stdout.strip() == "refused" and not (work / "ro" / "written").exists()


def test_a_hide_inside_the_workdir_stays_hidden(runner, profiles_dir):
    work = runner.workdir()
    for name in ("secret", "other"):
        as_user(runner, ["sh", "-c", f"echo {name} > {work}/{name}"], check=True)
    hiding = profile(profiles_dir, "hide", f'[filesystem]\nhide = ["{work}/secret"]\n')
    result = runner.run("run", *FULL, "--profile", hiding, "--workdir", str(work), "--", "sh", "-c",
                        "cat other; cat secret; echo end")
    assert result.returncode == 0, result.stderr
    ran_full(result)
    assert result.stdout.split() == ["other", "end"]  # control: the neighbour reads


def test_a_profile_bind_under_the_tmp_tmpfs_is_visible(runner, profiles_dir):
    tools = Path(tempfile.mkdtemp(prefix="sbx-view-tools-", dir="/tmp"))
    tools.chmod(0o755)
    (tools / "tool").write_text("tool\n")
    (tools / "tool").chmod(0o644)
    try:
        with_tools = profile(profiles_dir, "tools", f'[filesystem]\nro_binds = ["/usr", "{tools}"]\n')
        result = runner.run("run", *FULL, "--profile", with_tools, "--workdir", str(runner.workdir()), "--",
                            "cat", str(tools / "tool"))
        assert result.returncode == 0, result.stderr
        ran_full(result)
        assert result.stdout == "tool\n"
        # Control: without the entry the private /tmp does not have it.
        plain = runner.run("run", "--workdir", str(runner.workdir()), "--", "cat", str(tools / "tool"))
        assert plain.returncode != 0 and plain.stdout == ""
    finally:
        shutil.rmtree(tools, ignore_errors=True)


SIZES = ("import os; print(*[os.statvfs(p).f_blocks * os.statvfs(p).f_frsize >> 20 for p in ('/tmp', '/dev/shm')])")


def test_every_tmpfs_has_a_size(runner, profiles_dir):
    result = runner.run("run", *FULL, "--workdir", str(runner.workdir()), "--", "python3", "-I", "-S", "-c", SIZES)
    assert result.returncode == 0, result.stderr
    ran_full(result)
    assert result.stdout.split() == ["512", "64"]
    small = profile(profiles_dir, "small", "[filesystem]\ntmpfs_size_mib = 1\n")
    fill = "head -c {n} /dev/zero > /tmp/fill && echo wrote || echo full"
    # Control: what fits is written; what does not, does not.
    fits = runner.run("run", "--profile", small, "--workdir", str(runner.workdir()), "--", "sh", "-c",
                      fill.format(n=512 * 1024))
    over = runner.run("run", "--profile", small, "--workdir", str(runner.workdir()), "--", "sh", "-c",
                      fill.format(n=4 * 1024 * 1024) + " 2>/dev/null")
    assert fits.stdout.strip() == "wrote" and over.stdout.strip() == "full"


def test_strict_lists_its_own_view_but_not_a_host_directory_fd(runner, secret):
    probe = ("ls /; find / -maxdepth 1 -name usr; ls /proc/self/fd/8/ 2>/dev/null || echo fd-listing-denied; "
             "cat /proc/self/fd/8/secret 2>/dev/null || echo fd-read-denied")
    fds = f"exec 8<{secret.parent}"
    result = runner.run("run", *FULL, "--workdir", str(runner.workdir()), "--preserve-fd", "8", "--", "sh", "-c",
                        probe, fds=fds)
    assert result.returncode == 0, result.stderr
    ran_full(result)
    lines = result.stdout.split()
    assert {"usr", "tmp", "proc", "dev", "/usr"} <= set(lines)
    assert "etc" in lines and "root" not in lines and "home" not in lines  # only what the view contains
    assert "fd-listing-denied" in lines and "fd-read-denied" in lines and "host" not in lines
    # Control: without Landlock the same descriptor lists and reads.
    control = runner.run("run", *SECCOMP_ONLY, "--workdir", str(runner.workdir()), "--preserve-fd", "8", "--",
                         "sh", "-c", probe, fds=fds)
    assert verbose_tier(control.stderr) == "KernelSeccompOnly"
    assert "secret" in control.stdout.split() and "host" in control.stdout


NPROC = "import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])"


@pytest.mark.parametrize("profile_name", ["strict", "standard"])
def test_both_profiles_bound_the_process_count(runner, profile_name):
    result = runner.run("run", *FULL, "--profile", profile_name, "--workdir", str(runner.workdir()), "--",
                        "python3", "-I", "-S", "-c", NPROC)
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == "KernelFull"
    assert result.stdout.strip() == "4096"
    # Control: outside sbx the same user's limit is something else.
    assert as_user(runner, [SYSTEM_PYTHON, "-I", "-S", "-c", NPROC]).stdout.strip() != "4096"


def test_writes_through_the_standard_view_land_only_in_the_workdir(runner):
    work = runner.workdir()
    result = runner.run("run", *FULL, "--profile", "standard", "--workdir", str(work), "--", SYSTEM_PYTHON,
                        "-I", "-S", "-c", "open('x', 'w').write('1'); print('ok')")
    assert result.returncode == 0, result.stderr
    assert (work / "x").read_text() == "1"


@pytest.fixture
def root_only_file():
    directory = fresh_dir_with("sbx-view-rootonly-", {"secret": ("root only\n", 0o600)})
    yield directory / "secret"
    shutil.rmtree(directory, ignore_errors=True)


def test_root_only_files_in_the_view_stay_closed(runner, root_only_file):
    """standard shows the host read-only; a root caller's command is still not root there."""
    # Control: the file is in the view and root reads it outside sbx.
    assert subprocess.run(["cat", str(root_only_file)], capture_output=True, text=True).stdout == "root only\n"
    result = runner.run("run", *FULL, "--profile", "standard", "--workdir", str(runner.workdir()), "--",
                        "sh", "-c", f"ls {root_only_file.parent}; cat {root_only_file} || echo denied")
    assert verbose_tier(result.stderr) == "KernelFull"
    assert result.stdout.split() == ["secret", "denied"], result.stdout + result.stderr


FORK_UNTIL_REFUSED = r"""
import os, signal, sys, time
children = []
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
print(len(children))
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""


def test_the_process_count_is_bounded(runner, profiles_dir):
    capped = profile(profiles_dir, "capped", "[rlimits]\nnproc = 40\n")
    # Control: the same user outside sbx starts 120 processes.
    assert as_user(runner, [SYSTEM_PYTHON, "-I", "-S", "-c", FORK_UNTIL_REFUSED, "120"]).stdout.strip() == "120"
    result = runner.run("run", *FULL, "--profile", capped, "--workdir", str(runner.workdir()), "--",
                        "python3", "-I", "-S", "-c", FORK_UNTIL_REFUSED, "120")
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == "KernelFull"
    assert int(result.stdout) < 40


def test_a_root_callers_command_is_unprivileged_on_the_host_and_its_workdir_stays_writable(root_runner):
    import random
    import time

    import psutil

    from sandbox import Sandbox

    work = root_runner.workdir()
    work.chmod(0o700)  # root's own, closed to everyone else
    (work / "mine").write_text("mine\n")
    result = root_runner.run("run", *FULL, "--workdir", str(work), "--", "sh", "-c",
                             "stat -c %u mine; cat mine; echo made > made")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["65534", "mine"]  # the caller's files are the command's, through the idmap
    made = work / "made"
    assert made.read_text() == "made\n" and made.stat().st_uid == 0  # and stay root's on the host
    assert [e for e in os.listdir("/run/sbx-idmap") if e != "idmap-userns"] == []  # the staging mount is gone
    # Seen from the host, the command runs as this process's sandbox uid: not root, and not
    # nobody (whom other host processes may run as). Control: this test process is root.
    from sandbox.rootcaller import sandbox_uid

    assert os.getuid() == 0 and sandbox_uid() not in (0, 65534)
    marker = f"{random.randint(100, 999)}.{random.randint(10000, 99999)}"
    process = Sandbox("strict", work).spawn(["sleep", marker])
    try:
        deadline = time.monotonic() + 5
        found = []
        while not found and time.monotonic() < deadline:
            found = [p for p in psutil.process_iter(["cmdline", "uids"]) if p.info["cmdline"] == ["sleep", marker]]
            time.sleep(0.02)
        assert found and all(p.info["uids"].real == p.info["uids"].effective == sandbox_uid() for p in found)
    finally:
        process.kill_sandbox()
        process.wait()
