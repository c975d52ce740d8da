"""sbx-stage2 (sandbox/stage2.c), built here and run directly, without bwrap.

Each test hands the helper a config memfd and a status pipe exactly as the launcher does,
then checks what the exec'd command saw and what arrived on the status pipe. Three builds:
the normal one, one with -DSBX_STAGE2_FAULTS (a config record makes one step fail with
EPERM), and that one again under ASan/UBSan. Nothing here skips: without a C compiler
the build fixture fails.
"""

from __future__ import annotations

import ast
import errno
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from sandbox.stage2_wire import (
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_SETUP_FAILED,
    RLIMIT_NUMBERS,
    TAG_CWD,
    LandlockSpec,
    Stage2Config,
    StatusRecord,
    encode_config,
    frame_programs,
    parse_status,
)

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "sandbox" / "stage2.c"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11"]
BUILDS = {
    "normal": [],
    "faults": ["-DSBX_STAGE2_FAULTS"],
    "asan": ["-DSBX_STAGE2_FAULTS", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g"],
}
HELPER_ENV = {"ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
PY = ["/usr/bin/python3", "-I", "-S", "-c"]
HIGH_FD = 100  # the test's own descriptors go here, clear of the numbers the tests open on purpose

# Landlock, ABI 5 view (the kernel here has 7; a larger kernel ABI accepts an older plan).
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
LL_TRUNCATE, LL_IOCTL_DEV = 1 << 14, 1 << 15
LL_FS_ALL_ABI5 = (1 << 16) - 1
LL_FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
LL_READ = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR

FD_PROBE = """
import fcntl
fds = []
for fd in range(1024):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        continue
    fds.append(fd)
print(fds)
"""

Result = namedtuple("Result", "returncode stdout stderr records")


@pytest.fixture(scope="session")
def helpers(tmp_path_factory) -> dict[str, str]:
    cc = shutil.which("cc")
    assert cc, "no C compiler (cc) on PATH: these tests build sandbox/stage2.c themselves"
    out = tmp_path_factory.mktemp("stage2-build")
    jobs = {}
    for name, flags in BUILDS.items():
        binary = out / f"sbx-stage2-{name}"
        argv = [cc, *CFLAGS, *flags, "-o", str(binary), str(SOURCE)]
        jobs[name] = (binary, argv, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    built = {}
    for name, (binary, argv, job) in jobs.items():
        output, _ = job.communicate(timeout=180)
        assert job.returncode == 0, f"{' '.join(argv)} failed:\n{output}"
        assert output == "", f"{' '.join(argv)} was not silent:\n{output}"
        built[name] = str(binary)
    return built


# --- running the helper -----------------------------------------------------------------


def _high(fd: int) -> int:
    """``fd`` moved to a number >= HIGH_FD, close-on-exec in this process."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    os.close(fd)
    return moved


def memfd(data: bytes) -> int:
    fd = _high(os.memfd_create("sbx-stage2-test"))
    os.write(fd, data)
    return fd


def run_stage2(binary: str, argv=None, *, keep: str = "", raw=None, pass_fds=(), shell: str = "",
               restore_signals: bool = True, preexec_fn=None, **fields) -> Result:
    """Run the helper with a config built from ``fields`` (or ``raw(status_fd)`` bytes).

    ``pass_fds`` are handed over and closed here afterwards. ``shell`` runs first in a
    bash (dash cannot name fds above 9) that then execs the helper, to open or close
    descriptors (``exec 7</dev/null``) or set limits without touching this process's own."""
    status_read, status_write = os.pipe()
    status_write = _high(status_write)
    owned = [status_read, status_write, *pass_fds]
    try:
        if raw is not None:
            data = raw(status_write)
        else:
            data = encode_config(Stage2Config(status_fd=status_write, argv=argv, **fields))
        config_fd = memfd(data)
        owned.append(config_fd)
        command = [binary, str(config_fd), keep]
        if shell:
            command = ["/bin/bash", "-c", shell + '; exec "$@"', "bash", *command]
        proc = subprocess.run(command, pass_fds=(config_fd, status_write, *pass_fds), capture_output=True,
                              stdin=subprocess.DEVNULL, env=HELPER_ENV, timeout=30,
                              restore_signals=restore_signals, preexec_fn=preexec_fn)
        os.close(status_write)
        owned.remove(status_write)
        chunks = []
        while chunk := os.read(status_read, 65536):
            chunks.append(chunk)
    finally:
        for fd in owned:
            os.close(fd)
    return Result(proc.returncode, proc.stdout.decode(errors="surrogateescape"),
                  proc.stderr.decode(errors="surrogateescape"), parse_status(b"".join(chunks)))


def succeeded(result: Result) -> None:
    assert result.returncode == 0, result
    assert result.records == [StatusRecord("started", "", "", 0, None)], result
    assert result.stderr == "", result


def failure(result: Result, started: bool = True) -> StatusRecord:
    """The one error record; ``started``: whether an S record precedes it."""
    assert result.stderr == "", result
    kinds = [r.kind for r in result.records]
    assert kinds == (["started", "error"] if started else ["error"]), result
    record = result.records[-1]
    assert result.returncode == record.exit, result
    return record


def fd_list(result: Result) -> list[int]:
    assert result.returncode == 0, result
    return ast.literal_eval(result.stdout.strip())


# --- BPF by hand --------------------------------------------------------------------------

AUDIT_ARCH_AND_GETPPID = {"x86_64": (0xC000003E, 110), "aarch64": (0xC00000B7, 173)}
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return code.to_bytes(2, sys.byteorder) + bytes((jt, jf)) + k.to_bytes(4, sys.byteorder)


ALLOW_ALL = _insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)


def deny_getppid() -> bytes:
    """getppid() fails with EPERM on this architecture; everything else is allowed."""
    arch, nr = AUDIT_ARCH_AND_GETPPID[os.uname().machine]
    return b"".join([
        _insn(BPF_LD_W_ABS, 0, 0, 4),        # seccomp_data.arch
        _insn(BPF_JEQ_K, 0, 3, arch),        # another arch: allow
        _insn(BPF_LD_W_ABS, 0, 0, 0),        # seccomp_data.nr
        _insn(BPF_JEQ_K, 0, 1, nr),
        _insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
        _insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ])


SECCOMP_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
result = libc.syscall({"x86_64": 110, "aarch64": 173}[os.uname().machine])  # getppid; glibc's wrapper never sets errno
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(result, ctypes.get_errno(), status["Seccomp"].strip(), status["Seccomp_filters"].strip())
"""


# --- fd hygiene ------------------------------------------------------------------------------


def test_hygiene_hides_unlisted_fds_and_passes_kept_ones(helpers):
    kept = run_stage2(helpers["normal"], [*PY, FD_PROBE], keep="7", shell="exec 7</dev/null")
    assert fd_list(kept) == [0, 1, 2, 7]  # positive control: fd 7 really reaches the command
    hidden = run_stage2(helpers["normal"], [*PY, FD_PROBE], shell="exec 7</dev/null")
    assert fd_list(hidden) == [0, 1, 2]  # also the config and status fds (>= 100)
    succeeded(hidden)


def test_hygiene_gaps_around_several_kept_fds(helpers):
    shell = "exec 5</dev/null 6</dev/null 7</dev/null 9</dev/null 10</dev/null 40</dev/null"
    result = run_stage2(helpers["normal"], [*PY, FD_PROBE], keep="6,9,10", shell=shell)
    assert fd_list(result) == [0, 1, 2, 6, 9, 10]


def test_hygiene_fallback_walk_when_close_range_fails(helpers):
    shell = "exec 7</dev/null 8</dev/null 300</dev/null"
    kept = run_stage2(helpers["faults"], [*PY, FD_PROBE], keep="7", shell=shell, fault="close_range")
    assert fd_list(kept) == [0, 1, 2, 7]
    result = run_stage2(helpers["faults"], [*PY, FD_PROBE], shell=shell, fault="close_range")
    assert fd_list(result) == [0, 1, 2]
    assert result.records == [StatusRecord("started", "", "", 0, None),
                              StatusRecord("note", "fd-hygiene", "close_range unavailable: walked every fd", 0, None)]
    # Without the fault, close_range is used and no note is written.
    succeeded(run_stage2(helpers["faults"], [*PY, FD_PROBE], shell=shell))


def test_closed_preserved_fd_is_reported(helpers, tmp_path):
    marker = tmp_path / "ran"
    result = run_stage2(helpers["normal"], ["/usr/bin/touch", str(marker)], keep="9", shell="exec 9<&-")
    record = failure(result)
    assert (record.layer, record.errno, record.exit) == ("preserved-fd", errno.EBADF, EXIT_SETUP_FAILED)
    assert record.detail == "failed to read fd flags for preserved file descriptor 9"
    assert not marker.exists()
    succeeded(run_stage2(helpers["normal"], ["/usr/bin/touch", str(marker)], keep="9", shell="exec 9</dev/null"))
    assert marker.exists()


# --- every step's failure path ---------------------------------------------------------------


def _step_setup(step: str, tmp_path: Path) -> dict:
    """Config fields (and fds) that make ``step`` do real work."""
    if step == "preserved-fd":
        return {"keep": "7", "shell": "exec 7</dev/null"}
    if step == "chdir":
        return {"cwd": str(tmp_path)}
    if step == "rlimits":
        return {"rlimits": ((RLIMIT_NUMBERS["RLIMIT_CORE"], 0, 0),)}
    if step == "landlock":
        rules = (("/usr", LL_READ, False), (str(tmp_path), LL_FS_ALL_ABI5, False))
        return {"landlock": LandlockSpec(5, LL_FS_ALL_ABI5, 0, 0, LL_FILE_RIGHTS, rules)}
    if step == "seccomp":
        fd = memfd(frame_programs([ALLOW_ALL]))
        return {"seccomp_fd": fd, "pass_fds": (fd,)}
    if step == "supervisor":
        return {"supervise": True}
    if step == "network-bridge":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        _CHANNELS.append(ours)
        fd = _high(theirs.detach())
        return {"proxy_listen": (fd, _free_port()), "pass_fds": (fd,)}
    return {}


_CHANNELS: list = []  # the test's ends of network-bridge channels, kept open while the helper runs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


FAULT_EXPECTATIONS = {
    "preserved-fd": (EXIT_SETUP_FAILED, "failed to read fd flags for preserved file descriptor 7"),
    "chdir": (EXIT_SETUP_FAILED, None),  # the directory
    "network-bridge": (EXIT_SETUP_FAILED, "socket(AF_INET)"),
    "supervisor": (EXIT_SETUP_FAILED, "prctl(PR_SET_CHILD_SUBREAPER)"),
    "rlimits": (EXIT_SETUP_FAILED, "setrlimit(resource 4, soft 0, hard 0)"),
    "no_new_privs": (EXIT_SETUP_FAILED, "prctl(PR_SET_NO_NEW_PRIVS)"),
    "landlock": (EXIT_SETUP_FAILED, "landlock_restrict_self"),
    "seccomp": (EXIT_SETUP_FAILED, "seccomp(SECCOMP_SET_MODE_FILTER) program 0"),
    "exec": (EXIT_NOT_EXECUTABLE, "/usr/bin/touch"),
}


@pytest.mark.parametrize("build", ["faults", "asan"])
@pytest.mark.parametrize("step", list(FAULT_EXPECTATIONS))
def test_fault_in_each_step_is_reported_and_stops_the_command(helpers, tmp_path, build, step):
    marker = tmp_path / "ran"
    argv = ["/usr/bin/touch", str(marker)]
    # Control: the same config without the fault runs the command.
    succeeded(run_stage2(helpers[build], argv, **_step_setup(step, tmp_path)))
    assert marker.exists()
    marker.unlink()

    result = run_stage2(helpers[build], argv, fault=step, **_step_setup(step, tmp_path))
    record = failure(result)
    exit_status, detail = FAULT_EXPECTATIONS[step]
    assert (record.layer, record.errno, record.exit) == (step, errno.EPERM, exit_status)
    assert record.detail == (detail if detail is not None else str(tmp_path))
    assert not marker.exists()


# --- the network bridge ----------------------------------------------------------------------


def test_network_bridge_hands_over_a_listener_and_keeps_nothing(helpers):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel = _high(theirs.detach())
    port = _free_port()
    result = run_stage2(helpers["normal"], [*PY, FD_PROBE], proxy_listen=(channel, port), pass_fds=(channel,))
    succeeded(result)
    assert fd_list(result) == [0, 1, 2]  # neither the listener nor the channel reaches the command
    _, fds, _, _ = socket.recv_fds(ours, 1, 2)
    ours.close()
    assert len(fds) == 1
    with socket.socket(fileno=fds[0]) as listener:
        assert (listener.family, listener.type) == (socket.AF_INET, socket.SOCK_STREAM)
        assert listener.getsockname() == ("127.0.0.1", port)
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        client = socket.create_connection(("127.0.0.1", port), timeout=5)  # it listens: the host can accept
        listener.accept()[0].close()
        client.close()


def test_network_bridge_port_in_use_is_reported(helpers, tmp_path):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel = _high(theirs.detach())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        marker = tmp_path / "ran"
        result = run_stage2(helpers["normal"], ["/usr/bin/touch", str(marker)],
                            proxy_listen=(channel, port), pass_fds=(channel,))
    ours.close()
    record = failure(result)
    assert (record.layer, record.errno, record.exit) == ("network-bridge", errno.EADDRINUSE, EXIT_SETUP_FAILED)
    assert record.detail == f"bind 127.0.0.1:{port}"
    assert not marker.exists()


# --- the supervisor (tiers without a pid namespace) -----------------------------------------

# A sleeper in a session of its own, holding none of the test's pipes (the control's
# subprocess.run would wait for it otherwise).
LEAVE_BEHIND = 'setsid sh -c \'sleep 60 & echo $! > "$0"\' "$0" </dev/null >/dev/null 2>&1 & sleep 0.2; exit "$1"'


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("build", ["normal", "asan"])
def test_supervisor_kills_what_the_command_leaves_and_keeps_its_status(helpers, tmp_path, build):
    pidfile = tmp_path / "pid"
    argv = ["/bin/sh", "-c", LEAVE_BEHIND, str(pidfile), "7"]
    # Control: without the supervisor, the double-forked sleeper outlives stage 2.
    control = run_stage2(helpers[build], argv)
    assert control.returncode == 7
    leftover = int(pidfile.read_text())
    try:
        assert _alive(leftover)
    finally:
        os.kill(leftover, signal.SIGKILL)
    result = run_stage2(helpers[build], argv, supervise=True)
    assert result.returncode == 7 and result.records[0].kind == "started", result
    swept = int(pidfile.read_text())
    assert not _alive(swept)


def test_supervisor_reports_a_signal_as_128_plus_n_and_holds_no_descriptor(helpers):
    killed = run_stage2(helpers["normal"], ["/bin/sh", "-c", "kill -TERM $$"], supervise=True)
    assert killed.returncode == 128 + signal.SIGTERM
    # The status pipe reaches EOF when the command execs, not when the supervisor exits:
    # run_stage2 reads to EOF, so a supervisor holding the pipe would have hung it.
    fds = run_stage2(helpers["normal"], [*PY, FD_PROBE], supervise=True, keep="7", shell="exec 7</dev/null")
    assert fd_list(fds) == [0, 1, 2, 7]


# --- rlimits, no_new_privs ------------------------------------------------------------------


def test_rlimits_are_applied_and_clamped_to_the_hard_limit(helpers):
    nofile = RLIMIT_NUMBERS["RLIMIT_NOFILE"]
    shell = "ulimit -S -n 256; ulimit -H -n 512"
    probe = ["/bin/sh", "-c", "echo $(ulimit -S -n) $(ulimit -H -n)"]
    control = run_stage2(helpers["normal"], probe, shell=shell)
    assert control.stdout.split() == ["256", "512"], control
    lowered = run_stage2(helpers["normal"], probe, shell=shell, rlimits=((nofile, 64, -1),))
    succeeded(lowered)
    assert lowered.stdout.split() == ["64", "512"]
    clamped = run_stage2(helpers["normal"], probe, shell=shell, rlimits=((nofile, 1000, 2000),))
    succeeded(clamped)
    assert clamped.stdout.split() == ["512", "512"]


def test_rlimit_the_kernel_refuses_is_reported(helpers):
    result = run_stage2(helpers["normal"], ["/usr/bin/true"], rlimits=((RLIMIT_NUMBERS["RLIMIT_CORE"], 10, 5),),
                        shell="ulimit -H -c unlimited")
    record = failure(result)
    assert (record.layer, record.errno, record.exit) == ("rlimits", errno.EINVAL, EXIT_SETUP_FAILED)
    assert record.detail == "setrlimit(resource 4, soft 10, hard 5)"


def test_no_new_privs_is_set(helpers):
    probe = [*PY, "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')][0])"]
    with open("/proc/self/status") as status:
        assert "NoNewPrivs:\t0\n" in status.read()  # control: nothing above us set it already
    result = run_stage2(helpers["normal"], probe)
    succeeded(result)
    assert result.stdout.strip() == "1"


# --- Landlock --------------------------------------------------------------------------------

LANDLOCK_PROBE = """
for path in ("/etc/hostname", "/etc/passwd"):
    try:
        open(path).read()
        print(path, "read")
    except PermissionError:
        print(path, "denied")
"""


def _landlock(*extra_rules, abi: int = 5) -> LandlockSpec:
    rules = (("/usr", LL_READ, False), ("/etc/hostname", LL_READ, False), *extra_rules)
    return LandlockSpec(abi, LL_FS_ALL_ABI5, 0, 0, LL_FILE_RIGHTS, rules)


def test_landlock_allows_only_the_rules(helpers):
    control = run_stage2(helpers["normal"], [*PY, LANDLOCK_PROBE])
    assert control.stdout.split() == ["/etc/hostname", "read", "/etc/passwd", "read"], control
    result = run_stage2(helpers["normal"], [*PY, LANDLOCK_PROBE], landlock=_landlock())
    succeeded(result)
    assert result.stdout.split() == ["/etc/hostname", "read", "/etc/passwd", "denied"]


def test_landlock_optional_missing_rule_is_skipped_required_one_fails(helpers):
    missing = "/nonexistent-sbx-stage2-test/path"
    optional = run_stage2(helpers["normal"], [*PY, LANDLOCK_PROBE], landlock=_landlock((missing, LL_READ, True)))
    succeeded(optional)
    assert optional.stdout.split() == ["/etc/hostname", "read", "/etc/passwd", "denied"]

    required = run_stage2(helpers["normal"], [*PY, LANDLOCK_PROBE], landlock=_landlock((missing, LL_READ, False)))
    record = failure(required)
    assert (record.layer, record.errno, record.exit, record.detail) == ("landlock", errno.ENOENT, EXIT_SETUP_FAILED, missing)
    assert required.stdout == ""


@pytest.mark.parametrize("where", ["last", "parent"])
def test_landlock_rule_through_a_symlink_is_refused_not_followed(helpers, tmp_path, where):
    """A link planted where the plan named a directory (a writable workdir can hold one)
    must not turn into a grant on its target: ELOOP, exit 125, the command never runs."""
    link = tmp_path / "link"
    link.symlink_to("/etc")
    rule = str(link) if where == "last" else str(link / "ssl")
    # Control: the rule on the canonical path grants the hierarchy (/etc/passwd is read).
    granted = run_stage2(helpers["normal"], [*PY, LANDLOCK_PROBE], landlock=_landlock(("/etc", LL_READ, False)))
    succeeded(granted)
    assert granted.stdout.split() == ["/etc/hostname", "read", "/etc/passwd", "read"]
    for optional in (False, True):
        result = run_stage2(helpers["normal"], [*PY, LANDLOCK_PROBE], landlock=_landlock((rule, LL_READ, optional)))
        record = failure(result)
        assert (record.layer, record.errno, record.exit, record.detail) == ("landlock", errno.ELOOP, EXIT_SETUP_FAILED,
                                                                            rule)
        assert result.stdout == ""


def test_landlock_rule_paths_with_dot_components_are_refused(helpers):
    result = run_stage2(helpers["normal"], [*PY, LANDLOCK_PROBE], landlock=_landlock(("/usr/../etc", LL_READ, False)))
    record = failure(result)
    assert (record.layer, record.errno) == ("landlock", errno.EINVAL)


def test_landlock_abi_above_the_kernels_is_refused(helpers):
    record = failure(run_stage2(helpers["normal"], ["/usr/bin/true"], landlock=_landlock(abi=99)))
    assert (record.layer, record.errno, record.exit) == ("landlock", 0, EXIT_SETUP_FAILED)
    assert record.detail.startswith("the plan needs Landlock ABI 99, the kernel has ")
    assert int(record.detail.rsplit(" ", 1)[1]) >= 5


# --- seccomp --------------------------------------------------------------------------------


def test_seccomp_programs_are_loaded_in_order(helpers):
    control = run_stage2(helpers["normal"], [*PY, SECCOMP_PROBE])
    succeeded(control)
    ppid, _, mode, filters = control.stdout.split()
    assert int(ppid) > 0 and (mode, filters) == ("0", "0")

    fd = memfd(frame_programs([ALLOW_ALL, deny_getppid()]))
    result = run_stage2(helpers["normal"], [*PY, SECCOMP_PROBE], seccomp_fd=fd, pass_fds=(fd,))
    succeeded(result)
    assert result.stdout.split() == ["-1", str(errno.EPERM), "2", "2"]


@pytest.mark.parametrize("blob, detail", [
    ((12).to_bytes(4, "little") + bytes(12), "malformed BPF"),
    ((16).to_bytes(4, "little") + ALLOW_ALL, "malformed BPF"),
    ((0).to_bytes(4, "little"), "malformed BPF"),
    (b"\x08\x00", "malformed BPF (truncated frame header)"),
    (b"", "no BPF program arrived"),
])
def test_malformed_seccomp_blob_is_refused(helpers, tmp_path, blob, detail):
    marker = tmp_path / "ran"
    fd = memfd(blob)
    result = run_stage2(helpers["normal"], ["/usr/bin/touch", str(marker)], seccomp_fd=fd, pass_fds=(fd,))
    record = failure(result)
    assert (record.layer, record.errno, record.exit, record.detail) == ("seccomp", errno.EINVAL, EXIT_SETUP_FAILED, detail)
    assert not marker.exists()


# --- exec ------------------------------------------------------------------------------------


def _script(path: Path, text: str, mode: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_command_not_found(helpers, tmp_path):
    for directory in ("a", "b"):
        (tmp_path / directory).mkdir()
    result = run_stage2(helpers["normal"], ["sbx-no-such-command"], search_path=f"{tmp_path}/a:{tmp_path}/b:/nonexistent")
    record = failure(result)
    assert (record.layer, record.errno, record.exit) == ("exec", errno.ENOENT, EXIT_NOT_FOUND)
    assert record.detail == "sbx-no-such-command: command not found"
    absolute = failure(run_stage2(helpers["normal"], [f"{tmp_path}/a/missing"]))
    assert (absolute.exit, absolute.detail) == (EXIT_NOT_FOUND, f"{tmp_path}/a/missing: command not found")


def test_search_skips_a_non_executable_file(helpers, tmp_path):
    denied = _script(tmp_path / "a" / "cmd", "#!/bin/sh\necho first\n", 0o644)
    _script(tmp_path / "b" / "cmd", "#!/bin/sh\necho second\n", 0o755)
    both = run_stage2(helpers["normal"], ["cmd"], search_path=f"{tmp_path}/a:{tmp_path}/b")
    succeeded(both)
    assert both.stdout == "second\n"

    only = failure(run_stage2(helpers["normal"], ["cmd"], search_path=f"{tmp_path}/nonexistent:{tmp_path}/a"))
    assert (only.layer, only.errno, only.exit) == ("exec", errno.EACCES, EXIT_NOT_EXECUTABLE)
    assert only.detail == f"{denied}: permission denied"


def test_empty_search_path_component_is_the_working_directory(helpers, tmp_path):
    _script(tmp_path / "cmd", "#!/bin/sh\necho here\n", 0o755)
    result = run_stage2(helpers["normal"], ["cmd"], search_path="/nonexistent:", cwd=str(tmp_path))
    succeeded(result)
    assert result.stdout == "here\n"
    # Without the empty component the file in the working directory is no match.
    record = failure(run_stage2(helpers["normal"], ["cmd"], search_path="/nonexistent", cwd=str(tmp_path)))
    assert (record.errno, record.exit, record.detail) == (errno.ENOENT, EXIT_NOT_FOUND, "cmd: command not found")


def test_missing_interpreter_is_named(helpers, tmp_path):
    script = _script(tmp_path / "bin" / "cmd", "#!/nonexistent/interpreter\n", 0o755)
    message = f"{script}: its interpreter or loader is not visible in the sandbox"
    for argv, search_path in ((["cmd"], str(script.parent)), ([str(script)], "/nonexistent")):
        record = failure(run_stage2(helpers["normal"], argv, search_path=search_path))
        assert (record.layer, record.errno, record.exit, record.detail) == ("exec", errno.ENOENT, EXIT_NOT_EXECUTABLE, message)


def test_no_shell_fallback_for_a_file_the_kernel_cannot_run(helpers, tmp_path):
    junk = _script(tmp_path / "junk", "echo ran via sh\n", 0o755)
    result = run_stage2(helpers["normal"], [str(junk)])
    record = failure(result)
    assert (record.layer, record.errno, record.exit, record.detail) == ("exec", errno.ENOEXEC, EXIT_NOT_EXECUTABLE, str(junk))
    assert result.stdout == ""


def test_exe_fd_runs_the_descriptor_not_argv0(helpers):
    argv = ["sbx-not-on-any-path"]
    control = failure(run_stage2(helpers["normal"], argv, search_path="/nonexistent"))
    assert control.exit == EXIT_NOT_FOUND
    fd = _high(os.open("/usr/bin/true", os.O_RDONLY | os.O_CLOEXEC))
    succeeded(run_stage2(helpers["normal"], argv, search_path="/nonexistent", exe_fd=fd, pass_fds=(fd,)))


def _signal_masks(stdout: str) -> dict[str, int]:
    return {name: int(value, 16) for name, value in (line.split(":\t") for line in stdout.splitlines())}


def test_exec_resets_ignored_and_blocked_signals(helpers):
    def block_usr1():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    probe = ["/bin/grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]
    bit = {sig: 1 << (sig - 1) for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGUSR1)}
    # Control: this Python ignores SIGPIPE and SIGXFSZ, and the children inherit that and the mask.
    control = subprocess.run(probe, capture_output=True, text=True, restore_signals=False, preexec_fn=block_usr1)
    masks = _signal_masks(control.stdout)
    assert masks["SigIgn"] & bit[signal.SIGPIPE] and masks["SigIgn"] & bit[signal.SIGXFSZ], masks
    assert masks["SigBlk"] & bit[signal.SIGUSR1], masks

    result = run_stage2(helpers["normal"], probe, restore_signals=False, preexec_fn=block_usr1)
    succeeded(result)
    masks = _signal_masks(result.stdout)
    assert masks["SigIgn"] & (bit[signal.SIGPIPE] | bit[signal.SIGXFSZ]) == 0, masks
    assert masks["SigBlk"] == 0, masks


def test_argv_env_and_cwd_reach_the_command(helpers, tmp_path):
    odd = tmp_path / os.fsdecode(b"dir-\xff")  # not UTF-8: must arrive as the same bytes
    odd.mkdir()
    # LC_CTYPE: Python's own C-locale coercion may add it.
    probe = "import os, sys; print(sys.argv[1:], sorted(set(os.environ) - {'LC_CTYPE'}), os.environ['SBX_T'], os.getcwdb())"
    result = run_stage2(helpers["normal"], [*PY, probe, "a b", ""], env=(("SBX_T", "x=y"),), cwd=str(odd))
    succeeded(result)
    assert result.stdout.strip() == f"['a b', ''] ['SBX_T'] x=y {bytes(odd)!r}"

    missing = os.fsdecode(b"/nonexistent-\xfe")
    record = failure(run_stage2(helpers["normal"], ["/usr/bin/true"], cwd=missing))
    assert (record.layer, record.errno, record.detail) == ("chdir", errno.ENOENT, missing)


# --- everything at once, normal and sanitized ----------------------------------------------------


@pytest.mark.parametrize("build", ["normal", "asan"])
def test_all_layers_together(helpers, tmp_path, build):
    nofile = RLIMIT_NUMBERS["RLIMIT_NOFILE"]
    probe = FD_PROBE + LANDLOCK_PROBE + SECCOMP_PROBE + "import os, resource; print(os.getcwd(), resource.getrlimit(7)[0])"
    fd = memfd(frame_programs([deny_getppid()]))
    result = run_stage2(helpers[build], [*PY, probe], keep="7", shell="exec 7</dev/null 8</dev/null",
                        cwd=str(tmp_path), env=(("LANG", "C"),), rlimits=((nofile, 128, -1),),
                        landlock=_landlock((str(tmp_path), LL_READ, False), ("/proc", LL_READ, False)), seccomp_fd=fd, pass_fds=(fd,))
    succeeded(result)
    lines = result.stdout.splitlines()
    assert lines[0] == "[0, 1, 2, 7]"
    assert lines[1:3] == ["/etc/hostname read", "/etc/passwd denied"]
    assert lines[3] == f"-1 {errno.EPERM} 2 1"
    assert lines[4] == f"{tmp_path} 128"


# --- config and usage errors ---------------------------------------------------------------------


def _valid(status_fd: int) -> bytes:
    return encode_config(Stage2Config(status_fd=status_fd, argv=["/usr/bin/true"]))


def _record(tag: int, payload: bytes) -> bytes:
    return tag.to_bytes(2, "little") + len(payload).to_bytes(4, "little") + payload


CONFIG_ERRORS = [
    (lambda fd: _valid(fd)[:-3], "truncated record (record tag 5)"),
    (lambda fd: _valid(fd) + b"\x02\x00", "truncated record header"),
    (lambda fd: _valid(fd) + _record(99, b""), "unknown record tag (record tag 99)"),
    (lambda fd: _valid(fd) + _record(TAG_CWD, b"/") + _record(TAG_CWD, b"/"), "duplicate record (record tag 2)"),
    (lambda fd: _valid(fd) + _record(TAG_CWD, b"/a\0b"), "string with an embedded NUL byte (record tag 2)"),
    (lambda fd: _valid(fd) + _record(10, b"\x01\x00"), "record has length 2, expected 4 (record tag 10)"),
    (lambda fd: _valid(fd) + _record(8, bytes(9) + b"/"), "Landlock rule before the LANDLOCK record (record tag 8)"),
    (lambda fd: _valid(fd) + _record(4, b"NOEQUALS\0"), "environment entry is not NAME=VALUE (record tag 4)"),
    (lambda fd: _valid(fd) + _record(3, b""), "duplicate record (record tag 3)"),
    (lambda fd: _valid(fd)[:18], "no ARGV record"),
    (lambda fd: _valid(fd)[:18] + _record(3, b"/usr/bin/true"), "string list not NUL-terminated (record tag 3)"),
    (lambda fd: _valid(fd) + _record(7, bytes(36)) + _record(8, bytes(8) + b"\x02/"),
     "Landlock rule's optional flag is neither 0 nor 1 (record tag 8)"),
    (lambda fd: _valid(fd) + _record(6, bytes(4) + (-2).to_bytes(8, "little", signed=True) + bytes(8)),
     "rlimit value below -1 (record tag 6)"),
]
FAULT_IN_NORMAL_BUILD = (lambda fd: _valid(fd) + _record(0x7F, b"chdir"), "unknown record tag (record tag 127)")


@pytest.mark.parametrize("build, raw, detail", [("normal", *case) for case in [*CONFIG_ERRORS, FAULT_IN_NORMAL_BUILD]]
                         + [("asan", *case) for case in CONFIG_ERRORS])
def test_config_errors_after_the_status_fd_are_reported(helpers, build, raw, detail):
    result = run_stage2(helpers[build], raw=raw)
    record = failure(result, started=False)
    assert (record.layer, record.errno, record.exit, record.detail) == ("config", errno.EINVAL, EXIT_SETUP_FAILED, detail)


def test_fault_record_is_understood_by_the_test_build_only(helpers, tmp_path):
    marker = tmp_path / "ran"
    config = {"argv": ["/usr/bin/touch", str(marker)], "cwd": str(tmp_path), "fault": "chdir"}
    assert failure(run_stage2(helpers["normal"], **config), started=False).layer == "config"
    assert failure(run_stage2(helpers["faults"], **config)).layer == "chdir"
    assert failure(run_stage2(helpers["faults"], **{**config, "fault": "nonsense"}), started=False).layer == "config"
    assert not marker.exists()


@pytest.mark.parametrize("raw", [
    lambda fd: b"XBX2" + _valid(fd)[4:],                       # magic
    lambda fd: _valid(fd)[:4] + (2).to_bytes(4, "little") + _valid(fd)[8:],  # version
    lambda fd: _valid(fd)[:8] + _valid(fd)[18:],               # ARGV first, no STATUS_FD
    lambda fd: b"",
])
def test_config_errors_before_the_status_fd_exit_silently(helpers, raw):
    result = run_stage2(helpers["normal"], raw=raw)
    assert (result.returncode, result.records, result.stdout, result.stderr) == (EXIT_SETUP_FAILED, [], "", "")


@pytest.mark.parametrize("args", [[], ["3"], ["x", ""], ["-1", ""], ["3", "2"], ["3", "5,4"], ["3", "5,5"],
                                  ["3", "5,"], ["3", ",5"], ["3", "99999999999"], ["3", "", "extra"]])
def test_usage_errors(helpers, args):
    result = subprocess.run([helpers["normal"], *args], capture_output=True, text=True, env=HELPER_ENV, timeout=10)
    assert result.returncode == EXIT_SETUP_FAILED
    assert result.stderr.startswith("sbx-stage2: usage: ") and result.stderr.count("\n") == 1
    assert result.stdout == ""


# --- the Python side of the wire ------------------------------------------------------------------


@pytest.mark.parametrize("fields, field", [
    ({"argv": ["a\0b"]}, "argv[0]"),
    ({"argv": []}, "argv"),
    ({"argv": "true"}, "argv"),
    ({"argv": ["x"], "env": (("A\0", "1"),)}, "env[0] name"),
    ({"argv": ["x"], "env": (("A", "1\0"),)}, "env[0] value"),
    ({"argv": ["x"], "env": (("A=B", "1"),)}, "env[0] name"),
    ({"argv": ["x"], "env": (("", "1"),)}, "env[0] name"),
    ({"argv": ["x"], "cwd": "/a\0b"}, "cwd"),
    ({"argv": ["x"], "cwd": ""}, "cwd"),
    ({"argv": ["x"], "search_path": "/bin\0"}, "search_path"),
    ({"argv": ["x"], "status_fd": -1}, "status_fd"),
    ({"argv": ["x"], "status_fd": "3"}, "status_fd"),
    ({"argv": ["x"], "status_fd": True}, "status_fd"),
    ({"argv": ["x"], "seccomp_fd": -2}, "seccomp_fd"),
    ({"argv": ["x"], "exe_fd": 1 << 31}, "exe_fd"),
    ({"argv": ["x"], "rlimits": ((7, 1 << 63, -1),)}, "rlimits[0] soft"),
    ({"argv": ["x"], "rlimits": ((7, 1, -2),)}, "rlimits[0] hard"),
    ({"argv": ["x"], "rlimits": ((-1, 1, 1),)}, "rlimits[0] resource"),
    ({"argv": ["x"], "landlock": LandlockSpec(5, 1, 0, 0, 1, (("relative", 1, False),))}, "landlock.rules[0].path"),
    ({"argv": ["x"], "landlock": LandlockSpec(5, 1, 0, 0, 1, (("/a\0", 1, False),))}, "landlock.rules[0].path"),
    ({"argv": ["x"], "landlock": LandlockSpec(5, 1 << 64, 0, 0, 1)}, "landlock.fs"),
    ({"argv": ["x"], "landlock": LandlockSpec(5, 1, 0, 0, 1, (("/a", 1, 2),))}, "landlock.rules[0].optional"),
    ({"argv": ["x"], "fault": "a\0"}, "fault"),
    ({"argv": ["x"], "proxy_listen": (5, 0)}, "proxy_listen port"),
    ({"argv": ["x"], "proxy_listen": (5, 65536)}, "proxy_listen port"),
    ({"argv": ["x"], "proxy_listen": (-1, 80)}, "proxy_listen channel"),
    ({"argv": ["x"], "proxy_listen": 5}, "proxy_listen must be"),
])
def test_encode_config_rejects_what_stage2_cannot_represent(fields, field):
    fields = {"status_fd": 3, **fields}
    with pytest.raises(ValueError) as info:
        encode_config(Stage2Config(**fields))
    assert str(info.value).startswith(field), str(info.value)


def test_encode_config_layout():
    cfg = Stage2Config(status_fd=5, argv=["a", os.fsdecode(b"\xff")], env={"K": "v"}, cwd="/w", search_path="/bin",
                       rlimits=((7, 64, -1),), landlock=LandlockSpec(1, 2, 3, 4, 5, (("/p", 6, True),)),
                       seccomp_fd=8, exe_fd=9, proxy_listen=(11, 3128))
    data = encode_config(cfg)
    le = lambda n, size: n.to_bytes(size, "little", signed=True)  # noqa: E731
    assert data == (b"SBX2" + le(1, 4) + _record(1, le(5, 4)) + _record(2, b"/w") + _record(3, b"a\0\xff\0")
                    + _record(4, b"K=v\0") + _record(5, b"/bin") + _record(6, le(7, 4) + le(64, 8) + le(-1, 8))
                    + _record(7, le(1, 4) + le(2, 8) + le(3, 8) + le(4, 8) + le(5, 8))
                    + _record(8, le(6, 8) + b"\x01/p") + _record(9, le(8, 4)) + _record(10, le(9, 4))
                    + _record(11, le(11, 4) + le(3128, 2)))


def test_frame_programs_rejects_malformed_programs():
    assert frame_programs([ALLOW_ALL, ALLOW_ALL * 2]) == b"\x08\0\0\0" + ALLOW_ALL + b"\x10\0\0\0" + ALLOW_ALL * 2
    for bad in ([], [b""], [b"1234567"], [ALLOW_ALL * 4097]):
        with pytest.raises(ValueError):
            frame_programs(bad)


def test_parse_status_drops_a_bad_tail_and_never_raises():
    def frame(kind: bytes, payload: bytes) -> bytes:
        return kind + len(payload).to_bytes(4, "little") + payload

    stream = frame(b"S", b"") + frame(b"N", b"fd-hygiene\0walked") + frame(b"E", b"exec\0/x: \xff\x002\x00127")
    expected = [StatusRecord("started", "", "", 0, None), StatusRecord("note", "fd-hygiene", "walked", 0, None),
                StatusRecord("error", "exec", os.fsdecode(b"/x: \xff"), 2, 127)]
    assert parse_status(stream) == expected
    for cut in range(len(stream)):
        records = parse_status(stream[:cut])
        assert records == expected[:len(records)]
    assert parse_status(frame(b"S", b"") + frame(b"E", b"a\0b\0notanumber\0125")) == expected[:1]
    assert parse_status(frame(b"S", b"") + frame(b"X", b"")) == expected[:1]
    assert parse_status(frame(b"E", b"a\0b\0c")) == []
