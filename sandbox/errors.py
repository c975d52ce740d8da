"""sbx's own errors: each carries a stable code, one line of cause and one of remedy.

The CLI prints them as ``sbx: error: CODE: cause`` and ``sbx: remedy: ...`` and exits 125;
the library raises them. Codes are part of the interface and are listed in the README.
"""

from __future__ import annotations

EXIT_SBX_ERROR = 125


class SandboxError(Exception):
    """Base class of every error sbx raises on purpose."""

    code = "sbx-error"
    exit_status = EXIT_SBX_ERROR
    default_remedy = "see 'sbx --help' and the README"

    def __init__(self, message: str, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy or self.default_remedy

    def __str__(self) -> str:
        return self.message

    def render(self) -> str:
        """The two lines the CLI prints (without a trailing newline). A newline or other
        control character in a message (a path can hold one) is shown escaped, so a path
        can never forge a line of its own."""
        return f"sbx: error: {self.code}: {_one_line(self.message)}\nsbx: remedy: {_one_line(self.remedy)}"


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


class UsageError(SandboxError):
    code = "usage"
    default_remedy = "see 'sbx run --help'"


class ProfileError(SandboxError):
    code = "profile"
    default_remedy = "fix the profile, or list the shipped ones with 'sbx profiles'"


class PreservedFdError(SandboxError):
    code = "preserved-fd"
    default_remedy = (
        "keep the descriptor open in the caller until the sandbox has started "
        "(check for an early close, a dropped file object or a typo in the number)"
    )

    def __init__(self, message: str, fd: int, errno: int | None, remedy: str | None = None) -> None:
        super().__init__(message, remedy)
        self.fd = fd
        self.errno = errno


class WorkdirError(SandboxError):
    code = "workdir"
    default_remedy = "pass an existing directory with --workdir"


class BindError(SandboxError):
    code = "bind"
    default_remedy = "pass an existing host path to --bind/--ro-bind"


class TierError(SandboxError):
    """A tier was requested above what the host provides."""

    code = "tier"
    default_remedy = "run 'sbx doctor' to see which tier this host resolves and why"


class TierBelowFloorError(TierError):
    code = "tier-below-floor"
    default_remedy = (
        "fix what 'sbx doctor' reports, or pass --allow-degraded to run with less enforcement"
    )


class HostError(SandboxError):
    """The host lacks something the launch needs (bwrap, an interpreter, ...)."""

    code = "host"
    default_remedy = "run 'sbx doctor' for the failing check and its remedy"


class SetupError(SandboxError):
    """The sandbox could not be set up (bwrap or stage 2 failed before the command ran)."""

    code = "setup"
    default_remedy = "run 'sbx doctor'; rerun with --verbose for the layer that failed"


class ExecutableDigestError(SandboxError):
    code = "exe-digest"
    default_remedy = "check that the executable is the one you reviewed, then pass its digest"


class CommandNotFound(SandboxError):
    """Stage 2 found no such command on the sandbox's PATH (exit 127)."""

    code = "command-not-found"
    default_remedy = "check the command's name and that its directory is visible in the profile"
    exit_status = 127


class CommandNotExecutable(SandboxError):
    """The command exists but could not be executed (exit 126)."""

    code = "command-not-executable"
    default_remedy = "check the file's execute permission and, for scripts, that the interpreter is visible"
    exit_status = 126


class ArgumentTypeError(UsageError, TypeError):
    """A library argument of the wrong type; also a TypeError, as Python code expects."""


class ArgumentValueError(UsageError, ValueError):
    """A library argument with a value sbx cannot use; also a ValueError."""


class SandboxTimeout(SandboxError):
    """The sandbox's timeout fired: the whole sandbox was killed (exit status 124)."""

    code = "timeout"
    exit_status = 124
    default_remedy = "raise the timeout (--timeout, timeout=, or the profile's [run] timeout) if the command needs longer"
