"""Planning: profile + tier + request + host facts -> LaunchPlan. A pure function.

No syscalls and no I/O happen here: host facts arrive as a ``HostView`` and probe results
as ``Capabilities``. Every bwrap bind and every Landlock grant comes from the same list of
``Mount`` entries, so the two layers cannot disagree about what is visible.
"""

from __future__ import annotations

import os
from collections import namedtuple

from . import landlock_rights as ll
from . import landlock_view
from .errors import BindError, HostError, ProfileError, SandboxError, UsageError, WorkdirError
from .hostview import MERGED_USR_LINKS, HostPath, HostView
from .integrity import SYSTEM_EXACT, SYSTEM_TREES, overlaps
from .profile import Profile
from .seccomp_policy import spec_from_profile
from .stage2_wire import RLIMIT_NUMBERS, LandlockSpec, Stage2Config
from .tiers import Tier

RLIM_INFINITY = -1
RLIMIT_NAMES = {"nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC", "core": "RLIMIT_CORE",
                "as": "RLIMIT_AS", "cpu": "RLIMIT_CPU", "fsize": "RLIMIT_FSIZE"}
MAX_FD = 2**31 - 1  # descriptors are C ints
OVERFLOW_UID = 65534  # the uid a root caller becomes inside: no capabilities, nobody's files
DEFAULT_SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
MIB = 1 << 20
SANDBOX_HOSTNAME = "sbx"
HOSTS_FILE = (f"127.0.0.1\tlocalhost {SANDBOX_HOSTNAME}\n"
              f"::1\tlocalhost ip6-localhost ip6-loopback {SANDBOX_HOSTNAME}\n")
DATA_MARKER = "<generated>"  # in bwrap_args, where a generated file's descriptor goes
HIDE_TMPFS_BYTES = 1 << 16  # an empty, read-only tmpfs masking a directory
# The network allowlist's proxy inside the sandbox: a listener that stage 2 makes on
# 127.0.0.1 in the private namespace and hands to the front end (see netproxy.py). The
# namespace is new and empty, so the port is always free when stage 2 binds it.
PROXY_PORT = 3128
PROXY_HOST = "127.0.0.1"


# Records are namedtuples, not dataclasses: every tool call imports this module, and
# dataclasses (with the inspect module it pulls in) costs milliseconds at start-up.

class Request(namedtuple("Request", "argv workdir preserve_fds ro_binds binds share_net setenv host_env "
                         "exe_path exe_fd allow_hosts", defaults=((), (), (), False, (), (), None, None, ()))):
    """What one call asks for, on top of the profile. ``exe_fd`` is a verified executable;
    ``allow_hosts``: HOST[:PORT] entries added to the profile's network allowlist."""

    __slots__ = ()


class Mount(namedtuple("Mount", "op path source grant optional identity idmap",
                       defaults=("", None, False, None, False))):
    """One entry of the filesystem view: a bwrap operation and its Landlock grant.

    op: ro-bind, bind, symlink, tmpfs, dev, proc, hide-file, hide-dir or data; path: where
    it appears inside; source: the host source, a link's target, a tmpfs's size in bytes,
    or a generated file's text;
    grant: a GRANT_NAMES kind; identity: the source's (st_dev, st_ino) when it was checked,
    which the launch pins it to (see pathfd.py); idmap: shown through an idmapped mount
    that presents root's files as the sandbox uid's (root callers; see rootcaller.py).
    """

    __slots__ = ()


class LaunchPlan(namedtuple("LaunchPlan", "tier profile_name argv workdir mounts bwrap_args stage2_helper "
                            "preserved_fds env search_path rlimits landlock seccomp share_net exe_fd exe_path "
                            "stage2_identity run_as network_allow drop_caps",
                            defaults=(DEFAULT_SEARCH_PATH, (), None, None, False, None, None, None, None, (), False))):
    """Everything a launch needs. ``bwrap_args`` is None on EnvironmentOnly (no bwrap);
    ``landlock`` is a ``LandlockSpec`` or None; ``seccomp`` a ``SeccompSpec`` or None;
    ``run_as``: for a root caller, the command's uid inside; bwrap then runs as an
    unprivileged host uid of the process's own (rootcaller.py). None for anyone else.
    ``network_allow``: the allowlist's rules (netproxy.AllowRule); when not empty, the
    private network namespace's one way out is sbx's proxy, reached at 127.0.0.1:PROXY_PORT.
    ``drop_caps``: KernelNoNamespaces for a root caller: stage 2 starts with an empty
    capability bounding set (no uid switch: see rootcaller.capability_drop_prefix)."""

    __slots__ = ()

    def stage2_config(self, status_fd: int, seccomp_fd: int | None, proxy_channel_fd: int | None = None) -> Stage2Config:
        """Stage 2's configuration: this plan plus the descriptors made at launch.
        Raises ValueError for what stage 2 cannot be given (a NUL byte, ...)."""
        return Stage2Config(status_fd=status_fd, argv=self.argv, env=tuple(self.env.items()), cwd=self.workdir,
                            search_path=self.search_path,
                            rlimits=tuple((RLIMIT_NUMBERS[n], s, h) for n, s, h in self.rlimits),
                            landlock=self.landlock, seccomp_fd=seccomp_fd, exe_fd=self.exe_fd,
                            proxy_listen=(proxy_channel_fd, PROXY_PORT) if proxy_channel_fd is not None else None,
                            supervise=self.bwrap_args is None)

    def describe(self) -> str:
        """The human-readable plan printed by ``sbx run --dry-run``."""
        import shlex  # it imports re: only --dry-run and doctor pay for it
        out = [f"profile: {self.profile_name}", f"tier: {self.tier.name}",
               f"command: {shlex.join(self.argv)}", f"workdir: {self.workdir}",
               f"preserved fds: {', '.join(map(str, self.preserved_fds)) or 'none'} (plus 0, 1, 2)"]
        if self.bwrap_args is None and self.tier == Tier.KernelNoNamespaces:
            out.append("bwrap: not used (KernelNoNamespaces: stage 2 runs directly; the view is Landlock grants)")
            from .tiers import NO_NAMESPACES_LIMITS, NO_SIGNAL_SCOPE

            abi = self.landlock.abi if self.landlock else 0
            out += [f"not enforced at this tier: {limit}" for limit in
                    (*NO_NAMESPACES_LIMITS, *((NO_SIGNAL_SCOPE,) if abi < 6 else ()))]
            if self.drop_caps:
                out.append("identity: you are root and this tier has no user namespace: the command runs as uid 0 "
                           "with an empty capability bounding set (setpriv); files root owns in the granted paths "
                           "are its own")
        elif self.bwrap_args is None:
            out.append("bwrap: not used (EnvironmentOnly: nothing is kernel-enforced)")
        else:
            out.append("bwrap argv: bwrap " + shlex.join(self.bwrap_args)
                       + f" -- {self.stage2_helper} CONFIG_FD KEEP")
            out.append("bind sources: pinned at launch, each passed as a descriptor (--bind-fd/--ro-bind-fd)")
            if self.run_as is not None:
                shown = ", ".join(m.source for m in self.mounts if m.idmap) or "nothing"
                out.append("identity: you are root, so bwrap runs as an unprivileged host uid of this process's own "
                           f"(inside: {self.run_as}); idmapped: {shown}")
        if self.exe_fd is not None:
            out.append(f"verified executable: {self.exe_path}, run from sealed descriptor {self.exe_fd}")
        out.append(f"stage 2: {self.stage2_helper}: fd hygiene, rlimits, no_new_privs"
                   + (", Landlock" if self.landlock else "") + (", seccomp" if self.seccomp else "")
                   + ", exec")
        if self.landlock:
            abi = self.landlock.abi
            out.append(f"landlock: ABI {abi}; handled fs rights: "
                       + ", ".join(ll.names(ll.FS_RIGHTS, self.landlock.fs)))
            for path, bits, optional in self.landlock.rules:
                out.append(f"  grant {path}: {', '.join(ll.names(ll.FS_RIGHTS, bits))}"
                           + (" (if present)" if optional else ""))
            net = ll.names(ll.NET_RIGHTS, self.landlock.net)
            out.append(f"  network: {'denied: ' + ', '.join(net) if net else 'not restricted by Landlock'}")
            scopes = ll.names(ll.SCOPES, self.landlock.scoped)
            out.append(f"  scoped to the sandbox: {', '.join(scopes) or 'nothing'}")
            missing = ll.missing_at(abi)
            out.append(f"  not available at ABI {abi}: {', '.join(missing) or 'nothing'}")
        else:
            out.append("landlock: not enforced at this tier")
        if self.seccomp:
            out += ["seccomp:"] + [f"  {line}" for line in self.seccomp.summary()]
        else:
            out.append("seccomp: not enforced at this tier")
        out.append("rlimits: " + (", ".join(f"{n}={_limit(s)}" for n, s, _ in self.rlimits) or "inherited"))
        out.append("environment: " + ", ".join(f"{k}={v}" for k, v in sorted(self.env.items())))
        if self.bwrap_args is None and self.seccomp is not None:
            out.append("network: the host's network namespace; " + (
                "shared (--share-net)" if self.share_net else
                "socket() refused for every family by seccomp (socketpair AF_UNIX only), TCP bind and connect "
                "denied by Landlock at ABI 4+"))
        elif self.bwrap_args is None:
            out.append("network: the host's (this tier has no network namespace and no seccomp socket rule)")
        else:
            if self.share_net:
                out.append("network: shared with the host")
            elif self.network_allow:
                out.append(f"network: allowlist through sbx's proxy at {PROXY_HOST}:{PROXY_PORT} (HTTP CONNECT, "
                           "plain HTTP, SOCKS5 with names resolved by the proxy); allowed: "
                           + ", ".join(map(str, self.network_allow)))
                out.append("  everything else stays inside the private namespace: loopback works, nothing else "
                           "leaves; names are resolved on the host only after they are allowed")
            elif self.seccomp is None or self.seccomp.sockets == "loopback":
                out.append("network: loopback only (a private network namespace whose only interface is lo: "
                           "nothing leaves it)")
            else:
                out.append("network: none (a private network namespace; only AF_UNIX sockets)")
        return "\n".join(out)


def _limit(value: int) -> str:
    return "unlimited" if value == RLIM_INFINITY else str(value)


def paths_to_observe(profile: Profile, request: Request) -> list[str]:
    fs = profile.table("filesystem")
    return [*fs["ro_binds"], *fs["ro_binds_try"], *fs["binds"], *fs["hide"], *MERGED_USR_LINKS,
            *request.ro_binds, *request.binds, request.workdir, "/"]


def dirs_to_list(profile: Profile, request: Request) -> list[str]:
    """KernelNoNamespaces: the directories whose listings a complement grant may need
    (every ancestor of every path in the view; see landlock_view.py)."""
    fs = profile.table("filesystem")
    return landlock_view.dirs_to_list([*paths_to_observe(profile, request), *fs["tmpfs"], "/dev", "/proc"])


def build_plan(profile: Profile, tier: Tier, request: Request, host: HostView,
               landlock_abi: int, bwrap_features: frozenset[str] = frozenset()) -> LaunchPlan:
    """The launch plan. Raises SandboxError subclasses for requests that cannot be met."""
    if not request.argv:
        raise UsageError("no command given", "put the command after '--', e.g. sbx run -- ls")
    workdir = _check_workdir(request.workdir, host)
    fs_workdir = profile.table("filesystem")["workdir"]
    start_dir = workdir.real if fs_workdir != "none" else "/"  # with no workdir shown, start at /
    share_net = request.share_net or not profile.table("namespaces")["net"]
    network_allow = _allowlist(profile, request, tier, share_net)
    mounts = _mounts(profile, request, host, workdir)
    if profile.table("namespaces")["uts"] and not share_net and tier.uses_namespaces:
        # The sandbox's hostname resolves: its own /etc/hosts, not the host's.
        mounts = [m for m in mounts if m.path != "/etc/hosts"] + [Mount("data", "/etc/hosts", HOSTS_FILE, "read")]
        mounts.sort(key=lambda m: canonical(m.path).count("/") if m.path != "/" else 0)
    run_as = None
    if host.uid == 0 and tier.uses_bwrap:
        # A root caller's sandbox runs as an unprivileged host uid; what the caller chose to
        # show it (workdir, --bind, --ro-bind, profile binds) goes through an idmapped mount.
        run_as = OVERFLOW_UID
        chosen = _caller_chosen(profile, request, host, workdir)
        mounts = [m._replace(idmap=True) if m.op in ("bind", "ro-bind") and m.source in chosen else m for m in mounts]
    preserved = tuple(sorted(set(request.preserve_fds) | ({request.exe_fd} if request.exe_fd is not None else set())))
    for fd in preserved:
        if fd < 3:
            raise UsageError(f"--preserve-fd {fd}: descriptors 0, 1 and 2 are always passed",
                             "preserve descriptors numbered 3 or more")
        if fd > MAX_FD:
            raise UsageError(f"--preserve-fd {fd}: no descriptor can have that number",
                             "pass the number of a descriptor that is open in the caller")
    loopback = profile.table("network")["loopback"]
    landlock = (_landlock(profile, mounts, landlock_abi, share_net or loopback or bool(network_allow))
                if tier.uses_landlock else None)
    seccomp = (spec_from_profile(profile.table("seccomp"), share_net, loopback, tier.uses_namespaces,
                                 proxy=bool(network_allow))
               if tier.uses_seccomp else None)
    env = _environment(profile, request, proxied=bool(network_allow))
    if tier == Tier.KernelNoNamespaces:
        landlock, env = _without_namespaces(profile, mounts, landlock, env, host, share_net)
    if not host.stage2_helper:
        raise HostError("sbx's stage 2 helper (sbx-stage2) is missing from its installation",
                        "reinstall sbx (pip install builds it; it needs a C compiler: apt-get install gcc libc6-dev)")
    bwrap_args = (_bwrap_args(profile, mounts, start_dir, share_net, host, bwrap_features)
                  if tier.uses_bwrap else None)
    return LaunchPlan(tier=tier, profile_name=profile.name, argv=tuple(request.argv), workdir=start_dir,
                      mounts=tuple(mounts), bwrap_args=bwrap_args, stage2_helper=host.stage2_helper,
                      preserved_fds=preserved, env=env,
                      search_path=env.get("PATH", DEFAULT_SEARCH_PATH), rlimits=_rlimits(profile),
                      landlock=landlock, seccomp=seccomp, share_net=share_net, exe_fd=request.exe_fd,
                      exe_path=request.exe_path, stage2_identity=_identity(host, host.stage2_helper),
                      run_as=run_as, network_allow=network_allow,
                      drop_caps=host.uid == 0 and tier == Tier.KernelNoNamespaces)


def _allowlist(profile: Profile, request: Request, tier: Tier, share_net: bool) -> tuple:
    """The network allowlist's rules: the profile's ``[network] allow`` then ``allow_hosts``."""
    from_profile = profile.table("network")["allow"]
    if not from_profile and not request.allow_hosts:
        return ()
    from .netproxy import parse_allow  # asyncio and json: only runs that use the proxy pay for them

    rules = []
    for entry in from_profile:
        try:
            rules.append(parse_allow(entry))
        except UsageError as exc:
            raise ProfileError(f"profile {profile.name}: [network] allow: {exc.message}", exc.remedy) from None
    rules += [parse_allow(entry) for entry in request.allow_hosts]
    if share_net:
        raise UsageError("a network allowlist needs the sandbox's private network namespace, but the host "
                         "network is shared (--share-net or [namespaces] net = false): every host would be reachable",
                         "drop --share-net (or set [namespaces] net = true) to reach only the allowed hosts")
    if not tier.uses_namespaces:
        raise UsageError(f"a network allowlist needs a private network namespace, which tier {tier.name} does not have",
                         "run where user namespaces work (sbx doctor), or drop the allowlist")
    return tuple(dict.fromkeys(rules))


def _without_namespaces(profile: Profile, mounts: list[Mount], landlock: LandlockSpec, env: dict[str, str],
                        host: HostView, share_net: bool) -> tuple[LandlockSpec, dict[str, str]]:
    """KernelNoNamespaces: the view becomes Landlock grants (landlock_view.py), the tmpfs
    entries one private directory that TMPDIR (and any variable naming a tmpfs entry, such
    as HOME=/tmp) points at, and TCP is denied whenever the network is not shared: there is
    no network namespace to be the boundary."""
    fs = profile.table("filesystem")
    tmpfs = {canonical(p) for p in fs["tmpfs"]}
    rules = landlock_view.rules(mounts, landlock.abi, host.listings, bool(tmpfs), fs["dev"])
    net = 0 if share_net else ll.mask(ll.NET_RIGHTS, ll.NET_RIGHTS, landlock.abi)
    env = {k: (landlock_view.PRIVATE_TMP if v in tmpfs else v) for k, v in env.items()}
    if tmpfs:
        env["TMPDIR"] = landlock_view.PRIVATE_TMP
    return landlock._replace(rules=tuple(rules), net=net), env


def canonical(path: str) -> str:
    """The absolute path with "." and ".." folded and a leading "//" made "/" (POSIX lets
    "//" mean something else; Linux does not, and a check must not be fooled by it)."""
    return os.path.normpath("/" + path.lstrip("/")) if path.startswith("/") else os.path.normpath(path)


def system_directory(path: str) -> str | None:
    """The system directory that a writable bind of canonical ``path`` would expose, if any."""
    if path in SYSTEM_EXACT:
        return path
    for tree in SYSTEM_TREES:
        if path == tree or path.startswith(tree + "/"):
            return tree
    for tree in (*SYSTEM_TREES, *SYSTEM_EXACT):
        if tree.startswith(path.rstrip("/") + "/"):  # an ancestor of one: it contains it
            return tree
    return None


def _checked_path(host: HostView, path: str, what: str, error: type[SandboxError]) -> HostPath:
    """The host facts for a workdir or bind path, refusing what cannot be mounted as named:
    a relative or missing path, or one with a symlink anywhere in it (a link planted by an
    earlier sandbox must never redirect a bind; pass the target itself)."""
    if not os.path.isabs(path):
        raise error(f"{what} {path!r} is not an absolute path", "pass an absolute path")
    info = host.paths.get(path)
    if info is None or info.kind == "missing":
        raise error(f"{what} {path} does not exist on this host (or cannot be resolved)", "pass an existing path")
    if info.kind == "symlink" or info.real != canonical(path):
        raise error(f"{what} {path} goes through a symlink (it resolves to {info.real}); sbx never follows "
                    "links in bind paths", f"pass the resolved path itself if you mean it: {info.real}")
    return info


def _writable(host: HostView, path: str, info: HostPath, what: str, error: type[SandboxError]) -> None:
    """Refuse a writable bind of a system directory or of anything later runs trust, naming
    every reason (see integrity.py). System directories are matched by canonical path here
    and, through ``host.protected``, by identity as well (a second mount of the same tree)."""
    reasons = []
    system = system_directory(info.real)
    if system:
        reasons.append(f"would expose the system directory {system}")
    for how, entry in overlaps(info.chain, host.protected):
        if entry.label == "a system directory" and system:
            continue
        reasons.append(f"{'contains' if how == 'contains' else 'lies inside'} {entry.label} ({entry.path})")
    if reasons:
        raise error(f"{what} {path} {'; '.join(reasons)}: it would be writable inside, and a sandboxed "
                    "command could change the host or what later sbx runs enforce or execute",
                    "give the sandbox a project directory that holds no system directory and none of sbx's "
                    "installation, profiles or cache; show such paths read-only with --ro-bind")


def _check_workdir(workdir: str, host: HostView) -> HostPath:
    info = _checked_path(host, workdir, "workdir", WorkdirError)
    if not info.is_dir:
        raise WorkdirError(f"workdir {workdir} is not a directory", "pass a directory")
    return info


def _mounts(profile: Profile, request: Request, host: HostView, workdir: HostPath) -> list[Mount]:
    """Every entry of the view, in mount order: a parent before anything beneath it, so a
    read-only bind, hide or tmpfs inside a writable bind stays what it says (bwrap mounts
    in argument order, and a later mount covers an earlier one beneath it)."""
    fs = profile.table("filesystem")
    mounts: list[Mount] = []
    if fs["root"] == "host-ro":
        mounts.append(Mount("ro-bind", "/", "/", "read", identity=_identity(host, "/")))
    for key, optional in (("ro_binds", False), ("ro_binds_try", True), ("binds", False)):
        for path in fs[key]:
            mounts += _profile_mount(host, path, key, optional)
    if fs["merged_usr_links"]:
        for path in MERGED_USR_LINKS:
            info = host.paths.get(path)
            if info is None or info.kind == "missing":
                continue
            if info.kind == "symlink":
                mounts.append(Mount("symlink", path, info.target))
            else:
                mounts.append(Mount("ro-bind", path, path, "read", identity=info.chain[0] if info.chain else None))
    if fs["dev"]:
        mounts.append(Mount("dev", "/dev", grant="device"))
    if fs["proc"]:
        mounts.append(Mount("proc", "/proc", grant="read-noexec"))
    for path in fs["tmpfs"]:
        size = fs["shm_size_mib"] if canonical(path) == "/dev/shm" else fs["tmpfs_size_mib"]
        mounts.append(Mount("tmpfs", canonical(path), source=str(size * MIB), grant="read-write"))
    for path in fs["hide"]:
        info = host.paths.get(path)
        if info is None or info.kind == "missing":
            continue
        mounts.append(Mount("hide-dir" if info.is_dir else "hide-file", info.real or path))
    for path in request.ro_binds:
        info = _checked_path(host, path, "--ro-bind", BindError)
        mounts.append(Mount("ro-bind", info.real, info.real, "read", identity=info.chain[0]))
    for path in request.binds:
        info = _checked_path(host, path, "--bind", BindError)
        _writable(host, path, info, "--bind", BindError)
        mounts.append(Mount("bind", info.real, info.real, "read-write", identity=info.chain[0]))
    if fs["workdir"] == "rw":
        _writable(host, request.workdir, workdir, "workdir", WorkdirError)
        mounts.append(Mount("bind", workdir.real, workdir.real, "read-write", identity=workdir.chain[0]))
    elif fs["workdir"] == "ro":
        mounts.append(Mount("ro-bind", workdir.real, workdir.real, "read", identity=workdir.chain[0]))
    return sorted(mounts, key=lambda m: canonical(m.path).count("/") if m.path != "/" else 0)


def _profile_mount(host: HostView, path: str, key: str, optional: bool) -> list[Mount]:
    """A profile entry. One that is itself a symlink (/etc/localtime, /etc/os-release) is
    recreated inside as the same link, as the merged-usr links are: never followed to
    decide what to mount. A symlink further up the path is refused like any other."""
    info = host.paths.get(path)
    what = f"profile {key} entry"
    if info is None or info.kind == "missing":
        if optional:
            return []
        raise BindError(f"{what} {path} does not exist on this host", "fix the profile, or use ro_binds_try")
    if info.kind == "symlink" and info.clean_parent:
        return [Mount("symlink", canonical(path), info.target)]
    info = _checked_path(host, path, what, BindError)
    if key == "binds":
        _writable(host, path, info, what, BindError)
        return [Mount("bind", info.real, info.real, "read-write", identity=info.chain[0])]
    return [Mount("ro-bind", info.real, info.real, "read", optional, identity=info.chain[0])]


def _caller_chosen(profile: Profile, request: Request, host: HostView, workdir: HostPath) -> set[str]:
    """The bind sources the caller chose (workdir, --bind, --ro-bind, profile binds), by
    canonical path: a root caller's sandbox sees these through an idmapped mount."""
    chosen = {workdir.real}
    for path in (*request.binds, *request.ro_binds, *profile.table("filesystem")["binds"]):
        info = host.paths.get(path)
        if info is not None and info.real:
            chosen.add(info.real)
    return chosen


def _identity(host: HostView, path: str) -> tuple[int, int] | None:
    info = host.paths.get(path)
    return info.chain[0] if info is not None and info.chain else None


def _bwrap_args(profile: Profile, mounts: list[Mount], workdir: str, share_net: bool,
                host: HostView, features: frozenset[str]) -> tuple[str, ...]:
    ns = profile.table("namespaces")
    args: list[str] = []
    for name in ("user", "pid", "ipc", "uts"):
        if ns[name]:
            args.append(f"--unshare-{name}")
    if not share_net:
        args.append("--unshare-net")
    if ns["cgroup"]:
        args.append("--unshare-cgroup-try")
    if ns["user"]:
        inside_uid = host.uid or OVERFLOW_UID
        inside_gid = host.gid or OVERFLOW_UID
        args += ["--uid", str(inside_uid), "--gid", str(inside_gid)]
        if "disable-userns" in features:
            args.append("--disable-userns")
    if host.uid == 0:
        args += ["--cap-drop", "ALL"]
    if ns["uts"]:
        args += ["--hostname", SANDBOX_HOSTNAME]
    args += ["--die-with-parent", "--new-session"]
    if "clearenv" in features:
        args.append("--clearenv")
    if any(m.op in ("tmpfs", "hide-dir") for m in mounts) and "size" not in features:
        raise HostError("this bwrap has no --size option, and sbx gives every tmpfs a size",
                        "install bubblewrap 0.7 or newer (sbx doctor lists the options it has)")
    hidden_dirs = []
    for m in mounts:
        if m.op == "ro-bind":
            args += ["--ro-bind-try" if m.optional else "--ro-bind", m.source, m.path]
        elif m.op == "bind":
            args += ["--bind", m.source, m.path]
        elif m.op == "symlink":
            args += ["--symlink", m.source, m.path]
        elif m.op == "tmpfs":
            args += ["--size", m.source, "--tmpfs", m.path]
        elif m.op == "dev":
            args += ["--dev", m.path]
        elif m.op == "proc":
            args += ["--proc", m.path]
        elif m.op == "hide-file":
            args += ["--ro-bind", "/dev/null", m.path]
        elif m.op == "data":  # launch.prepare puts the text in a memfd in place of the marker
            args += ["--ro-bind-data", DATA_MARKER + m.path, m.path]
        elif m.op == "hide-dir":
            args += ["--size", str(HIDE_TMPFS_BYTES), "--tmpfs", m.path]
            hidden_dirs.append(m.path)
    # Stage 2 is placed by bwrap itself at its own host path, after every other mount so
    # that no tmpfs or hide covers it: no profile needs to show sbx's installation.
    args += ["--ro-bind", host.stage2_helper, host.stage2_helper]
    for path in hidden_dirs:
        args += ["--remount-ro", path]
    if profile.table("filesystem")["root"] == "empty":
        args += ["--remount-ro", "/"]
    args += ["--chdir", workdir]
    return tuple(args)


def _landlock(profile: Profile, mounts: list[Mount], abi: int, tcp_allowed: bool) -> LandlockSpec:
    if abi < 1:
        raise HostError("the plan needs Landlock but the kernel has none",
                        "run 'sbx doctor', or choose --tier KernelSeccompOnly --allow-degraded")
    settings = profile.table("landlock")
    rules = [(m.path, ll.grant_mask(m.grant, abi), m.optional) for m in mounts if m.grant]
    if profile.table("filesystem")["root"] == "empty":
        # Listing (only) from the sandbox's own root: `ls /` and `find /` see the view. The
        # root is bwrap's private tmpfs, so the grant covers nothing reached through a host
        # descriptor, and reading files still needs a grant of its own.
        rules.insert(0, ("/", ll.grant_mask("list", abi), False))
    net = 0
    # With loopback on, the private network namespace (only lo) is the boundary and
    # Landlock leaves TCP alone, so local servers work; with it off, TCP is denied here too.
    if settings["deny_tcp"] and not tcp_allowed:
        net = ll.mask(ll.NET_RIGHTS, ll.NET_RIGHTS, abi)
    scope_names = [n for n, wanted in (("signal", settings["scope_signals"]),
                                       ("abstract_unix_socket", settings["scope_abstract_unix"])) if wanted]
    return LandlockSpec(abi=abi, fs=ll.handled_fs(abi), net=net, scoped=ll.mask(ll.SCOPES, scope_names, abi),
                        file_rights=ll.file_rights(abi), rules=tuple(rules))


def proxy_environment() -> dict[str, str]:
    """What points clients at the proxy inside: the usual variables in both cases, and the
    ones pip, npm, git, cargo and Node read. ``ALL_PROXY`` is socks5h (names resolved by
    the proxy). --setenv and the profile's ``set`` can still override any of them."""
    http = f"http://{PROXY_HOST}:{PROXY_PORT}"
    env = {}
    for name, value in (("HTTP_PROXY", http), ("HTTPS_PROXY", http), ("ALL_PROXY", f"socks5h://{PROXY_HOST}:{PROXY_PORT}"),
                        ("NO_PROXY", "localhost,127.0.0.1,::1")):
        env[name] = env[name.lower()] = value
    env.update({"PIP_PROXY": http, "npm_config_proxy": http, "npm_config_https_proxy": http,
                "CARGO_HTTP_PROXY": http, "NODE_USE_ENV_PROXY": "1"})
    return env


def _environment(profile: Profile, request: Request, proxied: bool = False) -> dict[str, str]:
    table = profile.table("environment")
    env: dict[str, str] = {}
    for name, value in request.host_env:
        if any(glob_match(name, pattern) for pattern in table["keep"]):
            env[name] = value
    if proxied:
        env.update(proxy_environment())
    env.update(table["set"])
    for name, value in request.setenv:
        if not name or "=" in name:
            raise UsageError(f"--setenv {name}={value}: invalid variable name", "use --setenv NAME=VALUE")
        env[name] = value
    return env


def glob_match(name: str, pattern: str) -> bool:
    """``*`` matches any run of characters; nothing else is special (no fnmatch: it imports re)."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return name == pattern
    if not name.startswith(parts[0]) or len(name) < len(parts[0]) + len(parts[-1]):
        return False
    position, end = len(parts[0]), len(name) - len(parts[-1])
    if not name.endswith(parts[-1]):
        return False
    for middle in parts[1:-1]:
        found = name.find(middle, position, end)
        if found < 0:
            return False
        position = found + len(middle)
    return True


def _rlimits(profile: Profile) -> tuple[tuple[str, int, int], ...]:
    limits = []
    for key, value in profile.table("rlimits").items():
        number = RLIM_INFINITY if value == "unlimited" else int(value)
        limits.append((RLIMIT_NAMES[key], number, number))
    return tuple(limits)
