"""KernelNoNamespaces planning: the profile's view as Landlock grants alone (pure), and the
private temp directory's removal against what a sandbox can leave in it."""

from __future__ import annotations

import os
import subprocess

from test_planning import HELPER, HOST, hp

from sandbox import landlock_view
from sandbox.hostview import HostView
from sandbox.landlock_rights import grant_mask
from sandbox.plan import Mount, Request, build_plan, dirs_to_list
from sandbox.profile import load_profile
from sandbox.tiers import Tier

ABI = 7
READ, RW = grant_mask("read", ABI), grant_mask("read-write", ABI)
LISTINGS = {
    "/": (("bin", "symlink"), ("dev", "dir"), ("etc", "dir"), ("home", "dir"), ("proc", "dir"), ("sock", "other"),
          ("tmp", "dir"), ("usr", "dir"), ("vmlinuz", "file"), ("work", "dir")),
    "/etc": (("passwd", "file"), ("shadow", "file"), ("ssl", "dir"), ("to-shadow", "symlink")),
    "/work": (("other", "dir"), ("project", "dir")),
    "/work/project": (("notes", "file"), ("ro", "dir"), (".git", "dir")),
}


def granted(rules) -> dict[str, int]:
    out: dict[str, int] = {}
    for path, bits, _ in rules:
        out[path] = out.get(path, 0) | bits
    return out


def test_a_host_root_with_hidden_paths_is_granted_as_the_complement():
    mounts = [Mount("ro-bind", "/", "/", "read"), Mount("dev", "/dev", grant="device"),
              Mount("proc", "/proc", grant="read-noexec"), Mount("tmpfs", "/tmp", "1", "read-write"),
              Mount("hide-dir", "/home"), Mount("hide-file", "/etc/shadow"),
              Mount("bind", "/work/project", "/work/project", "read-write")]
    rules = granted(landlock_view.rules(mounts, ABI, LISTINGS, private_tmp=True, devices=True))
    assert rules == {
        "/etc/passwd": READ, "/etc/ssl": READ, "/usr": READ, "/vmlinuz": READ, "/work": READ,
        "/proc": grant_mask("read-noexec", ABI), "/work/project": RW,
        "/dev/null": grant_mask("device", ABI), "/dev/zero": grant_mask("device", ABI),
        "/dev/full": grant_mask("device", ABI), "/dev/urandom": grant_mask("read-noexec", ABI),
        "/dev/random": grant_mask("read-noexec", ABI), landlock_view.PRIVATE_TMP: RW,
    }
    # Never "/", nor a hidden path, the host's /tmp or /dev, a symlink (which stage 2 would
    # follow: /etc/to-shadow) or a socket.
    for path in ("/", "/etc", "/home", "/etc/shadow", "/tmp", "/dev", "/bin", "/etc/to-shadow", "/sock"):
        assert path not in rules, path


def test_an_empty_root_grants_exactly_its_entries():
    mounts = [Mount("ro-bind", "/usr", "/usr", "read"), Mount("symlink", "/bin", "usr/bin"),
              Mount("ro-bind", "/etc/passwd", "/etc/passwd", "read", True),
              Mount("bind", "/work/project", "/work/project", "read-write")]
    rules = landlock_view.rules(mounts, ABI, LISTINGS, private_tmp=False, devices=False)
    assert rules == [("/usr", READ, False), ("/etc/passwd", READ, True), ("/work/project", RW, False)]


def test_a_read_only_or_hidden_entry_inside_the_workdir_is_cut_out_of_its_grant():
    mounts = [Mount("bind", "/work/project", "/work/project", "read-write"),
              Mount("ro-bind", "/work/project/ro", "/work/project/ro", "read"),
              Mount("hide-dir", "/work/project/.git")]
    rules = granted(landlock_view.rules(mounts, ABI, LISTINGS, private_tmp=False, devices=False))
    assert rules == {"/work/project/notes": RW, "/work/project/ro": READ}


def test_a_directory_that_could_not_be_listed_gets_nothing_beneath_it():
    mounts = [Mount("ro-bind", "/", "/", "read"), Mount("hide-file", "/etc/shadow")]
    listings = {k: v for k, v in LISTINGS.items() if k != "/etc"}
    rules = granted(landlock_view.rules(mounts, ABI, listings, private_tmp=False, devices=False))
    assert "/etc" not in rules and not any(p.startswith("/etc/") for p in rules)
    assert rules["/usr"] == READ  # the control: the rest of / is granted


def test_the_planner_at_kernel_no_namespaces():
    host = HOST._replace(listings={"/": LISTINGS["/"], "/etc": LISTINGS["/etc"]})
    p = build_plan(load_profile("strict"), Tier.KernelNoNamespaces, Request(("ls",), "/work/project"), host, ABI)
    assert p.bwrap_args is None and p.run_as is None and not p.drop_caps
    assert p.env["TMPDIR"] == p.env["HOME"] == landlock_view.PRIVATE_TMP  # HOME=/tmp named a tmpfs entry
    assert p.seccomp.sockets == "none" and p.landlock.net == 0b11  # TCP bind and connect denied
    assert "/etc/hosts" not in [m.path for m in p.mounts if m.op == "data"]  # no namespace to show it in
    assert ("/work/project", RW, False) in p.landlock.rules and ("/", grant_mask("list", ABI), False) not in p.landlock.rules
    text = p.describe()
    for fragment in ("bwrap: not used (KernelNoNamespaces", "no pid namespace", "no mount namespace",
                     "refused by Landlock, not masked", "socket: every family EPERM"):
        assert fragment in text, fragment
    assert "signals to the caller's other processes" not in text  # ABI 7 scopes them
    old = build_plan(load_profile("strict"), Tier.KernelNoNamespaces, Request(("ls",), "/work/project"), host, 5)
    assert "signals to the caller's other processes (same uid)" in old.describe()
    shared = build_plan(load_profile("strict"), Tier.KernelNoNamespaces,
                        Request(("ls",), "/work/project", share_net=True), host, ABI)
    assert shared.seccomp.sockets == "all" and shared.landlock.net == 0
    root = build_plan(load_profile("strict"), Tier.KernelNoNamespaces, Request(("ls",), "/work/project"),
                      host._replace(uid=0, gid=0), ABI)
    assert root.drop_caps and root.run_as is None and "empty capability bounding set" in root.describe()
    # Above this tier: loopback in the private network namespace, as before.
    assert build_plan(load_profile("strict"), Tier.KernelFull, Request(("ls",), "/work/project"), host,
                      ABI, frozenset({"size"})).seccomp.sockets == "loopback"


def test_the_listings_asked_for_cover_every_ancestor():
    request = Request(("ls",), "/work/project", ro_binds=("/data",))
    wanted = dirs_to_list(load_profile("standard"), request)
    for directory in ("/", "/etc", "/var", "/var/lib", "/work"):
        assert directory in wanted, directory
    assert HostView(paths={}, stage2_helper=HELPER).listings == {}
    assert hp("dir", "/x", True).is_dir


def test_the_private_temp_dir_is_removed_without_following_what_the_sandbox_planted(runner, tmp_path):
    """Run as the runner's user: a link to a directory it owns elsewhere, directories it
    made unreadable and unwritable. The outside directory and its file survive; the temp
    directory is gone. Control: the same tree removed by following links loses the file."""
    outside = runner.workdir()
    (outside / "keep.txt").write_text("keep\n")
    code = f"""
import os, sys
from sandbox import private_tmp
tmp = private_tmp.create()
os.symlink({str(outside)!r}, os.path.join(tmp, "link"))
os.symlink({str(outside / "keep.txt")!r}, os.path.join(tmp, "filelink"))
for mode, name in ((0, "locked"), (0o500, "readonly"), (0o300, "noread")):
    os.makedirs(os.path.join(tmp, name, "deep"))
    open(os.path.join(tmp, name, "deep", "f"), "w").close()
    os.chmod(os.path.join(tmp, name), mode)
print(oct(os.stat(tmp).st_mode & 0o777), os.stat(tmp).st_uid == os.getuid())
sys.stdout.flush()
if sys.argv[1] == "control":
    import shutil
    shutil.rmtree(os.path.join(tmp, "link") + "/", ignore_errors=True)  # following the link
private_tmp.remove(tmp)
print(os.path.exists(tmp))
"""
    control = runner.run_argv(runner.python_argv(code, "control"))
    assert control.returncode == 0, control.stderr
    assert not (outside / "keep.txt").exists()  # the control: following the link would destroy it
    (outside / "keep.txt").write_text("keep\n")
    if runner.uid is not None:
        os.chown(outside / "keep.txt", runner.uid, runner.uid)
    result = runner.run_argv(runner.python_argv(code, "remove"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0o700", "True", "False"]
    assert (outside / "keep.txt").read_text() == "keep\n"
    subprocess.run(["rm", "-rf", str(outside)], check=True)
