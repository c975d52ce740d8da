"""The seccomp layer: which system calls a profile allows or denies, compiled to BPF.

``SeccompSpec`` is pure data derived from the profile (planning and ``--dry-run`` use it
without libseccomp). ``compiled_bpf`` turns a spec into a BPF program with pyseccomp on
a cache miss only: importing pyseccomp costs tens of milliseconds here, so compiled
programs are cached by spec content, architecture and libseccomp version.
"""

from __future__ import annotations

import errno
import os
from collections import namedtuple

from . import cache
from .errors import ProfileError, SetupError
from .stage2_wire import frame_programs

# Bump when the rules below change shape in a way the spec's content does not capture.
RULES_VERSION = 11

# Denied on every profile (EPERM before the kernel looks at the arguments). Each line says why.
DENIED_ALWAYS: tuple[str, ...] = (
    "ptrace", "process_vm_readv", "process_vm_writev",  # reading or steering other processes
    "pidfd_getfd", "kcmp",  # stealing or probing another process's descriptors
    "mount", "umount2", "pivot_root", "chroot",  # reshaping the filesystem view bwrap built
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",  # new mount API
    "unshare", "setns",  # new namespaces: the kernel's largest unprivileged attack surface
    "keyctl", "add_key", "request_key",  # the keyring is not namespaced
    "bpf", "perf_event_open", "userfaultfd",  # frequent kernel-exploit primitives
    "io_uring_setup", "io_uring_enter", "io_uring_register",  # io_uring operations bypass seccomp
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "open_by_handle_at", "name_to_handle_at",  # CVE-2014-3519 (shocker): opens by inode, past any bind
    "acct", "swapon", "swapoff", "syslog", "quotactl", "vhangup", "lookup_dcookie",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "iopl", "ioperm", "uselib", "fanotify_init", "personality",
)

# Denied at KernelNoNamespaces only: changing a file's mode, owner, extended attributes or
# times. Landlock has no hook for them (it checks opens, not metadata), and that tier has
# no read-only mount and no uid switch, so they would reach every file the caller owns
# anywhere on the host (for a root caller: chmod u+s, security.capability, /etc/shadow).
METADATA_CALLS: tuple[str, ...] = (
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    "setxattrat", "removexattrat", "file_setattr",
)
# Also at KernelNoNamespaces: file-flag and attribute ioctls (sync, noatime, nodump, project
# id, verity, encryption policy) that a read-only open would otherwise reach, and watching
# files (inotify reports names and activity in directories the view hides).
NO_NAMESPACES_IOCTLS = {
    "FS_IOC_SETFLAGS": 0x40086602, "FS_IOC32_SETFLAGS": 0x40046602, "FS_IOC_FSSETXATTR": 0x401C5820,
    "FS_IOC_SETVERSION": 0x40087602, "FS_IOC32_SETVERSION": 0x40047602, "FS_IOC_ENABLE_VERITY": 0x40806685,
    "FS_IOC_SET_ENCRYPTION_POLICY": 0x800C6613, "FS_IOC_SET_ENCRYPTION_POLICY_EX": 0xC0096613,
}
NO_NAMESPACES_DENIED: tuple[str, ...] = (
    "inotify_add_watch",
    # No IPC namespace: SysV shared memory, semaphores and message queues, and POSIX message
    # queues, are the host's (Landlock mediates none of them; mq_unlink skips its path hook).
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)
# Calls that act on another process when their first argument names one: at
# KernelNoNamespaces allowed on the caller itself only (pid 0), as prlimit64.
SELF_ONLY_CALLS: tuple[str, ...] = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
F_SETLEASE = 1024  # a lease on a file another process writes would stall that process
F_NOTIFY = 1026  # dnotify: inotify's older form, signalling activity in a directory
CLONE_PARENT = 0x00008000  # a child of sbx's own process instead of the command's

# Setting a file's times to anything but "now" (touch without -d keeps working): the index
# of the times argument, which must be NULL.
TIME_CALLS = {"utime": 1, "utimes": 1, "utimensat": 2, "futimesat": 2}
# Calls newer than some libseccomp releases: denied by number where the name is unknown
# (the generic syscall table gives them the same number on x86_64 and aarch64).
NEW_CALL_NUMBERS = {"setxattrat": 463, "removexattrat": 466, "file_setattr": 469}

# clone3 passes its flags in a struct seccomp cannot read: answer ENOSYS so libc falls back
# to clone, whose flags we can check (the lesson Flatpak recorded).
ENOSYS_ALWAYS: tuple[str, ...] = ("clone3",)

CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080, "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000,
}
# Typing into or reading the terminal; making it exclusive (nothing else can open it after
# the run) or changing its line discipline (a dead terminal, or a kernel module loaded).
DENIED_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C, "TIOCEXCL": 0x540C, "TIOCSETD": 0x5423}
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
LOOPBACK_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
LOOPBACK_FAMILY_LIMIT = AF_NETLINK  # families above it are refused by one GT rule
NETLINK_ROUTE = 0
SOCK_DGRAM, SOCK_RAW, SOCK_PACKET = 2, 3, 10  # the low 4 bits of socket()'s type; SOCK_NONBLOCK/CLOEXEC sit above

# What ordinary programs need: shells, coreutils, Python, git, compilers.
STRICT_ALLOWED: tuple[str, ...] = tuple(sorted(set("""
read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 lseek
open openat openat2 creat close close_range dup dup2 dup3 fcntl flock ioctl
stat fstat lstat newfstatat statx statfs fstatfs access faccessat faccessat2
readlink readlinkat getdents getdents64 getcwd chdir fchdir
mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 link linkat symlink symlinkat
chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat umask truncate ftruncate fallocate
utime utimes utimensat futimesat mknod mknodat
getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr
setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr
fsync fdatasync sync syncfs sync_file_range fadvise64 readahead
sendfile splice tee vmsplice copy_file_range
pipe pipe2 select pselect6 poll ppoll epoll_create epoll_create1 epoll_ctl epoll_wait
epoll_pwait epoll_pwait2 eventfd eventfd2 signalfd signalfd4 timerfd_create timerfd_settime
timerfd_gettime inotify_init inotify_init1 inotify_add_watch inotify_rm_watch
mmap munmap mprotect mremap msync mincore madvise brk mlock mlock2 munlock mlockall munlockall
membarrier memfd_create get_mempolicy set_mempolicy mbind
shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl
mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr
rt_sigaction rt_sigprocmask rt_sigreturn rt_sigsuspend rt_sigpending rt_sigtimedwait
rt_sigqueueinfo rt_tgsigqueueinfo sigaltstack kill tkill tgkill pause restart_syscall
clone fork vfork execve execveat exit exit_group wait4 waitid
pidfd_open pidfd_send_signal set_tid_address set_robust_list get_robust_list rseq
futex futex_waitv arch_prctl prctl
getpid getppid gettid getuid geteuid getgid getegid getresuid getresgid getgroups
setuid setgid setreuid setregid setresuid setresgid setfsuid setfsgid setgroups
getpgid setpgid getpgrp getsid setsid capget capset
getrlimit setrlimit prlimit64 getrusage getpriority setpriority
sched_yield sched_getaffinity sched_setaffinity sched_getparam sched_setparam
sched_getscheduler sched_setscheduler sched_get_priority_max sched_get_priority_min
sched_rr_get_interval sched_getattr sched_setattr getcpu
nanosleep clock_nanosleep clock_gettime clock_getres gettimeofday time times
alarm getitimer setitimer timer_create timer_settime timer_gettime timer_getoverrun timer_delete
uname sysinfo getrandom
socket socketpair connect accept accept4 bind listen shutdown getsockname getpeername
setsockopt getsockopt sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg
io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents
landlock_create_ruleset landlock_add_rule landlock_restrict_self
""".split())))

# The calls a descriptor-enumerating probe depends on; tests check they reach the kernel.
REQUIRED_CALLS: tuple[str, ...] = ("fcntl", "getrlimit", "prlimit64", "pread64")


class SeccompSpec(namedtuple("SeccompSpec", "mode allowed denied sockets namespaces", defaults=(True,))):
    """What the filter does, as data: the cache key and the ``--dry-run`` summary.

    mode "allowlist": unlisted calls get ENOSYS; "denylist": unlisted calls are allowed.
    sockets: "all" (the host network is shared), "loopback" (a private network namespace
    with only lo: unix, inet and inet6 sockets, netlink for routing only, no raw or packet
    sockets), "proxy" (the same namespace with the allowlist proxy's listener in it: as
    loopback, but no new AF_UNIX sockets and no datagram sockets; only TCP leaves, through
    the proxy) "unix" (AF_UNIX only) or "none" (no socket(); socketpair AF_UNIX only).
    """

    __slots__ = ()

    def key_material(self) -> str:
        # repr of tuples of strings, ints and sorted items is stable across runs.
        return repr((RULES_VERSION, self.mode, self.allowed, self.denied, self.sockets, self.namespaces,
                     sorted(CLONE_NAMESPACE_FLAGS.items()), sorted(DENIED_IOCTLS.items()), ENOSYS_ALWAYS))

    def summary(self) -> list[str]:
        lines = [
            f"mode: {self.mode} (" + ("unlisted calls fail with ENOSYS" if self.mode == "allowlist"
                                      else "unlisted calls are allowed") + ")",
            f"denied with EPERM: {', '.join(self.denied)}",
            "denied with EPERM: clone with any of " + ", ".join(CLONE_NAMESPACE_FLAGS),
            "denied with EPERM: ioctl " + ", ".join(DENIED_IOCTLS) + " (low 32 bits compared)",
            f"ENOSYS: {', '.join(ENOSYS_ALWAYS)} (libc falls back to clone)",
            "other architectures (i386, x32): the process is killed",
        ]
        if self.sockets == "unix":
            lines.append("socket: AF_UNIX only (other families EPERM)")
        elif self.sockets == "none":
            lines.append("socket: every family EPERM (no network namespace); socketpair: AF_UNIX stream and "
                         "seqpacket only")
        elif self.sockets == "loopback":
            lines.append("socket: AF_UNIX, AF_INET, AF_INET6, and AF_NETLINK for NETLINK_ROUTE only; raw and packet "
                         "sockets and other families EPERM; socketpair: AF_UNIX only")
        elif self.sockets == "proxy":
            lines.append("socket: AF_INET and AF_INET6 stream sockets, and AF_NETLINK for NETLINK_ROUTE only; new "
                         "AF_UNIX sockets, datagram (UDP), raw and packet sockets and other families EPERM; "
                         "socketpair: AF_UNIX stream and seqpacket only")
        if not self.namespaces:
            lines.append("prlimit64, setpriority, ioprio_set and sched_set*: on the calling process only")
            lines.append("EPERM (no namespace or read-only mount confines them): SysV IPC and POSIX message queues "
                         "(the host's: no IPC namespace); mode, owner and extended attribute changes; times set to "
                         "anything but now; file-flag ioctls (" + ", ".join(NO_NAMESPACES_IOCTLS) + "); leases "
                         "(F_SETLEASE); inotify and dnotify (F_NOTIFY) watches; clone with CLONE_PARENT")
        if self.mode == "allowlist":
            lines.append(f"allowed: {len(self.allowed)} calls")
        return lines


def spec_from_profile(seccomp_table: dict, share_net: bool, loopback: bool = True, namespaces: bool = True,
                      proxy: bool = False) -> SeccompSpec:
    extra_deny = set(seccomp_table.get("deny", ()))
    extra_allow = set(seccomp_table.get("allow", ()))
    denied = tuple(sorted(set(DENIED_ALWAYS) | extra_deny
                          | (set() if namespaces else {*METADATA_CALLS, *NO_NAMESPACES_DENIED})))
    mode = seccomp_table["mode"]
    allowed: tuple[str, ...] = ()
    if mode == "allowlist":
        allowed = tuple(sorted((set(STRICT_ALLOWED) | extra_allow) - set(denied) - set(ENOSYS_ALWAYS)))
    # Without a network namespace (KernelNoNamespaces) loopback would be the host's, and
    # Landlock does not mediate connecting to a host daemon's unix socket: no socket() at all.
    sockets = "all" if share_net else ("none" if not namespaces else "proxy" if proxy
                                       else "loopback" if loopback else "unix")
    return SeccompSpec(mode=mode, allowed=allowed, denied=denied, sockets=sockets, namespaces=namespaces)


LIBSECCOMP_DIRS = ("/usr/lib/{triplet}", "/lib/{triplet}", "/usr/lib64", "/lib64", "/usr/lib", "/lib")
TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}


def libseccomp_identity() -> str:
    """What identifies the libseccomp a BPF was compiled with, cheaply.

    The installed library file's real name (it carries the full version, e.g.
    libseccomp.so.2.5.4), size and mtime: a stat, not a dlopen, on the launch path. Where
    the file is not in the usual places, ask the library itself.
    """
    triplet = TRIPLETS.get(os.uname().machine, "")
    for directory in LIBSECCOMP_DIRS:
        path = os.path.join(directory.format(triplet=triplet), "libseccomp.so.2")
        try:
            info = os.stat(path)
        except OSError:
            continue
        return f"{os.path.realpath(path)}:{info.st_size}:{info.st_mtime_ns}"
    return libseccomp_version()


def libseccomp_version() -> str:
    """The version of the libseccomp the BPF would be compiled with (loaded by soname)."""
    import ctypes

    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return "missing"

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    lib.seccomp_version.restype = ctypes.POINTER(Version)
    v = lib.seccomp_version().contents
    return f"{v.major}.{v.minor}.{v.micro}"


def cache_key(spec: SeccompSpec) -> str:
    return cache.digest(f"{spec.key_material()}|{os.uname().machine}|{libseccomp_identity()}")


def compiled_bpf(spec: SeccompSpec) -> bytes:
    """The BPF program for ``spec``, from the cache or compiled now (and cached)."""
    name = f"seccomp-{cache_key(spec)}.bpf"
    program = cache.read(name)
    if program and _well_framed(program):
        return program
    program = compile_bpf(spec)
    cache.write(name, program)
    return program


BPF_LD_W_ABS, BPF_RET_CLASS = 0x20, 0x06
SECCOMP_DATA_ARCH_OFFSET = 4


def _well_framed(blob: bytes) -> bool:
    """The shape compile_bpf produces: two framed programs, each starting by loading the
    architecture (libseccomp's first check) and ending in a return. A cached blob of any
    other shape is compiled again; the check costs microseconds."""
    offset, programs = 0, 0
    while offset + 4 <= len(blob):
        size = int.from_bytes(blob[offset:offset + 4], "little")
        program = blob[offset + 4:offset + 4 + size]
        if size == 0 or size % 8 or len(program) != size or size // 8 > 4096:
            return False
        first_code, first_k = int.from_bytes(program[0:2], "little"), int.from_bytes(program[4:8], "little")
        last_code = int.from_bytes(program[-8:-6], "little")
        if (first_code, first_k) != (BPF_LD_W_ABS, SECCOMP_DATA_ARCH_OFFSET) or last_code & 0x07 != BPF_RET_CLASS:
            return False
        offset += 4 + size
        programs += 1
    return offset == len(blob) and programs == 2


def seccomp_names_from_profile(spec: SeccompSpec) -> set[str]:
    """The denied names that only a profile can have added (an unknown one is its error)."""
    return set(spec.denied) - set(DENIED_ALWAYS) - set(METADATA_CALLS) - set(NO_NAMESPACES_DENIED)


def compile_bpf(spec: SeccompSpec) -> bytes:
    """Two stacked programs, framed for stage 2 (see ``split_programs``).

    One is the profile's allowlist or denylist. The other guards arguments
    (clone namespace flags, terminal ioctls, socket families) with a default of ALLOW.
    They are separate because libseccomp folds an unconditional ALLOW for a call over its
    conditional denials; stacked filters cannot be folded: the kernel runs both and keeps
    the most restrictive answer.
    """
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as exc:
        raise SetupError(f"cannot load libseccomp through pyseccomp: {exc}",
                         "install libseccomp2 and the pyseccomp package (pip install pyseccomp)") from None
    eperm = sc.ERRNO(errno.EPERM)

    def new_filter(default: int):
        flt = sc.SyscallFilter(default)
        flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)  # i386 and x32 calls end the process
        flt.set_attr(sc.Attr.CTL_NNP, 0)  # stage 2 sets no_new_privs itself
        return flt

    def add(flt, action: int, name: str, *args, from_profile: bool = True) -> None:
        try:
            flt.add_rule(action, name, *args)
        except (OSError, ValueError, RuntimeError):
            if name in NEW_CALL_NUMBERS and os.uname().machine in TRIPLETS:
                flt.add_rule(action, NEW_CALL_NUMBERS[name], *args)
                return
            if from_profile:
                error = ProfileError(f"[seccomp] names {name!r}, which this libseccomp does not know as a "
                                     "system call on this architecture",
                                     "check the syscall names in the profile's [seccomp] table")
                error.syscall = name
                raise error from None

    main = new_filter(sc.ERRNO(errno.ENOSYS) if spec.mode == "allowlist" else sc.ALLOW)
    for name in spec.denied:
        add(main, eperm, name, from_profile=name in seccomp_names_from_profile(spec))
    for name in ENOSYS_ALWAYS:
        add(main, sc.ERRNO(errno.ENOSYS), name, from_profile=False)
    for name in spec.allowed:
        # Built-in names this libseccomp does not know stay at the default (ENOSYS).
        add(main, sc.ALLOW, name, from_profile=name not in STRICT_ALLOWED)

    guard = new_filter(sc.ALLOW)
    for flag in CLONE_NAMESPACE_FLAGS.values():
        add(guard, eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag), from_profile=False)
    for request in DENIED_IOCTLS.values():
        add(guard, eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request), from_profile=False)
    if spec.sockets != "all":
        # socketpair creates sockets too: only AF_UNIX has pairs, so refuse every other family
        # before the kernel runs (or autoloads) its code.
        add(guard, eperm, "socketpair", sc.Arg(0, sc.NE, AF_UNIX), from_profile=False)
    if spec.sockets in ("proxy", "none"):
        # A datagram pair can still sendto() or connect() any unix datagram socket it can
        # see (/dev/log, a bind-mounted one): where new unix sockets are refused, so is it.
        # The mask 0xE matches SOCK_DGRAM (2) and SOCK_RAW (3), which AF_UNIX turns into
        # SOCK_DGRAM; stream (1) and seqpacket (5) pairs cannot be pointed at an address.
        add(guard, eperm, "socketpair", sc.Arg(0, sc.EQ, AF_UNIX), sc.Arg(1, sc.MASKED_EQ, 0xE, SOCK_DGRAM),
            from_profile=False)
    if not spec.namespaces:
        add(guard, eperm, "prlimit64", sc.Arg(0, sc.NE, 0), from_profile=False)
        for name in SELF_ONLY_CALLS:
            add(guard, eperm, name, sc.Arg(0, sc.NE, 0), from_profile=False)
        # setpriority/ioprio_set(which, who): only (this process, 0); a process group or a
        # uid would renice every process of the caller, the runtime included.
        add(guard, eperm, "setpriority", sc.Arg(0, sc.NE, PRIO_PROCESS), from_profile=False)
        add(guard, eperm, "setpriority", sc.Arg(1, sc.NE, 0), from_profile=False)
        add(guard, eperm, "ioprio_set", sc.Arg(0, sc.NE, IOPRIO_WHO_PROCESS), from_profile=False)
        add(guard, eperm, "ioprio_set", sc.Arg(1, sc.NE, 0), from_profile=False)
        for name, index in TIME_CALLS.items():
            add(guard, eperm, name, sc.Arg(index, sc.NE, 0), from_profile=False)
        for request in NO_NAMESPACES_IOCTLS.values():
            add(guard, eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request), from_profile=False)
        # fcntl's command is an unsigned int to the kernel: compare the low 32 bits only, or
        # 0x100000000|F_SETLEASE would pass.
        for command in (F_SETLEASE, F_NOTIFY):
            add(guard, eperm, "fcntl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, command), from_profile=False)
        add(guard, eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_PARENT, CLONE_PARENT), from_profile=False)
    if spec.sockets == "unix":
        add(guard, eperm, "socket", sc.Arg(0, sc.NE, AF_UNIX), from_profile=False)
    elif spec.sockets == "none":
        add(guard, eperm, "socket", from_profile=False)
    elif spec.sockets in ("loopback", "proxy"):
        # Only lo exists in the namespace, so inet sockets reach nothing outside it. Every
        # other family is refused (one rule each: libseccomp has no "not in"), netlink is
        # kept to routing (getifaddrs, if_nameindex), and no raw or packet sockets.
        for family in range(0, LOOPBACK_FAMILY_LIMIT + 1):
            if family not in LOOPBACK_FAMILIES:
                add(guard, eperm, "socket", sc.Arg(0, sc.EQ, family), from_profile=False)
        add(guard, eperm, "socket", sc.Arg(0, sc.GT, LOOPBACK_FAMILY_LIMIT), from_profile=False)
        add(guard, eperm, "socket", sc.Arg(0, sc.EQ, AF_NETLINK), sc.Arg(2, sc.NE, NETLINK_ROUTE),
            from_profile=False)
        for family in (AF_INET, AF_INET6):
            for kind in (SOCK_RAW, SOCK_PACKET) + ((SOCK_DGRAM,) if spec.sockets == "proxy" else ()):
                add(guard, eperm, "socket", sc.Arg(0, sc.EQ, family), sc.Arg(1, sc.MASKED_EQ, 0xF, kind),
                    from_profile=False)
        if spec.sockets == "proxy":
            # The proxy's listener is the one way out; no new unix socket may look for another
            # (a socket file bind-mounted in, or the host's abstract namespace on other tiers).
            add(guard, eperm, "socket", sc.Arg(0, sc.EQ, AF_UNIX), from_profile=False)
    # The guard goes first: the allowlist program, once loaded, refuses seccomp() itself.
    return frame_programs([_export(guard), _export(main)])


def _export(flt) -> bytes:
    import tempfile

    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        return out.read()
