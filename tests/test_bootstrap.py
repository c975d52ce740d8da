"""The quick start's bootstrap: as a user without the system packages it prints the exact
command and stops, before touching anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from conftest import REPO, UNPRIV_UID


def test_missing_packages_as_a_user_print_the_install_command():
    home = Path(tempfile.mkdtemp(prefix="sbx-bootstrap-", dir="/tmp"))
    try:
        shutil.copytree(REPO / "scripts", home / "scripts")
        bin_dir = home / "bin"  # a PATH with the basics but without bwrap and setpriv
        bin_dir.mkdir()
        for tool in ("sh", "dirname", "id", "cat", "touch"):
            os.symlink(shutil.which(tool), bin_dir / tool)
        for path in [home, *home.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755)
        result = subprocess.run([shutil.which("setpriv"), f"--reuid={UNPRIV_UID}", f"--regid={UNPRIV_UID}", "--clear-groups",
                                 "--", str(home / "scripts" / "sbx"), "run", "--", "true"],
                                capture_output=True, text=True, env={"PATH": str(bin_dir), "HOME": str(home)})
        assert result.returncode == 125, result.stderr
        lines = result.stderr.strip().splitlines()
        assert lines[0].startswith("sbx: error: bootstrap: missing system packages:")
        assert "bubblewrap" in lines[0] and "util-linux" in lines[0]
        assert lines[1].startswith("sbx: remedy: sudo apt-get install -y") and "bubblewrap" in lines[1]
        assert not (home / ".venv").exists()  # nothing was created
    finally:
        shutil.rmtree(home, ignore_errors=True)
