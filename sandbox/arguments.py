"""Validation of what callers hand the library: every type, every byte, named in the error.

Each check raises ``ArgumentTypeError`` or ``ArgumentValueError`` (``usage`` errors that are
also ``TypeError``/``ValueError``) naming the argument, so nothing deeper in sbx ever sees
a value it would trip over with a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import ArgumentTypeError, ArgumentValueError
from .tiers import Tier

MAX_TIMEOUT = 10**7  # seconds (about 115 days): longer is no timeout, and overflows poll(2)


def _type_name(value: object) -> str:
    return type(value).__name__


def path(value: object, name: str) -> str:
    """A str, bytes or os.PathLike path, as str (undecodable bytes kept by surrogateescape)."""
    if isinstance(value, (str, bytes, os.PathLike)):
        text = os.fsdecode(os.fspath(value))
    else:
        raise ArgumentTypeError(f"{name} must be a path (str, bytes or os.PathLike), not {_type_name(value)}",
                                "pass a path such as '/home/me/project'")
    if "\0" in text:
        raise ArgumentValueError(f"{name} contains a NUL byte: {text!r}", "remove the NUL byte")
    if not text:
        raise ArgumentValueError(f"{name} is empty", "pass a path")
    encodable(text, name)
    return text


def encodable(text: str, name: str) -> None:
    """A str that cannot become bytes for the kernel (a lone surrogate that is not one of
    os.fsdecode's escapes) is refused here rather than failing deep inside."""
    try:
        os.fsencode(text)
    except UnicodeError:
        raise ArgumentValueError(f"{name} = {text!r} cannot be encoded for the system", "pass bytes, or valid text") \
            from None


def paths(value: object, name: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes, os.PathLike)) or not _iterable(value):
        raise ArgumentTypeError(f"{name} must be a list of paths, not {_type_name(value)}",
                                f"pass {name}=['/path', ...]")
    return tuple(os.path.abspath(path(item, f"{name}[{i}]")) for i, item in enumerate(value))


def argv(value: object) -> tuple[str, ...]:
    """The command: a non-empty sequence of str, bytes or os.PathLike, none holding NUL."""
    if isinstance(value, (str, bytes, os.PathLike)) or not _iterable(value):
        raise ArgumentTypeError(f"argv must be a sequence of strings, not {_type_name(value)}",
                                "pass ['cmd', 'arg', ...]")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, (str, bytes, os.PathLike)):
            raise ArgumentTypeError(f"argv[{i}] must be a str, bytes or os.PathLike, not {_type_name(item)}",
                                    "convert numbers with str()")
        text = os.fsdecode(os.fspath(item))
        if "\0" in text:
            raise ArgumentValueError(f"argv[{i}] contains a NUL byte: {text!r}", "remove the NUL byte")
        encodable(text, f"argv[{i}]")
        out.append(text)
    if not out or not out[0]:
        raise ArgumentValueError("argv is empty" if not out else "argv[0] is empty",
                                 "put the command first: ['ls', '-l']")
    return tuple(out)


def fds(value: object, name: str = "preserve_fds") -> tuple[int, ...]:
    if value is None or isinstance(value, (str, bytes)) or not _iterable(value):
        raise ArgumentTypeError(f"{name} must be a list of descriptor numbers, not {_type_name(value)}",
                                f"pass {name}=[fd, ...]")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int):
            raise ArgumentTypeError(f"{name}[{i}] must be an int, not {_type_name(item)} ({item!r})",
                                    "pass descriptor numbers such as 7")
        out.append(item)  # the range (3 and up, a C int) is the planner's check
    return tuple(out)


def variables(value: object, name: str) -> tuple[tuple[str, str], ...]:
    """Environment variables: a mapping of names to values, both str."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(f"{name} must be a mapping of names to values, not {_type_name(value)}",
                                f"pass {name}={{'NAME': 'value'}}")
    out = []
    for key, val in value.items():
        check_variable(key, val, f"{name}[{key!r}]")
        out.append((key, val))
    return tuple(out)


def check_variable(key: object, val: object, where: str) -> None:
    if not isinstance(key, str) or not isinstance(val, str):
        raise ArgumentTypeError(f"{where}: names and values must be str, not {_type_name(key)}/{_type_name(val)}",
                                "convert values with str()")
    if not key or "=" in key or "\0" in key:
        raise ArgumentValueError(f"{where}: {key!r} is not a variable name (empty, or holds '=' or NUL)",
                                 "use a name such as LANG")
    if "\0" in val:
        raise ArgumentValueError(f"{where}: the value holds a NUL byte", "remove the NUL byte")
    encodable(key, where)
    encodable(val, where)


def timeout(value: object, name: str = "timeout") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a number of seconds or None, not {_type_name(value)}",
                                "pass e.g. timeout=30")
    if not 0 < value <= MAX_TIMEOUT:  # also refuses nan; checked before float(): 10**400 overflows
        raise ArgumentValueError(f"{name} = {value!r}: a timeout is more than 0 and at most {MAX_TIMEOUT} seconds "
                                 "(None: no timeout)", "pass e.g. timeout=30, or None")
    return float(value)


def tier(value: object) -> Tier | None:
    if value is None or isinstance(value, Tier):
        return value
    if isinstance(value, str):
        return Tier.parse(value)
    raise ArgumentTypeError(f"tier must be a Tier, a tier name or None, not {_type_name(value)} ({value!r})",
                            "pass e.g. tier='KernelSeccompOnly'")


def flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, not {_type_name(value)}", f"pass {name}=True")
    return value


def digest(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ArgumentTypeError(f"exe_sha256 must be a hexadecimal str or None, not {_type_name(value)}",
                            "pass the SHA-256 as printed by 'sha256sum FILE'")


def _iterable(value: object) -> bool:
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def mib(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be a whole number of MiB, not {_type_name(value)}", f"pass e.g. {name}=256")
    if not 1 <= value <= 1 << 20:
        raise ArgumentValueError(f"{name} = {value}: from 1 to 1048576 MiB", f"pass e.g. {name}=256")
    return value


def hosts(value: object, name: str = "allow_hosts") -> tuple[str, ...]:
    """HOST[:PORT] entries; their syntax is checked by the planner (netproxy.parse_allow)."""
    if isinstance(value, (str, bytes)) or not _iterable(value):
        raise ArgumentTypeError(f"{name} must be a list of HOST[:PORT] strings, not {_type_name(value)}",
                                f"pass {name}=['pypi.org', 'github.com:443']")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ArgumentTypeError(f"{name}[{i}] must be a str, not {_type_name(item)}", "pass host names as str")
        out.append(item)
    return tuple(out)


def callback(value: object, name: str) -> object:
    if value is not None and not callable(value):
        raise ArgumentTypeError(f"{name} must be callable or None, not {_type_name(value)}",
                                f"pass a function, e.g. {name}=events.append")
    return value
