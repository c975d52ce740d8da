"""The library's process objects: ``SandboxProcess`` (a ``subprocess.Popen``) and
``SandboxResult`` (a ``CompletedProcess``). The CLI does not import this module.

``SandboxProcess`` composes with ``Popen`` through its public surface: ``wait`` and ``poll``
translate the raw status into sbx's exit table once the child is reaped.
"""

from __future__ import annotations

import os
import subprocess

from . import lifetime
from .errors import SandboxError, SetupError
from .launch import PreparedLaunch, SandboxStatus, kill_sandbox_tree, open_pidfd, prepare, signal_command
from .plan import LaunchPlan
from .tiers import Tier


class SandboxResult(subprocess.CompletedProcess):
    """A ``CompletedProcess`` that also says which tier the command ran at, why sbx ended
    it (``sandbox_error``) and whether its timeout fired (``timed_out``; status 124)."""

    def __init__(self, args: object, returncode: int, stdout: object = None, stderr: object = None,
                 tier: Tier | None = None, sandbox_error: SandboxError | None = None,
                 timed_out: bool = False) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.tier = tier
        self.sandbox_error = sandbox_error
        self.timed_out = timed_out


class SandboxProcess(subprocess.Popen):
    """A ``subprocess.Popen`` for a sandboxed command.

    ``returncode`` follows sbx's exit table (128+N for signal N, 124 when its timeout fired,
    125 when the sandbox could not be set up, 126/127 when the command could not be run);
    ``sandbox_error`` then says why. ``kill_sandbox()`` ends every process inside; dropping
    the handle of a running sandbox does the same, so nothing is left behind.
    """

    tier = None
    sandbox_error: SandboxError | None = None
    timed_out = False

    def __init__(self, prepared: PreparedLaunch, plan: LaunchPlan, timeout: float | None = None,
                 **popen_kwargs) -> None:
        self._status = SandboxStatus(prepared.status_read, plan.bwrap_args is not None, prepared.staged,
                                     prepared.private_tmp)
        self._uses_bwrap = plan.bwrap_args is not None
        self._killed_by_us = False
        self._translated = False
        self._deadline = None
        self._pidfd = None
        self.tier = plan.tier
        try:
            # Forked on the one long-lived spawner thread: bwrap's --die-with-parent follows
            # the forking thread, which must not be a short-lived caller's (lifetime.py).
            lifetime.on_spawner_thread(subprocess.Popen.__init__, self, prepared.argv, pass_fds=prepared.pass_fds,
                                       close_fds=True, env={}, start_new_session=True, **popen_kwargs)
        except BaseException:
            self._status.close()
            raise
        finally:
            prepared.close_parent_copies()
        self._pidfd = open_pidfd(self.pid)
        self._status.release_once_started()  # a root caller's staging mounts: gone once bwrap has them
        if timeout is not None:
            self._deadline = lifetime.kill_at_deadline(self, timeout)

    def expire(self) -> None:
        """The deadline passed: kill the whole sandbox; its status becomes 124."""
        if self.returncode is None:
            self.timed_out = True
            self.kill_sandbox()

    def _translate(self) -> int | None:
        if self.returncode is not None and not self._translated:
            self._translated = True
            lifetime.cancel(self._deadline)
            self.returncode = self._status.translate(self.returncode, self._killed_by_us, self.timed_out)
            self.sandbox_error = self._status.error
        return self.returncode

    def poll(self) -> int | None:
        super().poll()
        return self._translate()

    def wait(self, timeout: float | None = None) -> int:
        super().wait(timeout)
        return self._translate()

    @property
    def notes(self) -> list[str]:
        return self._status.notes

    def send_signal_to_command(self, signum: int) -> None:
        """Deliver ``signum`` to the command itself (not to bwrap, which would just die)."""
        if self.returncode is None:
            signal_command(self.pid, self._uses_bwrap, signum)

    def kill_sandbox(self) -> None:
        """SIGKILL every process in the sandbox, grandchildren included."""
        if self.returncode is not None:
            return
        self._killed_by_us = True
        kill_sandbox_tree(self.pid, self._uses_bwrap, self._pidfd)

    def __del__(self) -> None:
        if getattr(self, "returncode", 0) is None and getattr(self, "pid", None):
            try:
                self.kill_sandbox()
                self.wait(timeout=5)
            except Exception:
                pass
        status = getattr(self, "_status", None)
        if status is not None:
            status.close()
        if getattr(self, "_pidfd", None) is not None:
            os.close(self._pidfd)
            self._pidfd = None
        super().__del__()


def launch(plan: LaunchPlan, bwrap_path: str | None, bpf: bytes | None, timeout: float | None = None,
           **popen_kwargs) -> SandboxProcess:
    """Start ``plan``, killed after ``timeout`` seconds. Popen keyword arguments (stdio,
    text, ...) pass through."""
    prepared = prepare(plan, bwrap_path, bpf)
    try:
        return SandboxProcess(prepared, plan, timeout, **popen_kwargs)
    except OSError as exc:
        raise SetupError(f"could not start {prepared.argv[0]}: {exc.strerror}",
                         "run 'sbx doctor'") from None
