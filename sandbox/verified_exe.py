"""Verified-executable launch: the bytes whose hash was checked are the bytes that run.

The executable is resolved as exec would (PATH included, relative to the workdir), opened
once, and read through that one descriptor; the bytes read are hashed and, as they are
read, copied into a memfd that is then sealed against every change. On a match the memfd
is what runs (``fexecve`` in stage 2, a preserved descriptor with its close-on-exec flag
cleared by the preserved-file routine). The path is never opened again, so neither
replacing the file nor rewriting it in place after the check changes what runs; a ``#!``
script's interpreter reopens the script as ``/dev/fd/N``, which is the same sealed copy.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import stat
import string
from dataclasses import dataclass

from .errors import ExecutableDigestError
from .resolve import find_executable

DEFAULT_MAX_BYTES = 256 << 20  # the default --exe-max-mib

MFD_EXEC = 0x0010  # Linux 6.3+: ask for an executable memfd when vm.memfd_noexec is set
F_ADD_SEALS = 1033
SEALS = 0x0001 | 0x0002 | 0x0004 | 0x0008  # seal, shrink, grow, write


@dataclass
class VerifiedExecutable:
    path: str  # where it was found (for messages; never reopened)
    fd: int  # the sealed copy that runs
    interpreter: str | None = None  # what a #! line names (checked against the plan's writable mounts)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _new_memfd() -> int:
    # Safe: a fresh anonymous file owned by this process, close-on-exec until launch.
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        return os.memfd_create("sbx-verified-exe", flags | MFD_EXEC)
    except OSError:
        return os.memfd_create("sbx-verified-exe", flags)  # kernels before 6.3


def open_verified(name: str, expected_hex: str, search_path: str, workdir: str,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> VerifiedExecutable:
    """Resolve ``name`` (the one resolver, resolve.py), open it once without blocking,
    refuse anything but a regular file of at most ``max_bytes``, and hash it while copying
    it into a sealed memfd. Raises ExecutableDigestError, CommandNotFound/NotExecutable."""
    expected = expected_hex.strip().lower()
    if len(expected) != 64 or any(c not in string.hexdigits for c in expected):
        raise ExecutableDigestError(f"--exe-sha256 {expected_hex!r} is not 64 hexadecimal digits",
                                    "pass the SHA-256 as printed by 'sha256sum FILE'")
    path = find_executable(name, search_path, workdir)
    try:
        # O_NONBLOCK: a FIFO swapped in after the resolver's stat must not block the open.
        source = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise ExecutableDigestError(f"cannot open {path}: {exc.strerror}", "check the file's permissions") from None
    copy = -1
    try:
        info = os.fstat(source)  # the descriptor's file, not the path's
        if not stat.S_ISREG(info.st_mode):
            raise ExecutableDigestError(f"{path} is not a regular file (it changed after it was found?); nothing was run",
                                        "pass the path of the executable itself")
        if info.st_size > max_bytes:
            raise ExecutableDigestError(f"{path} is {info.st_size} bytes, over the {max_bytes}-byte limit for a verified "
                                        "executable; nothing was read", "raise --exe-max-mib (or [run] exe_max_mib)")
        copy = _new_memfd()
        digest = hashlib.sha256()
        total = 0
        while chunk := os.read(source, 1 << 20):
            total += len(chunk)
            if total > max_bytes:
                raise ExecutableDigestError(f"{path} grew past the {max_bytes}-byte limit while it was read; "
                                            "nothing was run", "check what is writing to it")
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(copy, view):]
        actual = digest.hexdigest()
        if not hmac.compare_digest(actual, expected):
            raise ExecutableDigestError(
                f"{path} has SHA-256 {actual}, not the expected {expected}; nothing was run",
                "check that the executable is the one you reviewed")
        os.fchmod(copy, 0o555)  # executable by the sandbox uid, which is not root for a root caller
        fcntl.fcntl(copy, F_ADD_SEALS, SEALS)
        os.lseek(copy, 0, os.SEEK_SET)
        interpreter = _interpreter(os.pread(copy, 256, 0))
        verified, copy = VerifiedExecutable(path, copy, interpreter), -1
        return verified
    except OSError as exc:
        raise ExecutableDigestError(f"cannot read {path} for verification: {exc.strerror}",
                                    "check the file and the descriptor limit") from None
    finally:
        os.close(source)
        if copy >= 0:
            os.close(copy)


def _interpreter(head: bytes) -> str | None:
    """The interpreter a ``#!`` line names (None for a binary)."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].strip()
    return os.fsdecode(line.split()[0]) if line else ""
