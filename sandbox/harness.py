"""The one harness that runs sbx and probes as a given user: ``sbx verify`` and the test
suite both use it, so what the suite proves is what ``verify`` proves on a user's host.

A ``User`` is an interpreter, an environment, the directory sbx is imported from, and a uid
to switch to with ``setpriv`` (None: stay who we are). Every Python it starts is isolated
from the cwd and the environment (``integrity.isolated_python``) and runs from ``/``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from .integrity import CLI_MAIN, isolated_python

UNPRIV_UID = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # reachable by every uid


class User:
    """How to run things as one user: the interpreter, the environment, the wrapper."""

    def __init__(self, label: str, python: str, env: dict, import_root: str, uid: int | None = None) -> None:
        self.label, self.python, self.env, self.import_root, self.uid = label, python, env, import_root, uid

    def __repr__(self) -> str:
        return f"User({self.label!r}, uid={self.uid})"

    def replace(self, **changes: object) -> User:
        fields = {"label": self.label, "python": self.python, "env": self.env, "import_root": self.import_root,
                  "uid": self.uid, **changes}
        return User(**fields)  # type: ignore[arg-type]

    def python_argv(self, code: str, *args: str) -> list[str]:
        """This user's Python running ``code``, isolated from the cwd and the environment."""
        return [*isolated_python(self.python, self.import_root, code), *args]

    def argv(self, *sbx_args: str) -> list[str]:
        """The sbx command line as this user (before any ``setpriv``)."""
        return self.python_argv(CLI_MAIN, *sbx_args)

    def wrap(self, argv: list[str], fds: str = "") -> list[str]:
        """``fds`` is a shell redirection run first in a child, e.g. ``exec 7</etc/hostname``
        (fd 7 open and inheritable) or ``exec 9<&-``; the caller's own fds stay untouched."""
        if fds:
            argv = ["/bin/bash", "-c", f'{fds}; exec "$@"', "bash", *argv]
        if self.uid is None:
            return argv
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--", *argv]

    def run_argv(self, argv: list[str], *, fds: str = "", pass_fds=(), cwd: str | None = None, timeout: float = 120,
                 input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.wrap(argv, fds), capture_output=True, text=True, pass_fds=pass_fds,
                              cwd=cwd, env=self.env if env is None else env, timeout=timeout, input=input)

    def run(self, *sbx_args: str, **kwargs) -> subprocess.CompletedProcess:
        """Run sbx with ``sbx_args`` (keyword arguments as for ``run_argv``)."""
        return self.run_argv(self.argv(*sbx_args), **kwargs)

    def workdir(self, parent: str | Path = "/tmp") -> Path:
        """A fresh directory this user owns, under ``parent``."""
        path = Path(tempfile.mkdtemp(prefix=f"sbx-work-{self.label}-", dir=str(parent)))
        path.chmod(0o755)
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)
        return path
