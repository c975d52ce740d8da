"""KernelNoNamespaces: the private temp directory that stands in for the tmpfs mounts.

``create`` makes it (``mkdtemp``: mode 0700, owned by the caller, under /tmp); the plan
names it ``landlock_view.PRIVATE_TMP`` until ``substitute`` puts the real path in the
Landlock rules and the environment (TMPDIR). ``remove`` deletes it when the sandbox ends,
on every path (launch.SandboxStatus.close, PreparedLaunch.discard, a failed prepare).

The sandbox owned it, so removal assumes the worst of what is inside: every step is
relative to a descriptor of a directory opened with O_NOFOLLOW, so a symlink is unlinked,
never followed (not even by chmod); a directory the command made unwritable or unreadable
(mode 0, 0500) is given back its owner's rights through its own descriptor before it is
emptied; a tree deeper than a bound is taken apart from the top in passes, never by
recursion as deep as the command made it. Removal is best effort and never raises: what
cannot be removed (a process that escaped the kill and keeps writing) is left in place.
"""

from __future__ import annotations

import os
import secrets
import tempfile

from .landlock_view import PRIVATE_TMP

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def create() -> str:
    return tempfile.mkdtemp(prefix="sbx-tmp-", dir="/tmp" if os.path.isdir("/tmp") else None)


def substitute(plan, path: str):
    """``plan`` with the private directory's real path in place of the marker."""
    env = {k: (path if v == PRIVATE_TMP else v) for k, v in plan.env.items()}
    landlock = plan.landlock._replace(rules=tuple((path if p == PRIVATE_TMP else p, bits, optional)
                                                  for p, bits, optional in plan.landlock.rules))
    return plan._replace(env=env, landlock=landlock)


def _open_dir(name: str, dir_fd: int | None) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        # Mode 0 (or 0300): take our rights back through an O_PATH descriptor of the
        # directory itself; /proc/self/fd/N names exactly that object, never a link.
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        finally:
            os.close(path_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


_MAX_DEPTH = 64  # well below Python's recursion limit and the descriptor limit
_MAX_PASSES = 100_000


def _empty(top_fd: int) -> None:
    """Remove everything below ``top_fd``, however deep: a directory found at _MAX_DEPTH is
    moved (renameat, relative to descriptors, so nothing is followed) up to the top and
    emptied on a later pass, so neither the recursion nor the open descriptors grow with the
    depth the command chose."""
    for _ in range(_MAX_PASSES):
        if not _empty_tree(top_fd, top_fd, 0):
            return
    raise OSError("the private temp directory keeps growing")


def _empty_tree(dir_fd: int, top_fd: int, depth: int) -> bool:
    """Empty ``dir_fd``; True when something was hoisted to the top for another pass."""
    hoisted = False
    os.fchmod(dir_fd, 0o700)  # unlinking inside needs write and search on the directory
    for entry in list(os.scandir(dir_fd)):
        try:
            os.unlink(entry.name, dir_fd=dir_fd)  # files, links (never followed), sockets, FIFOs
            continue
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            pass
        except PermissionError:  # EPERM from unlink: a directory
            pass
        if depth >= _MAX_DEPTH:
            os.rename(entry.name, f".sbx-hoisted-{secrets.token_hex(8)}", src_dir_fd=dir_fd, dst_dir_fd=top_fd)
            hoisted = True
            continue
        child = _open_dir(entry.name, dir_fd)
        try:
            hoisted |= _empty_tree(child, top_fd, depth + 1)
        finally:
            os.close(child)
        os.rmdir(entry.name, dir_fd=dir_fd)
    return hoisted


def remove(path: str) -> None:
    for _ in range(3):  # a process still writing there can win a round; it cannot win every one
        try:
            top = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            return
        except OSError:
            return
        try:
            _empty(top)
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except (OSError, RecursionError):
            continue
        finally:
            os.close(top)
