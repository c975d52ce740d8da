"""The ``sbx`` command line. It builds a ``Sandbox`` and uses the same launch path as the library."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence

from .errors import EXIT_SBX_ERROR, SandboxError, UsageError

EXIT_TIMEOUT = 124
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit 2 with its own format
        raise UsageError(message, f"see '{self.prog} --help'")


def _fd_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a descriptor number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a descriptor number")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("the timeout must be more than 0 seconds")
    return value


def _setenv(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sbx", description="Run untrusted commands in a bubblewrap sandbox "
                     "with Landlock, seccomp and fd hygiene.")
    parser.add_argument("--version", action="store_true", help="print sbx's version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="run a command in the sandbox",
                         usage="sbx run [options] -- COMMAND [ARG ...]")
    run.add_argument("--profile", default="strict", help="profile name or path to a .toml file (default: strict)")
    run.add_argument("--workdir", help="read-write working directory (default: the current directory)")
    run.add_argument("--ro-bind", action="append", default=[], metavar="PATH", help="also show PATH read-only")
    run.add_argument("--bind", action="append", default=[], metavar="PATH", help="also show PATH read-write")
    run.add_argument("--share-net", action="store_true", help="keep the host network")
    run.add_argument("--setenv", action="append", default=[], type=_setenv, metavar="NAME=VALUE",
                     help="set a variable inside")
    run.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="kill the whole sandbox after this long (exit 124)")
    run.add_argument("--tier", help="force a lower tier: KernelFull, KernelSeccompOnly or EnvironmentOnly")
    run.add_argument("--allow-degraded", action="store_true", help="run below the profile's floor tier (with a warning)")
    run.add_argument("--preserve-fd", action="append", default=[], type=_fd_number, metavar="N",
                     help="pass descriptor N through with the same number")
    run.add_argument("--exe-sha256", metavar="HEX", help="run COMMAND only if its bytes have this SHA-256, through the checked descriptor")
    run.add_argument("--dry-run", action="store_true", help="print the launch plan and exit 0")
    run.add_argument("--verbose", action="store_true", help="say which tier and layers the run used")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="the command, after --")

    doctor = sub.add_parser("doctor", help="probe the host and resolve the tier")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument("--profile", default="strict", help="show this profile's layers at the resolved tier")

    profiles = sub.add_parser("profiles", help="list profiles, or show one resolved")
    profiles.add_argument("action", nargs="?", choices=["list", "show"], default="list")
    profiles.add_argument("name", nargs="?")

    verify = sub.add_parser("verify", help="prove on this host that the sandbox enforces what it claims")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.add_argument("--output", metavar="FILE", help="also write a Markdown record to FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except SandboxError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(f"sbx {__version__}")
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
    parser.print_help(sys.stderr)
    return EXIT_SBX_ERROR


def cmd_run(args: argparse.Namespace) -> int:
    from .api import Sandbox

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UsageError("no command given", "put the command after '--': sbx run --profile strict -- ls")
    if args.workdir is not None and not os.path.isdir(args.workdir):
        raise UsageError(f"--workdir {args.workdir}: not an existing directory", "create it first, or pass another")
    sandbox = Sandbox(args.profile, args.workdir, tier=args.tier, allow_degraded=args.allow_degraded,
                      ro_binds=args.ro_bind, binds=args.bind, share_net=args.share_net,
                      setenv=dict(args.setenv), timeout=args.timeout)
    if sandbox.degraded_warning:
        print(f"sbx: warning: {sandbox.degraded_warning}", file=sys.stderr)
    if args.dry_run:
        print(sandbox.plan(command, args.preserve_fd).describe())
        return 0
    if args.verbose:
        print(f"sbx: tier {sandbox.tier.name} (host resolves {sandbox.host_tier.name}; "
              f"profile {sandbox.profile.name}, floor {sandbox.profile.tier_floor.name}; "
              f"landlock ABI {sandbox.capabilities.landlock_abi})", file=sys.stderr)
    process = sandbox.spawn(command, preserve_fds=args.preserve_fd, exe_sha256=args.exe_sha256)

    def forward(signum: int, _frame: object) -> None:
        process.send_signal_to_command(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        try:
            status = process.wait(timeout=sandbox.timeout)
        except Exception:  # subprocess.TimeoutExpired, without importing subprocess here
            process.kill_sandbox()
            process.wait()
            print(f"sbx: error: timeout: the command ran longer than {sandbox.timeout:g} s; "
                  "the whole sandbox was killed", file=sys.stderr)
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


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import probes
    from .hostview import observe
    from .plan import Request, build_plan, paths_to_observe
    from .profile import load_profile

    caps = probes.host_capabilities(refresh=True)
    tier = probes.resolve_tier(caps)
    profile = load_profile(args.profile)
    layers: list[str] = []
    plan_tier = tier
    try:
        request = Request(argv=("true",), workdir=os.getcwd())
        host = observe(paths_to_observe(profile, request))
        layers = build_plan(profile, plan_tier, request, host, caps.landlock_abi,
                            caps.bwrap_features).describe().splitlines()
    except SandboxError as exc:
        layers = [f"(cannot plan profile {profile.name} here: {exc})"]
    if args.json:
        print(json.dumps({"tier": tier.name, "landlock_abi": caps.landlock_abi,
                          "checks": [c.__dict__ for c in caps.checks],
                          "bwrap": {"path": caps.bwrap_path, "version": caps.bwrap_version,
                                    "features": sorted(caps.bwrap_features)},
                          "profile": profile.name, "layers": layers}, indent=2))
        return 0
    width = max(len(c.name) for c in caps.checks)
    for check in caps.checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.name:<{width}}  {check.detail}")
        if not check.ok and check.remedy:
            print(f"     {'':<{width}}  remedy: {check.remedy}")
    print(f"\ntier: {tier.name}")
    print(f"\nlayers of profile {profile.name!r} at {plan_tier.name}:")
    for line in layers:
        print(f"  {line}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from .profile import list_profiles, load_profile

    if args.action == "show":
        if not args.name:
            raise UsageError("'sbx profiles show' needs a profile name or path", "sbx profiles show strict")
        print(load_profile(args.name).to_toml(), end="")
        return 0
    for name, path in list_profiles().items():
        profile = load_profile(str(path))
        print(f"{name:<12} floor {profile.tier_floor.name:<18} {profile.data['description']}  ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
