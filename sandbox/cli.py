"""The ``sbx`` command line. It builds a ``Sandbox`` and uses the same launch path as the library."""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable, Sequence

from .errors import SandboxError, UsageError

EXIT_TIMEOUT = 124
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# A small table-driven parser instead of argparse: importing argparse and building its
# parser cost about ten milliseconds, and every tool call starts this front end.


def _fd_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()):  # "¹".isdigit() is True, int("¹") is not
        raise UsageError(f"--preserve-fd {text!r} is not a descriptor number", "pass a number such as 7")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--timeout {text!r} is not a number of seconds", "pass e.g. --timeout 30") from None
    if not 0 < value <= 10**7:  # nan and inf too
        raise UsageError(f"--timeout {text!r}: the timeout is more than 0 and at most 10000000 seconds",
                         "pass e.g. --timeout 30")
    return value


def _mib(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 1 << 20:
        raise UsageError(f"--exe-max-mib {text!r} is not a whole number of MiB from 1 to 1048576",
                         "pass e.g. --exe-max-mib 512")
    return int(text)


def _setenv(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UsageError(f"--setenv {text!r} is not NAME=VALUE", "pass e.g. --setenv LANG=C.UTF-8")
    return name, value


class Option:
    """One flag: ``kind`` is "flag", "value" or "append"; ``convert`` checks a value."""

    def __init__(self, name: str, kind: str, help: str, metavar: str = "", default: object = None,
                 convert: Callable[[str], object] = str) -> None:
        self.name, self.kind, self.help, self.metavar, self.convert = name, kind, help, metavar, convert
        self.dest = name.lstrip("-").replace("-", "_")
        self.default = [] if kind == "append" else (False if kind == "flag" else default)


COMMANDS: dict[str, tuple[str, str, list[Option]]] = {
    "run": ("run a command in the sandbox", "sbx run [options] -- COMMAND [ARG ...]", [
        Option("--profile", "value", "profile name or path to a .toml file (default: strict)", "NAME", "strict"),
        Option("--workdir", "value", "read-write working directory (default: the current directory)", "DIR"),
        Option("--ro-bind", "append", "also show PATH read-only (repeatable)", "PATH"),
        Option("--bind", "append", "also show PATH read-write (repeatable)", "PATH"),
        Option("--share-net", "flag", "keep the host network"),
        Option("--allow-host", "append", "let the command reach HOST (ports 80 and 443, or PORT) through sbx's proxy "
               "(repeatable; *.DOMAIN for its subdomains)", "HOST[:PORT]"),
        Option("--net-log", "value", "write every allow/deny decision of the proxy to FILE as JSON lines", "FILE"),
        Option("--setenv", "append", "set a variable inside (repeatable)", "NAME=VALUE", convert=_setenv),
        Option("--timeout", "value", "kill the whole sandbox after this long (exit 124)", "SECONDS", convert=_seconds),
        Option("--tier", "value", "force a lower tier: KernelFull, KernelSeccompOnly, KernelNoNamespaces or EnvironmentOnly", "NAME"),
        Option("--allow-degraded", "flag", "run below the profile's floor tier (with a warning)"),
        Option("--preserve-fd", "append", "pass descriptor N through with the same number (repeatable)", "N",
               convert=_fd_number),
        Option("--exe-sha256", "value", "run COMMAND only if its bytes have this SHA-256, from the checked copy",
               "HEX"),
        Option("--exe-max-mib", "value", "the largest file --exe-sha256 reads, in MiB (default 256)", "N",
               convert=_mib),
        Option("--dry-run", "flag", "print the launch plan and exit 0"),
        Option("--verbose", "flag", "say which tier and layers the run used, and each proxy decision"),
    ]),
    "doctor": ("probe the host and resolve the tier", "sbx doctor [--json] [--profile NAME]", [
        Option("--json", "flag", "print one JSON object"),
        Option("--profile", "value", "show this profile's layers at the resolved tier", "NAME", "strict"),
    ]),
    "profiles": ("list profiles, or show one resolved", "sbx profiles [list | show NAME|PATH]", []),
    "verify": ("prove on this host that the sandbox enforces what it claims",
               "sbx verify [--json] [--output FILE]", [
        Option("--json", "flag", "print one JSON object"),
        Option("--output", "value", "also write a Markdown record to FILE", "FILE"),
    ]),
}


class Arguments:
    """The parsed command line: ``command``, one attribute per option, ``positionals``."""

    def __init__(self, command: str, options: list[Option]) -> None:
        self.command = command
        self.positionals: list[str] = []
        for option in options:
            setattr(self, option.dest, list(option.default) if option.kind == "append" else option.default)


def usage() -> str:
    lines = ["usage: sbx COMMAND [options]", "",
             "Run untrusted commands in a bubblewrap sandbox with Landlock, seccomp and fd hygiene.", "",
             "commands:"]
    lines += [f"  {name:<9} {summary}" for name, (summary, _, _) in COMMANDS.items()]
    lines += ["", "  sbx --version", "  sbx COMMAND --help"]
    return "\n".join(lines)


def command_help(name: str) -> str:
    summary, synopsis, options = COMMANDS[name]
    lines = [f"usage: {synopsis}", "", summary, ""]
    if options:
        lines.append("options:")
        for option in options:
            flag = f"{option.name} {option.metavar}".strip()
            lines.append(f"  {flag:<24} {option.help}")
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> Arguments | None:
    """Parse sbx's command line; None means help or the version was printed."""
    if not argv:
        raise UsageError("no command given", "'sbx --help' lists the commands")
    if argv[0] in ("-h", "--help"):
        print(usage())
        return None
    if argv[0] == "--version":
        from . import __version__

        print(f"sbx {__version__}")
        return None
    command = argv[0]
    if command not in COMMANDS:
        raise UsageError(f"unknown command {command!r}", "use one of: " + ", ".join(COMMANDS))
    options = {o.name: o for o in COMMANDS[command][2]}
    args = Arguments(command, list(options.values()))
    rest = list(argv[1:])
    while rest:
        token = rest.pop(0)
        if command == "run" and (token == "--" or not token.startswith("-")):
            args.positionals = rest if token == "--" else [token, *rest]
            break
        if token in ("-h", "--help"):
            print(command_help(command))
            return None
        if not token.startswith("-") or token == "--":
            args.positionals.append(token)
            continue
        name, has_value, value = token.partition("=")
        option = options.get(name)
        if option is None:
            raise UsageError(f"unrecognized option {name!r} for 'sbx {command}'", f"see 'sbx {command} --help'")
        if option.kind == "flag":
            if has_value:
                raise UsageError(f"{name} takes no value", f"see 'sbx {command} --help'")
            setattr(args, option.dest, True)
            continue
        if not has_value:
            if not rest:
                raise UsageError(f"{name} needs a value ({option.metavar})", f"see 'sbx {command} --help'")
            value = rest.pop(0)
        converted = option.convert(value)
        if option.kind == "append":
            getattr(args, option.dest).append(converted)
        else:
            setattr(args, option.dest, converted)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    # A path or argument that is not UTF-8 is printed as the bytes it is, never a traceback.
    for stream, errors in ((sys.stdout, "surrogateescape"), (sys.stderr, "backslashreplace")):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=errors)
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except SandboxError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def entry() -> None:
    """The console script: run, flush, and leave without interpreter teardown (it costs
    milliseconds and there is nothing left to clean up: the sandbox has been waited for)."""
    status = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _main(argv: list[str]) -> int:
    args = parse(argv)
    if args is None:
        return 0
    if args.command == "run":
        return cmd_run(args)
    if args.command == "doctor":
        return cmd_doctor(args)
    if args.command == "profiles":
        return cmd_profiles(args)
    if args.command == "verify":
        from .verify import cmd_verify

        return cmd_verify(args)
    raise UsageError(f"unknown command {args.command!r}", "see 'sbx --help'")


def cmd_run(args: Arguments) -> int:
    from .api import Sandbox

    command = args.positionals
    if not command:
        raise UsageError("no command given", "put the command after '--': sbx run --profile strict -- ls")
    net_log: list[int] = []  # the --net-log descriptor, opened once everything else checked out
    sandbox = Sandbox(args.profile, args.workdir, tier=args.tier, allow_degraded=args.allow_degraded,
                      ro_binds=args.ro_bind, binds=args.bind, share_net=args.share_net,
                      setenv=dict(args.setenv), timeout=args.timeout, exe_max_mib=args.exe_max_mib,
                      allow_hosts=args.allow_host,
                      on_network_event=_network_reporter(net_log, args.verbose))
    if args.net_log is not None:
        if not sandbox.network_allow:
            raise UsageError("--net-log without a network allowlist: there would be nothing to log",
                             "add --allow-host HOST (or a profile's [network] allow), or drop --net-log")
        if not args.dry_run:
            writable = [m.source for m in sandbox.plan(command).mounts if m.op == "bind"]
            net_log.append(_open_net_log(args.net_log, writable))
    if sandbox.degraded_warning:  # start() does not log it: the CLI says it here, once
        print(f"sbx: warning: {sandbox.degraded_warning}", file=sys.stderr)
    if args.dry_run:
        print(sandbox.plan(command, args.preserve_fd).describe())
        return 0
    if args.verbose:
        print(f"sbx: tier {sandbox.tier.name} (host resolves {sandbox.host_tier.name}; "
              f"profile {sandbox.profile.name}, floor {sandbox.profile.tier_floor.name}; "
              f"landlock ABI {sandbox.capabilities.landlock_abi}; bwrap {sandbox.capabilities.bwrap_path})",
              file=sys.stderr)
    # The handlers go in before the start: a signal that arrives while the sandbox is being
    # set up is held and forwarded as soon as the command exists, never lost.
    started: list = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if started:
            started[0].send_signal_to_command(signum)
        else:
            pending.append(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        process = sandbox.start(command, preserve_fds=args.preserve_fd, exe_sha256=args.exe_sha256)
        started.append(process)
        for signum in pending:
            process.send_signal_to_command(signum)
        status = process.wait(timeout=sandbox.timeout)
        if status is None:
            process.kill_sandbox()
            process.wait()
            print(f"sbx: error: timeout: the command ran longer than {sandbox.timeout:g} s; "
                  "the whole sandbox was killed\nsbx: remedy: raise --timeout (or the profile's [run] timeout) "
                  "if the command needs longer", file=sys.stderr)
            return EXIT_TIMEOUT
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if args.verbose:
        for note in process.notes:
            print(f"sbx: note: {note}", file=sys.stderr)
    if process.sandbox_error is not None:
        print(process.sandbox_error.render(), file=sys.stderr)
    return status


def _open_net_log(path: str, writable_inside: list[str]) -> int:
    """The --net-log file, opened once, before the sandbox exists: created 0600 or truncated;
    its directory walked without following any symlink, the file itself never a link, FIFO or
    device (an earlier sandbox may have planted one in its workdir to block or redirect sbx),
    and never in a directory the sandbox can write (the command could rewrite the log)."""
    from .pathfd import open_directory

    directory, name = os.path.split(os.path.abspath(path))
    try:
        dir_fd = open_directory(directory)
    except OSError as exc:
        raise UsageError(f"--net-log {path}: its directory {directory} cannot be opened without following a link "
                         f"({exc.strerror})", "pass a path whose directories are real directories") from None
    try:
        real = os.readlink(f"/proc/self/fd/{dir_fd}")
        for source in writable_inside:
            if real == source or real.startswith(source.rstrip("/") + "/"):
                raise UsageError(f"--net-log {path} lies in {source}, which the sandbox can write: the command could "
                                 "rewrite its own log", "write the log outside the workdir and every --bind")
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a FIFO with no reader: refused without blocking
                raise UsageError(f"--net-log {path} is not a regular file",
                                 "pass a path to a regular file (it is created)") from None
            raise UsageError(f"--net-log {path}: cannot open it: {exc.strerror}",
                             "pass a path to a regular file in a directory you can write") from None
    finally:
        os.close(dir_fd)
    import stat

    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UsageError(f"--net-log {path} is not a regular file", "pass a path to a regular file (it is created)")
    if info.st_nlink != 1:  # a second name for it could lie anywhere, the workdir included
        os.close(fd)
        raise UsageError(f"--net-log {path} has {info.st_nlink} hard links; nothing was written to it",
                         "pass a path to a new file, or one with no other name")
    os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return fd


def _network_reporter(log: list[int], verbose: bool):
    """The CLI's proxy event sink: JSON lines to --net-log, one line each on stderr with --verbose."""
    def report(event) -> None:
        for fd in log:
            os.write(fd, (event.to_json() + "\n").encode())
        if verbose:
            where = f"{event.host}:{event.port}"
            print(f"sbx: net: {event.action} {where} ({event.protocol})" + (f": {event.reason}" if event.reason else ""),
                  file=sys.stderr, flush=True)
    return report


def cmd_doctor(args: Arguments) -> int:
    from . import probes
    from .hostview import observe
    from .integrity import protected_paths
    from .plan import Request, build_plan, dirs_to_list, paths_to_observe
    from .profile import load_profile

    caps = probes.host_capabilities(refresh=True)
    tier = probes.resolve_tier(caps)
    profile = load_profile(args.profile)
    layers: list[str] = []
    try:
        request = Request(argv=("true",), workdir=os.getcwd())
        host = observe(paths_to_observe(profile, request), protected_paths(profile.sources, caps.bwrap_path),
                       dirs_to_list(profile, request) if tier == probes.Tier.KernelNoNamespaces else ())
        layers = build_plan(profile, tier, request, host, caps.landlock_abi,
                            caps.bwrap_features).describe().splitlines()
    except SandboxError as exc:
        layers = [f"(cannot plan profile {profile.name} here: {exc})"]
    from .netcheck import allowlist_check

    checks = [*caps.checks, allowlist_check(tier)]
    if args.json:
        import json

        limits = []
        if tier == probes.Tier.KernelNoNamespaces:
            from .tiers import NO_NAMESPACES_LIMITS, NO_SIGNAL_SCOPE

            limits = [*NO_NAMESPACES_LIMITS, *((NO_SIGNAL_SCOPE,) if caps.landlock_abi < 6 else ())]
        print(json.dumps({"tier": tier.name, "landlock_abi": caps.landlock_abi, "tier_lacks": limits,
                          "checks": [c._asdict() for c in checks],
                          "bwrap": {"path": caps.bwrap_path, "version": caps.bwrap_version,
                                    "features": sorted(caps.bwrap_features)},
                          "profile": profile.name, "layers": layers}, indent=2))
        return 0
    width = max(len(c.name) for c in checks)
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.name:<{width}}  {check.detail}")
        if not check.ok and check.remedy:
            print(f"     {'':<{width}}  remedy: {check.remedy}")
    print(f"\ntier: {tier.name}")
    if tier == probes.Tier.KernelNoNamespaces:
        from .tiers import NO_NAMESPACES_LIMITS, NO_SIGNAL_SCOPE

        print("  bwrap cannot create namespaces here, so sbx enforces Landlock and seccomp without them. "
              "What this tier lacks:")
        for limit in (*NO_NAMESPACES_LIMITS, *((NO_SIGNAL_SCOPE,) if caps.landlock_abi < 6 else ())):
            print(f"  - {limit}")
        failed = next((c for c in caps.checks if c.name == "bwrap-userns" and not c.ok), None)
        if failed is not None and failed.remedy:
            print(f"  for every layer (KernelFull): {failed.remedy}")
    print(f"\nlayers of profile {profile.name!r} at {tier.name}:")
    for line in layers:
        print(f"  {line}")
    return 0


def cmd_profiles(args: Arguments) -> int:
    from .profile import list_profiles, load_profile

    action, *names = args.positionals or ["list"]
    if action not in ("list", "show") or (action == "list" and names) or len(names) > 1:
        raise UsageError(f"'sbx profiles {' '.join(args.positionals)}' is not understood",
                         "use 'sbx profiles' or 'sbx profiles show NAME'")
    if action == "show":
        if not names:
            raise UsageError("'sbx profiles show' needs a profile name or path", "sbx profiles show strict")
        print(load_profile(names[0]).to_toml(), end="")
        return 0
    for name, path in list_profiles().items():
        profile = load_profile(str(path))
        print(f"{name:<12} floor {profile.tier_floor.name:<18} {profile.data['description']}  ({path})")
    return 0


if __name__ == "__main__":
    entry()
