"""Host probes, the capabilities they find, and the tier those resolve to.

Each probe is a method of ``HostProbes``; tests pass a fake with the same methods to
resolve every tier without such a host. Nothing here parses bwrap's human-readable
stderr: decisions come from exit statuses and our own syscalls. The launch path reads a
cached ``Capabilities`` (keyed by boot, user, bwrap binary and the userns sysctls) so that
every tool call does not pay for a bwrap smoke run; ``sbx doctor`` always probes afresh.
"""

from __future__ import annotations

import marshal
import os
import sys
from collections import namedtuple

from . import cache
from .errors import TierBelowFloorError, TierError
from .tiers import Tier

PROBE_VERSION = 6
BWRAP_ENV = "SBX_BWRAP"
# Options newer than Debian 11's bwrap 0.4 that the planner uses when present.
OPTIONAL_BWRAP_OPTIONS: dict[str, tuple[str, ...]] = {
    "clearenv": ("--clearenv",),
    "disable-userns": ("--unshare-user", "--disable-userns"),
    "json-status-fd": ("--json-status-fd", "2"),
    "size": ("--size", "1048576", "--tmpfs", "/tmp"),
}
USERNS_SYSCTLS = {
    "/proc/sys/kernel/unprivileged_userns_clone": "0",
    "/proc/sys/user/max_user_namespaces": "0",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1",
}
APPARMOR_REMEDY = (
    "install an AppArmor profile that lets bwrap create user namespaces, e.g. "
    "/etc/apparmor.d/bwrap containing 'abi <abi/4.0>, include <tunables/global> "
    "profile bwrap /usr/bin/bwrap flags=(unconfined) { userns, }', then "
    "'apparmor_parser -r /etc/apparmor.d/bwrap' (keep the restriction on for everything else)"
)


class Check(namedtuple("Check", "name ok detail remedy", defaults=("",))):
    """One named probe result, with what fixes it when it failed."""

    __slots__ = ()


class Capabilities(namedtuple("Capabilities", "bwrap_path bwrap_version bwrap_usable bwrap_features "
                              "landlock_abi seccomp no_new_privs close_range_cloexec checks",
                              defaults=(None, "", False, frozenset(), 0, False, False, False, ()))):
    """What the probes found; ``resolve_tier`` turns it into a tier."""

    __slots__ = ()

    def to_record(self) -> dict:
        data = self._asdict()
        data["bwrap_features"] = sorted(self.bwrap_features)
        data["checks"] = [tuple(c) for c in self.checks]
        return data

    @classmethod
    def from_record(cls, data: object, bwrap_path: str | None) -> Capabilities:
        """A cached record, checked for form; ``bwrap_path`` is always the one found now,
        never a path read back from the cache. Raises ValueError for anything malformed."""
        if not isinstance(data, dict) or set(data) != set(cls._fields):
            raise ValueError("not a capabilities record")
        kinds = {"bwrap_version": str, "bwrap_usable": bool, "landlock_abi": int, "seccomp": bool,
                 "no_new_privs": bool, "close_range_cloexec": bool}
        for key, kind in kinds.items():
            if type(data[key]) is not kind:
                raise ValueError(key)
        features = data["bwrap_features"]
        if not isinstance(features, list) or not set(features) <= set(OPTIONAL_BWRAP_OPTIONS):
            raise ValueError("bwrap_features")
        checks = data["checks"]
        if not isinstance(checks, list) or not all(
                isinstance(c, tuple) and len(c) == 4 and all(isinstance(x, (str, bool)) for x in c) for c in checks):
            raise ValueError("checks")
        if data["bwrap_path"] != bwrap_path or not 0 <= data["landlock_abi"] < 1000:
            raise ValueError("bwrap_path")
        return cls(**{**data, "bwrap_features": frozenset(features), "checks": tuple(Check(*c) for c in checks)})


def resolve_tier(caps: Capabilities) -> Tier:
    """The strongest tier these capabilities support (the README's tier table)."""
    if caps.bwrap_usable and caps.seccomp and caps.no_new_privs:
        return Tier.KernelFull if caps.landlock_abi >= 1 else Tier.KernelSeccompOnly
    if caps.seccomp and caps.no_new_privs and caps.landlock_abi >= 1:
        # No usable bwrap (no user namespaces: a container, AppArmor's restriction, or no
        # bwrap at all): Landlock stands in for the mounts. Without Landlock there is no
        # filesystem boundary at all, so that is EnvironmentOnly, never this tier.
        return Tier.KernelNoNamespaces
    return Tier.EnvironmentOnly


def choose_tier(host_tier: Tier, requested: Tier | None, floor: Tier, allow_degraded: bool,
                profile_name: str) -> tuple[Tier, str | None]:
    """The tier to run at and, when it is below the profile's floor, the warning to print."""
    tier = host_tier
    if requested is not None:
        if requested > host_tier:
            raise TierError(f"--tier {requested.name} is above what this host resolves ({host_tier.name})",
                            "a tier can be forced lower, never higher; see 'sbx doctor' for what is missing")
        tier = requested
    if tier >= floor:
        return tier, None
    why = "forced by --tier" if requested is not None else "this host resolves no higher"
    if not allow_degraded:
        raise TierBelowFloorError(
            f"profile {profile_name!r} needs at least {floor.name}; this run would be {tier.name} ({why})")
    return tier, (f"running at {tier.name}, below profile {profile_name!r}'s floor {floor.name} "
                  f"({why}; --allow-degraded): layers above {tier.name} are NOT enforced")


# bwrap is looked up here and never on PATH: a PATH entry a sandboxed command can write
# (a project's bin directory, ".") would let it plant a "bwrap" that runs on the host.
TRUSTED_BWRAP_DIRS = ("/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin")


def which(name: str, directories=None) -> str | None:
    """shutil.which without importing shutil on the launch path."""
    if directories is None:
        directories = os.environ.get("PATH", os.defpath).split(os.pathsep)
    for directory in directories:
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def bwrap_not_found() -> tuple[str, str]:
    """The detail and remedy of a failed bwrap lookup, naming what was looked at."""
    explicit = os.environ.get(BWRAP_ENV)
    if explicit:
        why = "is not an absolute path" if not os.path.isabs(explicit) else "is not an executable file"
        return f"{BWRAP_ENV}={explicit} {why}", f"point {BWRAP_ENV} at the bwrap binary by its absolute path, or unset it"
    return (f"bubblewrap (bwrap) not found in {', '.join(TRUSTED_BWRAP_DIRS)}",
            f"apt-get install bubblewrap (or set {BWRAP_ENV} to its absolute path)")


class HostProbes:
    """The real probes. Each returns plain values; ``probe_host`` turns them into checks."""

    def find_bwrap(self) -> str | None:
        explicit = os.environ.get(BWRAP_ENV)
        if explicit:
            ok = os.path.isabs(explicit) and os.path.isfile(explicit) and os.access(explicit, os.X_OK)
            return os.path.realpath(explicit) if ok else None
        found = which("bwrap", TRUSTED_BWRAP_DIRS)
        return os.path.realpath(found) if found else None

    def bwrap_version(self, bwrap: str) -> str:
        import subprocess  # probes run only on a cache miss or in doctor: off the launch path

        try:
            out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout.strip().split()[-1] if out.returncode == 0 and out.stdout.strip() else ""

    def bwrap_runs(self, bwrap: str, extra: tuple[str, ...] = ()) -> tuple[bool, str]:
        """Run ``bwrap <namespaces> <extra> true``; (exit status was 0, bwrap's stderr)."""
        true = which("true", TRUSTED_BWRAP_DIRS) or "/bin/true"
        argv = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
                "--proc", "/proc", *extra, "--", true]
        if os.geteuid() == 0:  # a root caller's sandbox runs as an unprivileged uid: probe that
            from .rootcaller import setpriv_prefix

            argv = [*setpriv_prefix(), *argv]
        import subprocess

        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        return out.returncode == 0, out.stderr.strip()

    def userns_sysctls(self) -> dict[str, str]:
        values = {}
        for path in USERNS_SYSCTLS:
            try:
                with open(path) as f:
                    values[path] = f.read().strip()
            except OSError:
                pass
        return values

    def container(self, root: str = "/") -> str:
        """Which container runtime this host looks like it runs in ("" for none found):
        the marker files Docker and Podman leave, the cgroup path of pid 1, and the
        ``container=`` variable of pid 1's environment when it is readable."""
        if os.path.exists(os.path.join(root, ".dockerenv")):
            return "docker"
        if os.path.exists(os.path.join(root, "run/.containerenv")):
            return "podman"
        try:
            with open(os.path.join(root, "proc/1/cgroup")) as f:
                cgroup = f.read()
        except OSError:
            cgroup = ""
        for marker, name in (("kubepods", "kubernetes"), ("docker", "docker"), ("containerd", "containerd"),
                             ("libpod", "podman"), ("lxc", "lxc")):
            if marker in cgroup:
                return name
        try:
            with open(os.path.join(root, "proc/1/environ"), "rb") as f:
                for entry in f.read().split(b"\0"):
                    if entry.startswith(b"container="):
                        return entry[len(b"container="):].decode("utf-8", "replace") or "container"
        except OSError:
            pass
        return ""

    def own_seccomp_mode(self) -> str:
        """This process's ``Seccomp:`` field: "2" when a filter (a container runtime's, an
        outer sandbox's) already confines it and may be what refused the namespaces."""
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("Seccomp:"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return ""

    def landlock_abi(self) -> tuple[int, str]:
        """The Landlock ABI and, when there is none, why. Off the launch path, so the
        ``landlock`` package (whose import costs tens of milliseconds) answers here, with
        its reasons; our raw syscall is the fallback when the package is missing."""
        try:
            from landlock.plumbing import landlock_abi_version
        except ImportError:
            pass
        else:
            try:
                return int(landlock_abi_version()), ""
            except OSError as exc:
                return 0, getattr(exc, "reason", None) or os.strerror(exc.errno or 0)
        try:
            return raw_syscall(SYSCALL_NUMBERS["landlock_create_ruleset"], None, 0, 1), ""
        except OSError as exc:
            return 0, os.strerror(exc.errno or 0)

    def seccomp_and_nnp(self) -> tuple[bool, bool, str]:
        """Run the real stage 2 helper with an allow-all filter and read back the
        command's /proc/self/status: both layers as a launch installs them."""
        import subprocess

        from .fds import memfd_with
        from .hostview import stage2_helper_path
        from .stage2_wire import Stage2Config, encode_config, frame_programs, parse_status

        allow_all = (6).to_bytes(2, "little") + bytes(2) + (0x7FFF0000).to_bytes(4, "little")  # ret ALLOW
        helper = stage2_helper_path()
        fds: list[int] = []
        try:
            read_end, write_end = os.pipe()
            fds += [read_end, write_end]
            seccomp_fd = memfd_with("sbx-probe-bpf", frame_programs([allow_all]))
            fds.append(seccomp_fd)
            config = Stage2Config(status_fd=write_end, argv=("cat", "/proc/self/status"), seccomp_fd=seccomp_fd)
            config_fd = memfd_with("sbx-probe-config", encode_config(config))
            fds.append(config_fd)
            out = subprocess.run([helper, str(config_fd), ""], capture_output=True, text=True, timeout=20,
                                 pass_fds=(write_end, seccomp_fd, config_fd), env={}, cwd="/")
            os.close(write_end)
            fds.remove(write_end)
            errors = [r for r in parse_status(os.read(read_end, 65536)) if r.kind == "error"]
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, False, f"the stage 2 helper {helper} could not run: {exc}"
        finally:
            for fd in fds:
                os.close(fd)
        status = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
        seccomp = status.get("Seccomp", "").strip() == "2"
        nnp = status.get("NoNewPrivs", "").strip() == "1"
        detail = "" if out.returncode == 0 else (
            f"{errors[0].layer}: {errors[0].detail}: {os.strerror(errors[0].errno)}" if errors
            else (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1])
        return seccomp, nnp, detail

    def close_range_cloexec(self) -> tuple[bool, str]:
        try:
            # A range far above any open descriptor: nothing is touched, only support is seen.
            raw_syscall(SYSCALL_NUMBERS["close_range"], 0x7FFFFFF0, 0x7FFFFFF0, 1 << 2)
            return True, ""
        except OSError as exc:
            return False, os.strerror(exc.errno or 0)


SYSCALL_NUMBERS = {"close_range": 436, "landlock_create_ruleset": 444}  # the same on x86_64 and aarch64


def raw_syscall(number: int, *args) -> int:
    # Safe: used only by the probes above, with arguments that change nothing (a version
    # query; close_range over a range where no descriptor is open). Off the launch path,
    # so the ctypes import is paid only by doctor and cold probes.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def probe_host(probes: HostProbes | None = None) -> Capabilities:
    """Run every probe and build the capabilities with a named check for each."""
    probes = probes or HostProbes()
    checks: list[Check] = []
    bwrap = probes.find_bwrap()
    version, usable, features = "", False, set()
    if bwrap is None:
        checks.append(Check("bwrap", False, *bwrap_not_found()))
    else:
        version = probes.bwrap_version(bwrap)
        checks.append(Check("bwrap", True, f"{bwrap} (version {version or 'unknown'})"))
        usable, stderr = probes.bwrap_runs(bwrap)
        if usable:
            checks.append(Check("bwrap-userns", True, "bwrap created user, pid, net, ipc, uts and cgroup namespaces"))
            features = {name for name, opt in OPTIONAL_BWRAP_OPTIONS.items() if probes.bwrap_runs(bwrap, opt)[0]}
            missing = sorted(set(OPTIONAL_BWRAP_OPTIONS) - features)
            checks.append(Check("bwrap-options", True,
                                "supported: " + (", ".join(sorted(features)) or "none of the optional ones")
                                + ("; missing (not needed): " + ", ".join(missing) if missing else "")))
        else:
            detail, remedy = _userns_failure(probes.userns_sysctls(), stderr, probes.container(),
                                             probes.own_seccomp_mode())
            checks.append(Check("bwrap-userns", False, detail, remedy))
    container = probes.container()
    checks.append(Check("container", True, f"inside a {container} container (user namespaces may be refused there)"
                        if container else "no container detected"))
    abi, why = probes.landlock_abi()
    if abi >= 1:
        checks.append(Check("landlock", True, f"ABI {abi}"))
    else:
        disabled = why == os.strerror(95) or "disabled at boot" in why
        remedy = ("boot with Landlock in the LSM list (lsm=landlock,... on the kernel command line)"
                  if disabled else "use a kernel built with CONFIG_SECURITY_LANDLOCK (5.13+)")
        checks.append(Check("landlock", False, f"unavailable: {why or 'no ABI'}", remedy))
    seccomp, nnp, detail = probes.seccomp_and_nnp()
    checks.append(Check("seccomp", seccomp, "a seccomp filter installs (Seccomp: 2)" if seccomp
                        else f"a seccomp filter could not be installed: {detail}",
                        "" if seccomp else "use a kernel with CONFIG_SECCOMP_FILTER"))
    checks.append(Check("no_new_privs", nnp, "PR_SET_NO_NEW_PRIVS takes effect" if nnp
                        else f"no_new_privs did not take effect: {detail}",
                        "" if nnp else "use a kernel 3.5 or newer"))
    cr, why = probes.close_range_cloexec()
    checks.append(Check("close_range", cr, "close_range with CLOSE_RANGE_CLOEXEC works" if cr
                        else f"close_range(CLOSE_RANGE_CLOEXEC) unavailable ({why}): stage 2 walks every fd instead",
                        "" if cr else "use Linux 5.11 or newer for the fast path (hygiene still runs)"))
    return Capabilities(bwrap_path=bwrap, bwrap_version=version, bwrap_usable=usable,
                        bwrap_features=frozenset(features), landlock_abi=abi, seccomp=seccomp,
                        no_new_privs=nnp, close_range_cloexec=cr, checks=tuple(checks))


CONTAINER_REMEDIES = {
    "docker": ("start the container with a seccomp profile that lets it create user namespaces (Docker's default "
               "one refuses unshare and clone with CLONE_NEWUSER): --security-opt seccomp=PROFILE.json, or "
               "seccomp=unconfined; on an AppArmor host also --security-opt apparmor=unconfined or a profile that "
               "allows userns"),
    "podman": ("start the container with --security-opt seccomp=unconfined (or a profile that allows "
               "CLONE_NEWUSER) and, rootless, keep user namespaces enabled on the host"),
    "kubernetes": ("give the pod its own user namespace (spec.hostUsers: false, Kubernetes 1.30+ with a runtime "
                   "that supports it) or a seccomp profile that allows CLONE_NEWUSER"),
}


def _userns_failure(sysctls: dict[str, str], stderr: str, container: str = "", seccomp_mode: str = "") -> tuple[str, str]:
    if sysctls.get("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("bwrap could not create a user namespace: AppArmor restricts unprivileged user "
                "namespaces (kernel.apparmor_restrict_unprivileged_userns=1)", APPARMOR_REMEDY)
    if container:
        remedy = CONTAINER_REMEDIES.get(container, "start the container with user namespaces allowed "
                                                   "(its seccomp and AppArmor profiles must permit CLONE_NEWUSER)")
        return (f"bwrap could not create a user namespace inside this {container} container "
                "(its seccomp or AppArmor profile refuses them)", remedy)
    if sysctls.get("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return ("bwrap could not create a user namespace: kernel.unprivileged_userns_clone=0",
                "sysctl -w kernel.unprivileged_userns_clone=1 (and persist it in /etc/sysctl.d)")
    if sysctls.get("/proc/sys/user/max_user_namespaces") == "0":
        return ("bwrap could not create a user namespace: user.max_user_namespaces=0",
                "sysctl -w user.max_user_namespaces=15000 (and persist it in /etc/sysctl.d)")
    first = stderr.splitlines()[0] if stderr else "no message"
    if seccomp_mode == "2":
        return (f"bwrap could not set up namespaces (its message: {first}); this process already runs under a "
                "seccomp filter (Seccomp: 2), as inside a container or another sandbox, which may refuse them",
                "run sbx where that filter allows CLONE_NEWUSER (a container: its seccomp profile), or accept "
                "KernelNoNamespaces (Landlock and seccomp without namespaces)")
    return (f"bwrap could not set up namespaces (its message: {first})",
            "check that unprivileged user namespaces are allowed on this host, or install bwrap setuid")


def _cache_key(probes: HostProbes) -> str:
    from .cache import digest
    from .hostview import stage2_helper_path

    parts = [str(PROBE_VERSION), str(os.geteuid()), sys.executable]
    for path in (stage2_helper_path(),):  # the seccomp probe runs it
        try:
            st = os.stat(path)
            parts += [path, str(st.st_ino), str(st.st_size), str(st.st_mtime_ns)]
        except OSError:
            parts.append(f"{path}-missing")
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        parts.append("no-boot-id")
    bwrap = probes.find_bwrap()
    if bwrap:
        try:
            st = os.stat(bwrap)
            parts += [bwrap, str(st.st_ino), str(st.st_size), str(st.st_mtime_ns), oct(st.st_mode)]
        except OSError:
            parts.append("bwrap-unstattable")
    parts.append(repr(sorted(probes.userns_sysctls().items())))
    return digest("|".join(parts))


_memo: dict[str, Capabilities] = {}


def host_capabilities(refresh: bool = False, probes: HostProbes | None = None) -> Capabilities:
    """Capabilities for the launch path: from memory, the cache, or a fresh probe."""
    probes = probes or HostProbes()
    key = _cache_key(probes)
    name = f"host-{key}.marshal"
    if not refresh:
        if key in _memo:
            return _memo[key]
        raw = cache.read(name)
        if raw:
            try:
                caps = Capabilities.from_record(marshal.loads(raw), probes.find_bwrap())
                _memo[key] = caps
                return caps
            except (ValueError, TypeError, EOFError):
                pass  # malformed: probe again (a forged or corrupted cache costs time)
    caps = probe_host(probes)
    cache.write(name, marshal.dumps(caps.to_record(), 2))
    _memo[key] = caps
    return caps
