"""What the planner needs to know about this host's filesystem, gathered in one place.

Planning stays pure by taking a ``HostView`` as input: which paths exist and of what
kind, where the merged-usr links point, which interpreters could run stage 2, and which
host paths sbx itself trusts on later runs (``protected``). This module is the only one
that looks; tests build ``HostView`` values by hand.
"""

from __future__ import annotations

import os
from collections import namedtuple

MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
STAGE2_HELPER = "sbx-stage2"  # built into the package by setup.py from stage2.c


class HostPath(namedtuple("HostPath", "kind target real is_dir chain clean_parent",
                          defaults=("", "", False, (), True))):
    """kind: dir, file, symlink, missing or other; target: a link's text; real: realpath;
    is_dir: after following links; chain: the (st_dev, st_ino) of ``real`` and of each of
    its ancestors up to ``/`` -- for a missing path, of its deepest existing ancestor up;
    clean_parent: the directory holding it is reached without any symlink."""

    __slots__ = ()


class Protected(namedtuple("Protected", "label path chain exists tree", defaults=(True,))):
    """A host path no writable bind may overlap: what a later sbx run trusts (its package,
    venv, profiles, cache, bwrap) and the system directories.

    ``chain`` as for ``HostPath``; ``exists`` says whether ``chain[0]`` is the path itself;
    ``tree``: what lies beneath is protected too (False for /home, /tmp: only themselves).
    Comparing (st_dev, st_ino) rather than strings also catches a path reached through
    another bind mount or a symlinked ancestor.
    """

    __slots__ = ()


class HostView(namedtuple("HostView", "paths stage2_helper uid gid protected listings",
                          defaults=("", 0, 0, (), {}))):
    """The host facts planning needs: every path it asks about, where the stage 2 helper
    is ("" when missing), ids, the paths no writable bind may overlap, and (for
    KernelNoNamespaces, see landlock_view.py) directory listings: path -> ((name, kind), ...)
    with kind dir, file, symlink or other, never following a link; a directory that could
    not be listed is absent."""

    __slots__ = ()

    def kind(self, path: str) -> str:
        return self.paths[path].kind if path in self.paths else "missing"


def identity_chain(real: str) -> tuple[tuple[int, int], ...]:
    """(st_dev, st_ino) of ``real`` (or its deepest existing ancestor) and every ancestor."""
    chain = []
    path = real
    while True:
        try:
            info = os.stat(path)
        except OSError:
            info = None
        if info is not None:
            chain.append((info.st_dev, info.st_ino))
        parent = os.path.dirname(path)
        if parent == path:
            return tuple(chain)
        path = parent


def inspect_path(path: str) -> HostPath:
    try:
        return _inspect(path)
    except (OSError, ValueError):  # unreadable (a /proc link of another process), unencodable, ...
        return HostPath("missing")


def _inspect(path: str) -> HostPath:
    try:
        info = os.lstat(path)
    except (OSError, ValueError):
        return HostPath("missing")
    import stat

    real = os.path.realpath(path)
    chain = identity_chain(real)
    if stat.S_ISLNK(info.st_mode):
        kind = "symlink" if os.path.exists(real) else "missing"
        parent = os.path.dirname(os.path.normpath("/" + path.lstrip("/")))
        return HostPath(kind, os.readlink(path), real, os.path.isdir(real), chain,
                        os.path.realpath(parent) == parent)
    if stat.S_ISDIR(info.st_mode):
        return HostPath("dir", real=real, is_dir=True, chain=chain)
    if stat.S_ISREG(info.st_mode) or stat.S_ISCHR(info.st_mode):
        return HostPath("file", real=real, chain=chain)
    return HostPath("other", real=real, chain=chain)


def protect(label: str, path: str, tree: bool = True) -> Protected:
    real = os.path.realpath(path)
    return Protected(label, real, identity_chain(real), os.path.lexists(real), tree)


def observe(paths, protected=(), listing_dirs=()) -> HostView:
    helper = stage2_helper_path()
    seen = {p: inspect_path(p) for p in dict.fromkeys([*paths, helper])}
    listings = {}
    for directory in listing_dirs:
        entries = list_directory(directory)
        if entries is not None:
            listings[directory] = entries
    return HostView(paths=seen, stage2_helper=helper if os.access(helper, os.X_OK) else "",
                    uid=os.getuid(), gid=os.getgid(), protected=tuple(protected), listings=listings)


def list_directory(path: str) -> tuple[tuple[str, str], ...] | None:
    """(name, kind) of each entry of ``path``, links not followed; None when it cannot be
    listed or is not a directory reached without a symlink (then nothing beneath is granted)."""
    try:
        if os.path.realpath(path) != os.path.normpath(path):
            return None
        out = []
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_symlink():
                    kind = "symlink"
                elif entry.is_dir(follow_symlinks=False):
                    kind = "dir"
                elif entry.is_file(follow_symlinks=False):
                    kind = "file"
                else:
                    kind = "other"
                out.append((entry.name, kind))
        return tuple(sorted(out))
    except (OSError, ValueError):
        return None


def stage2_helper_path() -> str:
    """The installed stage 2 helper's canonical path (it may be missing)."""
    return os.path.join(os.path.dirname(os.path.realpath(__file__)), STAGE2_HELPER)
