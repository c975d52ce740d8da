"""The one command resolver: execvp's rules, as stage 2 applies them inside the sandbox.

Stage 2 (stage2.c) resolves a plain run's command inside the sandbox; a verified run must
find its file on the host first, to hash it. Both follow these rules, on the sandbox's
PATH (the profile's, or ``/usr/local/bin:/usr/bin:/bin`` when it sets none): a name with a
``/`` is a path (relative to the workdir); otherwise each PATH entry in order (an empty one
is the workdir); a directory, or a file without execute permission, is passed over (an
execute-less one is remembered: 126 if nothing else is found); nothing: 127. A test runs
both resolvers on the same layouts and compares.
"""

from __future__ import annotations

import os
import stat

from .errors import CommandNotExecutable, CommandNotFound


def find_executable(name: str, search_path: str, workdir: str) -> str:
    """The file ``name`` resolves to; CommandNotFound (127) or CommandNotExecutable (126)."""
    if not name:
        raise CommandNotFound("an empty command name: command not found")
    if "/" in name:
        candidates = [os.path.join(workdir, name)]
    else:
        candidates = [os.path.join(directory or workdir, name) for directory in search_path.split(":")]
    not_executable = None
    for candidate in candidates:
        try:
            info = os.stat(candidate)
        except (OSError, ValueError):
            continue
        if stat.S_ISDIR(info.st_mode):
            continue
        if os.access(candidate, os.X_OK) and stat.S_ISREG(info.st_mode):
            return candidate
        not_executable = not_executable or candidate
    if not_executable:
        raise CommandNotExecutable(f"{not_executable}: permission denied")
    raise CommandNotFound(f"{name}: command not found (searched {search_path or 'nothing'})")
