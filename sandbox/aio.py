"""asyncio support: ``Sandbox.spawn_async`` returns an ``asyncio.subprocess.Process``.

Planning, descriptor preparation and executable hashing run in sbx's own small thread pool,
so the event loop only pays for the fork itself. The same preparation, status channel, exit
table and kill-the-whole-sandbox logic as the synchronous path are used.
"""

from __future__ import annotations

import asyncio
import asyncio.subprocess
import os
from typing import Any

from . import lifetime
from .launch import SandboxStatus, kill_sandbox_tree, open_pidfd, signal_command


class SandboxAsyncProcess(asyncio.subprocess.Process):
    """An ``asyncio.subprocess.Process`` whose returncode follows sbx's exit table.

    Composed through the public surface: ``returncode`` translates what the base class
    reports; ``wait`` and ``communicate`` kill the whole sandbox when the task awaiting them
    is cancelled; dropping the handle, a passed deadline or a closed event loop kill it too.
    """

    def __init__(self, transport, protocol, loop, status: SandboxStatus, plan, timeout: float | None) -> None:
        super().__init__(transport, protocol, loop)
        self._sbx_status = status
        self._uses_bwrap = plan.bwrap_args is not None
        self._killed_by_us = False
        self._translated: int | None = None
        self.timed_out = False
        self.tier = plan.tier
        self.sandbox_error = None
        self._pidfd = open_pidfd(self.pid)
        self._deadline = lifetime.kill_at_deadline(self, timeout) if timeout is not None else None
        lifetime.kill_when_loop_closes(loop, self)

    @property
    def returncode(self) -> int | None:
        raw = super().returncode
        if raw is None:
            return None
        if self._translated is None:
            lifetime.cancel(self._deadline)
            self._translated = self._sbx_status.translate(raw, self._killed_by_us, self.timed_out)
            self.sandbox_error = self._sbx_status.error
        return self._translated

    async def wait(self) -> int:
        try:
            await super().wait()
        except asyncio.CancelledError:
            self.kill_sandbox()
            raise
        return self.returncode

    async def communicate(self, input: bytes | None = None) -> tuple:
        try:
            return await super().communicate(input)
        except asyncio.CancelledError:
            self.kill_sandbox()
            raise

    def running(self) -> bool:
        """Whether the sandbox has not ended yet (safe from any thread: no translation)."""
        return super().returncode is None

    def expire(self) -> None:
        """The deadline passed (called from the watchdog thread): kill; status 124."""
        if super().returncode is None:
            self.timed_out = True
            self.kill_sandbox()

    def kill_sandbox(self) -> None:
        if super().returncode is None:
            self._killed_by_us = True
            kill_sandbox_tree(self.pid, self._uses_bwrap, self._pidfd)

    def send_signal_to_command(self, signum: int) -> None:
        if super().returncode is None:
            signal_command(self.pid, self._uses_bwrap, signum)

    def __del__(self) -> None:
        try:
            self.kill_sandbox()  # only signals: safe from a finalizer on any thread
        except Exception:
            pass
        if getattr(self, "_pidfd", None) is not None:
            os.close(self._pidfd)
            self._pidfd = None
        status = getattr(self, "_sbx_status", None)
        if status is not None:
            status.close()  # the status pipe, and any idmapped staging mounts


_preparers = None


def _discard(future) -> None:
    """A preparation whose spawn was cancelled: close its descriptors, release its mounts."""
    if not future.cancelled() and future.exception() is None:
        _, prepared, exe = future.result()
        prepared.discard()
        if exe is not None:
            exe.close()


async def spawn_async(sandbox, argv, *, preserve_fds=(), env=None, exe_sha256=None, stdin=None,
                      stdout=None, stderr=None, limit: int = 2 ** 16, timeout: float | None = None) -> Any:
    global _preparers
    loop = asyncio.get_running_loop()
    if _preparers is None:
        from concurrent.futures import ThreadPoolExecutor

        _preparers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sbx-prepare")
    # Planning, descriptors and hashing run off the loop. If the task is cancelled meanwhile,
    # the preparation still finishes in its thread; _discard then undoes it.
    preparation = _preparers.submit(sandbox._prepare, argv, preserve_fds, env, exe_sha256)
    try:
        plan, prepared, exe = await asyncio.wrap_future(preparation)
    except asyncio.CancelledError:
        preparation.add_done_callback(_discard)
        raise
    status = SandboxStatus(prepared.status_read, plan.bwrap_args is not None, prepared.staged, prepared.private_tmp)
    try:
        # If this is cancelled after the fork, asyncio closes the transport: it kills bwrap,
        # and with it (--die-with-parent, the pid namespace) the whole sandbox.
        transport, protocol = await loop.subprocess_exec(
            lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=limit, loop=loop),
            *prepared.argv, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=prepared.pass_fds,
            close_fds=True, env={}, start_new_session=True)
    except BaseException:
        status.close()
        raise
    finally:
        prepared.close_parent_copies()
        if exe is not None:
            exe.close()
    process = SandboxAsyncProcess(transport, protocol, loop, status, plan, timeout)
    if prepared.staged:  # a root caller's staging mounts: released once bwrap has them, off the loop
        await asyncio.wrap_future(_preparers.submit(status.release_once_started))
    return process
