"""--exe-sha256 and exe_sha256=: the bytes that were checked are the bytes that run."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading

import pytest

from sandbox import Sandbox
from sandbox.errors import ExecutableDigestError, PreservedFdError


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def outside_dir():
    """A directory the strict profile does not bind."""
    path = tempfile.mkdtemp(prefix="sbx-exe-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def write_script(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho {text}\n")
    os.chmod(path, 0o755)
    return path


def test_right_digest_runs_a_binary(root_runner, tmp_path):
    result = root_runner.run("run", "--workdir", str(tmp_path), "--exe-sha256", sha256("/usr/bin/uname"),
                             "--", "uname", "-s")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Linux\n"


def test_right_digest_runs_a_script_from_an_unbound_directory(root_runner, tmp_path, outside_dir):
    script = write_script(os.path.join(outside_dir, "tool.sh"), "reviewed")
    write_script(os.path.join(outside_dir, "neighbour.sh"), "neighbour")
    result = root_runner.run("run", "--workdir", str(tmp_path), "--exe-sha256", sha256(script), "--", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "reviewed\n"
    # The directory itself stays invisible: only the verified file was made runnable.
    neighbour_path = os.path.join(outside_dir, "neighbour.sh")
    neighbour = root_runner.run("run", "--workdir", str(tmp_path), "--", "cat", neighbour_path)
    assert neighbour.returncode != 0 and "neighbour" not in neighbour.stdout
    # Control: shown read-only, the same cat reads it; so the failure above is the view's doing.
    shown = root_runner.run("run", "--workdir", str(tmp_path), "--ro-bind", outside_dir, "--", "cat", neighbour_path)
    assert shown.returncode == 0 and "neighbour" in shown.stdout, shown.stderr


def test_wrong_digest_refuses_and_runs_nothing(root_runner, tmp_path):
    marker = tmp_path / "ran"
    script = write_script(str(tmp_path / "tool.sh"), "x")
    with open(script, "a") as f:
        f.write(f"touch {marker}\n")
    result = root_runner.run("run", "--workdir", str(tmp_path), "--exe-sha256", "0" * 64, "--", script)
    assert result.returncode == 125
    assert result.stderr.startswith("sbx: error: exe-digest: ")
    assert sha256(script) in result.stderr and "0" * 64 in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("how", ["rename", "rewrite-in-place"])
def test_swapping_the_file_after_the_check_changes_nothing(tmp_path, how, monkeypatch):
    script = write_script(str(tmp_path / "tool.sh"), "original")
    digest = sha256(script)
    sandbox = Sandbox("strict", str(tmp_path))
    from sandbox import verified_exe

    real_open = verified_exe.open_verified

    def open_then_swap(*args, **kwargs):
        verified = real_open(*args, **kwargs)
        if how == "rename":
            write_script(str(tmp_path / "evil.sh"), "EVIL")
            os.rename(tmp_path / "evil.sh", script)
        else:
            with open(script, "r+") as f:
                f.write("#!/bin/sh\necho EVIL   \n")
        return verified

    monkeypatch.setattr(verified_exe, "open_verified", open_then_swap)
    result = sandbox.run([script], capture_output=True, text=True, exe_sha256=digest)
    assert open(script).read().count("EVIL") == 1  # the swap really happened
    assert result.stdout == "original\n"
    assert result.returncode == 0


def test_a_descriptor_that_cannot_be_made_inheritable_is_the_documented_error(tmp_path, monkeypatch):
    import errno

    from sandbox import fds, launch

    sandbox = Sandbox("strict", str(tmp_path))

    def refuse(fd, cmd, arg=0):
        if cmd == fds.fcntl.F_SETFD:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        return fds.fcntl.fcntl(fd, cmd)

    monkeypatch.setattr(launch, "make_files_inheritable",
                        lambda numbers, fcntl_fn=refuse: [fds.clear_cloexec(fd, refuse) for fd in numbers])
    with pytest.raises(PreservedFdError) as error:
        sandbox.run(["uname"], exe_sha256=sha256("/usr/bin/uname"))
    assert "failed to clear close-on-exec for preserved file descriptor" in str(error.value)
    assert "Operation not permitted" in str(error.value)


def test_library_wrong_digest_raises(tmp_path):
    with pytest.raises(ExecutableDigestError):
        Sandbox("strict", str(tmp_path)).run(["uname"], exe_sha256="f" * 64)


def test_concurrent_verified_launches(tmp_path):
    sandbox = Sandbox("strict", str(tmp_path))
    digest = sha256("/usr/bin/uname")
    results = []

    def worker():
        results.append(sandbox.run(["uname", "-s"], capture_output=True, text=True, exe_sha256=digest).stdout)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["Linux\n"] * 8


# --- one resolver, a hardened open ----------------------------------------------------


@pytest.fixture
def profiles(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


def test_a_profile_without_path_resolves_like_a_plain_run(tmp_path, profiles):
    no_path = profiles / "nopath.toml"
    no_path.write_text('extends = "strict"\n[environment]\nset = { HOME = "/tmp" }\n')
    work = tmp_path / "work"
    work.mkdir()
    sandbox = Sandbox(str(no_path), work)
    assert "PATH" not in sandbox.plan(["uname"]).env
    plain = sandbox.run(["uname", "-s"], capture_output=True, text=True)  # the control: stage 2 finds it
    assert plain.returncode == 0 and plain.stdout == "Linux\n", plain.stderr
    verified = sandbox.run(["uname", "-s"], exe_sha256=sha256("/usr/bin/uname"), capture_output=True, text=True)
    assert verified.returncode == 0 and verified.stdout == "Linux\n", verified.stderr


def test_both_resolvers_pass_over_a_file_that_is_not_executable(tmp_path, outside_dir):
    first, second = os.path.join(outside_dir, "a"), os.path.join(outside_dir, "b")
    os.mkdir(first)
    os.mkdir(second)
    with open(os.path.join(first, "tool"), "w") as f:
        f.write("#!/bin/sh\necho first\n")
    os.chmod(os.path.join(first, "tool"), 0o644)  # earlier on PATH, but not executable
    script = write_script(os.path.join(second, "tool"), "second")
    work = tmp_path / "work"
    work.mkdir()
    sandbox = Sandbox("strict", work, ro_binds=[outside_dir], setenv={"PATH": f"{first}:{second}:/usr/bin:/bin"})
    plain = sandbox.run(["tool"], capture_output=True, text=True)  # stage 2's resolver, inside
    verified = sandbox.run(["tool"], exe_sha256=sha256(script), capture_output=True, text=True)  # the host's
    assert plain.stdout == verified.stdout == "second\n", (plain, verified)
    from sandbox.resolve import find_executable

    assert find_executable("tool", f"{first}:{second}", str(work)) == script
    os.chmod(script, 0o644)  # now neither is executable: 126 from both
    assert sandbox.run(["tool"]).returncode == 126
    with pytest.raises(Exception) as error:
        sandbox.run(["tool"], exe_sha256=sha256(script))
    assert getattr(error.value, "exit_status", None) == 126


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, outside_dir):
    big = os.path.join(outside_dir, "big")
    with open(big, "wb") as f:
        f.truncate(300 << 20)  # sparse: 300 MB that cost nothing to make
    os.chmod(big, 0o755)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ExecutableDigestError, match="over the 268435456-byte limit"):
        Sandbox("strict", work).run([big], exe_sha256="0" * 64)
    # Control: under a limit it fits, the file is read and hashed (and then refused for its digest).
    small = os.path.join(outside_dir, "small")
    with open(small, "wb") as f:
        f.truncate(512 << 10)
    os.chmod(small, 0o755)
    with pytest.raises(ExecutableDigestError, match="has SHA-256"):
        Sandbox("strict", work, exe_max_mib=1).run([small], exe_sha256="0" * 64)
    with pytest.raises(ExecutableDigestError, match="over the 1048576-byte limit"):
        Sandbox("strict", work, exe_max_mib=1).run([big], exe_sha256="0" * 64)


def test_a_fifo_swapped_in_after_resolution_neither_blocks_nor_runs(tmp_path, monkeypatch):
    from sandbox import verified_exe

    fifo = tmp_path / "tool"
    os.mkfifo(fifo)
    monkeypatch.setattr(verified_exe, "find_executable", lambda *args: str(fifo))  # the swap, after the stat
    work = tmp_path / "work"
    work.mkdir()
    done = []

    def attempt():
        try:
            Sandbox("strict", work).run(["tool"], exe_sha256="0" * 64)
        except ExecutableDigestError as exc:
            done.append(str(exc))

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(10)
    assert done and "not a regular file" in done[0]  # an open that blocked would leave done empty


def script_with_a_workdir_interpreter(tmp_path, spelling: str = "{work}/mysh"):
    """A workdir holding a copy of sh and a script whose #! line names it as ``spelling``."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy("/bin/sh", work / "mysh")
    script = work / "tool.sh"
    script.write_text(f"#!{spelling.format(work=work)}\necho ran\n")
    script.chmod(0o755)
    return work, script


def test_a_verified_script_whose_interpreter_lies_in_the_workdir_is_refused(tmp_path):
    work, script = script_with_a_workdir_interpreter(tmp_path)
    sandbox = Sandbox("strict", work)
    with pytest.raises(ExecutableDigestError, match="writable inside the sandbox"):
        sandbox.run([str(script)], exe_sha256=sha256(script))
    # Control: the same script with a read-only interpreter runs.
    script.write_text("#!/bin/sh\necho ran\n")
    result = sandbox.run([str(script)], exe_sha256=sha256(script), capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "ran\n", result.stderr


@pytest.mark.parametrize("spelling", ["//{work}/mysh", "/usr/..{work}/mysh"])
def test_an_interpreter_spelled_around_the_check_is_refused(tmp_path, spelling):
    work, script = script_with_a_workdir_interpreter(tmp_path, spelling)
    with pytest.raises(ExecutableDigestError):
        Sandbox("strict", work).run([str(script)], exe_sha256=sha256(script))
