"""Profiles: TOML files that name a filesystem view, namespaces, layers and limits.

A profile is validated against ``SCHEMA`` before it is used: an unknown key, a wrong
type, a missing file or a syntax error is a ``ProfileError`` naming the file, the line
when it is known, and what was expected. ``extends = "NAME"`` merges a profile over
another one: tables merge key by key, any other value (lists included) replaces.
"""

from __future__ import annotations

import marshal
import os
import sys
from collections import namedtuple

from .errors import ProfileError
from .tiers import Tier

PROFILE_PATH_ENV = "SBX_PROFILE_PATH"
SCHEMA_VERSION = 6  # bump when SCHEMA changes: cached validations are then redone

# table -> key -> (type description, check). None as the table means top level.
_STR = ("a string", lambda v: isinstance(v, str))
_BOOL = ("true or false", lambda v: isinstance(v, bool))
_STRS = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
_ABS_PATHS = ("a list of absolute paths",
              lambda v: isinstance(v, list) and all(isinstance(x, str) and x.startswith("/") for x in v))
_LIMIT = ("a whole number >= 0, or \"unlimited\"",
          lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or v == "unlimited")
_TIER = ("one of " + ", ".join(t.name for t in Tier), lambda v: isinstance(v, str) and v in Tier.__members__)
_ENV_MAP = ("a table of variable names (no '=' or NUL) to string values (no NUL)",
            lambda v: isinstance(v, dict) and all(
                isinstance(x, str) and "\0" not in x and k and "=" not in k and "\0" not in k for k, x in v.items()))


def _limit_at_least(minimum: int, why: str) -> tuple:
    """A limit below which no program (stage 2 included) can run: a profile error, not a
    crash that would look like the command's own status."""
    return (f"a whole number >= {minimum} ({why}), or \"unlimited\"",
            lambda v: (isinstance(v, int) and not isinstance(v, bool) and v >= minimum) or v == "unlimited")
_MIB = ("a whole number of MiB >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 20)
_TIMEOUT = ("a number of seconds from 0 (none) to 10000000",
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 10**7)

SCHEMA: dict[str | None, dict[str, tuple]] = {
    None: {"description": _STR, "extends": _STR, "tier_floor": _TIER},
    "namespaces": {"user": _BOOL, "pid": _BOOL, "net": _BOOL, "ipc": _BOOL, "uts": _BOOL, "cgroup": _BOOL},
    "filesystem": {
        "root": ("\"empty\" or \"host-ro\"", lambda v: v in ("empty", "host-ro")),
        "ro_binds": _ABS_PATHS, "ro_binds_try": _ABS_PATHS, "binds": _ABS_PATHS,
        "tmpfs": _ABS_PATHS, "hide": _ABS_PATHS, "dev": _BOOL, "proc": _BOOL,
        "workdir": ("\"rw\", \"ro\" or \"none\"", lambda v: v in ("rw", "ro", "none")),
        "merged_usr_links": _BOOL, "tmpfs_size_mib": _MIB, "shm_size_mib": _MIB,
    },
    "environment": {"keep": _STRS, "set": _ENV_MAP},
    "seccomp": {
        "mode": ("\"allowlist\" or \"denylist\"", lambda v: v in ("allowlist", "denylist")),
        "allow": _STRS, "deny": _STRS,
    },
    "landlock": {"deny_tcp": _BOOL, "scope_signals": _BOOL, "scope_abstract_unix": _BOOL},
    "rlimits": {"nofile": _limit_at_least(16, "descriptors a program needs to start"), "nproc": _LIMIT,
                "core": _LIMIT, "as": _limit_at_least(64 << 20, "bytes: 64 MiB; less and no program can start"),
                "cpu": _limit_at_least(1, "seconds"),
                "fsize": _LIMIT},
    "run": {"timeout": _TIMEOUT, "exe_max_mib": _MIB},
    "network": {"loopback": _BOOL, "allow": _STRS},
}

DEFAULTS: dict[str, object] = {
    "description": "",
    "tier_floor": "KernelFull",
    "namespaces": {"user": True, "pid": True, "net": True, "ipc": True, "uts": True, "cgroup": True},
    "filesystem": {"root": "empty", "ro_binds": [], "ro_binds_try": [], "binds": [], "tmpfs": ["/tmp"],
                   "hide": [], "dev": True, "proc": True, "workdir": "rw", "merged_usr_links": True,
                   "tmpfs_size_mib": 512, "shm_size_mib": 64},
    "environment": {"keep": [], "set": {}},
    "seccomp": {"mode": "allowlist", "allow": [], "deny": []},
    "landlock": {"deny_tcp": True, "scope_signals": True, "scope_abstract_unix": True},
    "rlimits": {"core": 0},
    "run": {"timeout": 0, "exe_max_mib": 256},
    "network": {"loopback": True, "allow": []},
}


class Profile(namedtuple("Profile", "name source data sources", defaults=((),))):
    """A validated, fully merged profile: its name, the file it was read from, its tables,
    and every file its ``extends`` chain read (no sandbox may write those)."""

    __slots__ = ()

    @property
    def tier_floor(self) -> Tier:
        return Tier[self.data["tier_floor"]]

    def table(self, name: str) -> dict:
        return self.data[name]

    @property
    def timeout(self) -> float:
        return float(self.data["run"]["timeout"])

    def to_toml(self) -> str:
        """The resolved profile as TOML (``sbx profiles show``)."""
        lines = [f"# resolved profile {self.name!r} from {self.source}"]
        for key in ("description", "tier_floor"):
            lines.append(f"{key} = {_toml_value(self.data[key])}")
        for table in SCHEMA:
            if table is None:
                continue
            lines.append(f"\n[{table}]")
            for key, value in self.data[table].items():
                lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def profile_dirs() -> list[str]:
    """Where profile names are looked up, first match wins."""
    # Relative entries are ignored: they would name a directory relative to the current one,
    # which a sandbox may have written (and integrity.py protects absolute paths only).
    dirs = [p for p in os.environ.get(PROFILE_PATH_ENV, "").split(":") if os.path.isabs(p)]
    package = os.path.dirname(os.path.abspath(__file__))
    dirs.append(os.path.join(os.path.dirname(package), "profiles"))  # a source checkout
    dirs.append(os.path.join(sys.prefix, "share", "sbx", "profiles"))  # an installed wheel
    return dirs


def list_profiles() -> dict[str, str]:
    found: dict[str, str] = {}
    for directory in profile_dirs():
        if os.path.isdir(directory):
            for entry in sorted(os.listdir(directory)):
                if entry.endswith(".toml"):
                    found.setdefault(entry[:-5], os.path.join(directory, entry))
    return found


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or spec.endswith(".toml")


def find_profile(spec: str, relative_to: str | None = None) -> str:
    if _looks_like_path(spec):
        path = spec
        if relative_to is not None and not os.path.isabs(path):
            path = os.path.join(relative_to, path)
        if os.path.isdir(path):
            raise ProfileError(f"profile {spec} is a directory, not a .toml file",
                               "name a profile file, or a shipped profile (see 'sbx profiles')")
        if not os.path.isfile(path):
            raise ProfileError(f"profile file {spec} does not exist",
                               "check the path, or name a shipped profile (see 'sbx profiles')")
        return path
    for directory in profile_dirs():
        candidate = os.path.join(directory, f"{spec}.toml")
        if os.path.isfile(candidate):
            return candidate
    names = ", ".join(sorted(list_profiles())) or "none found"
    raise ProfileError(f"no profile named {spec!r} (known: {names})",
                       "use one of the listed names, or a path to a .toml file")


def load_profile(spec: str) -> Profile:
    """Load, merge (``extends``) and validate a profile by name or path."""
    path = find_profile(spec)
    sources: list[str] = []
    merged = _load_merged(path, chain=(), sources=sources)
    data = _deep_merge(DEFAULTS, merged)
    data.pop("extends", None)
    name = os.path.basename(path)[:-5] if _looks_like_path(spec) and path.endswith(".toml") else spec
    return Profile(name=name, source=path, data=data, sources=tuple(sources))


def _load_merged(path: str, chain: tuple, sources: list[str]) -> dict:
    resolved = os.path.realpath(path)
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise ProfileError(f"profile {path}: 'extends' forms a cycle: {cycle}",
                           "make the chain of 'extends' end in a profile that extends nothing")
    sources.append(resolved)
    raw = _validated_raw(path)
    parent_spec = raw.get("extends")
    if parent_spec is None:
        return raw
    try:
        parent_path = find_profile(parent_spec, relative_to=os.path.dirname(path))
    except ProfileError as exc:
        line = _line_of(path, None, "extends")
        raise ProfileError(f"profile {path}{f':{line}' if line else ''}: extends = {parent_spec!r}: {exc.message}",
                           exc.remedy) from None
    parent = _load_merged(parent_path, (*chain, resolved), sources)
    return _deep_merge(parent, raw)


def _validated_raw(path: str) -> dict:
    """The file's validated tables; from the per-user cache when the file is unchanged.

    Parsing TOML costs a few milliseconds and every tool call pays it, so a file that
    validated once is cached by its path, inode, size and mtime.
    """
    from . import cache

    try:
        info = os.stat(path)
        name = "profile-" + cache.digest(f"{os.path.realpath(path)}|{info.st_ino}|{info.st_size}|"
                                         f"{info.st_mtime_ns}|{SCHEMA_VERSION}") + ".marshal"
    except OSError:
        name = None
    if name:
        stored = cache.read(name)
        if stored:
            try:
                raw = marshal.loads(stored)
                if isinstance(raw, dict):
                    _validate(raw, path, "")  # cheap; only the TOML parse is worth caching
                    return raw
            except (ValueError, EOFError, TypeError, ProfileError):
                pass  # malformed: parse the file again
    raw, text = _read_toml(path)
    _validate(raw, path, text)
    if name:
        cache.write(name, marshal.dumps(raw, 2))
    return raw


def _read_toml(path: str) -> tuple[dict, str]:
    import tomllib

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror}",
                           "check the file's permissions") from None
    except UnicodeDecodeError:
        raise ProfileError(f"profile {path} is not UTF-8 text", "save the profile as UTF-8") from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {path}: TOML syntax error: {exc}",
                           "fix the syntax at that line (see https://toml.io)") from None


def _validate(raw: dict, path: str, text: str) -> None:
    for key, value in raw.items():
        if key in SCHEMA:
            if not isinstance(value, dict):
                _fail(path, text, None, key, f"[{key}] must be a table")
            for sub, sub_value in value.items():
                _check(path, text, key, sub, sub_value)
        else:
            _check(path, text, None, key, value)


def _check(path: str, text: str, table: str | None, key: str, value: object) -> None:
    allowed = SCHEMA[table]
    where = f"[{table}] " if table else ""
    if key not in allowed:
        expected = ", ".join(sorted(k for k in allowed)) + (
            ", or a table: " + ", ".join(f"[{t}]" for t in SCHEMA if t) if table is None else "")
        _fail(path, text, table, key, f"unknown key {where}{key!r}; expected one of: {expected}")
    description, ok = allowed[key]
    if not ok(value):
        _fail(path, text, table, key, f"{where}{key} = {value!r} is invalid: expected {description}")


def _fail(path: str, text: str, table: str | None, key: str, message: str) -> None:
    line = find_key_line(text, table, key)
    at = f"{path}:{line}" if line else str(path)
    raise ProfileError(f"profile {at}: {message}", "fix that line; the README lists every profile key")


def _line_of(path: str, table: str | None, key: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            return find_key_line(f.read(), table, key)
    except (OSError, UnicodeDecodeError):
        return None


def locate_value(sources: tuple[str, ...], table: str, value: str) -> str:
    """"FILE:LINE" of the first profile file in ``sources`` whose ``[table]`` mentions
    ``value`` (for errors found after validation, such as an unknown syscall name)."""
    for path in sources:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        current = None
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("[") and not stripped.startswith("[["):
                current = stripped.strip("[]").strip()
            elif current == table and (f'"{value}"' in line or f"'{value}'" in line):
                return f"{path}:{number}"
    return sources[0] if sources else "the profile"


def find_key_line(text: str, table: str | None, key: str) -> int | None:
    """The line (1-based) where ``key`` is set inside ``[table]``, if it can be found."""
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            current = stripped.strip("[]").strip()
            if current == key and table is None:
                return number
            continue
        name = stripped.split("=", 1)[0].strip().strip('"') if "=" in stripped else None
        if name == key and current == table:
            return number
        if table and name == table:  # an inline table at top level
            return number
    return None


def _deep_merge(base: dict, over: dict) -> dict:
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key in SCHEMA:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged
