# Sourced by scripts/sbx and scripts/test: make sure bubblewrap, a C compiler (stage 2 is a
# small C program built at install time), python3 with venv, and a virtual environment with
# sbx installed exist. As root it installs the Debian/Ubuntu packages; as anyone else it
# prints the exact command and stops (exit 125). Sets SBX_VENV to the environment's directory.
#
# sbx is installed into the venv as a regular (not editable) package: an editable install
# puts an import finder in front of every interpreter start. The install is redone when a
# source file is newer than the last one.

sbx_repo=$(cd "$(dirname "$0")/.." && pwd)
SBX_VENV=${SBX_VENV:-$sbx_repo/.venv}
# The system interpreter: reachable by every uid.
sbx_python=/usr/bin/python3
[ -x "$sbx_python" ] || sbx_python=$(command -v python3 || true)

sbx_missing=""
[ -n "$sbx_python" ] || sbx_missing="$sbx_missing python3"
command -v bwrap >/dev/null 2>&1 || sbx_missing="$sbx_missing bubblewrap"
if [ -n "$sbx_python" ] && ! "$sbx_python" -I -c 'import ensurepip, venv' >/dev/null 2>&1; then
  sbx_missing="$sbx_missing python3-venv"
fi
command -v setpriv >/dev/null 2>&1 || sbx_missing="$sbx_missing util-linux"
command -v cc >/dev/null 2>&1 && [ -e /usr/include/stdio.h ] || sbx_missing="$sbx_missing gcc libc6-dev"
# The test suite (scripts/test sets SBX_BOOTSTRAP_TESTS) also runs some of CPython's own tests.
if [ -n "${SBX_BOOTSTRAP_TESTS:-}" ] && [ -n "$sbx_python" ] && ! "$sbx_python" -I -c 'import test.test_selectors' >/dev/null 2>&1; then
  sbx_missing="$sbx_missing libpython$("$sbx_python" -I -c 'import sys; print("%d.%d" % sys.version_info[:2])')-testsuite"
fi
if [ -n "$sbx_missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "sbx: installing:$sbx_missing" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $sbx_missing >&2
    [ -n "$sbx_python" ] || sbx_python=/usr/bin/python3
  else
    echo "sbx: error: bootstrap: missing system packages:$sbx_missing" >&2
    echo "sbx: remedy: sudo apt-get install -y$sbx_missing" >&2
    exit 125
  fi
fi

sbx_stamp="$SBX_VENV/.sbx-installed"
sbx_stale() {
  [ ! -x "$SBX_VENV/bin/sbx" ] || [ ! -f "$sbx_stamp" ] && return 0
  [ -n "$(find "$sbx_repo/sandbox" "$sbx_repo/profiles" "$sbx_repo/pyproject.toml" "$sbx_repo/setup.py" \
          -newer "$sbx_stamp" -not -name '*.pyc' -print -quit 2>/dev/null)" ]
}
if sbx_stale; then
  echo "sbx: preparing $SBX_VENV" >&2
  [ -x "$SBX_VENV/bin/python" ] || "$sbx_python" -I -m venv "$SBX_VENV" >&2
  touch "$sbx_stamp.new"
  # cd /: pip builds from the named directory only, and nothing in the caller's one is read.
  (cd / && "$SBX_VENV/bin/python" -I -m pip install -q --disable-pip-version-check \
      "$sbx_repo[test]" >&2) || exit 125
  rm -rf "$sbx_repo/build" "$sbx_repo"/*.egg-info
  # setuptools' distutils-precedence.pth would run at every start of the sbx command;
  # builds use pip's isolated build environment, so the venv does not need it.
  "$SBX_VENV/bin/python" -I -m pip uninstall -q -y setuptools >/dev/null 2>&1 || true
  mv "$sbx_stamp.new" "$sbx_stamp"
fi
