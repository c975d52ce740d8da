"""Probes on fake hosts, the preserved-fd routine, constants and the seccomp cache."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from sandbox import fds, probes, seccomp_policy
from sandbox.landlock_rights import FS_RIGHTS
from sandbox.tiers import Tier


class FakeHost(probes.HostProbes):
    def __init__(self, bwrap="/usr/bin/bwrap", userns=True, abi=7, seccomp=True, sysctls=None, container=""):
        self._container = container
        self._bwrap, self._userns, self._abi, self._seccomp = bwrap, userns, abi, seccomp
        self._sysctls = sysctls or {}

    def find_bwrap(self):
        return self._bwrap

    def bwrap_version(self, bwrap):
        return "0.8.0"

    def bwrap_runs(self, bwrap, extra=()):
        return (self._userns and "--json-status-fd" not in extra), "bwrap: setting up uid map: Permission denied"

    def container(self):
        return self._container

    def userns_sysctls(self):
        return self._sysctls

    def landlock_abi(self):
        return (self._abi, "") if self._abi else (0, os.strerror(errno.EOPNOTSUPP))

    def seccomp_and_nnp(self):
        return self._seccomp, True, ""

    def own_seccomp_mode(self):
        return "0"

    def close_range_cloexec(self):
        return True, ""


@pytest.mark.parametrize("host, tier", [
    (FakeHost(), Tier.KernelFull),
    (FakeHost(abi=0), Tier.KernelSeccompOnly),
    (FakeHost(bwrap=None), Tier.KernelNoNamespaces),  # the tier needs no bwrap
    (FakeHost(userns=False), Tier.KernelNoNamespaces),
    (FakeHost(userns=False, abi=0), Tier.EnvironmentOnly),  # no Landlock: no filesystem boundary at all
    (FakeHost(bwrap=None, abi=0), Tier.EnvironmentOnly),
    (FakeHost(userns=False, seccomp=False), Tier.EnvironmentOnly),
    (FakeHost(seccomp=False), Tier.EnvironmentOnly),
])
def test_tier_resolution_on_fake_hosts(host, tier):
    caps = probes.probe_host(host)
    assert probes.resolve_tier(caps) == tier
    failed = [c for c in caps.checks if not c.ok]
    assert all(c.remedy for c in failed), failed


def test_feature_detection_reports_what_the_bwrap_lacks():
    caps = probes.probe_host(FakeHost())
    assert caps.bwrap_features == {"clearenv", "disable-userns", "size"}  # all but json-status-fd


@pytest.mark.parametrize("sysctls, fragment, remedy", [
    ({"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1"}, "AppArmor", "apparmor_parser"),
    ({"/proc/sys/kernel/unprivileged_userns_clone": "0"}, "unprivileged_userns_clone=0", "sysctl"),
    ({"/proc/sys/user/max_user_namespaces": "0"}, "max_user_namespaces=0", "sysctl"),
])
def test_userns_refusals_say_why(sysctls, fragment, remedy):
    caps = probes.probe_host(FakeHost(userns=False, sysctls=sysctls))
    check = next(c for c in caps.checks if c.name == "bwrap-userns")
    assert not check.ok and fragment in check.detail and remedy in check.remedy


@pytest.mark.parametrize("container, remedy", [("docker", "seccomp"), ("kubernetes", "hostUsers: false"),
                                               ("podman", "seccomp=unconfined"), ("lxc", "CLONE_NEWUSER")])
def test_a_container_refusing_user_namespaces_gets_its_own_remedy(container, remedy):
    caps = probes.probe_host(FakeHost(userns=False, container=container))
    check = next(c for c in caps.checks if c.name == "bwrap-userns")
    assert not check.ok and container in check.detail and remedy in check.remedy
    assert probes.resolve_tier(caps) == Tier.KernelNoNamespaces


def test_an_outer_seccomp_filter_is_named_when_nothing_else_explains_the_refusal():
    class Filtered(FakeHost):
        def own_seccomp_mode(self):
            return "2"

    check = next(c for c in probes.probe_host(Filtered(userns=False)).checks if c.name == "bwrap-userns")
    assert "Seccomp: 2" in check.detail and "KernelNoNamespaces" in check.remedy
    unfiltered = next(c for c in probes.probe_host(FakeHost(userns=False)).checks if c.name == "bwrap-userns")
    assert "Seccomp: 2" not in unfiltered.detail  # the control: only said when it is so


def test_tier_properties():
    assert [t.name for t in sorted(Tier)] == ["EnvironmentOnly", "KernelNoNamespaces", "KernelSeccompOnly", "KernelFull"]
    assert [t for t in Tier if t.uses_landlock] == [Tier.KernelNoNamespaces, Tier.KernelFull]
    assert [t for t in Tier if t.uses_seccomp] == [Tier.KernelNoNamespaces, Tier.KernelSeccompOnly, Tier.KernelFull]
    assert [t for t in Tier if t.uses_namespaces] == [Tier.KernelSeccompOnly, Tier.KernelFull]


def test_container_detection(tmp_path):
    detect = probes.HostProbes().container
    assert detect(str(tmp_path)) == ""  # control: an empty root has no marker
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/kubepods/besteffort/pod1/abc\n")
    assert detect(str(tmp_path)) == "kubernetes"
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/\n")
    (tmp_path / "proc" / "1" / "environ").write_bytes(b"PATH=/bin\0container=lxc\0")
    assert detect(str(tmp_path)) == "lxc"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text("")
    assert detect(str(tmp_path)) == "podman"
    (tmp_path / ".dockerenv").write_text("")
    assert detect(str(tmp_path)) == "docker"


def test_landlock_missing_from_lsm_list_says_so():
    check = next(c for c in probes.probe_host(FakeHost(abi=0)).checks if c.name == "landlock")
    assert not check.ok and "lsm=" in check.remedy


class RecordingFcntl:
    def __init__(self, flags=fcntl.FD_CLOEXEC, fail_set=None, fail_get=None):
        self.flags, self.fail_set, self.fail_get, self.calls = flags, fail_set, fail_get, []

    def __call__(self, fd, cmd, arg=0):
        self.calls.append(cmd)
        if cmd == fcntl.F_GETFD:
            if self.fail_get:
                raise OSError(self.fail_get, os.strerror(self.fail_get))
            return self.flags
        if self.fail_set:
            raise OSError(self.fail_set, os.strerror(self.fail_set))
        self.flags = arg
        return 0


def test_clear_cloexec_clears_the_flag():
    fake = RecordingFcntl()
    fds.clear_cloexec(11, fake)
    assert fake.calls == [fcntl.F_GETFD, fcntl.F_SETFD] and fake.flags == 0


def test_clear_cloexec_makes_no_second_call_when_already_clear():
    fake = RecordingFcntl(flags=0)
    fds.clear_cloexec(11, fake)
    assert fake.calls == [fcntl.F_GETFD]


def test_clear_cloexec_errors_name_the_fd_and_errno():
    with pytest.raises(fds.FdFlagError) as read_error:
        fds.clear_cloexec(9, RecordingFcntl(fail_get=errno.EBADF))
    assert str(read_error.value) == "failed to read fd flags for preserved file descriptor 9: Bad file descriptor"
    with pytest.raises(fds.FdFlagError) as set_error:
        fds.clear_cloexec(9, RecordingFcntl(fail_set=errno.EPERM))
    assert str(set_error.value) == ("failed to clear close-on-exec for preserved file descriptor 9: "
                                    "Operation not permitted")


def test_clear_cloexec_on_a_number_beyond_any_fd_is_ebadf():
    with pytest.raises(fds.FdFlagError) as error:
        fds.clear_cloexec(2**40)
    assert "Bad file descriptor" in str(error.value)


def test_real_fd_round_trip():
    r, w = os.pipe()
    try:
        fds.make_files_inheritable([r])
        assert os.get_inheritable(r)
    finally:
        os.close(r)
        os.close(w)


def test_landlock_bits_match_the_landlock_package():
    from landlock.plumbing import FSAccess

    for name, (bit, _) in FS_RIGHTS.items():
        assert getattr(FSAccess, name.upper()) == bit, name


def test_changed_profile_is_not_served_a_stale_filter(tmp_path, monkeypatch):
    monkeypatch.setenv("SBX_CACHE_DIR", str(tmp_path / "cache"))
    base = seccomp_policy.spec_from_profile({"mode": "allowlist", "allow": [], "deny": []}, share_net=False)
    changed = seccomp_policy.spec_from_profile({"mode": "allowlist", "allow": [], "deny": ["uname"]}, share_net=False)
    compiled = []
    real_compile = seccomp_policy.compile_bpf
    monkeypatch.setattr(seccomp_policy, "compile_bpf", lambda spec: compiled.append(spec) or real_compile(spec))
    first = seccomp_policy.compiled_bpf(base)
    assert seccomp_policy.compiled_bpf(base) == first
    assert compiled == [base]  # the second call was served from the cache, not compiled again
    assert len(list((tmp_path / "cache").iterdir())) == 1
    second = seccomp_policy.compiled_bpf(changed)
    assert compiled == [base, changed]  # a changed profile is compiled, not served the stale filter
    assert second != first
    assert second == real_compile(changed)
    assert seccomp_policy.cache_key(base) != seccomp_policy.cache_key(changed)


def test_cache_refuses_a_directory_others_can_write(tmp_path, monkeypatch):
    from sandbox import cache

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("SBX_CACHE_DIR", str(shared))
    assert cache.cache_dir() is None
    cache.write("x", b"data")
    assert cache.read("x") is None and not (shared / "x").exists()


def test_preserved_fd_flag_is_restored_after_the_launch(tmp_path):
    from sandbox import Sandbox

    r, w = os.pipe()  # close-on-exec, as Python opens everything
    try:
        assert not os.get_inheritable(r)
        result = Sandbox("strict", str(tmp_path)).run(["true"], preserve_fds=[r])
        assert result.returncode == 0
        assert not os.get_inheritable(r)  # the caller's other subprocesses will not inherit it
        os.set_inheritable(w, True)  # already inheritable: left as the caller set it
        Sandbox("strict", str(tmp_path)).run(["true"], preserve_fds=[w])
        assert os.get_inheritable(w)
    finally:
        os.close(r)
        os.close(w)
