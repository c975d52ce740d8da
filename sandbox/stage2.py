"""Stage 2: the first code that runs inside the sandbox, between bwrap and the command.

It is started as ``python3 -I -S -c <this file's source> CONFIG_FD KEEP`` (inside bwrap's
namespaces on the kernel tiers, directly as the child on EnvironmentOnly), where KEEP is
the comma-separated list of preserved descriptors. It reads like nsjail's containment
order, top to bottom:

    fd hygiene -> rlimits -> no_new_privs -> Landlock -> seccomp -> exec

Rules for this file, because of where it runs:

- Standard library only, and only cheap modules: it is imported by the package too
  (for ``clear_cloexec``), but as stage 2 it runs with ``-I -S`` inside a filesystem view
  that has no site-packages, and every tool call pays its start-up time.
- Hygiene is the first statement of ``main`` and works only on the argv it was given.
- A layer the plan asks for that cannot be installed is reported on the status fd and
  ends stage 2 with status 125; nothing is skipped silently.

The status fd carries framed records to the parent: ``S`` (stage 2 started), ``N``
(a note), ``E`` (an error, marshal-encoded dict). It is close-on-exec, so a successful
exec closes it with nothing more said.
"""

from __future__ import annotations

import errno
import fcntl
import marshal
import os
import sys

FIRST_INHERITED_FD = 3
CLOSE_RANGE_CLOEXEC = 1 << 2
MAX_FD_NUMBER = 0xFFFFFFFF  # close_range takes unsigned int bounds; ~0U means "to the end"
FALLBACK_WALK_CAP = 1 << 20  # the kernel's own fs.nr_open ceiling

# Syscall numbers that the libc wrappers do not cover on Debian 12's glibc 2.36.
_SYSCALLS = {
    "x86_64": {"close_range": 436, "seccomp": 317, "prctl": 157, "landlock_create_ruleset": 444,
               "landlock_add_rule": 445, "landlock_restrict_self": 446},
    "aarch64": {"close_range": 436, "seccomp": 277, "prctl": 167, "landlock_create_ruleset": 444,
                "landlock_add_rule": 445, "landlock_restrict_self": 446},
}

PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1

EXIT_SETUP_FAILED = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class Stage2Failure(Exception):
    """A layer could not be installed; carries what the parent reports."""

    def __init__(self, layer: str, message: str, err: int = 0, exit_status: int = EXIT_SETUP_FAILED):
        super().__init__(message)
        self.layer = layer
        self.message = message
        self.errno = err
        self.exit_status = exit_status


class FdFlagError(Exception):
    """fcntl on a preserved descriptor failed; the message is the one users see."""

    def __init__(self, fd: int, err: int, reading: bool):
        what = "read fd flags for" if reading else "clear close-on-exec for"
        super().__init__(f"failed to {what} preserved file descriptor {fd}: {os.strerror(err)}")
        self.fd = fd
        self.errno = err


# --- descriptors ----------------------------------------------------------------------


def clear_cloexec(fd: int, fcntl_fn=fcntl.fcntl) -> bool:
    """Make ``fd`` survive exec, exactly as Codex's ``clear_cloexec`` does.

    Read the flags; a failure (typically EBADF: closed or dropped too early) is an error
    naming the fd. If FD_CLOEXEC is already clear, make no second call. Otherwise clear
    it and report a failure the same way. Never reopen anything as a fallback. Returns
    whether the flag was changed.
    Safe wherever it runs: it only touches the descriptor flag of an fd the caller
    declared as its own to pass on.
    """
    try:
        flags = fcntl_fn(fd, fcntl.F_GETFD)
    except OSError as exc:
        raise FdFlagError(fd, exc.errno or errno.EBADF, reading=True) from None
    except OverflowError:  # not even a C int: no such descriptor can exist
        raise FdFlagError(fd, errno.EBADF, reading=True) from None
    if flags < 0:
        raise FdFlagError(fd, errno.EBADF, reading=True)
    cleared = flags & ~fcntl.FD_CLOEXEC
    if cleared == flags:
        return False
    try:
        result = fcntl_fn(fd, fcntl.F_SETFD, cleared)
    except OSError as exc:
        raise FdFlagError(fd, exc.errno or errno.EBADF, reading=False) from None
    if result < 0:
        raise FdFlagError(fd, errno.EBADF, reading=False)
    return True


def make_files_inheritable(fds, fcntl_fn=fcntl.fcntl) -> list:
    """clear_cloexec on each fd; returns the fds whose flag was changed."""
    return [fd for fd in fds if clear_cloexec(fd, fcntl_fn)]


def cloexec_gaps(keep) -> list:
    """The [first, last] ranges of fd numbers >= 3 that are not in ``keep``."""
    gaps = []
    low = FIRST_INHERITED_FD
    for fd in sorted(set(keep)):
        if fd < low:
            continue
        if fd > low:
            gaps.append((low, fd - 1))
        low = fd + 1
    gaps.append((low, MAX_FD_NUMBER))
    return gaps


def mark_inherited_fds_cloexec(keep, close_range_fn=None) -> str:
    """Mark every descriptor >= 3 that is not in ``keep`` close-on-exec.

    Landlock cannot stop a descriptor that was opened before its ruleset existed, so this
    is the only thing between a descriptor the caller leaked and the command. Returns the
    mechanism used ("close_range" or "walk"). The walk is as strong as close_range: it
    visits every number up to the larger RLIMIT_NOFILE bound, using fcntl only, never
    /proc (which a Landlock ruleset may hide).
    """
    gaps = cloexec_gaps(keep)
    close_range_fn = close_range_fn or _close_range
    try:
        for first, last in gaps:
            close_range_fn(first, last, CLOSE_RANGE_CLOEXEC)
        return "close_range"
    except OSError:
        pass
    import resource  # only on kernels before 5.11

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    finite = [b for b in (soft, hard) if b != resource.RLIM_INFINITY]
    bound = min(max(finite), FALLBACK_WALK_CAP) if finite else FALLBACK_WALK_CAP
    keep_set = set(keep)
    for fd in range(FIRST_INHERITED_FD, bound):
        if fd in keep_set:
            continue
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue  # EBADF: not open
        if not flags & fcntl.FD_CLOEXEC:
            fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)
    return "walk"


# --- raw syscalls ------------------------------------------------------------------------
# Through _ctypes directly: the ctypes package costs about a millisecond more to import,
# and every tool call pays stage 2's start-up. Only syscall(2) itself is bound.

_syscall = None


def _syscall_table() -> dict:
    machine = os.uname().machine
    table = _SYSCALLS.get(machine)
    if table is None:
        raise Stage2Failure("platform", f"unsupported architecture {machine}")
    return table


def _bind_syscall():
    global _syscall
    if _syscall is None:
        import _ctypes

        class CLong(_ctypes._SimpleCData):
            _type_ = "l"

        class SyscallFunction(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = CLong

        function = SyscallFunction(_ctypes.dlsym(_ctypes.dlopen(None, os.RTLD_NOW), "syscall"))
        _syscall = (function, CLong, _ctypes)
    return _syscall


def _raw_syscall(name: str, *args) -> int:
    """syscall(2) by name. Integers travel as C longs, bytes as pointers to their data,
    None as NULL. Raises OSError with the kernel's errno on -1."""
    function, c_long, _ctypes = _bind_syscall()
    converted = [c_long(a) if isinstance(a, int) else a for a in args]
    result = function(c_long(_syscall_table()[name]), *converted)
    if result == -1:
        err = _ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def _pointer_to_copy(data: bytes):
    """A C buffer holding ``data`` and its address (keep the buffer alive while in use)."""
    _, _, _ctypes = _bind_syscall()

    class CChar(_ctypes._SimpleCData):
        _type_ = "c"

    buffer_type = type("Buffer", (_ctypes.Array,), {"_type_": CChar, "_length_": len(data)})
    buffer = buffer_type.from_buffer_copy(data)
    return buffer, _ctypes.addressof(buffer)


def _close_range(first: int, last: int, flags: int) -> None:
    # Safe here: CLOSE_RANGE_CLOEXEC only sets a flag; nothing is closed before exec.
    _raw_syscall("close_range", first, last, flags)


def set_no_new_privs() -> None:
    # Safe here: it only forbids gaining privileges at exec; required before seccomp and
    # Landlock by an unprivileged caller.
    try:
        _raw_syscall("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    except OSError as exc:
        raise Stage2Failure("no_new_privs", f"prctl(PR_SET_NO_NEW_PRIVS) failed: {exc.strerror}",
                            exc.errno) from None


def landlock_abi_version() -> int:
    """The running kernel's Landlock ABI, or 0 when Landlock is unavailable."""
    try:
        return _raw_syscall("landlock_create_ruleset", None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    except OSError:
        return 0


def install_landlock(spec: dict) -> None:
    """Create the ruleset the plan derived from the binds and restrict this process.

    Safe here: it only narrows what this process and its descendants may open; the
    ruleset fd is close-on-exec and dropped before the command runs.
    """
    abi = landlock_abi_version()
    if abi < spec["abi"]:
        raise Stage2Failure("landlock", f"the plan needs Landlock ABI {spec['abi']}, the kernel has {abi}")
    order = sys.byteorder
    attr = (spec["fs"].to_bytes(8, order) + spec["net"].to_bytes(8, order)
            + spec["scoped"].to_bytes(8, order))
    try:
        ruleset = _raw_syscall("landlock_create_ruleset", attr, len(attr), 0)
    except OSError as exc:
        raise Stage2Failure("landlock", f"landlock_create_ruleset failed: {exc.strerror}", exc.errno) from None
    try:
        fcntl.fcntl(ruleset, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
        for path, access, optional in spec["rules"]:
            _add_path_rule(ruleset, path, access, optional, spec["file_rights"])
        try:
            _raw_syscall("landlock_restrict_self", ruleset, 0)
        except OSError as exc:
            raise Stage2Failure("landlock", f"landlock_restrict_self failed: {exc.strerror}",
                                exc.errno) from None
    finally:
        os.close(ruleset)


def _add_path_rule(ruleset: int, path: str, access: int, optional: bool, file_rights: int) -> None:
    import stat

    try:
        parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        if optional and exc.errno == errno.ENOENT:
            return
        raise Stage2Failure("landlock", f"cannot open {path} for a Landlock rule: {exc.strerror}",
                            exc.errno) from None
    try:
        if not stat.S_ISDIR(os.fstat(parent).st_mode):
            access &= file_rights  # the kernel refuses directory rights on a file rule
        rule = access.to_bytes(8, sys.byteorder) + parent.to_bytes(4, sys.byteorder, signed=True)
        try:
            _raw_syscall("landlock_add_rule", ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0)
        except OSError as exc:
            raise Stage2Failure("landlock", f"landlock_add_rule({path}) failed: {exc.strerror}",
                                exc.errno) from None
    finally:
        os.close(parent)


def install_seccomp(fd: int) -> None:
    """Load the BPF programs the parent compiled, from the fd it handed us, in order.

    Safe here: no_new_privs is already set, the programs were built for this architecture,
    and nothing else runs in this process after them but exec. Each program is framed by
    its length (4 bytes, little-endian); stacked filters all run and the strictest wins.
    """
    blob = b""
    while True:
        chunk = os.pread(fd, 65536, len(blob))
        if not chunk:
            break
        blob += chunk
    os.close(fd)

    offset = 0
    while offset < len(blob):
        size = int.from_bytes(blob[offset:offset + 4], "little")
        program = blob[offset + 4:offset + 4 + size]
        offset += 4 + size
        if not size or size % 8 or len(program) != size:
            raise Stage2Failure("seccomp", f"the BPF handed to stage 2 is malformed ({len(blob)} bytes)")
        buffer, address = _pointer_to_copy(program)
        # struct sock_fprog { unsigned short len; /* 6 bytes padding */ struct sock_filter *filter; }
        prog = (size // 8).to_bytes(2, sys.byteorder) + bytes(6) + address.to_bytes(8, sys.byteorder)
        try:
            _raw_syscall("seccomp", SECCOMP_SET_MODE_FILTER, 0, prog)
        except OSError as exc:
            raise Stage2Failure("seccomp", f"seccomp(SET_MODE_FILTER) failed: {exc.strerror}",
                                exc.errno) from None
        del buffer  # the kernel has copied the program
    if not offset:
        raise Stage2Failure("seccomp", "the plan asked for seccomp but no BPF program arrived")


def apply_rlimits(rlimits) -> None:
    import resource

    for name, soft, hard in rlimits:
        which = getattr(resource, name)
        _, cur_hard = resource.getrlimit(which)
        if cur_hard != resource.RLIM_INFINITY:
            hard = cur_hard if hard == resource.RLIM_INFINITY else min(hard, cur_hard)
            soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        try:
            resource.setrlimit(which, (soft, hard))
        except (OSError, ValueError) as exc:
            raise Stage2Failure("rlimits", f"setrlimit({name}, {soft}, {hard}) failed: {exc}") from None


# --- exec --------------------------------------------------------------------------------


def find_executable(name: str, search_path: str) -> str:
    """Resolve ``name`` as execvp would, reporting 127/126 the way shells do."""
    if "/" in name:
        return name
    found_not_executable = None
    for directory in search_path.split(":"):
        candidate = os.path.join(directory or ".", name)
        try:
            if os.path.isdir(candidate):
                continue
            os.stat(candidate)
        except OSError:
            continue
        if os.access(candidate, os.X_OK):
            return candidate
        found_not_executable = candidate
    if found_not_executable:
        raise Stage2Failure("exec", f"{found_not_executable}: permission denied", errno.EACCES,
                            EXIT_NOT_EXECUTABLE)
    raise Stage2Failure("exec", f"{name}: command not found", errno.ENOENT, EXIT_NOT_FOUND)


def exec_command(config: dict) -> None:
    import signal

    # Python ignores these at start-up; a command expects the default disposition.
    for signame in ("SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, signame), signal.SIG_DFL)
    argv, env = config["argv"], config["env"]
    exe_fd = config.get("exe_fd")
    path = None
    try:
        if exe_fd is not None:
            os.execve(exe_fd, argv, env)  # fexecve: the bytes the parent hashed
        path = find_executable(argv[0], config["search_path"])
        os.execve(path, argv, env)
    except OSError as exc:
        if exc.errno == errno.ENOENT and (exe_fd is not None or (path and os.path.exists(path))):
            # The file is there: its #! interpreter or ELF loader is what is missing.
            raise Stage2Failure("exec", f"{argv[0]}: its interpreter or loader is not visible in the sandbox",
                                exc.errno, EXIT_NOT_EXECUTABLE) from None
        status = EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_NOT_EXECUTABLE
        raise Stage2Failure("exec", f"{argv[0]}: {exc.strerror}", exc.errno or 0, status) from None


# --- status channel ----------------------------------------------------------------------


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + len(payload).to_bytes(4, "little") + payload


def parse_frames(data: bytes) -> list:
    """The records in ``data``; a truncated or undecodable tail is dropped."""
    records, offset = [], 0
    while offset + 5 <= len(data):
        kind = data[offset:offset + 1]
        size = int.from_bytes(data[offset + 1:offset + 5], "little")
        payload = data[offset + 5:offset + 5 + size]
        if len(payload) != size:
            break
        try:
            records.append((kind, marshal.loads(payload) if payload else None))
        except (ValueError, EOFError, TypeError):
            break
        offset += 5 + size
    return records


def _report(status_fd: int, kind: bytes, record=None) -> None:
    payload = marshal.dumps(record, 2) if record is not None else b""
    try:
        os.write(status_fd, frame(kind, payload))
    except OSError:
        pass  # the parent went away; die-with-parent ends us next


def _read_config(fd: int) -> dict:
    data = b""
    while True:
        chunk = os.pread(fd, 1 << 16, len(data))
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return marshal.loads(data)


def main(argv) -> None:
    # argv: [-c, CONFIG_FD, KEEP(, CODE_FD when loaded precompiled)]
    keep = [int(fd) for fd in argv[2].split(",") if fd] if len(argv) > 2 else []
    hygiene = mark_inherited_fds_cloexec(keep)
    config = _read_config(int(argv[1]))
    status_fd = config["status_fd"]
    _report(status_fd, b"S")
    if hygiene != "close_range":
        _report(status_fd, b"N", {"layer": "fd-hygiene", "message": "close_range unavailable: walked every fd"})
    try:
        make_files_inheritable(keep)
        if config.get("cwd"):
            os.chdir(config["cwd"])
        apply_rlimits(config["rlimits"])
        set_no_new_privs()
        if config.get("landlock"):
            install_landlock(config["landlock"])
        if config.get("seccomp_fd") is not None:
            install_seccomp(config["seccomp_fd"])
        exec_command(config)
    except FdFlagError as exc:
        failure = Stage2Failure("preserved-fd", str(exc), exc.errno)
    except Stage2Failure as exc:
        failure = exc
    except OSError as exc:
        failure = Stage2Failure("stage2", f"{exc}", exc.errno or 0)
    _report(status_fd, b"E", {"layer": failure.layer, "message": failure.message,
                              "errno": failure.errno, "exit": failure.exit_status})
    os._exit(failure.exit_status)


if __name__ == "__main__":
    main(sys.argv)
