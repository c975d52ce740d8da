"""The embedding API: subprocess vocabulary, typed errors, timeouts that kill the whole tree,
no leftovers, rlimits, threads and asyncio."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sandbox import Sandbox, SandboxProcess, SandboxResult, Tier
from sandbox.errors import PreservedFdError, ProfileError, TierBelowFloorError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def sandbox(tmp_path):
    return Sandbox("strict", tmp_path)


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def sleepers(marker: str) -> int:
    return sum(1 for p in processes_with(marker) if p.name() == "sleep")


def unique_sleep() -> tuple[str, list[str]]:
    seconds = f"{random.randint(100, 999)}.{random.randint(10000, 99999)}"
    return seconds, ["sh", "-c", f"sleep {seconds} & sleep {seconds}"]


def wait_gone(marker: str, within: float = 5.0) -> list:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = processes_with(marker)
        if not left:
            return []
        time.sleep(0.05)
    return processes_with(marker)


def test_spawn_and_run_speak_subprocess(sandbox):
    process = sandbox.spawn(["sh", "-c", "cat; echo err >&2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert isinstance(process, subprocess.Popen) and isinstance(process, SandboxProcess)
    out, err = process.communicate("hello")
    assert (out, err, process.returncode, process.tier) == ("hello", "err\n", 0, Tier.KernelFull)
    result = sandbox.run(["sh", "-c", "read x; echo $x; exit 3"], input="abc\n", capture_output=True, text=True)
    assert isinstance(result, SandboxResult) and isinstance(result, subprocess.CompletedProcess)
    assert (result.stdout, result.returncode, result.tier) == ("abc\n", 3, Tier.KernelFull)
    with pytest.raises(subprocess.CalledProcessError):
        sandbox.run(["false"], check=True)
    assert sandbox.run(["sh", "-c", "echo $GREETING"], env={"GREETING": "hi"}, capture_output=True).stdout == b"hi\n"


def test_errors_are_typed(tmp_path):
    with pytest.raises(ProfileError):
        Sandbox("no-such-profile", tmp_path)
    with pytest.raises(TierBelowFloorError):
        Sandbox("strict", tmp_path, tier="KernelSeccompOnly")
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(PreservedFdError) as error:
        Sandbox("strict", tmp_path).spawn(["true"], preserve_fds=[r])
    assert f"preserved file descriptor {r}: Bad file descriptor" in str(error.value)


def test_timeout_kills_every_process_inside(sandbox):
    marker, argv = unique_sleep()
    start = time.monotonic()
    result = sandbox.run(argv, timeout=0.5)
    assert (result.returncode, result.timed_out, result.sandbox_error.code) == (124, True, "timeout")
    assert time.monotonic() - start < 5
    assert wait_gone(marker) == []


def test_dropping_a_running_handle_kills_the_sandbox(sandbox):
    marker, argv = unique_sleep()
    process = sandbox.spawn(argv)
    deadline = time.monotonic() + 5
    while sleepers(marker) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sleepers(marker) == 2  # control: both sleeps really ran
    del process
    gc.collect()
    assert wait_gone(marker) == []


def test_the_callers_death_kills_the_sandbox(tmp_path):
    marker, argv = unique_sleep()
    code = textwrap.dedent(f"""
        import sys, time
        from sandbox import Sandbox
        p = Sandbox("strict", {str(tmp_path)!r}).spawn({argv!r})
        print("started", flush=True)
        time.sleep(60)
    """)
    caller = subprocess.Popen([sys.executable, "-I", "-c", code], stdout=subprocess.PIPE, text=True)
    assert caller.stdout.readline() == "started\n"
    deadline = time.monotonic() + 5
    while sleepers(marker) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sleepers(marker) == 2
    caller.kill()
    caller.wait()
    assert wait_gone(marker) == []


def test_rlimits_from_the_profile(tmp_path):
    read_limits = ("import resource as r; print(*[r.getrlimit(x)[0] for x in "
                   "(r.RLIMIT_NOFILE, r.RLIMIT_CORE, r.RLIMIT_NPROC)])")
    result = Sandbox("strict", tmp_path).run(["python3", "-I", "-S", "-c", read_limits],
                                             capture_output=True, text=True)
    assert result.stdout.split() == ["1024", "0", "4096"]
    profile = tmp_path / "profiles" / "cpu.toml"  # outside the workdir: sbx refuses a writable profile
    profile.parent.mkdir()
    profile.write_text('extends = "strict"\n[rlimits]\ncpu = 1\nfsize = 4096\nnofile = 64\n')
    work = tmp_path / "work"
    work.mkdir()
    limited = Sandbox(str(profile), work)
    spin = limited.run(["python3", "-I", "-S", "-c", "while True: pass"], timeout=20)
    assert spin.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)  # soft == hard: the kernel may KILL
    big = limited.run(["sh", "-c", "head -c 8192 /dev/zero > big"])  # in work/
    assert big.returncode == 128 + signal.SIGXFSZ
    assert limited.run(["sh", "-c", "ulimit -n"], capture_output=True, text=True).stdout == "64\n"


def test_thread_harness_zero_foreign_descriptors_and_a_control_that_leaks():
    spec = importlib.util.spec_from_file_location("harness", REPO / "scripts" / "fd_leak_harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    control = harness.measure(threads=8, per_thread=25, control=True)
    assert control["foreign"] > 0  # first, the control: the harness does see leaks
    measured = harness.measure(threads=8, per_thread=25)
    assert measured["tier"] == "KernelFull"
    assert measured["own_missing"] == 0  # positive control: preserved fds work under load
    assert measured["spawns"] == 200 and measured["errors"] == 0
    assert measured["foreign"] == 0


def test_fifty_concurrent_spawn_async(sandbox, monkeypatch):
    import threading

    prepared_on = []
    real_prepare = Sandbox._prepare

    def recording(self, *args):
        prepared_on.append(threading.current_thread())
        return real_prepare(self, *args)

    monkeypatch.setattr(Sandbox, "_prepare", recording)

    async def one(i: int):
        process = await sandbox.spawn_async(["sh", "-c", f"echo {i}; exit {i % 7}"], stdout=asyncio.subprocess.PIPE)
        out, _ = await process.communicate()
        return i, out, process.returncode, process.tier

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.create_task(ticker())
        results = await asyncio.gather(*(one(i) for i in range(50)))
        beat.cancel()
        return results, ticks

    results, ticks = asyncio.run(main())
    for i, out, code, tier in results:
        assert (out, code, tier) == (f"{i}\n".encode(), i % 7, Tier.KernelFull)
    assert ticks > 10  # the loop kept running while sandboxes were set up
    # Planning and descriptor preparation ran in the executor, never on the loop's thread.
    assert len(prepared_on) == 50 and threading.main_thread() not in prepared_on


def test_spawn_async_timeout_kills_the_whole_sandbox(sandbox):
    marker, argv = unique_sleep()

    async def main():
        process = await sandbox.spawn_async(argv)
        try:
            await asyncio.wait_for(process.wait(), 0.5)
        except TimeoutError:
            process.kill_sandbox()
        return await process.wait()

    assert asyncio.run(main()) == 128 + signal.SIGKILL
    assert wait_gone(marker) == []


def test_cli_forwards_sigterm_and_exits_with_the_commands_status(root_runner, tmp_path):
    script = "trap 'echo got-term; exit 3' TERM; echo ready; sleep 30 & wait"
    process = subprocess.Popen(root_runner.argv("run", "--workdir", str(tmp_path), "--", "sh", "-c", script),
                               stdout=subprocess.PIPE, text=True, env=root_runner.env)
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=10)
    assert out == "got-term\n"
    assert process.returncode == 3


def test_readme_examples_run(tmp_path, monkeypatch):
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    assert blocks, "the README has no Python examples"
    monkeypatch.chdir(tmp_path)
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"README.md python example {number}", "exec"), {"__name__": "readme"})


def test_a_layer_that_cannot_be_installed_fails_closed(tmp_path):
    from sandbox.errors import SetupError

    honest = Sandbox("strict", tmp_path)
    # A plan that asks for a Landlock ABI this kernel does not have: stage 2 must refuse.
    future = Sandbox("strict", tmp_path, capabilities=honest.capabilities._replace(landlock_abi=99))
    marker = tmp_path / "ran"
    with pytest.raises(SetupError) as error:
        future.run(["touch", str(marker)])
    assert "landlock" in str(error.value) and "99" in str(error.value)
    assert not marker.exists()
    # A seccomp program the kernel rejects: the command must not run without its filter.
    broken = Sandbox("strict", tmp_path)
    broken._bpf = (16).to_bytes(4, "little") + b"\xff" * 16
    with pytest.raises(SetupError) as error:
        broken.run(["touch", str(marker)])
    assert "seccomp" in str(error.value)
    assert not marker.exists()


PY_WORK = ("import multiprocessing as m, subprocess; p = m.Pool(2); print(p.map(abs, [-1, -2])); p.close(); "
           "print(subprocess.run(['echo', 'sub'], capture_output=True, text=True).stdout.strip())")
ORDINARY_WORK = f"""
set -e
printf 'b\\na\\n' | sort | head -1
git init -q repo && cd repo && git -c user.email=a@b -c user.name=n commit -q --allow-empty -m x
git log --oneline | wc -l
cd ..
python3 -c "{PY_WORK}"
cc -o h h.c && ./h
"""


@pytest.mark.parametrize("profile", ["strict", "standard"])
def test_ordinary_programs_work_at_kernel_full(tmp_path, profile):
    """Shells, coreutils, git, Python (threads, subprocess, multiprocessing) and a compiler
    (the bootstrap installs gcc: a missing one fails here, as it should)."""
    (tmp_path / "h.c").write_text('#include <stdio.h>\nint main(void) { puts("cc ok"); return 0; }\n')
    result = Sandbox(profile, tmp_path).run(["sh", "-c", ORDINARY_WORK], capture_output=True, text=True, timeout=60)
    assert result.tier == Tier.KernelFull
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:5] == ["a", "1", "[1, 2]", "sub", "cc ok"]
