"""The library's process objects: ``SandboxProcess`` (a ``subprocess.Popen``) and
``SandboxResult`` (a ``CompletedProcess``). The CLI does not import this module.

``SandboxProcess`` composes with ``Popen`` through its public surface: ``wait`` and ``poll``
translate the raw status into sbx's exit table once the child is reaped.
"""

from __future__ import annotations

import subprocess

from .errors import SandboxError, SetupError
from .launch import PreparedLaunch, SandboxStatus, kill_sandbox_tree, prepare, signal_command
from .plan import LaunchPlan
from .tiers import Tier


class SandboxResult(subprocess.CompletedProcess):
    """A ``CompletedProcess`` that also says which tier the command ran at."""

    def __init__(self, args: object, returncode: int, stdout: object = None, stderr: object = None,
                 tier: Tier | None = None, sandbox_error: SandboxError | None = None) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.tier = tier
        self.sandbox_error = sandbox_error


class SandboxProcess(subprocess.Popen):
    """A ``subprocess.Popen`` for a sandboxed command.

    ``returncode`` follows sbx's exit table (128+N for signal N, 125 when the sandbox could
    not be set up, 126/127 when the command could not be run); ``sandbox_error`` then says
    why. ``kill_sandbox()`` ends every process inside; dropping the handle of a running
    sandbox does the same, so nothing is left behind.
    """

    tier = None
    sandbox_error: SandboxError | None = None
    timed_out = False

    def __init__(self, prepared: PreparedLaunch, plan: LaunchPlan, **popen_kwargs) -> None:
        self._status = SandboxStatus(prepared.status_read, plan.bwrap_args is not None, prepared.staged)
        self._uses_bwrap = plan.bwrap_args is not None
        self._killed_by_us = False
        self._translated = False
        self.tier = plan.tier
        try:
            super().__init__(prepared.argv, pass_fds=prepared.pass_fds, close_fds=True,
                             env={}, start_new_session=True, **popen_kwargs)
        except BaseException:
            self._status.close()
            raise
        finally:
            prepared.close_parent_copies()

    def _translate(self) -> int | None:
        if self.returncode is not None and not self._translated:
            self._translated = True
            self.returncode = self._status.translate(self.returncode, self._killed_by_us)
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
        kill_sandbox_tree(self.pid, self._uses_bwrap)

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
        super().__del__()


def launch(plan: LaunchPlan, bwrap_path: str | None, bpf: bytes | None, **popen_kwargs) -> SandboxProcess:
    """Start ``plan``. Popen keyword arguments (stdio, text, ...) pass through."""
    prepared = prepare(plan, bwrap_path, bpf)
    try:
        return SandboxProcess(prepared, plan, **popen_kwargs)
    except OSError as exc:
        raise SetupError(f"could not start {prepared.argv[0]}: {exc.strerror}",
                         "run 'sbx doctor'") from None
