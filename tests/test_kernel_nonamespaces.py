"""KernelNoNamespaces on a real host without user namespaces, with no mocks.

The host: an outer sbx ``standard`` sandbox. Its seccomp filter refuses unshare, setns and
clone with any namespace flag (as Docker's default profile does), so the inner sbx's bwrap
cannot create a user namespace and the inner sbx can only resolve KernelNoNamespaces: the
``nested`` fixture proves that first (inner ``sbx doctor``) and errors when it is not so.
Each claim is then proved inside, with its positive control run in the same outer sandbox
without the inner sbx. Run as root and as uid 65534 on the host (inside the outer sandbox
both are uid 65534: bwrap maps a root caller to an unprivileged uid); the root caller of
this tier, which keeps uid 0, is covered by the forced-tier tests at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import ACCESS_PROBE, SYSTEM_PYTHON, parse_json_line, probe_source, verbose_tier

PRELUDE = r"""
import json, os, subprocess, sys, time
IMPORT_ROOT = sys.path[0]
W = os.environ["SBX_NESTED_WORKDIR"]

def sbx(*args, pass_fds=(), timeout=60):
    argv = [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {IMPORT_ROOT!r})\nfrom sandbox.cli import entry; entry()", *args]
    r = subprocess.run(argv, capture_output=True, text=True, pass_fds=pass_fds, timeout=timeout)
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}

def plain(argv, pass_fds=()):
    r = subprocess.run(argv, capture_output=True, text=True, pass_fds=pass_fds, timeout=60)
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}

def inner(*argv, profile="container", extra=(), pass_fds=()):
    return sbx("run", "--verbose", "--profile", profile, "--workdir", W + "/inner", *extra, "--", *argv,
               pass_fds=pass_fds)

def emit(**result):
    print(json.dumps(result))
"""


class NestedHost:
    """The outer ``standard`` sandbox: ``run(code)`` runs PRELUDE + code in it with the
    runner's Python and sbx; W (the outer workdir) holds ``inner``, the inner workdir."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.workdir = runner.workdir("/var/tmp")  # not under /tmp, which the inner profiles do not show
        inner = self.workdir / "inner"
        inner.mkdir()
        if runner.uid is not None:
            os.chown(inner, runner.uid, runner.uid)

    def run(self, code: str, *args: str) -> dict:
        flags = ["run", "--profile", "standard", "--workdir", str(self.workdir),
                 "--setenv", f"SBX_NESTED_WORKDIR={self.workdir}"]
        # The runner's sbx and interpreter, where they live under /tmp (a tmpfs in the outer
        # sandbox): uid 65534's copy of sbx always, and a checkout cloned there (as in CI).
        venv = os.path.dirname(os.path.dirname(self.runner.python))
        for path in dict.fromkeys((venv, self.runner.import_root)):
            if path.startswith("/tmp/"):
                flags += ["--ro-bind", path]
        result = self.runner.run(*flags, "--", *self.runner.python_argv(PRELUDE + code, *args), timeout=180)
        assert result.returncode == 0, f"the outer sandbox failed: {result.stdout}\n{result.stderr}"
        return parse_json_line(result.stdout)


@pytest.fixture
def nested(runner):
    host = NestedHost(runner)
    doctor = host.run("""
r = sbx("doctor", "--json", "--profile", "container")
emit(rc=r["rc"], doctor=json.loads(r["out"]) if r["rc"] == 0 else r["err"],
     status=open("/proc/self/status").read())
""")
    # The control that makes everything below meaningful: inside, bwrap cannot create
    # namespaces, and sbx resolves exactly KernelNoNamespaces.
    assert doctor["rc"] == 0, doctor
    checks = {c["name"]: c for c in doctor["doctor"]["checks"]}
    assert not checks["bwrap-userns"]["ok"], checks["bwrap-userns"]
    assert checks["landlock"]["ok"] and checks["seccomp"]["ok"], checks
    assert doctor["doctor"]["tier"] == "KernelNoNamespaces", doctor["doctor"]["tier"]
    assert "Seccomp:\t2" in doctor["status"]  # the outer filter is what refuses the namespaces
    yield host
    shutil.rmtree(host.workdir, ignore_errors=True)


def _inner_tier(result: dict) -> str:
    return verbose_tier(result["err"])


def test_the_tier_is_reported_and_cannot_be_forced_higher_and_floors_hold(nested):
    seen = nested.run("""
emit(doctor=sbx("doctor", "--profile", "container")["out"],
     higher=sbx("run", "--tier", "KernelSeccompOnly", "--allow-degraded", "--workdir", W + "/inner", "--", "true"),
     strict=sbx("run", "--profile", "strict", "--workdir", W + "/inner", "--", "true"),
     standard=sbx("run", "--profile", "standard", "--workdir", W + "/inner", "--", "true"),
     degraded=inner("true", profile="strict", extra=("--allow-degraded",)),
     dry=sbx("run", "--dry-run", "--profile", "container", "--workdir", W + "/inner", "--", "true"))
""")
    assert "tier: KernelNoNamespaces" in seen["doctor"]
    for fragment in ("What this tier lacks", "no pid namespace", "hidden paths are refused by Landlock, not masked",
                     "remedy:"):
        assert fragment in seen["doctor"], fragment
    assert seen["higher"]["rc"] == 125 and "sbx: error: tier:" in seen["higher"]["err"]
    for name in ("strict", "standard"):
        assert seen[name]["rc"] == 125 and "tier-below-floor" in seen[name]["err"], seen[name]
    assert seen["degraded"]["rc"] == 0 and "below profile 'strict''s floor" in seen["degraded"]["err"]
    assert _inner_tier(seen["degraded"]) == "KernelNoNamespaces"
    assert "bwrap: not used (KernelNoNamespaces" in seen["dry"]["out"]


def test_fd_hygiene(nested):
    seen = nested.run("""
fd = os.open("/etc/hostname", os.O_RDONLY)
os.dup2(fd, 7)
os.set_inheritable(7, True)
probe = ["python3", "-I", "-S", "-c", sys.argv[1]]
emit(control=plain(probe, pass_fds=(7,)), kept=inner(*probe, extra=("--preserve-fd", "7"), pass_fds=(7,)),
     hidden=inner(*probe, pass_fds=(7,)))
""", probe_source("fdprobe"))
    assert 7 in parse_json_line(seen["control"]["out"])["fds"]  # a child started without sbx sees it
    assert parse_json_line(seen["kept"]["out"])["fds"] == [0, 1, 2, 7], seen["kept"]  # the sbx path can see it
    assert _inner_tier(seen["hidden"]) == "KernelNoNamespaces"
    assert parse_json_line(seen["hidden"]["out"])["fds"] == [0, 1, 2], seen["hidden"]


def test_workdir_writes_land_writes_elsewhere_are_refused_and_secrets_stay_unread(nested):
    seen = nested.run("""
os.makedirs(W + "/other")
os.makedirs(W + "/secret")
with open(W + "/secret/s.txt", "w") as f:
    f.write("secret\\n")
probe = ["python3", "-I", "-S", "-c", sys.argv[1]]
reads = ",".join([W + "/secret/s.txt", "/etc/passwd"])
writes = ",".join([W + "/inner/in.txt", W + "/other/out.txt", "/tmp/out.txt"])
control = plain([*probe, reads, W + "/other/control.txt"])
result = inner(*probe, reads, writes)
emit(control=control, result=result, landed=open(W + "/inner/in.txt").read() if os.path.exists(W + "/inner/in.txt") else None,
     leaked=[p for p in (W + "/other/out.txt", "/tmp/out.txt") if os.path.exists(p)])
""", ACCESS_PROBE)
    control = parse_json_line(seen["control"]["out"])
    assert set(control["read"].values()) == {"ok"} and set(control["write"].values()) == {"ok"}, control
    assert _inner_tier(seen["result"]) == "KernelNoNamespaces"
    result = parse_json_line(seen["result"]["out"])
    assert seen["landed"] == "sbx was here\n"
    written = {os.path.basename(p): v for p, v in result["write"].items()}
    assert written["in.txt"] == "ok"
    assert written["out.txt"] != "ok" and not seen["leaked"], (result, seen["leaked"])
    read = {os.path.basename(p): v for p, v in result["read"].items()}
    assert read["s.txt"] != "ok" and read["passwd"] == "ok", read  # a granted file reads (the control)


def test_a_host_ro_profile_hides_by_refusal_and_grants_the_rest(nested):
    """standard's view (a read-only host root with hides) as Landlock's complement: the
    hidden directory is refused, its sibling is readable (the complement's own control)."""
    seen = nested.run("""
os.makedirs(W + "/hidden")
for name in ("hidden/s.txt", "public.txt"):
    with open(W + "/" + name, "w") as f:
        f.write("x\\n")
with open(W + "/p.toml", "w") as f:
    f.write('extends = "standard"\\ntier_floor = "KernelNoNamespaces"\\n[filesystem]\\nhide = ["/etc/shadow", "%s/hidden"]\\n' % W)
probe = ["python3", "-I", "-S", "-c", sys.argv[1], ",".join([W + "/hidden/s.txt", W + "/public.txt", "/etc/hostname"]), ""]
emit(control=plain(probe), result=inner(*probe, profile=W + "/p.toml"))
""", ACCESS_PROBE)
    assert set(parse_json_line(seen["control"]["out"])["read"].values()) == {"ok"}
    assert _inner_tier(seen["result"]) == "KernelNoNamespaces", seen["result"]
    read = {os.path.basename(p): v for p, v in parse_json_line(seen["result"]["out"])["read"].items()}
    assert read == {"s.txt": "Permission denied", "public.txt": "ok", "hostname": "ok"}, read


NET_PROBE = r"""
import json, socket, sys
out = {}
for name, family, address in (("inet", socket.AF_INET, ("127.0.0.1", int(sys.argv[1]))),
                              ("unix", socket.AF_UNIX, sys.argv[2])):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(address)
        s.close()
        out[name] = "ok"
    except OSError as exc:
        out[name] = exc.strerror or str(exc)
print(json.dumps(out))
"""


def test_no_network_and_no_host_unix_socket(nested):
    seen = nested.run("""
import socket, threading
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen(8)
os.makedirs(W + "/daemon")
unix = socket.socket(socket.AF_UNIX)
unix.bind(W + "/daemon/sock")  # a host daemon's socket: outside the inner view
unix.listen(8)
def accept(s):
    try:
        while True:
            s.accept()[0].close()
    except OSError:
        pass
for s in (tcp, unix):
    threading.Thread(target=accept, args=(s,), daemon=True).start()
probe = ["python3", "-I", "-S", "-c", sys.argv[1], str(tcp.getsockname()[1]), W + "/daemon/sock"]
emit(control=plain(probe), result=inner(*probe))
""", NET_PROBE)
    assert parse_json_line(seen["control"]["out"]) == {"inet": "ok", "unix": "ok"}
    assert _inner_tier(seen["result"]) == "KernelNoNamespaces"
    result = parse_json_line(seen["result"]["out"])
    assert result["inet"] != "ok" and result["unix"] != "ok", result


SPAWN_TREE = ('sleep 300 & echo $! > "$1"; (sleep 301 & echo $! >> "$1"); echo started; sleep 302')


def test_the_timeout_kills_the_whole_tree(nested):
    seen = nested.run("""
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False

def pids(path):
    for _ in range(500):
        if os.path.exists(path) and len(open(path).read().split()) == 2:
            return [int(p) for p in open(path).read().split()]
        time.sleep(0.01)
    return []

tree = sys.argv[1]
# Control: killing only the direct child leaves the grandchildren running.
proc = subprocess.Popen(["sh", "-c", tree, "sh", W + "/control-pids"], start_new_session=True, stdout=subprocess.PIPE)
control = pids(W + "/control-pids")
proc.kill()
proc.wait()
survived = [p for p in control if alive(p)]
os.killpg(proc.pid, 9)
result = sbx("run", "--verbose", "--profile", "container", "--timeout", "2", "--workdir", W + "/inner", "--",
             "sh", "-c", tree, "sh", W + "/inner/pids")
inner_pids = pids(W + "/inner/pids")
time.sleep(0.2)
emit(control=control, survived=survived, result=result, pids=inner_pids, alive=[p for p in inner_pids if alive(p)])
""", SPAWN_TREE)
    assert len(seen["control"]) == 2 and seen["survived"] == seen["control"], seen  # the probe sees survivors
    assert seen["result"]["rc"] == 124, seen["result"]
    assert _inner_tier(seen["result"]) == "KernelNoNamespaces"
    assert len(seen["pids"]) == 2 and seen["alive"] == [], seen


def test_seccomp_stacks_on_the_inner_command(nested):
    """The outer sandbox already shows Seccomp: 2 and NoNewPrivs: 1, so the proof is the
    filter count: the inner command carries the inner sbx's two programs on top."""
    seen = nested.run("""
emit(control=plain(["cat", "/proc/self/status"]), result=inner("cat", "/proc/self/status"))
""")
    def fields(text):
        return dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()))
    outside, inside = fields(seen["control"]["out"]), fields(seen["result"]["out"])
    assert _inner_tier(seen["result"]) == "KernelNoNamespaces"
    assert inside["Seccomp"] == "2" and inside["NoNewPrivs"] == "1"
    assert int(inside["Seccomp_filters"]) == int(outside["Seccomp_filters"]) + 2, (outside, inside)


def test_tmpdir_is_private_and_removed_even_with_planted_links(nested):
    seen = nested.run("""
os.makedirs(W + "/keep")
open(W + "/keep/file", "w").close()
script = ('echo "$TMPDIR"; stat -c "%a %u" "$TMPDIR"; echo hi > "$TMPDIR/f"; cat "$TMPDIR/f"; '
          'ln -s "$1" "$TMPDIR/link"; mkdir -p "$TMPDIR/d/e"; touch "$TMPDIR/d/e/f"; chmod 0 "$TMPDIR/d"; '
          'echo x > /tmp/shared 2>/dev/null || echo refused')
result = inner("sh", "-c", script, "sh", W + "/keep")
lines = result["out"].split()
timed = sbx("run", "--profile", "container", "--timeout", "1", "--workdir", W + "/inner", "--",
            "sh", "-c", 'echo "$TMPDIR"; exec sleep 30')
emit(result=result, lines=lines, gone=not os.path.lexists(lines[0]) if lines else None,
     kept=os.path.exists(W + "/keep/file"), shared=os.path.exists("/tmp/shared"), timed=timed,
     timed_gone=not os.path.lexists(timed["out"].strip()) if timed["out"].strip() else None, uid=os.getuid())
""")
    lines = seen["lines"]
    assert lines[0].startswith("/tmp/sbx-tmp-") and lines[1:4] == ["700", str(seen["uid"]), "hi"], seen
    assert lines[4] == "refused" and not seen["shared"]  # the outer /tmp itself is not granted
    assert seen["gone"] is True and seen["kept"] is True, seen
    assert seen["timed"]["rc"] == 124 and seen["timed_gone"] is True, seen["timed"]


# ---- the tier forced on this host (KernelFull resolves here): what needs the real host ----

def test_forced_tier_drops_root_capabilities_and_sets_no_new_privs(runner):
    fields = "grep -E '^(Uid|CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status"
    control = runner.run_argv(["sh", "-c", fields])
    result = runner.run("run", "--verbose", "--profile", "container", "--tier", "KernelNoNamespaces",
                        "--workdir", str(runner.workdir()), "--", "sh", "-c", fields)
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == "KernelNoNamespaces"
    outside = dict(line.split(":", 1) for line in control.stdout.splitlines())
    inside = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert outside["NoNewPrivs"].strip() == "0" and outside["Seccomp"].strip() == "0"  # the control
    assert inside["NoNewPrivs"].strip() == "1" and inside["Seccomp"].strip() == "2"
    assert inside["Uid"].split()[0] == outside["Uid"].split()[0]  # no uid switch at this tier
    if runner.uid is None:
        assert int(outside["CapEff"], 16) != 0  # root outside has capabilities ...
        assert int(inside["CapEff"], 16) == 0 and int(inside["CapBnd"], 16) == 0  # ... and none inside


def _leftover_tmp_dirs() -> set[str]:
    return {name for name in os.listdir("/tmp") if name.startswith("sbx-tmp-")}


def test_library_paths_remove_the_private_temp_dir(tmp_path):
    import asyncio

    from sandbox import Sandbox, Tier

    before = _leftover_tmp_dirs()
    sb = Sandbox("container", str(tmp_path), tier=Tier.KernelNoNamespaces)
    r = sb.run(["sh", "-c", 'echo "$TMPDIR"; touch "$TMPDIR/x"'], capture_output=True, text=True)
    assert r.returncode == 0 and r.tier == Tier.KernelNoNamespaces, r.stderr
    assert r.stdout.startswith("/tmp/sbx-tmp-") and not os.path.exists(r.stdout.strip())
    timed = sb.run(["sleep", "30"], timeout=0.5)
    assert timed.returncode == 124 and timed.timed_out
    missing = sb.run(["no-such-command-sbx"])
    assert missing.returncode == 127
    p = sb.spawn(["sh", "-c", 'echo "$TMPDIR"'], stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate()
    assert out.startswith("/tmp/sbx-tmp-") and not os.path.exists(out.strip())
    dropped = sb.spawn(["sleep", "30"])
    dropped.kill_sandbox()
    dropped.wait()

    async def main():
        p = await sb.spawn_async(["sh", "-c", 'echo "$TMPDIR"'], stdout=asyncio.subprocess.PIPE)
        out, _ = await p.communicate()
        return out.decode()

    out = asyncio.run(main())
    assert out.startswith("/tmp/sbx-tmp-") and not os.path.exists(out.strip())
    assert _leftover_tmp_dirs() - before == set()



# What Landlock cannot confine at this tier, tried on the caller's own file outside the view
# and on the caller's own process: seccomp refuses them, while the same calls on the
# command's own process and files it only creates keep working.
OUTSIDE_VIEW_PROBE = r"""
import json, os, resource, sys
victim_file, victim_pid = sys.argv[1], int(sys.argv[2])
out = {}
def attempt(name, fn):
    try:
        fn(); out[name] = "done"
    except OSError as exc:
        out[name] = exc.errno
attempt("chmod", lambda: os.chmod(victim_file, 0o4777))
attempt("chown", lambda: os.chown(victim_file, os.getuid(), os.getgid()))
attempt("setxattr", lambda: os.setxattr(victim_file, "user.sbx", b"1"))
attempt("utime", lambda: os.utime(victim_file, (0, 0)))
attempt("prlimit_other", lambda: resource.prlimit(victim_pid, resource.RLIMIT_CORE, (0, 0)))
attempt("prlimit_self", lambda: resource.prlimit(0, resource.RLIMIT_CORE, (0, 0)))
attempt("create", lambda: open("made-here", "w").close())
attempt("touch_now", lambda: os.utime(victim_file, None))
import ctypes, fcntl, struct
libc = ctypes.CDLL(None, use_errno=True)
def check(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), "")
    return result
own = os.open("made-here", os.O_RDONLY)
def setflags():  # the file's own flags written back: a no-op that still needs FS_IOC_SETFLAGS
    flags = fcntl.ioctl(own, 0x80086601, struct.pack("l", 0))
    fcntl.ioctl(own, 0x40086602, flags)
attempt("setflags", setflags)
attempt("lease", lambda: fcntl.fcntl(own, fcntl.F_SETLEASE, fcntl.F_RDLCK))
attempt("lease_high_bits", lambda: check(libc.syscall(72, own, 0x100000000 | fcntl.F_SETLEASE, fcntl.F_RDLCK)))
here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
attempt("dnotify", lambda: check(libc.syscall(72, here, 1026, 0x4)))  # F_NOTIFY, DN_CREATE
attempt("inotify", lambda: check(libc.inotify_add_watch(check(libc.inotify_init1(0)), b".", 0x100)))
def clone_parent():
    pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD)
    if pid == 0:
        os._exit(0)
    check(pid)
attempt("clone_parent", clone_parent)
attempt("renice_other", lambda: os.setpriority(os.PRIO_PROCESS, victim_pid, 5))
try:
    os.setpgid(0, 0)  # a group of our own (inside, stage 2 already made one: EPERM, ignored)
except OSError:
    pass
attempt("renice_group", lambda: os.setpriority(os.PRIO_PGRP, 0, os.getpriority(os.PRIO_PROCESS, 0)))
attempt("affinity_other", lambda: os.sched_setaffinity(victim_pid, os.sched_getaffinity(victim_pid)))
attempt("renice_self", lambda: os.setpriority(os.PRIO_PROCESS, 0, 1))
attempt("affinity_self", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
attempt("sysv_shm", lambda: check(libc.shmget(0, 4096, 0o1600)))  # IPC_PRIVATE | IPC_CREAT | 0600
attempt("sysv_msg", lambda: check(libc.msgget(0, 0o1600)))
print(json.dumps(out))
"""


def test_metadata_calls_and_other_processes_limits_are_refused(runner):
    victim_dir = runner.workdir("/var/tmp")  # outside the view, owned by the runner's uid
    victim = victim_dir / "victim"
    victim.write_text("x")
    if runner.uid is not None:
        os.chown(victim, runner.uid, runner.uid)
    sleeper = subprocess.Popen(runner.wrap(["sleep", "60"]))
    try:
        # Control: outside sbx, the same user changes the file's metadata and the sleeper's limits.
        pid = _sleeper_pid(sleeper)
        control = parse_json_line(runner.run_argv([SYSTEM_PYTHON, "-I", "-S", "-c", OUTSIDE_VIEW_PROBE, str(victim),
                                                   str(pid)], cwd=str(runner.workdir())).stdout)
        probes = ("chmod", "setxattr", "utime", "prlimit_other", "setflags", "lease", "inotify", "clone_parent",
                  "renice_other", "renice_group", "affinity_other", "sysv_shm", "sysv_msg", "dnotify")
        assert {k: control[k] for k in probes} == dict.fromkeys(probes, "done"), control
        os.chmod(victim, 0o644)
        before = os.stat(victim)
        result = runner.run("run", "--verbose", "--profile", "container", "--tier", "KernelNoNamespaces",
                            "--workdir", str(runner.workdir()), "--", SYSTEM_PYTHON, "-I", "-S", "-c",
                            OUTSIDE_VIEW_PROBE, str(victim), str(pid))
        assert result.returncode == 0, result.stderr
        assert verbose_tier(result.stderr) == "KernelNoNamespaces"
        inside = parse_json_line(result.stdout)
        refused = ("chmod", "chown", "setxattr", "utime", "prlimit_other", "setflags", "lease", "inotify",
                   "clone_parent", "renice_other", "renice_group", "affinity_other", "sysv_shm", "sysv_msg",
                   "lease_high_bits", "dnotify")
        assert {k: inside[k] for k in refused} == dict.fromkeys(refused, 1), inside  # EPERM
        assert inside["prlimit_self"] == "done" and inside["create"] == "done", inside
        assert inside["renice_self"] == "done" and inside["affinity_self"] == "done", inside
        assert inside["touch_now"] == "done", inside  # times set to now: what touch does
        after = os.stat(victim)
        assert after.st_mode == before.st_mode and after.st_mtime_ns >= before.st_mtime_ns
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
        shutil.rmtree(victim_dir)


def _sleeper_pid(sleeper) -> int:
    """The pid of ``sleep`` itself (setpriv execs it, so it is the Popen's pid)."""
    import time

    for _ in range(100):
        with open(f"/proc/{sleeper.pid}/comm") as comm:
            if comm.read().strip() == "sleep":
                return sleeper.pid
        time.sleep(0.02)
    raise AssertionError("the sleeper did not start")


def test_private_tmp_removal_takes_apart_a_tree_deeper_than_any_recursion(tmp_path):
    """The command chooses the depth (3000 levels, made through directory descriptors, with
    a mode-0 directory and a link out deep inside): removal still leaves nothing, and the
    link's target outside is untouched."""
    from sandbox import private_tmp

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    path = private_tmp.create()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(3000):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        if level == 1500:
            os.symlink(str(outside), "out", dir_fd=child)
            with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=child), "w") as f:
                f.write("x")
        os.close(fd)
        fd = child
    os.close(fd)
    locked = os.open(path, os.O_RDONLY | os.O_DIRECTORY)  # a mode-0 directory near the top
    os.chmod("d", 0, dir_fd=locked)
    os.close(locked)
    private_tmp.remove(path)
    assert not os.path.exists(path)
    assert (outside / "keep").read_text() == "kept"


# Leaves a sleeper in a session of its own holding the run's stdout, and prints its pid.
LEAVER = 'setsid sh -c \'sleep 60 & echo $!\' & sleep 0.3'


def test_what_the_command_leaves_behind_is_killed_when_it_exits(runner):
    """No pid namespace ends the processes a command leaves (one holding the caller's
    terminal would read what the user types next): stage 2's supervisor kills them, and a
    run capturing output returns at once instead of waiting for the leftover's EOF."""
    import time

    # Control: the same command without sbx leaves the sleeper running.
    control = runner.run_argv(["sh", "-c", LEAVER.replace("sleep 60 &", "sleep 60 >/dev/null 2>&1 &")])
    leftover = int(control.stdout.split()[-1])
    try:
        assert os.path.exists(f"/proc/{leftover}")
    finally:
        os.kill(leftover, 9)
    started = time.monotonic()
    result = runner.run("run", "--verbose", "--profile", "container", "--tier", "KernelNoNamespaces",
                        "--workdir", str(runner.workdir()), "--", "sh", "-c", LEAVER, timeout=30)
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == "KernelNoNamespaces"
    assert time.monotonic() - started < 10  # not the leftover's 60 s
    swept = int(result.stdout.split()[-1])
    time.sleep(0.1)
    with open(f"/proc/{swept}/stat") if os.path.exists(f"/proc/{swept}/stat") else open(os.devnull) as stat:
        assert stat.read().rsplit(")", 1)[-1].split()[:1] in ([], ["Z"]), f"pid {swept} is still running"
