"""Bind sources pinned by descriptor: what bwrap mounts is exactly what the planner checked.

The planner checks canonical paths (no symlink anywhere, not a system directory, not a
protected path) and records each source's (st_dev, st_ino). Between that check and the
mount, a sandbox running meanwhile could swap a component of a path it can write for a
symlink. So at launch each source is opened again one component at a time without
following any link, its identity compared with the one checked, and the descriptor handed
to bwrap (``--bind-fd``/``--ro-bind-fd``): bwrap never resolves the path itself.
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import SetupError

_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY
_LEAF_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def open_pinned(path: str, identity: tuple[int, int], optional: bool = False) -> int | None:
    """An O_PATH descriptor on canonical ``path`` if it is still the object checked.

    Safe where it runs (the parent, before spawning): O_PATH opens nothing for reading, and
    O_NOFOLLOW on every component means no symlink is ever followed. Returns None for an
    optional source that has gone; raises SetupError for anything else that changed.
    """
    parts = [p for p in path.split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    try:
        for index, part in enumerate(parts):
            flags = _LEAF_FLAGS if index == len(parts) - 1 else _DIR_FLAGS
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if optional and exc.errno == errno.ENOENT:
                    return None
                why = "a symlink appeared in it" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
                raise SetupError(f"bind source {path} changed after sbx checked it ({why}); nothing was run",
                                 "something is rewriting that path: find out what before running again") from None
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if stat.S_ISLNK(info.st_mode) or (info.st_dev, info.st_ino) != tuple(identity):
            raise SetupError(f"bind source {path} is no longer the file sbx checked; nothing was run",
                             "something is replacing that path: find out what before running again")
        pinned, fd = fd, -1
        return pinned
    finally:
        if fd >= 0:
            os.close(fd)


def open_directory(path: str) -> int:
    """An O_PATH descriptor on the directory ``path`` (absolute, already normalised), walked
    one component at a time without following any symlink: OSError (ELOOP or ENOTDIR) if one
    is in the way. For a file sbx itself writes on the host (``--net-log``), whose directory
    an earlier sandbox may have planted a link in."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in (p for p in path.split("/") if p):
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        opened, fd = fd, -1
        return opened
    finally:
        if fd >= 0:
            os.close(fd)
