"""The one launch path: a LaunchPlan becomes a running sandbox.

The CLI and the library both end here, so hygiene, preserved files and exit statuses
cannot drift apart. Everything bwrap and stage 2 need travels through descriptors
(memfds and a pipe), never through a path another user could read or swap:

    --args FD      bwrap's own arguments, NUL-separated (memfd)
    CONFIG_FD      stage 2's configuration, marshal-encoded (memfd)
    seccomp FD     the compiled BPF programs (memfd)
    status FD      stage 2 -> parent: started / note / error (pipe, close-on-exec in stage 2)

Each is created close-on-exec and passed to the child alone through ``pass_fds``, so a
spawn in another thread cannot inherit it.
"""

from __future__ import annotations

import marshal
import os
import signal
import subprocess

from . import stage2
from .errors import EXIT_SBX_ERROR, PreservedFdError, SandboxError, SetupError
from .plan import LaunchPlan

_STAGE2_SOURCE: str | None = None
_STAGE2_CODE: dict[str, bytes | None] = {}
# Stage 2 arrives precompiled: -c runs this loader, which executes the code object in the
# memfd named by the last argument. Compiling stage 2's source on every call would cost
# more than a millisecond of every tool call's start-up.
STAGE2_LOADER = "import marshal,os,sys;exec(marshal.loads(os.pread(int(sys.argv[-1]),1<<22,0)))"
_COMPILER = ("import marshal,sys;sys.stdout.buffer.write(marshal.dumps("
             "compile(sys.stdin.read(),'sbx-stage2','exec')))")


def stage2_source() -> str:
    global _STAGE2_SOURCE
    if _STAGE2_SOURCE is None:
        with open(stage2.__file__, encoding="utf-8") as f:
            _STAGE2_SOURCE = f.read()
    return _STAGE2_SOURCE


def stage2_code(python: str) -> bytes | None:
    """Stage 2 compiled by ``python`` itself (marshal is version-specific), cached per user
    by interpreter and source; None when it cannot be had, and the source is sent instead."""
    if python in _STAGE2_CODE:
        return _STAGE2_CODE[python]
    from . import cache

    source = stage2_source()
    try:
        info = os.stat(python)
        key = cache.digest(f"{os.path.realpath(python)}|{info.st_size}|{info.st_mtime_ns}|{source}")
    except OSError:
        _STAGE2_CODE[python] = None
        return None
    name = f"stage2-{key}.marshal"
    code = cache.read(name)
    if not code:
        try:
            out = subprocess.run([python, "-I", "-S", "-c", _COMPILER], input=source.encode(),
                                 capture_output=True, timeout=30)
            code = out.stdout if out.returncode == 0 and out.stdout else None
        except (OSError, subprocess.TimeoutExpired):
            code = None
        if code:
            cache.write(name, code)
    _STAGE2_CODE[python] = code
    return code


class CommandNotFound(SandboxError):
    code = "command-not-found"
    default_remedy = "check the command's name and that its directory is visible in the profile"
    exit_status = stage2.EXIT_NOT_FOUND


class CommandNotExecutable(SandboxError):
    code = "command-not-executable"
    default_remedy = "check the file's execute permission and, for scripts, that the interpreter is visible"
    exit_status = stage2.EXIT_NOT_EXECUTABLE


def _memfd_with(name: str, data: bytes) -> int:
    # Safe: a fresh anonymous file owned by this process, close-on-exec until passed.
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class PreparedLaunch:
    """The argv and descriptors of one launch; ``owned_fds`` are ours to close once the child has them."""

    def __init__(self, argv: list[str], pass_fds: tuple[int, ...], cwd: str | None, status_read: int,
                 owned_fds: list[int], cleared_cloexec: list[int]) -> None:
        self.argv, self.pass_fds, self.cwd = argv, pass_fds, cwd
        self.status_read, self.owned_fds, self.cleared_cloexec = status_read, owned_fds, cleared_cloexec

    def close_parent_copies(self) -> None:
        """Once the child is started (or failed to): close our descriptors, and set back the
        close-on-exec flags that prepare() cleared on the caller's preserved files."""
        for fd in self.owned_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.owned_fds.clear()
        _restore_cloexec(self.cleared_cloexec)
        self.cleared_cloexec = []


def prepare(plan: LaunchPlan, bwrap_path: str | None, bpf: bytes | None) -> PreparedLaunch:
    """Make the preserved fds inheritable and build every descriptor the child needs."""
    try:
        cleared = stage2.make_files_inheritable(plan.preserved_fds)
    except stage2.FdFlagError as exc:
        raise PreservedFdError(str(exc), exc.fd, exc.errno) from None
    owned: list[int] = []
    try:
        status_read, status_write = os.pipe()  # both close-on-exec
        owned.append(status_write)
        os.set_blocking(status_read, False)
        config = plan.stage2_config()
        config["status_fd"] = status_write
        if plan.seccomp is not None:
            if not bpf:
                raise SetupError("the plan needs seccomp but no compiled filter was given",
                                 "this is a bug in sbx: report it with 'sbx run --dry-run' output")
            config["seccomp_fd"] = _memfd_with("sbx-seccomp", bpf)
            owned.append(config["seccomp_fd"])
        config_fd = _memfd_with("sbx-config", marshal.dumps(config, 2))
        owned.append(config_fd)
        keep = ",".join(str(fd) for fd in plan.preserved_fds)
        code = stage2_code(plan.stage2_python)
        if code:
            code_fd = _memfd_with("sbx-stage2", code)
            owned.append(code_fd)
            stage2_argv = [plan.stage2_python, "-I", "-S", "-c", STAGE2_LOADER, str(config_fd), keep, str(code_fd)]
        else:
            stage2_argv = [plan.stage2_python, "-I", "-S", "-c", stage2_source(), str(config_fd), keep]
        if plan.bwrap_args is None:
            argv, cwd = stage2_argv, plan.workdir
        else:
            if not bwrap_path:
                raise SetupError("the plan needs bubblewrap but it was not found",
                                 "apt-get install bubblewrap, then run 'sbx doctor'")
            # bwrap takes options from --args but the command only from its own argv.
            args = b"".join(a.encode() + b"\0" for a in plan.bwrap_args)
            args_fd = _memfd_with("sbx-bwrap-args", args)
            owned.append(args_fd)
            argv, cwd = [bwrap_path, "--args", str(args_fd), "--", *stage2_argv], None
    except OSError as exc:
        for fd in owned:
            os.close(fd)
        _restore_cloexec(cleared)
        raise SetupError(f"could not prepare the launch descriptors: {exc.strerror}",
                         "check the descriptor limit (ulimit -n)") from None
    return PreparedLaunch(argv=argv, pass_fds=tuple(sorted({*plan.preserved_fds, *owned})),
                          cwd=cwd, status_read=status_read, owned_fds=owned, cleared_cloexec=cleared)


def _restore_cloexec(fds: list[int]) -> None:
    # Safe: only fds whose flag prepare() cleared, set back once the child has its copies
    # (pass_fds makes them inheritable in that child regardless), so the caller's other
    # subprocesses do not inherit them from here on.
    import fcntl

    for fd in fds:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.fcntl(fd, fcntl.F_GETFD) | fcntl.FD_CLOEXEC)
        except OSError:
            pass


class SandboxStatus:
    """Reads stage 2's status records and turns a raw exit status into sbx's table."""

    def __init__(self, status_read: int, uses_bwrap: bool) -> None:
        self._fd: int | None = status_read
        self._uses_bwrap = uses_bwrap
        self.records: list = []
        self.error: SandboxError | None = None
        self.notes: list[str] = []

    def drain(self) -> None:
        if self._fd is None:
            return
        data = b""
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        self.records += stage2.parse_frames(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def translate(self, raw: int, killed_by_us: bool) -> int:
        """The exit status in DESIGN.md's table for a child that ended with ``raw``."""
        self.drain()
        self.close()
        started = any(kind == b"S" for kind, _ in self.records)
        for kind, record in self.records:
            if kind == b"N":
                self.notes.append(f"{record['layer']}: {record['message']}")
            if kind == b"E":
                self.error = _error_from_record(record)
                return record["exit"]
        if raw < 0:
            return 128 - raw  # a signal; bwrap itself already reports 128+N this way
        if not started and not killed_by_us:
            self.error = SetupError(
                f"bubblewrap could not set up the sandbox (exit status {raw}; its message is above)"
                if self._uses_bwrap else f"stage 2 did not start (exit status {raw})")
            return EXIT_SBX_ERROR
        return raw


def _error_from_record(record: dict) -> SandboxError:
    if record["exit"] == stage2.EXIT_NOT_FOUND:
        return CommandNotFound(record["message"])
    if record["exit"] == stage2.EXIT_NOT_EXECUTABLE:
        return CommandNotExecutable(record["message"])
    if record["layer"] == "preserved-fd":
        return PreservedFdError(record["message"], -1, record.get("errno"))
    return SetupError(f"{record['layer']}: {record['message']}")


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
        self._status = SandboxStatus(prepared.status_read, plan.bwrap_args is not None)
        self._uses_bwrap = plan.bwrap_args is not None
        self._killed_by_us = False
        self.tier = plan.tier
        try:
            super().__init__(prepared.argv, pass_fds=prepared.pass_fds, close_fds=True,
                             cwd=prepared.cwd, env={}, start_new_session=True, **popen_kwargs)
        except BaseException:
            self._status.close()
            raise
        finally:
            prepared.close_parent_copies()

    def _handle_exitstatus(self, sts, *args, **kwargs) -> None:  # called by wait()/poll()
        super()._handle_exitstatus(sts, *args, **kwargs)
        if self.returncode is not None and getattr(self, "_status", None) is not None:
            self.returncode = self._status.translate(self.returncode, self._killed_by_us)
            self.sandbox_error = self._status.error

    @property
    def notes(self) -> list[str]:
        return self._status.notes

    def send_signal_to_command(self, signum: int) -> None:
        """Deliver ``signum`` to the command itself (not to bwrap, which would just die)."""
        targets = command_pids(self.pid, self._uses_bwrap) if self.returncode is None else []
        if not targets:
            targets = [self.pid]
        for pid in targets:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

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


def kill_sandbox_tree(pid: int, uses_bwrap: bool) -> None:
    """SIGKILL the sandbox rooted at ``pid`` (bwrap, or stage 2's exec on EnvironmentOnly)."""
    if uses_bwrap:
        # bwrap's --die-with-parent and the pid namespace do the rest: when the pid-1
        # reaper dies, the kernel kills everything else in the namespace.
        victims = [pid]
    else:
        victims = _descendants(pid) + [pid]
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass


def command_pids(pid: int, uses_bwrap: bool) -> list[int]:
    """Host pids of the sandboxed command(s): bwrap -> its pid-1 reaper -> the command."""
    if not uses_bwrap:
        return [pid]
    found = []
    for reaper in _children(pid):
        found += _children(reaper) or [reaper]
    return found


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:
        found, queue = [], [pid]
        while queue:
            for child in _children(queue.pop()):
                found.append(child)
                queue.append(child)
        return found


def launch(plan: LaunchPlan, bwrap_path: str | None, bpf: bytes | None, **popen_kwargs) -> SandboxProcess:
    """Start ``plan``. Popen keyword arguments (stdio, text, ...) pass through."""
    prepared = prepare(plan, bwrap_path, bpf)
    try:
        return SandboxProcess(prepared, plan, **popen_kwargs)
    except OSError as exc:
        raise SetupError(f"could not start {prepared.argv[0]}: {exc.strerror}",
                         "run 'sbx doctor'") from None
