"""The embedding API: ``Sandbox`` with a subprocess-like ``spawn``/``run``/``spawn_async``.

A ``Sandbox`` does the per-profile work once (load and validate the profile, resolve the
tier, compile or load the seccomp filter, look at the host paths) so that each call only
plans and launches. It holds no per-call state, so one instance serves many threads.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

from . import arguments, hostview, probes
from .errors import HostError, ProfileError, UsageError, WorkdirError
from .integrity import protected_paths
from .launch import DirectProcess, prepare
from .plan import LaunchPlan, Request, build_plan, dirs_to_list, paths_to_observe
from .profile import Profile, load_profile, locate_value
from .seccomp_policy import compiled_bpf, spec_from_profile
from .tiers import Tier


class Sandbox:
    """A configured sandbox; call ``spawn``/``run`` as often as you like, from any thread."""

    def __init__(self, profile: str | Profile = "strict", workdir: str | os.PathLike | None = None, *,
                 tier: str | Tier | None = None, allow_degraded: bool = False,
                 ro_binds: Sequence[str] = (), binds: Sequence[str] = (), share_net: bool = False,
                 setenv: Mapping[str, str] | None = None, timeout: float | None = None,
                 exe_max_mib: int | None = None, capabilities: probes.Capabilities | None = None,
                 allow_hosts: Sequence[str] = (), on_network_event: Callable[[object], object] | None = None,
                 network_resolver: Callable[[str, int], Awaitable[list[str]]] | None = None) -> None:
        if isinstance(profile, Profile):
            self.profile = profile
        else:
            self.profile = load_profile(arguments.path(profile, "profile"))
        self.workdir = os.path.abspath(arguments.path(workdir, "workdir")) if workdir is not None else os.getcwd()
        if not os.path.isdir(self.workdir):
            raise WorkdirError(f"workdir {self.workdir} is not an existing directory", "create it, or pass another")
        allow_degraded = arguments.flag(allow_degraded, "allow_degraded")
        requested = arguments.tier(tier)
        self._ro_binds = arguments.paths(ro_binds, "ro_binds")
        self._binds = arguments.paths(binds, "binds")
        self._share_net = arguments.flag(share_net, "share_net")
        self._setenv = arguments.variables(setenv, "setenv")
        self._allow_hosts = arguments.hosts(allow_hosts)
        # Called on the proxy's thread for each allow/deny decision (netproxy.NetEvent);
        # the resolver maps an allowed name to the addresses to try (tests inject one).
        self._network_hooks = (arguments.callback(on_network_event, "on_network_event"),
                               arguments.callback(network_resolver, "network_resolver"))
        timeout = arguments.timeout(timeout)
        self.capabilities = capabilities or probes.host_capabilities()
        self.host_tier = probes.resolve_tier(self.capabilities)
        self.tier, self.degraded_warning = probes.choose_tier(
            self.host_tier, requested, self.profile.tier_floor, allow_degraded, self.profile.name)
        if self.tier.uses_bwrap and not self.capabilities.bwrap_path:
            raise HostError("bubblewrap is needed at this tier but was not found",
                            "apt-get install bubblewrap, then run 'sbx doctor'")
        self.timeout = timeout if timeout is not None else (self.profile.timeout or None)
        mib = arguments.mib(exe_max_mib, "exe_max_mib") if exe_max_mib is not None else self.profile.data["run"]["exe_max_mib"]
        self.exe_max_bytes = mib << 20  # the largest file --exe-sha256 reads
        probe_request = self._request(("true",))
        self._host = hostview.observe(paths_to_observe(self.profile, probe_request),
                                      protected_paths(self.profile.sources, self.capabilities.bwrap_path),
                                      dirs_to_list(self.profile, probe_request) if self.tier == Tier.KernelNoNamespaces
                                      else ())
        network = self.profile.table("network")
        try:
            # The same spec every call's plan carries (plan.build_plan): it depends only on the
            # profile, the tier and the network settings, all fixed here.
            self._bpf = (compiled_bpf(spec_from_profile(self.profile.table("seccomp"), self._effective_share_net(),
                                                        network["loopback"], self.tier.uses_namespaces,
                                                        proxy=bool(network["allow"] or self._allow_hosts)))
                         if self.tier.uses_seccomp else None)
        except ProfileError as exc:  # an unknown syscall name: say where the profile names it
            where = locate_value(self.profile.sources, "seccomp", getattr(exc, "syscall", ""))
            raise ProfileError(f"profile {where}: {exc.message}", exc.remedy) from None
        first = self.plan(["true"])  # refuse a broken configuration now, not at the first call
        self.network_allow = first.network_allow

    def _effective_share_net(self) -> bool:
        return self._share_net or not self.profile.table("namespaces")["net"]

    def _request(self, argv: Sequence[str], preserve_fds: Sequence[int] = (),
                 env: Mapping[str, str] | None = None, exe_fd: int | None = None,
                 exe_path: str | None = None) -> Request:
        setenv = self._setenv + arguments.variables(env, "env")
        return Request(argv=arguments.argv(argv), workdir=self.workdir, preserve_fds=arguments.fds(preserve_fds),
                       ro_binds=self._ro_binds, binds=self._binds, share_net=self._share_net,
                       setenv=setenv, host_env=tuple(os.environ.items()), exe_fd=exe_fd,
                       exe_path=exe_path, allow_hosts=self._allow_hosts)

    def plan(self, argv: Sequence[str], preserve_fds: Sequence[int] = (),
             env: Mapping[str, str] | None = None, exe_fd: int | None = None,
             exe_path: str | None = None) -> LaunchPlan:
        """The launch plan for one call (what ``sbx run --dry-run`` prints)."""
        request = self._request(argv, preserve_fds, env, exe_fd, exe_path)
        return build_plan(self.profile, self.tier, request, self._host, self.capabilities.landlock_abi,
                          self.capabilities.bwrap_features)

    def spawn(self, argv: Sequence[str], *, preserve_fds: Sequence[int] = (),
              env: Mapping[str, str] | None = None, exe_sha256: str | None = None,
              timeout: float | None = None, **popen_kwargs: object) -> SandboxProcess:  # noqa: F821 (from .process, imported when used)
        """Start ``argv`` in the sandbox and return a ``subprocess.Popen`` for it.

        ``env`` adds variables to the profile's environment. stdin/stdout/stderr, text,
        encoding, errors and bufsize are passed to Popen; ``preserve_fds`` keep their numbers.
        ``timeout`` (default: the Sandbox's) is a deadline: when it passes, the whole sandbox
        is killed, whether or not anything waits, and its status becomes 124 (``timed_out``).
        """
        deadline = self._deadline(timeout)
        for key in ("pass_fds", "close_fds", "cwd", "preexec_fn", "start_new_session", "shell",
                    "executable", "process_group", "user", "group", "extra_groups", "umask"):
            if key in popen_kwargs:
                raise UsageError(f"Sandbox.spawn does not take {key}=",
                                 "the sandbox decides that; use preserve_fds/workdir/env instead")
        plan, exe = self._plan_with_exe(argv, preserve_fds, env, exe_sha256)
        self._warn_if_degraded()
        from .process import launch

        try:
            return launch(plan, self.capabilities.bwrap_path, self._bpf, deadline, self._network_hooks, **popen_kwargs)
        finally:
            if exe is not None:
                exe.close()

    def start(self, argv: Sequence[str], *, preserve_fds: Sequence[int] = (),
              exe_sha256: str | None = None) -> DirectProcess:
        """Start ``argv`` with the caller's stdio and return a light handle (``wait``,
        ``send_signal_to_command``, ``kill_sandbox``): what the CLI uses, without
        importing ``subprocess`` or ``logging``: a below-floor warning is the caller's to print
        (``degraded_warning``). The same preparation, status channel and exit table."""
        plan, exe = self._plan_with_exe(argv, preserve_fds, None, exe_sha256)
        try:
            return DirectProcess(prepare(plan, self.capabilities.bwrap_path, self._bpf, self._network_hooks), plan)
        finally:
            if exe is not None:
                exe.close()

    def _warn_if_degraded(self) -> None:
        if self.degraded_warning:
            import logging

            logging.getLogger("sbx").warning("sbx: warning: %s", self.degraded_warning)

    def _plan_with_exe(self, argv, preserve_fds, env, exe_sha256):
        exe_sha256 = arguments.digest(exe_sha256)
        if exe_sha256 is None:
            return self.plan(argv, preserve_fds, env), None
        from .verified_exe import open_verified

        probe = self.plan(argv, preserve_fds, env)  # the sandbox's PATH and mounts
        exe = open_verified(probe.argv[0], exe_sha256, probe.search_path, self.workdir, self.exe_max_bytes)
        try:
            _refuse_writable_interpreter(exe, probe)
            return self.plan(argv, preserve_fds, env, exe_fd=exe.fd, exe_path=exe.path), exe
        except BaseException:
            exe.close()
            raise

    def run(self, argv: Sequence[str], *, input: object = None, capture_output: bool = False,
            timeout: float | None = None, check: bool = False, preserve_fds: Sequence[int] = (),
            env: Mapping[str, str] | None = None, exe_sha256: str | None = None,
            **popen_kwargs: object) -> SandboxResult:  # noqa: F821 (from .process)
        """Run ``argv`` to completion, like ``subprocess.run``.

        On timeout the whole sandbox is killed and ``subprocess.TimeoutExpired`` is raised.
        If the sandbox could not be set up, the ``SandboxError`` is raised.
        """
        import subprocess

        from .process import SandboxResult
        if input is not None:
            popen_kwargs["stdin"] = subprocess.PIPE
        if capture_output:
            popen_kwargs["stdout"] = subprocess.PIPE
            popen_kwargs["stderr"] = subprocess.PIPE
        with self.spawn(argv, preserve_fds=preserve_fds, env=env, exe_sha256=exe_sha256, timeout=timeout,
                        **popen_kwargs) as process:
            try:
                stdout, stderr = process.communicate(input)  # the deadline ends it, if set
            except BaseException:
                process.kill_sandbox()
                raise
        if process.sandbox_error is not None and process.returncode == 125:
            raise _with_bwrap_message(process.sandbox_error, stderr)
        if check and process.returncode:
            raise subprocess.CalledProcessError(process.returncode, list(argv), stdout, stderr)
        return SandboxResult(list(argv), process.returncode, stdout, stderr, tier=self.tier,
                             sandbox_error=process.sandbox_error, timed_out=process.timed_out)

    async def spawn_async(self, argv: Sequence[str], *, preserve_fds: Sequence[int] = (),
                          env: Mapping[str, str] | None = None, exe_sha256: str | None = None,
                          stdin: object = None, stdout: object = None, stderr: object = None,
                          limit: int = 2 ** 16, timeout: float | None = None) -> object:
        """Like ``spawn``, returning an ``asyncio.subprocess.Process`` (see ``aio.py``)."""
        from .aio import spawn_async

        return await spawn_async(self, argv, preserve_fds=preserve_fds, env=env, exe_sha256=exe_sha256,
                                 stdin=stdin, stdout=stdout, stderr=stderr, limit=limit,
                                 timeout=self._deadline(timeout))

    def _deadline(self, timeout: object) -> float | None:
        """A call's timeout, validated, else the Sandbox's (constructor or profile)."""
        return arguments.timeout(timeout) if timeout is not None else self.timeout

    # For aio.py: the same preparation the synchronous path uses.
    def _prepare(self, argv, preserve_fds, env, exe_sha256):
        self._warn_if_degraded()
        plan, exe = self._plan_with_exe(argv, preserve_fds, env, exe_sha256)
        try:
            return plan, prepare(plan, self.capabilities.bwrap_path, self._bpf, self._network_hooks), exe
        except BaseException:
            if exe is not None:
                exe.close()
            raise


def _with_bwrap_message(error: Exception, stderr: object) -> Exception:
    """A bwrap setup failure whose message ``run`` captured: put bwrap's words in the error."""
    if not getattr(error, "bwrap_failed", False) or not stderr:
        return error
    text = stderr if isinstance(stderr, str) else bytes(stderr).decode("utf-8", "replace")
    said = [line for line in text.splitlines() if line.startswith("bwrap:")] or text.splitlines()[-1:]
    error.message = error.message.replace("its own message went to the command's stderr", "it said: " + "; ".join(said))
    error.args = (error.message,)
    return error


def _refuse_writable_interpreter(exe, plan: LaunchPlan) -> None:
    """A verified ``#!`` script runs its interpreter by path inside the sandbox: one that
    lies in a writable part of the view (the workdir, a bind, a tmpfs) could have been
    replaced by an earlier command, so the check would prove nothing. Refuse it."""
    interpreter = exe.interpreter
    if interpreter is None:
        return
    from .errors import ExecutableDigestError

    if not interpreter.startswith("/") or ".." in interpreter.split("/") or "//" in interpreter:
        raise ExecutableDigestError(f"{exe.path}: its #! interpreter {interpreter!r} is not a plain absolute path "
                                    "(no '..', no '//')", "name the interpreter by its canonical path in the #! line")
    import os

    # The literal path and where it leads on the host: both must stay clear of what is writable.
    for candidate in {interpreter, os.path.realpath(interpreter)}:
        _refuse_in_writable_mount(exe, plan, interpreter, candidate)


def _refuse_in_writable_mount(exe, plan: LaunchPlan, interpreter: str, candidate: str) -> None:
    from .errors import ExecutableDigestError

    for mount in plan.mounts:
        if mount.op in ("bind", "tmpfs") and (candidate == mount.path or candidate.startswith(mount.path + "/")):
            raise ExecutableDigestError(
                f"{exe.path}: its #! interpreter {interpreter} lies in {mount.path}, which is writable inside the "
                "sandbox: a command could replace it, so the digest would not cover what runs; nothing was run",
                "use an interpreter from a read-only part of the view (such as /usr/bin), or verify a binary")
