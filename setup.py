"""Builds stage 2, the small C helper that runs first inside every sandbox.

Everything else is in pyproject.toml. The helper is a program, not an extension module:
``build_py`` compiles ``sandbox/stage2.c`` into the package as ``sandbox/sbx-stage2``, so
every install (wheel, ``pip install .``) carries a helper built for its machine.
"""

import os
import shlex
import subprocess
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

STAGE2_SOURCE = os.path.join("sandbox", "stage2.c")
STAGE2_NAME = "sbx-stage2"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong"]


def compile_stage2(output: str) -> None:
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")[:1] or ["cc"]
    extra = shlex.split(os.environ.get("SBX_STAGE2_CFLAGS", ""))
    argv = [*compiler, *CFLAGS, *extra, "-o", output, STAGE2_SOURCE]
    try:
        subprocess.run(argv, check=True)
    except FileNotFoundError:
        raise SystemExit(f"sbx: building stage 2 needs a C compiler ({compiler[0]} not found): "
                         "apt-get install gcc libc6-dev") from None
    os.chmod(output, 0o755)


class BuildWithStage2(build_py):
    def run(self) -> None:
        super().run()
        target = os.path.join(self.build_lib, "sandbox", STAGE2_NAME)
        self.mkpath(os.path.dirname(target))
        compile_stage2(target)


class PlatformDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # a compiled helper: the wheel is for this platform
        return True


setup(cmdclass={"build_py": BuildWithStage2}, distclass=PlatformDistribution)
