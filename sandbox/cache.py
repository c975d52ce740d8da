"""A per-user cache for compiled seccomp programs, host probe results and validated profiles.

What is cached decides what later runs enforce, so it lives only where no sandbox can
write: the planner refuses every writable bind that overlaps any candidate directory
below (see ``integrity.py``). On top of that, only a directory this user owns, that
nobody else can write to and that is not a symlink is used; files are opened with
O_NOFOLLOW, must be owned by this user, and are replaced atomically; readers check the
form of what they read and recompute when it is wrong. When no safe directory exists,
nothing is cached (correct, slower). Directories are created only below a ``$HOME`` or
``$XDG_CACHE_HOME`` that already exists.
"""

from __future__ import annotations

import os
import stat

CACHE_DIR_ENV = "SBX_CACHE_DIR"
_checked: dict[str, str | None] = {}


def digest(text: str) -> str:
    """A SHA-256 hex prefix for cache file names, without importing hashlib (OpenSSL)."""
    try:
        from _sha256 import sha256  # Python 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # Python 3.12+
        except ImportError:
            from hashlib import sha256
    return sha256(text.encode()).hexdigest()[:32]


def candidates() -> list[str]:
    """The directories the cache may use, first choice first. Relative settings are
    ignored: they would name a directory relative to whatever the current one is."""
    explicit = os.environ.get(CACHE_DIR_ENV, "")
    if explicit:
        return [explicit] if os.path.isabs(explicit) else []
    found = []
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    home = os.environ.get("HOME", "")
    if os.path.isabs(xdg):
        found.append(os.path.join(xdg, "sbx"))
    elif os.path.isabs(home):
        found.append(os.path.join(home, ".cache", "sbx"))
    found.append(f"/tmp/sbx-cache-{os.geteuid()}")
    return found


def every_candidate() -> list[str]:
    """Every directory any run of this user might use as its cache, whatever this run's
    environment selects: a run with XDG_CACHE_HOME set elsewhere must not make the
    ~/.cache/sbx that a later run without it reads writable (integrity.py protects all)."""
    import pwd

    found = [d for d in (os.environ.get(CACHE_DIR_ENV, ""),) if os.path.isabs(d)]
    for base in (os.environ.get("XDG_CACHE_HOME", ""),):
        if os.path.isabs(base):
            found.append(os.path.join(base, "sbx"))
    homes = {os.environ.get("HOME", "")}
    try:
        homes.add(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    found += [os.path.join(home, ".cache", "sbx") for home in homes if os.path.isabs(home)]
    found.append(f"/tmp/sbx-cache-{os.geteuid()}")
    return list(dict.fromkeys(found))


def _make(path: str) -> None:
    """Create ``path`` and at most its parent (``~/.cache``), never a missing home."""
    parent = os.path.dirname(path)
    if not os.path.isdir(os.path.dirname(parent)):
        raise FileNotFoundError(parent)
    try:
        os.mkdir(parent, 0o700)
    except FileExistsError:
        pass
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def _safe_dir(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def cache_dir() -> str | None:
    key = os.environ.get(CACHE_DIR_ENV, "") + "|" + os.environ.get("XDG_CACHE_HOME", "") + "|" + os.environ.get("HOME", "")
    if key in _checked:
        return _checked[key]
    chosen = None
    for path in candidates():
        try:
            _make(path)
        except OSError:
            continue
        if _safe_dir(path):
            chosen = path
            break
    _checked[key] = chosen
    return chosen


def read(name: str) -> bytes | None:
    directory = cache_dir()
    if directory is None:
        return None
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write(name: str, data: bytes) -> None:
    directory = cache_dir()
    if directory is None:
        return
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, os.path.join(directory, name))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
