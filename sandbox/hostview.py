"""What the planner needs to know about this host's filesystem, gathered in one place.

Planning stays pure by taking a ``HostView`` as input: which paths exist and of what
kind, where the merged-usr links point, which interpreters could run stage 2. This module
is the only one that looks; tests build ``HostView`` values by hand.
"""

from __future__ import annotations

import os
import sys
from collections import namedtuple

MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEFAULT_STAGE2_PYTHONS = ("/usr/bin/python3",)


class HostPath(namedtuple("HostPath", "kind target real is_dir", defaults=("", "", False))):
    """kind: dir, file, symlink, missing or other; target: a link's text; real: realpath;
    is_dir: after following links."""

    __slots__ = ()


class HostView(namedtuple("HostView", "paths python_candidates uid gid", defaults=((), 0, 0))):
    """The host facts planning needs: every path it asks about, interpreters for stage 2, ids."""

    __slots__ = ()

    def kind(self, path: str) -> str:
        return self.paths[path].kind if path in self.paths else "missing"


def inspect_path(path: str) -> HostPath:
    try:
        info = os.lstat(path)
    except OSError:
        return HostPath("missing")
    import stat

    if stat.S_ISLNK(info.st_mode):
        real = os.path.realpath(path)
        kind = "symlink" if os.path.exists(real) else "missing"
        return HostPath(kind, os.readlink(path), real, os.path.isdir(real))
    if stat.S_ISDIR(info.st_mode):
        return HostPath("dir", real=path, is_dir=True)
    if stat.S_ISREG(info.st_mode) or stat.S_ISCHR(info.st_mode):
        return HostPath("file", real=path)
    return HostPath("other", real=path)


def observe(paths) -> HostView:
    seen = {p: inspect_path(p) for p in dict.fromkeys(paths)}
    pythons = [os.path.realpath(sys.executable)]
    pythons += [os.path.realpath(p) for p in DEFAULT_STAGE2_PYTHONS if os.path.exists(p)]
    return HostView(paths=seen, python_candidates=tuple(dict.fromkeys(pythons)),
                    uid=os.getuid(), gid=os.getgid())
