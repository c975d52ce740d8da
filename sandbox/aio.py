"""asyncio support: ``Sandbox.spawn_async`` returns an ``asyncio.subprocess.Process``.

Planning, descriptor preparation and executable hashing run in the loop's executor, so the
event loop only pays for the fork itself. The same preparation, status channel, exit
table and kill-the-whole-sandbox logic as the synchronous path are used.
"""

from __future__ import annotations

import asyncio
import asyncio.subprocess
from typing import Any

from .launch import SandboxStatus, kill_sandbox_tree


class SandboxAsyncProcess(asyncio.subprocess.Process):
    """An ``asyncio.subprocess.Process`` whose returncode follows sbx's exit table."""

    def __init__(self, transport, protocol, loop, status: SandboxStatus, plan) -> None:
        super().__init__(transport, protocol, loop)
        self._sbx_status = status
        self._uses_bwrap = plan.bwrap_args is not None
        self._killed_by_us = False
        self._translated: int | None = None
        self.tier = plan.tier
        self.sandbox_error = None

    @property
    def returncode(self) -> int | None:
        raw = self._transport.get_returncode()
        if raw is None:
            return None
        if self._translated is None:
            self._translated = self._sbx_status.translate(raw, self._killed_by_us)
            self.sandbox_error = self._sbx_status.error
        return self._translated

    async def wait(self) -> int:
        await super().wait()
        return self.returncode

    def kill_sandbox(self) -> None:
        if self._transport.get_returncode() is None:
            self._killed_by_us = True
            kill_sandbox_tree(self.pid, self._uses_bwrap)


async def spawn_async(sandbox, argv, *, preserve_fds=(), env=None, exe_sha256=None, stdin=None,
                      stdout=None, stderr=None, limit: int = 2 ** 16) -> Any:
    loop = asyncio.get_running_loop()
    plan, prepared, exe = await loop.run_in_executor(None, sandbox._prepare, argv, preserve_fds, env, exe_sha256)
    status = SandboxStatus(prepared.status_read, plan.bwrap_args is not None, prepared.staged)
    try:
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
    return SandboxAsyncProcess(transport, protocol, loop, status, plan)
