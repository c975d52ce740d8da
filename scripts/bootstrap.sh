# Sourced by scripts/sbx and scripts/test: make sure bubblewrap, python3 with venv, and a
# virtual environment with sbx installed exist. As root it installs the Debian/Ubuntu
# packages; as anyone else it prints the exact command and stops (exit 125).
# Sets SBX_VENV to the environment's directory.

sbx_repo=$(cd "$(dirname "$0")/.." && pwd)
SBX_VENV=${SBX_VENV:-$sbx_repo/.venv}
# The system interpreter: /usr is visible inside the strict profile and to every uid.
sbx_python=/usr/bin/python3
[ -x "$sbx_python" ] || sbx_python=$(command -v python3 || true)

sbx_missing=""
[ -n "$sbx_python" ] || sbx_missing="$sbx_missing python3"
command -v bwrap >/dev/null 2>&1 || sbx_missing="$sbx_missing bubblewrap"
if [ -n "$sbx_python" ] && ! "$sbx_python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  sbx_missing="$sbx_missing python3-venv"
fi
command -v setpriv >/dev/null 2>&1 || sbx_missing="$sbx_missing util-linux"
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
if [ ! -x "$SBX_VENV/bin/sbx" ] || [ ! -f "$sbx_stamp" ] || [ "$sbx_repo/pyproject.toml" -nt "$sbx_stamp" ]; then
  echo "sbx: preparing $SBX_VENV" >&2
  "$sbx_python" -I -m venv "$SBX_VENV" >&2
  "$SBX_VENV/bin/python" -I -m pip install -q --disable-pip-version-check -e "$sbx_repo[test]" >&2
  touch "$sbx_stamp"
fi
