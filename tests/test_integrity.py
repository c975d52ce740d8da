"""What a sandboxed command cannot touch: sbx's cache, its own installation, the cwd of
its host-side Python, the bwrap it runs. Each attack is tried for real, next to a control
that shows the same payload lands (and would be trusted) where sbx allows the write; the
run after every attack is checked to be fully enforced. As root and as uid 65534."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, SYSTEM_PYTHON, fresh_dir_with, parse_json_line, verbose_tier

# What a later run must still enforce: seccomp (Seccomp: 2, ptrace refused with EPERM where
# the kernel itself answers ESRCH), no_new_privs, and Landlock (a preserved directory fd
# cannot be read through, which the mount view alone would allow).
ENFORCEMENT_PROBE = r"""
import ctypes, json
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
libc = ctypes.CDLL(None, use_errno=True)
ctypes.set_errno(0)
rc = libc.syscall(ctypes.c_long(101), ctypes.c_long(16), ctypes.c_long(0x7FFFFFF0), ctypes.c_long(0), ctypes.c_long(0))
try:
    open("/proc/self/fd/8/secret").read()
    landlock = "read"
except OSError as exc:
    landlock = exc.strerror
print(json.dumps({"seccomp": status["Seccomp"].strip(), "nnp": status["NoNewPrivs"].strip(),
                  "ptrace_errno": ctypes.get_errno() if rc == -1 else 0, "landlock": landlock}))
"""
EPERM, ESRCH = 1, 3


def as_user(runner, argv: list[str], **kw) -> subprocess.CompletedProcess:
    if runner.uid is not None:
        argv = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.uid}", "--clear-groups", "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def owned_dir(runner, prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    if runner.uid is not None:
        os.chown(path, runner.uid, runner.uid)
    return path


def with_env(runner, **changes):
    env = {k: v for k, v in runner.env.items() if k not in changes}
    env.update({k: v for k, v in changes.items() if v is not None})
    return runner.replace(env=env)


@pytest.fixture(scope="module")
def secret_dir():
    path = fresh_dir_with("sbx-integrity-secret-", {"secret": ("secret\n", 0o644)})
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def enforcement(runner, secret_dir):
    """Returns a check that a run is fully enforced. Its control runs first: the probe outside
    sbx, as the same user, sees no seccomp, the kernel's own ESRCH and a readable secret, so
    the probe is able to see each layer missing."""
    outside = as_user(runner, ["/bin/sh", "-c", f'exec 8<{secret_dir}; exec "$@"', "sh",
                               SYSTEM_PYTHON, "-I", "-S", "-c", ENFORCEMENT_PROBE])
    seen = parse_json_line(outside.stdout)
    assert (seen["seccomp"], seen["ptrace_errno"], seen["landlock"]) == ("0", ESRCH, "read"), seen

    def check(checked_runner=None) -> None:
        checked_runner = checked_runner or runner
        workdir = owned_dir(runner, "sbx-integrity-next-")
        result = checked_runner.run("run", "--verbose", "--workdir", str(workdir), "--preserve-fd", "8", "--",
                                    "python3", "-I", "-S", "-c", ENFORCEMENT_PROBE, fds=f"exec 8<{secret_dir}")
        assert result.returncode == 0, result.stderr
        assert verbose_tier(result.stderr) == "KernelFull"
        assert "bwrap /usr/bin/bwrap)" in result.stderr
        inside = parse_json_line(result.stdout)
        assert inside == {"seccomp": "2", "nnp": "1", "ptrace_errno": EPERM, "landlock": "Permission denied"}

    return check


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


POISON = "for f in $(find {cache} -type f); do printf forged > \"$f\"; done; echo poisoned > {cache}/poisoned"


def assert_refused(result: subprocess.CompletedProcess, code: str, *fragments: str) -> None:
    assert result.returncode == 125, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"sbx: error: {code}: "), result.stderr
    assert lines[1].startswith("sbx: remedy: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.stderr


def poison_setups(runner):
    """(name, runner with the environment of the setup, the cache dir, the workdir that holds it)."""
    home = owned_dir(runner, "sbx-integrity-home-")
    yield "workdir is $HOME and holds the cache", with_env(runner, HOME=str(home), XDG_CACHE_HOME=None,
                                                           SBX_CACHE_DIR=None), home / ".cache" / "sbx", home
    work = owned_dir(runner, "sbx-integrity-work-")
    yield "SBX_CACHE_DIR inside the workdir", with_env(runner, SBX_CACHE_DIR=str(work / "cache")), work / "cache", work
    uid = runner.uid if runner.uid is not None else os.geteuid()
    yield ("--workdir /tmp with the /tmp fallback", with_env(runner, HOME="/nonexistent-sbx-home", XDG_CACHE_HOME=None,
                                                             SBX_CACHE_DIR=None), Path(f"/tmp/sbx-cache-{uid}"), Path("/tmp"))


def test_a_sandbox_cannot_poison_the_cache_in_any_setup(runner, enforcement):
    for name, setup, cache, workdir in poison_setups(runner):
        # The cache exists and is in use: a first, ordinary run fills it.
        first = setup.run("run", "--workdir", str(owned_dir(runner, "sbx-integrity-fill-")), "--", "true")
        assert first.returncode == 0, (name, first.stderr)
        assert any(cache.glob("host-*.marshal")) and any(cache.glob("seccomp-*.bpf")), (name, list(cache.iterdir()))
        before = snapshot(cache)

        # Control: the same payload, given a writable copy of the cache, rewrites every file in it.
        decoy = owned_dir(runner, "sbx-integrity-decoy-")
        shutil.copytree(cache, decoy / "cache")
        subprocess.run(["chown", "-R", f"{runner.uid or 0}:{runner.uid or 0}", str(decoy)], check=True)
        control = setup.run("run", "--workdir", str(decoy), "--", "sh", "-c", POISON.format(cache=decoy / "cache"))
        assert control.returncode == 0, (name, control.stderr)
        assert (decoy / "cache" / "poisoned").exists()
        assert all(p.read_bytes() == b"forged" for p in (decoy / "cache").glob("*.*") if p.name != "poisoned")

        # The attack: the same payload with the real cache inside the workdir is refused before it runs.
        attack = setup.run("run", "--workdir", str(workdir), "--", "sh", "-c", POISON.format(cache=cache))
        assert_refused(attack, "workdir", "sbx's cache", str(workdir))
        assert snapshot(cache) == before, name
        assert not (cache / "poisoned").exists()
        # And the next run, with that cache, is fully enforced.
        enforcement(setup)


def test_no_cache_directory_under_a_missing_home(runner):
    missing = Path("/tmp") / f"sbx-no-such-home-{os.getpid()}-{runner.label}"
    setup = with_env(runner, HOME=str(missing), XDG_CACHE_HOME=None, SBX_CACHE_DIR=None)
    result = setup.run("run", "--workdir", str(owned_dir(runner, "sbx-integrity-w-")), "--", "true")
    assert result.returncode == 0, result.stderr
    assert not missing.exists()
    # Control: with the home present, the cache is created in it.
    missing.mkdir()
    if runner.uid is not None:
        os.chown(missing, runner.uid, runner.uid)
    try:
        assert setup.run("run", "--workdir", str(owned_dir(runner, "sbx-integrity-w-")), "--", "true").returncode == 0
        assert (missing / ".cache" / "sbx").is_dir()
    finally:
        shutil.rmtree(missing, ignore_errors=True)


def test_rewriting_a_symlink_from_inside_cannot_redirect_the_cache(runner, enforcement):
    """SBX_CACHE_DIR reaches the cache through a link inside the workdir. The command
    repoints the link at a directory it filled; the next run sees that the cache would
    now be inside the workdir and refuses, so the forged entries are never read."""
    real_cache_parent = owned_dir(runner, "sbx-integrity-realcache-")
    work = owned_dir(runner, "sbx-integrity-linkwork-")
    os.symlink(real_cache_parent, work / "link")
    setup = with_env(runner, SBX_CACHE_DIR=str(work / "link" / "sbx"))
    first = setup.run("run", "--workdir", str(work), "--", "sh", "-c",
                      f"mkdir -p {work}/evil/sbx && echo forged > {work}/evil/sbx/x && ln -sfn {work}/evil {work}/link")
    assert first.returncode == 0, first.stderr
    assert os.readlink(work / "link") == f"{work}/evil"  # control: the redirect happened
    assert any((real_cache_parent / "sbx").glob("host-*.marshal"))  # the first run used the real cache
    assert_refused(setup.run("run", "--workdir", str(work), "--", "true"), "workdir", "sbx's cache")
    enforcement(with_env(runner, SBX_CACHE_DIR=str(real_cache_parent / "sbx")))


def test_forged_cache_entries_are_recomputed(root_runner, tmp_path):
    """A corrupted cache costs time, never enforcement: malformed entries are probed,
    validated or compiled again."""
    cache = tmp_path / "cache"
    setup = with_env(root_runner, SBX_CACHE_DIR=str(cache))
    work = tmp_path / "work"
    work.mkdir()
    assert setup.run("run", "--workdir", str(work), "--", "true").returncode == 0
    forged = {"host": b"\xe3forged", "profile": b"\xfb", "seccomp": b"\x08\x00\x00\x00" + bytes(8)}
    for path in cache.iterdir():
        kind = path.name.split("-")[0]
        if kind in forged:
            path.write_bytes(forged[kind])
    result = setup.run("run", "--verbose", "--workdir", str(work), "--", "sh", "-c", "grep Seccomp: /proc/self/status")
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == "KernelFull"
    assert result.stdout.split() == ["Seccomp:", "2"]


@pytest.fixture
def own_installation(runner):
    """A copy of sbx owned by the runner's user, imported from there: the user's own
    checkout, which it can write outside the sandbox. (A copy, so that a broken check
    damages nothing but the copy.)"""
    from sandbox.verify import stage_package_copy

    home = stage_package_copy(owned_dir(runner, "sbx-integrity-install-"))
    subprocess.run(["chown", "-R", f"{runner.uid or 0}:{runner.uid or 0}", str(home)], check=True)
    yield runner.replace(import_root=str(home))
    shutil.rmtree(home, ignore_errors=True)


def test_the_checkout_is_never_writable_inside(runner, own_installation, enforcement):
    """sbx's package, the directory it is imported from (the checkout or a site-packages)
    and its venv: a writable workdir or bind holding or inside any of them is refused."""
    root = Path(own_installation.import_root)
    marker = root.parent / f"{root.name}-pwned"
    payload = f"echo 'open(\"{marker}\", \"w\")' >> sandbox/__init__.py"
    before = hashlib.sha256((root / "sandbox" / "__init__.py").read_bytes()).hexdigest()

    # Control: a copy of the package in a directory sbx allows is rewritten, and importing it runs the payload.
    copy = owned_dir(runner, "sbx-integrity-copy-")
    shutil.copytree(root / "sandbox", copy / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chown", "-R", f"{runner.uid or 0}:{runner.uid or 0}", str(copy)], check=True)
    control = own_installation.run("run", "--workdir", str(copy), "--", "sh", "-c", payload.replace(str(marker), f"{copy}/pwned"))
    assert control.returncode == 0, control.stderr
    as_user(runner, [SYSTEM_PYTHON, "-I", "-c", f"import sys; sys.path.insert(0, {str(copy)!r}); import sandbox"])
    assert (copy / "pwned").exists()

    attempts = [("run", "--", "sh", "-c", payload)]  # the workdir defaults to the cwd: the checkout
    attempts.append(("run", "--workdir", str(root / "sandbox"), "--", "true"))
    attempts.append(("run", "--workdir", str(copy), "--bind", str(root), "--", "true"))
    if runner.uid is None:  # the venv running sbx (sys.prefix) for root; /usr for the system python
        attempts.append(("run", "--workdir", str(copy), "--bind", str(REPO / ".venv"), "--", "true"))
    for argv in attempts:
        result = own_installation.run(*argv, cwd=str(root))
        assert_refused(result, "workdir" if "--bind" not in argv else "bind", "sbx")
    assert hashlib.sha256((root / "sandbox" / "__init__.py").read_bytes()).hexdigest() == before
    assert not marker.exists()
    enforcement(own_installation)


def test_a_profile_the_run_loads_is_never_writable_inside(root_runner, tmp_path):
    profile = tmp_path / "mine.toml"
    profile.write_text('extends = "strict"\n')
    result = root_runner.run("run", "--profile", str(profile), "--workdir", str(tmp_path), "--", "true")
    assert_refused(result, "workdir", "the profile this run loads", str(profile))
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    assert root_runner.run("run", "--profile", str(profile), "--workdir", str(elsewhere), "--", "true").returncode == 0
    shadow = tmp_path / "profiles"  # a directory on SBX_PROFILE_PATH, even before it exists
    setup = with_env(root_runner, SBX_PROFILE_PATH=str(shadow))
    assert_refused(setup.run("run", "--workdir", str(tmp_path), "--", "true"), "workdir",
                   "a directory sbx loads profiles from")


def test_bwrap_is_never_taken_from_path(runner, enforcement):
    """A bwrap planted in a PATH directory (a workdir's bin/, say) never runs on the host."""
    work = owned_dir(runner, "sbx-integrity-path-")
    plant = runner.run("run", "--workdir", str(work), "--", "sh", "-c",
                       f"mkdir bin && printf '#!/bin/sh\\ntouch {work}/ran-on-host\\nexec /usr/bin/bwrap \"$@\"\\n' > bin/bwrap"
                       " && chmod +x bin/bwrap")
    assert plant.returncode == 0, plant.stderr
    setup = with_env(runner, PATH=f"{work}/bin:/usr/local/bin:/usr/bin:/bin")
    # Control: that PATH does name the planted bwrap first.
    found = as_user(runner, ["sh", "-c", "command -v bwrap"], env=setup.env)
    assert found.stdout.strip() == f"{work}/bin/bwrap"
    assert setup.run("doctor").returncode == 0
    enforcement(setup)
    assert not (work / "ran-on-host").exists()


def test_verify_never_imports_from_its_cwd(root_runner, tmp_path):
    """An earlier sandboxed command plants a ``sandbox`` package (and ``json``) in its workdir;
    ``sbx verify`` run from there must not import them."""
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "imported"
    plant = root_runner.run("run", "--workdir", str(work), "--", "sh", "-c",
                            f"mkdir sandbox && for m in sandbox/__init__ json; do echo 'open(\"{marker}\", \"w\")' > $m.py; done")
    assert plant.returncode == 0, plant.stderr
    # Control: a Python that is not isolated from the cwd does import the planted package.
    subprocess.run([SYSTEM_PYTHON, "-c", "import sandbox"], cwd=work, capture_output=True)
    assert marker.exists()
    marker.unlink()
    result = root_runner.run("verify", "--json", cwd=str(work), timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert not marker.exists()


# --- from the adversarial review -------------------------------------------------------


def test_every_cache_a_later_run_might_use_is_protected(runner):
    """A run with XDG_CACHE_HOME elsewhere must not make ~/.cache/sbx, which a later run
    without it reads, writable: every candidate is protected, whatever this run selects."""
    home = owned_dir(runner, "sbx-integrity-xdghome-")
    plain = with_env(runner, HOME=str(home), XDG_CACHE_HOME=None, SBX_CACHE_DIR=None)
    assert plain.run("run", "--workdir", str(owned_dir(runner, "sbx-integrity-w-")), "--", "true").returncode == 0
    assert any((home / ".cache" / "sbx").glob("seccomp-*.bpf"))  # control: that cache is in use
    elsewhere = owned_dir(runner, "sbx-integrity-xdg-")
    for changes in ({"XDG_CACHE_HOME": str(elsewhere)}, {"SBX_CACHE_DIR": str(elsewhere / "c")}):
        setup = with_env(plain, **changes)
        assert_refused(setup.run("run", "--workdir", str(home), "--", "true"), "workdir", "sbx's cache")


def test_a_relative_profile_path_entry_is_ignored(root_runner, tmp_path):
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()
    (work / "p").mkdir()
    (work / "p" / "strict.toml").write_text('tier_floor = "EnvironmentOnly"\n[namespaces]\nnet = false\n')
    setup = with_env(root_runner, SBX_PROFILE_PATH="p")
    result = setup.run("run", "--dry-run", "--workdir", str(other), "--", "true", cwd=str(work))
    assert result.returncode == 0, result.stderr
    assert "profile: strict" in result.stdout and "tier: KernelFull" in result.stdout
    assert "shared with the host" not in result.stdout  # the planted strict.toml was not loaded


def test_an_unresolvable_bind_is_a_clean_error(runner):
    result = runner.run("run", "--workdir", str(owned_dir(runner, "sbx-integrity-w-")), "--ro-bind", "/proc/1/cwd",
                        "--", "true")
    assert_refused(result, "bind")


def test_a_root_callers_staging_mounts_are_gone_while_the_sandbox_runs(root_runner):
    """They exist only during bwrap's setup: a host process running as nobody cannot reach
    the caller's files through them while the command runs."""
    import time

    from sandbox import Sandbox

    work = owned_dir(root_runner, "sbx-integrity-root-")
    work.chmod(0o700)
    (work / "secret").write_text("root's\n")
    (work / "secret").chmod(0o600)
    process = Sandbox("strict", work).spawn(["sh", "-c", "stat -c %u secret; sleep 5"], stdout=subprocess.PIPE,
                                            text=True)
    try:
        assert process.stdout.readline().strip() == "65534"  # control: the workdir came through an idmapped mount
        time.sleep(0.2)
        with open("/proc/self/mountinfo") as f:
            staged = [line for line in f if "/run/sbx-idmap/" in line and "idmap-userns" not in line]
        assert staged == []
    finally:
        process.kill_sandbox()
        process.wait()
