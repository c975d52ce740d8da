"""The pure planner: exact bwrap argv, Landlock grants from the same entries, tier choice."""

from __future__ import annotations

import pytest

from sandbox.errors import BindError, HostError, TierBelowFloorError, TierError, UsageError, WorkdirError
from sandbox.hostview import HostPath, HostView
from sandbox.landlock_rights import FS_RIGHTS, grant_mask
from sandbox.plan import Request, build_plan
from sandbox.probes import choose_tier
from sandbox.profile import load_profile
from sandbox.tiers import Tier


def hp(kind: str, real: str, is_dir: bool = False, target: str = "") -> HostPath:
    """A host path with a made-up identity chain (one (dev, ino) per path component)."""
    parts = [p for p in real.split("/") if p]
    chain = tuple((1, hash("/" + "/".join(parts[:n]))) for n in range(len(parts), -1, -1))
    return HostPath(kind, target, real, is_dir, chain)


HELPER = "/opt/sbx/sandbox/sbx-stage2"
HOST = HostView(
    paths={
        "/": hp("dir", "/", True),
        "/usr": hp("dir", "/usr", True),
        "/etc/passwd": hp("file", "/etc/passwd"),
        "/bin": hp("symlink", "/usr/bin", True, "usr/bin"),
        "/lib64": hp("symlink", "/usr/lib64", True, "usr/lib64"),
        "/work/project": hp("dir", "/work/project", True),
        "/work/project/ro": hp("dir", "/work/project/ro", True),
        "/work/link": hp("symlink", "/etc", True, "/etc"),
        "/data": hp("dir", "/data", True),
        HELPER: hp("file", HELPER),
    },
    stage2_helper=HELPER, uid=1000, gid=1000)
FEATURES = frozenset({"clearenv", "disable-userns", "size"})
MIB = 1 << 20


def plan(tier=Tier.KernelFull, profile="strict", **request):
    fields = {"argv": ("ls", "-l"), "workdir": "/work/project", **request}
    return build_plan(load_profile(profile), tier, Request(**fields), HOST, 7, FEATURES)


def test_strict_bwrap_argv_is_exact():
    p = plan()
    assert p.bwrap_args == (
        "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
        "--unshare-cgroup-try", "--uid", "1000", "--gid", "1000", "--disable-userns",
        "--hostname", "sbx", "--die-with-parent", "--new-session", "--clearenv",
        # Mount order: a parent before anything beneath it.
        "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib64", "/lib64",
        "--dev", "/dev", "--proc", "/proc", "--size", str(512 * MIB), "--tmpfs", "/tmp",
        "--ro-bind-try", "/etc/passwd", "/etc/passwd", "--size", str(64 * MIB), "--tmpfs", "/dev/shm",
        "--bind", "/work/project", "/work/project",
        "--ro-bind-data", "<generated>/etc/hosts", "/etc/hosts",  # the sandbox's hostname resolves
        "--ro-bind", HELPER, HELPER,  # stage 2, from anywhere
        "--remount-ro", "/", "--chdir", "/work/project")
    assert p.stage2_helper == "/opt/sbx/sandbox/sbx-stage2"


def test_landlock_grants_come_from_the_same_entries_as_the_binds():
    p = plan(ro_binds=("/data",))
    rules = {path: bits for path, bits, _ in p.landlock.rules}
    bound = {p.bwrap_args[i + 2] for i, a in enumerate(p.bwrap_args)
             if a in ("--ro-bind", "--ro-bind-try", "--bind", "--ro-bind-data")}
    bound.discard(HOST.stage2_helper)  # stage 2 runs before Landlock; the command gets no grant on it
    assert bound | {"/", "/dev", "/proc", "/tmp", "/dev/shm"} == set(rules)
    assert rules["/"] == FS_RIGHTS["read_dir"][0]  # listing the view's own root, nothing more
    assert rules["/usr"] == rules["/data"] == grant_mask("read", 7)
    assert rules["/work/project"] == rules["/tmp"] == sum(bit for bit, _ in FS_RIGHTS.values())
    assert not rules["/usr"] & FS_RIGHTS["write_file"][0]
    assert p.landlock.net == 0  # loopback on: the private network namespace is the boundary
    assert p.landlock.scoped == 3


def test_share_net_drops_the_net_namespace_and_the_tcp_rules():
    p = plan(share_net=True)
    assert "--unshare-net" not in p.bwrap_args
    assert p.landlock.net == 0
    assert p.seccomp.sockets == "all"


def test_landlock_abi_below_network_support_handles_no_net_rights():
    p = build_plan(load_profile("strict"), Tier.KernelFull, Request(("ls",), "/work/project"), HOST, 3, FEATURES)
    assert p.landlock.net == 0 and p.landlock.scoped == 0
    assert not p.landlock.fs & FS_RIGHTS["ioctl_dev"][0]


def test_seccomp_only_tier_has_no_landlock_and_environment_only_no_bwrap():
    assert plan(Tier.KernelSeccompOnly).landlock is None
    env_only = plan(Tier.EnvironmentOnly)
    assert env_only.bwrap_args is None and env_only.seccomp is None and env_only.landlock is None
    assert env_only.stage2_helper == "/opt/sbx/sandbox/sbx-stage2"


def test_environment_is_an_allowlist():
    p = plan(host_env=(("LANG", "C.UTF-8"), ("LC_ALL", "C"), ("AWS_SECRET_ACCESS_KEY", "x"), ("HOME", "/root")),
             setenv=(("FOO", "bar"),))
    assert p.env["LANG"] == "C.UTF-8" and p.env["LC_ALL"] == "C" and p.env["FOO"] == "bar"
    assert "AWS_SECRET_ACCESS_KEY" not in p.env
    assert p.env["HOME"] == "/tmp"


def test_standard_hides_secrets_under_a_read_only_host():
    host = HostView(paths={**HOST.paths, "/etc/shadow": hp("file", "/etc/shadow"), "/root": hp("dir", "/root", True)},
                    stage2_helper=HOST.stage2_helper, uid=0, gid=0)
    p = build_plan(load_profile("standard"), Tier.KernelSeccompOnly, Request(("ls",), "/work/project"), host, 0,
                   FEATURES)
    args = p.bwrap_args
    assert args[args.index("--ro-bind"):args.index("--ro-bind") + 3] == ("--ro-bind", "/", "/")
    triples = [args[i:i + 3] for i in range(len(args) - 2)]
    assert ("--ro-bind", "/dev/null", "/etc/shadow") in triples
    pairs = [args[i:i + 2] for i in range(len(args) - 1)]
    assert ("--tmpfs", "/root") in pairs and ("--remount-ro", "/root") in pairs
    assert ("--size", str(1 << 16)) in pairs  # every tmpfs has a size, hides too
    assert "--cap-drop" in args and "65534" in args  # root becomes an unprivileged uid inside


@pytest.mark.parametrize("request_fields, error", [
    ({"argv": ()}, UsageError),
    ({"workdir": "/"}, WorkdirError),
    ({"workdir": "//etc"}, WorkdirError),
    ({"workdir": "/missing"}, WorkdirError),
    ({"workdir": "relative"}, WorkdirError),
    ({"workdir": "/work/link"}, WorkdirError),
    ({"binds": ("/missing",)}, BindError),
    ({"binds": ("/usr",)}, BindError),
    ({"binds": ("//usr",)}, BindError),
    ({"binds": ("/usr/share",)}, BindError),
    ({"binds": ("/work/link",)}, BindError),
    ({"ro_binds": ("/work/link",)}, BindError),
    ({"preserve_fds": (2,)}, UsageError),
])
def test_requests_that_cannot_be_met(request_fields, error):
    paths = {**HOST.paths, "//etc": hp("dir", "/etc", True), "//usr": hp("dir", "/usr", True),
             "/usr/share": hp("dir", "/usr/share", True)}
    host = HostView(paths=paths, stage2_helper=HOST.stage2_helper)
    fields = {"argv": ("ls",), "workdir": "/work/project", **request_fields}
    with pytest.raises(error):
        build_plan(load_profile("strict"), Tier.KernelFull, Request(**fields), host, 7, FEATURES)


@pytest.mark.parametrize("path", ["/", "/usr/share", "/usr/local", "/etc/ssl", "/var", "/var/lib/x", "/root",
                                  "/root/project", "/home", "/tmp", "/boot/x", "/proc/1", "/sys", "/dev/shm",
                                  "/run/user/0", "/opt/tool"])
def test_system_directories_and_everything_beneath_them_are_never_writable(path):
    from sandbox.plan import system_directory

    assert system_directory(path) is not None
    host = HostView(paths={**HOST.paths, path: hp("dir", path, True)}, stage2_helper=HELPER)
    for fields in ({"workdir": path}, {"binds": (path,)}):
        with pytest.raises((WorkdirError, BindError), match="system directory"):
            build_plan(load_profile("strict"), Tier.KernelFull, Request(("ls",), **{"workdir": "/work/project",
                                                                                    **fields}), host, 7, FEATURES)


@pytest.mark.parametrize("path", ["/home/me/project", "/tmp/work", "/var/tmp/x", "/srv/data", "/work/project"])
def test_project_directories_are_fine(path):
    from sandbox.plan import system_directory

    assert system_directory(path) is None


def test_profile_binds_are_checked_like_any_other(tmp_path):
    custom = tmp_path / "b.toml"
    custom.write_text('extends = "strict"\n[filesystem]\nbinds = ["/usr"]\n')
    from sandbox.profile import load_profile as load

    with pytest.raises(BindError, match="system directory /usr"):
        build_plan(load(str(custom)), Tier.KernelFull, Request(("ls",), "/work/project"), HOST, 7, FEATURES)


def test_read_only_binds_inside_the_workdir_are_mounted_after_it():
    p = plan(ro_binds=("/work/project/ro",))
    args = p.bwrap_args
    assert args.index("/work/project/ro") > args.index("/work/project")


def test_profile_binds_under_a_tmpfs_come_after_the_tmpfs(tmp_path):
    custom = tmp_path / "t.toml"
    custom.write_text('extends = "strict"\n[filesystem]\nro_binds = ["/usr", "/tmp/tools"]\n')
    from sandbox.profile import load_profile as load

    host = HostView(paths={**HOST.paths, "/tmp/tools": hp("dir", "/tmp/tools", True)}, stage2_helper=HELPER)
    p = build_plan(load(str(custom)), Tier.KernelFull, Request(("ls",), "/work/project"), host, 7, FEATURES)
    assert p.bwrap_args.index("/tmp/tools") > p.bwrap_args.index("/tmp")


def test_a_bwrap_without_size_is_a_clear_error():
    with pytest.raises(HostError, match="--size"):
        build_plan(load_profile("strict"), Tier.KernelFull, Request(("ls",), "/work/project"), HOST, 7,
                   frozenset({"clearenv"}))


def test_environment_only_does_not_claim_a_network_namespace():
    text = plan(Tier.EnvironmentOnly).describe()
    assert "new network namespace" not in text and "network: the host's" in text


def test_tier_choice():
    assert choose_tier(Tier.KernelFull, None, Tier.KernelFull, False, "strict") == (Tier.KernelFull, None)
    with pytest.raises(TierError):
        choose_tier(Tier.KernelSeccompOnly, Tier.KernelFull, Tier.KernelSeccompOnly, False, "standard")
    with pytest.raises(TierBelowFloorError):
        choose_tier(Tier.KernelSeccompOnly, None, Tier.KernelFull, False, "strict")
    tier, warning = choose_tier(Tier.KernelFull, Tier.EnvironmentOnly, Tier.KernelFull, True, "strict")
    assert tier == Tier.EnvironmentOnly and "NOT enforced" in warning


def test_dry_run_describes_every_layer():
    text = plan().describe()
    for fragment in ("tier: KernelFull", "bwrap argv: bwrap --unshare-user", "grant /usr: execute, read_file",
                     "network: not restricted by Landlock", "network: loopback only", "mode: allowlist", "ptrace",
                     "RLIMIT_NOFILE=1024"):
        assert fragment in text, fragment


@pytest.mark.parametrize("name, pattern, expected", [
    ("LC_ALL", "LC_*", True), ("LANG", "LC_*", False), ("LANG", "LANG", True), ("LANGUAGE", "LANG", False),
    ("XDG_DATA_DIRS", "XDG_*_DIRS", True), ("XDG_DIRS", "XDG_*_DIRS", False), ("ab", "*", True),
    ("abcabc", "a*c*c", True), ("abc", "a*b*b", False),
])
def test_environment_keep_patterns(name, pattern, expected):
    from sandbox.plan import glob_match

    assert glob_match(name, pattern) is expected


def test_a_profile_without_a_workdir_starts_at_root(tmp_path):
    custom = tmp_path / "nowork.toml"
    custom.write_text('extends = "strict"\n[filesystem]\nworkdir = "none"\n')
    from sandbox.profile import load_profile as load

    p = build_plan(load(str(custom)), Tier.KernelFull, Request(("ls",), "/work/project"), HOST, 7, FEATURES)
    assert "/work/project" not in p.bwrap_args and p.bwrap_args[-2:] == ("--chdir", "/")
    assert p.workdir == "/"


def test_status_frames_survive_a_truncated_tail():
    from sandbox.stage2_wire import StatusRecord, parse_status

    started = b"S" + bytes(4)
    assert parse_status(started + b"E" + (9).to_bytes(4, "little") + b"\x00garbage") == [
        StatusRecord("started", "", "", 0, None)]
    assert parse_status(started[:3]) == []


def test_loopback_off_restores_unix_only_sockets_and_landlock_tcp_rules(tmp_path):
    custom = tmp_path / "n.toml"
    custom.write_text('extends = "strict"\n[network]\nloopback = false\n')
    from sandbox.profile import load_profile as load

    p = build_plan(load(str(custom)), Tier.KernelFull, Request(("ls",), "/work/project"), HOST, 7, FEATURES)
    assert p.seccomp.sockets == "unix" and p.landlock.net == 3
    assert plan().seccomp.sockets == "loopback"
