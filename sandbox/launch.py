"""The one launch path: a LaunchPlan becomes a running sandbox.

The CLI and the library both end here, so hygiene, preserved files and exit statuses
cannot drift apart. Everything bwrap and stage 2 need travels through descriptors
(memfds and a pipe), never through a path another user could read or swap:

    --args FD      bwrap's own arguments, NUL-separated (memfd)
    CONFIG_FD      stage 2's configuration, ``stage2_wire.encode_config`` (memfd)
    seccomp FD     the compiled BPF programs, framed (memfd)
    status FD      stage 2 -> parent: started / note / error (pipe, close-on-exec in stage 2)

Each is created close-on-exec and passed to the child alone through ``pass_fds``, so a
spawn in another thread cannot inherit it. Stage 2 itself is the compiled helper
``sbx-stage2``; bwrap places it inside at its own host path (see ``plan._bwrap_args``).
"""

from __future__ import annotations

import os
import signal

from .errors import (
    EXIT_SBX_ERROR,
    CommandNotExecutable,
    CommandNotFound,
    PreservedFdError,
    SandboxError,
    SandboxTimeout,
    SetupError,
    UsageError,
)
from .fds import FdFlagError, make_files_inheritable, memfd_with, restore_cloexec
from .plan import LaunchPlan
from .stage2_wire import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, encode_config, parse_status


class PreparedLaunch:
    """The argv and descriptors of one launch; ``owned_fds`` are ours to close once the child has them."""

    def __init__(self, argv: list[str], pass_fds: tuple[int, ...], status_read: int,
                 owned_fds: list[int], cleared_cloexec: list[int], staged: list[str], bridge=None,
                 private_tmp: str | None = None) -> None:
        self.argv, self.pass_fds = argv, pass_fds
        self.status_read, self.owned_fds, self.cleared_cloexec = status_read, owned_fds, cleared_cloexec
        self.staged = staged  # idmapped mounts to release when the sandbox ends (rootcaller.py)
        self.bridge = bridge  # the network allowlist's NetworkBridge (netbridge.py), or None
        self.private_tmp = private_tmp  # KernelNoNamespaces: removed when the sandbox ends (private_tmp.py)

    def status(self, uses_bwrap: bool) -> SandboxStatus:
        """The status channel of this launch, which also owns its staging mounts, bridge and
        private temp directory."""
        return SandboxStatus(self.status_read, uses_bwrap, self.staged, self.bridge, self.private_tmp)

    def close_parent_copies(self) -> None:
        """Once the child is started (or failed to): close our descriptors, and set back the
        close-on-exec flags that prepare() cleared on the caller's preserved files."""
        for fd in self.owned_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.owned_fds.clear()
        restore_cloexec(self.cleared_cloexec)
        self.cleared_cloexec = []

    def discard(self) -> None:
        """For a preparation that is not launched through this module (benchmarks, tests):
        close everything and release what was staged."""
        self.close_parent_copies()
        try:
            os.close(self.status_read)
        except OSError:
            pass
        release_staged(self.staged)
        if self.bridge is not None:
            self.bridge.close()
        if self.private_tmp is not None:
            from .private_tmp import remove

            remove(self.private_tmp)
            self.private_tmp = None


def prepare(plan: LaunchPlan, bwrap_path: str | None, bpf: bytes | None,
            network_hooks: tuple = (None, None)) -> PreparedLaunch:
    """Make the preserved fds inheritable and build every descriptor the child needs.
    ``network_hooks``: (on_event, resolver) for a plan with a network allowlist."""
    if plan.seccomp is not None and not bpf:
        raise SetupError("the plan needs seccomp but no compiled filter was given",
                         "this is a bug in sbx: report it with 'sbx run --dry-run' output")
    if plan.bwrap_args is not None and not bwrap_path:
        raise SetupError("the plan needs bubblewrap but it was not found",
                         "apt-get install bubblewrap, then run 'sbx doctor'")
    try:
        cleared = make_files_inheritable(plan.preserved_fds)
    except FdFlagError as exc:
        raise PreservedFdError(str(exc), exc.fd, exc.errno) from None
    owned: list[int] = []
    staged: list[str] = []
    bridge = None
    private_tmp = None
    try:
        if plan.bwrap_args is None and plan.landlock is not None:
            from .private_tmp import create, substitute

            private_tmp = create()  # the tmpfs entries of a tier without mounts
            plan = substitute(plan, private_tmp)
        status_read, status_write = os.pipe()  # both close-on-exec
        owned.append(status_write)
        os.set_blocking(status_read, False)
        seccomp_fd = None
        if plan.seccomp is not None:
            seccomp_fd = memfd_with("sbx-seccomp", bpf)
            owned.append(seccomp_fd)
        if plan.network_allow:
            from .netbridge import NetworkBridge

            bridge = NetworkBridge(plan.network_allow, *network_hooks)
            owned.append(bridge.child_fd)
        config = encode_config(plan.stage2_config(status_write, seccomp_fd,
                                                  bridge.child_fd if bridge is not None else None))
        config_fd = memfd_with("sbx-config", config)
        owned.append(config_fd)
        stage2_argv = [plan.stage2_helper, str(config_fd), ",".join(str(fd) for fd in plan.preserved_fds)]
        if plan.bwrap_args is None:
            argv = stage2_argv
            if plan.drop_caps:
                from .rootcaller import capability_drop_prefix

                argv = [*capability_drop_prefix(), *argv]
        else:
            bwrap_args = pin_bind_sources(plan, owned, staged)
            # bwrap takes options from --args but the command only from its own argv.
            args_fd = memfd_with("sbx-bwrap-args", b"".join(os.fsencode(a) + b"\0" for a in bwrap_args))
            owned.append(args_fd)
            argv = [bwrap_path, "--args", str(args_fd), "--", *stage2_argv]
            if plan.run_as is not None:
                from .rootcaller import setpriv_prefix

                argv = [*setpriv_prefix(), *argv]
    except (OSError, ValueError, SandboxError) as exc:
        for fd in owned:
            os.close(fd)
        if "status_read" in locals():
            os.close(status_read)
        release_staged(staged)
        if bridge is not None:
            bridge.close()
        if private_tmp is not None:
            from .private_tmp import remove

            remove(private_tmp)
        restore_cloexec(cleared)
        if isinstance(exc, SandboxError):
            raise
        if isinstance(exc, ValueError):
            raise UsageError(f"cannot hand this to the sandbox: {exc}",
                             "remove NUL bytes and '=' in variable names from the command, environment and paths") from None
        raise SetupError(f"could not prepare the launch descriptors: {exc.strerror}",
                         "check the descriptor limit (ulimit -n)") from None
    return PreparedLaunch(argv=argv, pass_fds=tuple(sorted({*plan.preserved_fds, *owned})),
                          status_read=status_read, owned_fds=owned, cleared_cloexec=cleared, staged=staged,
                          bridge=bridge, private_tmp=private_tmp)


def bare_argv(prepared: PreparedLaunch, bwrap_path: str, command: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    """The same bwrap invocation (arguments, pinned descriptors, identity) with ``command``
    in place of stage 2, and ``extra`` bwrap options: what the benchmarks compare sbx with."""
    end = prepared.argv.index("--", prepared.argv.index(bwrap_path))
    return [*prepared.argv[:end], *extra, "--", *command]


def release_staged(staged: list[str], background: bool = False) -> None:
    if staged:
        from .rootcaller import release, release_in_background

        if background:
            release_in_background(list(staged))
        else:
            for target in staged:
                release(target)
        staged.clear()


BIND_FLAGS = {"--ro-bind": "--ro-bind-fd", "--ro-bind-try": "--ro-bind-fd", "--bind": "--bind-fd"}


def pin_bind_sources(plan: LaunchPlan, owned: list[int], staged: list[str]) -> list[str]:
    """bwrap's arguments with each checked bind source replaced by a descriptor pinned to
    the object the planner checked (see pathfd.py); the descriptors go into ``owned``.
    An optional source that has gone is left out, as bwrap's --ro-bind-try would. A mount
    marked ``idmap`` is shown through an idmapped clone (rootcaller.py), noted in ``staged``."""
    from .pathfd import open_pinned

    sources = {(m.source, m.path): m for m in plan.mounts if m.identity is not None}
    helper = plan.stage2_identity
    from .plan import DATA_MARKER

    data = {m.path: m.source for m in plan.mounts if m.op == "data"}
    args = list(plan.bwrap_args)
    out: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i]
        if flag == "--ro-bind-data" and args[i + 1].startswith(DATA_MARKER):
            fd = memfd_with("sbx-data", data[args[i + 2]].encode())
            owned.append(fd)
            out += [flag, str(fd), args[i + 2]]
            i += 3
            continue
        if flag in BIND_FLAGS and i + 2 < len(args):
            source, dest = args[i + 1], args[i + 2]
            mount = sources.get((source, dest))
            identity = mount.identity if mount is not None else (helper if source == plan.stage2_helper else None)
            if identity is not None:
                fd = open_pinned(source, identity, optional=flag == "--ro-bind-try")
                if fd is not None and mount is not None and mount.idmap:
                    from .rootcaller import stage_idmapped

                    try:
                        target, staged_fd = stage_idmapped(fd, source, read_only=flag != "--bind")
                    finally:
                        os.close(fd)
                    staged.append(target)
                    fd = staged_fd
                if fd is not None:
                    owned.append(fd)
                    out += [BIND_FLAGS[flag], str(fd), dest]
                i += 3
                continue
        out.append(flag)
        i += 1
    return out


class SandboxStatus:
    """Reads stage 2's status records and turns a raw exit status into sbx's table."""

    def __init__(self, status_read: int, uses_bwrap: bool, staged: list[str] | None = None, bridge=None,
                 private_tmp: str | None = None) -> None:
        self._fd: int | None = status_read
        self._uses_bwrap = uses_bwrap
        self._staged = staged if staged is not None else []
        self._bridge = bridge
        self._private_tmp = private_tmp
        # The library's handles may be waited for on an event loop's thread: unmount there
        # in the background. The CLI (DirectProcess) releases in line before it exits.
        self.release_in_background = True
        self._data = b""
        self.error: SandboxError | None = None
        self.notes: list[str] = []

    def drain(self) -> None:
        if self._fd is None:
            return
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # BlockingIOError included: nothing more for now
                break
            if not chunk:
                break
            self._data += chunk

    def release_once_started(self, timeout: float = 10.0) -> None:
        """For a root caller's launch: wait until stage 2 reports it started (so bwrap has
        made every mount, the idmapped ones included), then release the staging mounts at
        once, so they are reachable by path on the host only during bwrap's setup. A no-op
        without staged mounts. What is read is kept for ``translate``."""
        if not self._staged or self._fd is None:
            return
        import select
        import time

        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                break
            before = len(self._data)
            self.drain()
            if len(self._data) == before or parse_status(self._data):  # EOF, or a record (S or E) arrived
                break
        release_staged(self._staged, background=False)

    def after_start(self) -> None:
        """Right after the child is started: release a root caller's staging mounts once
        bwrap has them, and serve the network bridge once stage 2 sends it. Blocks for at
        most a few milliseconds on a healthy host; a SetupError means the sandbox must be
        killed (the bridge never came)."""
        self.release_once_started()
        if self._bridge is not None:
            self._bridge.start()

    @property
    def needs_after_start(self) -> bool:
        return bool(self._staged) or self._bridge is not None

    def close(self) -> None:
        """Done with this sandbox: close the channel, release any idmapped staging mounts,
        stop its proxy."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        release_staged(self._staged, self.release_in_background)
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()
        if self._private_tmp is not None:
            from .private_tmp import remove

            # The sandbox has ended (or never started): nothing sbx started writes there now.
            remove(self._private_tmp)
            self._private_tmp = None

    def translate(self, raw: int, killed_by_us: bool, timed_out: bool = False) -> int:
        """The exit status in the README's table for a child that ended with ``raw``."""
        self.drain()
        self.close()
        if timed_out:
            self.error = SandboxTimeout("the sandbox ran past its timeout; the whole sandbox was killed")
            return self.error.exit_status
        records = parse_status(self._data)
        started = any(r.kind == "started" for r in records)
        for record in records:
            if record.kind == "note":
                self.notes.append(f"{record.layer}: {record.detail}")
            elif record.kind == "error":
                self.error = error_from_record(record)
                return record.exit
        if raw < 0:
            return 128 - raw  # a signal; bwrap itself already reports 128+N this way
        if not started and not killed_by_us:
            self.error = SetupError(
                f"bubblewrap could not set up the sandbox (exit status {raw}; its own message went to the "
                "command's stderr)" if self._uses_bwrap else f"stage 2 did not start (exit status {raw})")
            self.error.bwrap_failed = self._uses_bwrap
            return EXIT_SBX_ERROR
        return raw


def error_from_record(record) -> SandboxError:
    """The SandboxError for one stage 2 error record; the messages are written here."""
    reason = os.strerror(record.errno) if record.errno else ""
    if record.exit == EXIT_NOT_FOUND:
        return CommandNotFound(record.detail)
    if record.exit == EXIT_NOT_EXECUTABLE:
        return CommandNotExecutable(f"{record.detail}: {reason}" if reason and reason not in record.detail
                                    else record.detail)
    if record.layer == "preserved-fd":
        return PreservedFdError(f"{record.detail}: {reason}", -1, record.errno)
    return SetupError(f"{record.layer}: {record.detail}" + (f": {reason}" if reason else ""))


class DirectProcess:
    """A sandbox started with ``os.posix_spawn``: the light handle the CLI uses.

    It needs neither pipes nor ``subprocess`` (whose import, with ``locale`` and ``re``,
    would cost every tool call several milliseconds). Everything before the spawn is the
    library's ``prepare``; the status channel and the exit table are the same
    ``SandboxStatus``. The child gets exactly ``pass_fds`` besides 0-2, as with
    ``Popen(close_fds=True)``: every other inheritable descriptor of this process is closed
    in the child by a spawn file action.
    """

    def __init__(self, prepared: PreparedLaunch, plan: LaunchPlan) -> None:
        self._status = prepared.status(plan.bwrap_args is not None)
        self._status.release_in_background = False
        self._uses_bwrap = plan.bwrap_args is not None
        self._killed_by_us = False
        self.tier = plan.tier
        self.returncode: int | None = None
        self.sandbox_error: SandboxError | None = None
        try:
            actions = _close_other_fds(set(prepared.pass_fds))
            for fd in prepared.owned_fds:
                os.set_inheritable(fd, True)  # ours, closed right after the spawn
            self.pid = os.posix_spawn(prepared.argv[0], prepared.argv, {}, file_actions=actions, setsid=True,
                                      setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        except OSError as exc:
            self._status.close()
            raise SetupError(f"could not start {prepared.argv[0]}: {exc.strerror}", "run 'sbx doctor'") from None
        finally:
            prepared.close_parent_copies()
        self._pidfd = os.pidfd_open(self.pid)
        try:
            self._status.after_start()
        except SandboxError:
            self.kill_sandbox()
            self.wait()
            raise

    @property
    def notes(self) -> list[str]:
        return self._status.notes

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status (sbx's table), or None when ``timeout`` seconds passed first."""
        if self.returncode is None:
            import select

            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            import time

            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                # poll(2) takes at most 2**31-1 ms: wait in slices of an hour.
                if poller.poll(None if left is None else max(0, int(min(left, 3600) * 1000))):
                    break
                if left is not None and left <= 0:
                    return None
            _, raw = os.waitpid(self.pid, 0)
            os.close(self._pidfd)
            status = os.waitstatus_to_exitcode(raw)
            self.returncode = self._status.translate(status, self._killed_by_us)
            self.sandbox_error = self._status.error
        return self.returncode

    def send_signal_to_command(self, signum: int) -> None:
        """Deliver ``signum`` to the command itself (not to bwrap, which would just die)."""
        if self.returncode is None:
            signal_command(self.pid, self._uses_bwrap, signum)

    def kill_sandbox(self) -> None:
        """SIGKILL every process in the sandbox, grandchildren included."""
        if self.returncode is None:
            self._killed_by_us = True
            kill_sandbox_tree(self.pid, self._uses_bwrap, self._pidfd)


def _close_other_fds(keep: set[int]) -> list[tuple]:
    """posix_spawn file actions closing, in the child, every inheritable fd >= 3 not kept."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError as exc:
        raise SetupError(f"cannot list this process's descriptors in /proc/self/fd: {exc.strerror}",
                         "mount /proc, or use the library's Sandbox.spawn") from None
    actions = []
    for fd in open_fds:
        if fd > 2 and fd not in keep:
            try:
                if os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:
                pass  # the listing's own descriptor, already closed
    return actions


def signal_command(pid: int, uses_bwrap: bool, signum: int) -> None:
    """Deliver ``signum`` to the sandboxed command(s) rooted at ``pid``."""
    for target in command_pids(pid, uses_bwrap) or [pid]:
        try:
            os.kill(target, signum)
        except ProcessLookupError:
            pass


def open_pidfd(pid: int) -> int | None:
    # Safe: a descriptor on our own child, taken right after the spawn; it names that
    # process and no other, even once its pid is reused.
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def kill_sandbox_tree(pid: int, uses_bwrap: bool, pidfd: int | None = None) -> None:
    """SIGKILL the sandbox rooted at ``pid`` (bwrap, or stage 2's exec on EnvironmentOnly).

    ``pidfd`` (from ``open_pidfd``) guards against pid reuse: a child already reaped by
    someone else (asyncio's child watcher reaps in a thread) is not ours to signal, and
    its pid or process group may belong to another sandbox by now.
    """
    if pidfd is not None:
        import select

        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if poller.poll(0):
            return  # it has exited: its pid is no longer a safe name for it
    if uses_bwrap:
        # bwrap's pid-1 reaper runs in a session of its own, and --die-with-parent's
        # PR_SET_PDEATHSIG is set by the reaper itself after its fork: killed in between,
        # bwrap leaves a reaper (and the sandbox) running. So stop bwrap first (no further
        # fork), kill its children by pid (the reaper: its death ends the pid namespace),
        # then bwrap.
        _stop(pid, pidfd)
        victims = _children(pid)
    else:
        # Stage 2's supervisor (no pid namespace): SIGTERM makes it SIGKILL everything below
        # it, orphans that left the process group included, and exit; the walk below is the
        # belt to those braces, and the supervisor itself goes last, once it has swept.
        _signal(pid, pidfd, signal.SIGTERM)
        victims = _descendants(pid)
    for victim in victims:
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass
    if not uses_bwrap and pidfd is not None:
        # Never blocks (this runs on event loops and in finalizers): the supervisor gets
        # SWEEP_GRACE seconds to sweep and exit; only one that is still there then (stopped
        # by a command below Landlock ABI 6, say) is killed, by the watchdog thread. Killing
        # it at once would hand what is left to init.
        _kill_later_unless_exited(os.dup(pidfd), SWEEP_GRACE)
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    _signal(pid, pidfd, signal.SIGKILL)


SWEEP_GRACE = 10.0  # seconds stage 2's supervisor has to sweep before it is killed itself


def _kill_later_unless_exited(pidfd: int, seconds: float) -> None:
    """SIGKILL the process behind ``pidfd`` (ours to close) in ``seconds``, unless it has exited."""
    from .lifetime import call_later

    def fire() -> None:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # ESRCH once it has exited
        except OSError:
            pass
        finally:
            os.close(pidfd)

    call_later(seconds, fire)


def _signal(pid: int, pidfd: int | None, signum: int) -> bool:
    """Signal our child through its pidfd when we have one (never a reused pid)."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)
        return True
    except OSError:
        return False


def _stop(pid: int, pidfd: int | None) -> None:
    """SIGSTOP ``pid`` and wait (at most 50 ms) until the kernel shows it stopped."""
    import time

    if not _signal(pid, pidfd, signal.SIGSTOP):
        return
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.0005)


def command_pids(pid: int, uses_bwrap: bool) -> list[int]:
    """Host pids of the sandboxed command(s): bwrap -> its pid-1 reaper -> the command;
    without bwrap, stage 2's supervisor -> the command (and orphans re-parented to it)."""
    if not uses_bwrap:
        return _children(pid)
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
