"""Embedding as a long-running runtime does: timeouts on every path, cancellation, dropped
handles, closed loops, short-lived threads, and a storm of 200 spawns with random
cancellations and timeouts that must leave no process and no descriptor behind."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import threading
import time

import psutil
import pytest

from sandbox import Sandbox, Tier


def unique() -> str:
    return f"{random.randint(100, 999)}.{random.randint(10000, 99999)}"


def sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline[:1] == ["sleep"] and marker in cmdline:
            found.append(proc)
    return found


def wait_for(predicate, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def started_and_gone(marker: str, action, within: float = 1.0) -> None:
    """Control first: the sleeper is really running; then ``action`` must end it within ``within`` s."""
    assert wait_for(lambda: len(sleepers(marker)) >= 1, 5), "control: the sandboxed sleep never started"
    action()
    assert wait_for(lambda: not sleepers(marker), within), f"{sleepers(marker)} outlived the sandbox"


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture
def sandbox(tmp_path):
    return Sandbox("strict", tmp_path)


def test_the_constructor_timeout_applies_to_spawn_and_wait(tmp_path):
    marker = unique()
    process = Sandbox("strict", tmp_path, timeout=0.5).spawn(["sleep", marker])
    assert wait_for(lambda: sleepers(marker), 5)  # control: it runs
    start = time.monotonic()
    assert process.wait() == 124  # nobody passed a timeout to wait(): the sandbox's deadline ended it
    assert time.monotonic() - start < 2
    assert process.timed_out and process.sandbox_error.code == "timeout"
    assert wait_for(lambda: not sleepers(marker), 1)


def test_a_deadline_fires_even_when_nothing_waits(sandbox):
    marker = unique()
    process = sandbox.spawn(["sleep", marker], timeout=0.3)
    started_and_gone(marker, lambda: None, within=2)
    assert process.poll() == 124 and process.timed_out


def test_spawn_async_takes_a_timeout_and_the_constructor_default(tmp_path):
    async def main():
        own = await Sandbox("strict", tmp_path).spawn_async(["sleep", unique()], timeout=0.3)
        default = await Sandbox("strict", tmp_path, timeout=0.3).spawn_async(["sleep", unique()])
        return await own.wait(), own.timed_out, await default.wait(), default.timed_out

    assert asyncio.run(main()) == (124, True, 124, True)


def test_a_finished_command_is_not_marked_timed_out(sandbox):
    result = sandbox.run(["true"], timeout=5)
    assert (result.returncode, result.timed_out, result.sandbox_error) == (0, False, None)


def test_wait_for_cancelling_communicate_kills_the_sandbox(sandbox):
    marker = unique()

    async def main():
        process = await sandbox.spawn_async(["sleep", marker], stdout=asyncio.subprocess.PIPE)
        assert wait_for(lambda: sleepers(marker), 5)  # control
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(process.communicate(), 0.2)
        return process

    process = asyncio.run(main())
    assert wait_for(lambda: not sleepers(marker), 1)
    assert process.returncode is not None or not sleepers(marker)


def test_a_task_group_cancellation_kills_every_sandbox(sandbox):
    markers = [unique() for _ in range(3)]

    async def sleeper(marker: str):
        process = await sandbox.spawn_async(["sleep", marker])
        await process.wait()

    async def failing():
        await asyncio.sleep(0.5)
        raise RuntimeError("one task failed")

    async def main():
        async with asyncio.TaskGroup() as group:
            for marker in markers:
                group.create_task(sleeper(marker))
            group.create_task(failing())

    with pytest.raises(ExceptionGroup):
        asyncio.run(main())
    assert wait_for(lambda: not any(sleepers(m) for m in markers), 1)


def test_dropping_an_async_handle_kills_the_sandbox(sandbox):
    marker = unique()

    async def main():
        process = await sandbox.spawn_async(["sleep", marker])
        assert wait_for(lambda: sleepers(marker), 5)  # control
        del process
        gc.collect()
        await asyncio.sleep(0)
        assert wait_for(lambda: not sleepers(marker), 1)

    asyncio.run(main())


def test_closing_the_event_loop_kills_the_sandbox(sandbox):
    marker = unique()
    loop = asyncio.new_event_loop()
    process = loop.run_until_complete(sandbox.spawn_async(["sleep", marker]))
    started_and_gone(marker, loop.close)
    del process


def test_a_sandbox_outlives_the_short_lived_thread_that_spawned_it(sandbox):
    marker = unique()
    handles = []
    thread = threading.Thread(target=lambda: handles.append(sandbox.spawn(["sleep", marker])))
    thread.start()
    thread.join()
    assert wait_for(lambda: sleepers(marker), 5)
    time.sleep(0.5)
    assert sleepers(marker), "the sandbox died with the thread that spawned it"
    started_and_gone(marker, handles[0].kill_sandbox)
    assert handles[0].wait() == 128 + 9


def test_two_hundred_async_spawns_with_random_cancellations_and_timeouts(sandbox):
    """Every fourth is cancelled, every fourth times out, the rest finish: afterwards no
    sandboxed process is left and this process holds exactly the descriptors it had."""
    marker = unique()
    rng = random.Random(7)
    assert sandbox.run(["true"]).returncode == 0  # warm: what lives as long as the process is open now
    before = open_fds()

    async def one(i: int):
        kind = i % 4
        if kind == 0:  # finishes
            process = await sandbox.spawn_async(["sh", "-c", f"exit {i % 7}"])
            return "done", await process.wait()
        if kind == 1:  # its deadline fires
            process = await sandbox.spawn_async(["sleep", marker], timeout=rng.uniform(0.05, 0.4))
            return "timeout", await process.wait()
        process = await sandbox.spawn_async(["sleep", marker], stdout=asyncio.subprocess.PIPE)
        if kind == 2:  # the awaiting task is cancelled
            task = asyncio.ensure_future(process.communicate())
            await asyncio.sleep(rng.uniform(0, 0.3))
            task.cancel()
            return "cancelled", None
        return "wait_for", await asyncio.wait_for(process.wait(), rng.uniform(0.05, 0.3))

    async def main():
        gate = asyncio.Semaphore(32)

        async def guarded(i: int):
            async with gate:
                try:
                    return await one(i)
                except TimeoutError:
                    return "wait_for", None

        results = await asyncio.gather(*(guarded(i) for i in range(200)))
        # A runtime's loop keeps running: give the killed sandboxes' pipe transports the
        # turns they need to see EOF and close (closing the loop first leaks their fds in
        # asyncio itself, whoever started the child).
        await asyncio.sleep(0.5)
        return results

    results = asyncio.run(main())
    assert [results[i] for i in range(0, 200, 4)] == [("done", i % 7) for i in range(0, 200, 4)]
    assert [results[i] for i in range(1, 200, 4)] == [("timeout", 124)] * 50
    gc.collect()
    assert wait_for(lambda: not sleepers(marker), 2), f"{len(sleepers(marker))} sandboxed sleeps left behind"
    assert wait_for(lambda: open_fds() <= before, 2), f"descriptors left open: {open_fds() - before}"
    assert sandbox.tier == Tier.KernelFull
