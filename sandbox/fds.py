"""Descriptor flags in the parent: the preserved-file routine and the memfds a launch hands over.

This is the parent's side only; the child's hygiene is stage 2's first step (stage2.c).
"""

from __future__ import annotations

import errno
import fcntl
import os


class FdFlagError(Exception):
    """fcntl on a preserved descriptor failed; the message is the one users see."""

    def __init__(self, fd: int, err: int, reading: bool):
        what = "read fd flags for" if reading else "clear close-on-exec for"
        super().__init__(f"failed to {what} preserved file descriptor {fd}: {os.strerror(err)}")
        self.fd = fd
        self.errno = err


def clear_cloexec(fd: int, fcntl_fn=fcntl.fcntl) -> bool:
    """Make ``fd`` survive exec, exactly as Codex's ``clear_cloexec`` does.

    Read the flags; a failure (typically EBADF: closed or dropped too early) is an error
    naming the fd. If FD_CLOEXEC is already clear, make no second call. Otherwise clear
    it and report a failure the same way. Never reopen anything as a fallback. Returns
    whether the flag was changed.
    Safe wherever it runs: it only touches the descriptor flag of an fd the caller
    declared as its own to pass on.
    """
    try:
        flags = fcntl_fn(fd, fcntl.F_GETFD)
    except OSError as exc:
        raise FdFlagError(fd, exc.errno or errno.EBADF, reading=True) from None
    except OverflowError:  # not even a C int: no such descriptor can exist
        raise FdFlagError(fd, errno.EBADF, reading=True) from None
    if flags < 0:
        raise FdFlagError(fd, errno.EBADF, reading=True)
    cleared = flags & ~fcntl.FD_CLOEXEC
    if cleared == flags:
        return False
    try:
        result = fcntl_fn(fd, fcntl.F_SETFD, cleared)
    except OSError as exc:
        raise FdFlagError(fd, exc.errno or errno.EBADF, reading=False) from None
    if result < 0:
        raise FdFlagError(fd, errno.EBADF, reading=False)
    return True


def make_files_inheritable(fds, fcntl_fn=fcntl.fcntl) -> list:
    """clear_cloexec on each fd; returns the fds whose flag was changed."""
    return [fd for fd in fds if clear_cloexec(fd, fcntl_fn)]


def restore_cloexec(fds) -> None:
    # Safe: only fds whose flag make_files_inheritable cleared, set back once the child
    # has its copies (pass_fds makes them inheritable in that child regardless), so the
    # caller's other subprocesses do not inherit them from here on.
    for fd in fds:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.fcntl(fd, fcntl.F_GETFD) | fcntl.FD_CLOEXEC)
        except OSError:
            pass


def memfd_with(name: str, data: bytes) -> int:
    # Safe: a fresh anonymous file owned by this process, close-on-exec until passed.
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
