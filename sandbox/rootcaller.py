"""Root callers: the sandbox runs as an unprivileged host uid, the workdir through an idmapped mount.

Run by root, bwrap's user namespace maps the command to host root: file permissions would
let it read every root-only file in its view, and RLIMIT_NPROC does not apply to root.
So for a root caller sbx starts bwrap as ``sandbox_uid()``, an unprivileged uid of its own
chosen at random far above any account, with no groups: root-only files are closed to the
command, and its process count is bounded. To keep the caller's writable binds (the workdir) writable, each is
shown through an *idmapped mount* whose map presents the host's root as that uid:
inside, the caller's files appear owned by the command; what it creates is owned by root
on the host. The mount is made here (open_tree, mount_setattr, move_mount) under a
staging directory only root can list, handed to bwrap by descriptor, and removed when the sandbox
has made its mounts (stage 2's first status record), so a staged mount is reachable by
path on the host only during bwrap's setup; stale ones from a process that died are swept
at the next launch. A read-only bind's clone is read-only.

Needs Linux 5.12+ and a filesystem with idmapped mounts (ext4, xfs, btrfs, tmpfs 6.3+, ...);
otherwise the launch fails with a ``setup`` error (fail closed).
"""

from __future__ import annotations

import os

from .errors import HostError, SetupError

SANDBOX_UID_BASE, SANDBOX_UID_SPAN = 2_000_000_000, 100_000_000  # far above any account
_sandbox_uid: int | None = None
STAGING_ROOT = "/run/sbx-idmap"
SETPRIV_DIRS = ("/usr/bin", "/bin")

# Syscall numbers (x86_64 and aarch64 share them) and flags from linux/mount.h.
_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000
_MOUNT_ATTR_RDONLY = 0x00000001
_MNT_DETACH = 2

_userns_fd: int | None = None


def setpriv_prefix() -> list[str]:
    """The argv prefix that starts bwrap as the sandbox uid, with no groups."""
    for directory in SETPRIV_DIRS:
        path = os.path.join(directory, "setpriv")
        if os.access(path, os.X_OK):
            uid = sandbox_uid()
            return [path, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    raise HostError("run as root, sbx starts the sandbox as an unprivileged uid with setpriv, which is missing",
                    "apt-get install util-linux")


def capability_drop_prefix() -> list[str]:
    """KernelNoNamespaces, root caller: there is no user namespace to map an unprivileged
    uid into and no mount namespace for an idmapped workdir, so the command keeps uid 0;
    it starts with an empty capability bounding set, no inheritable capabilities, no groups
    and SECBIT_NOROOT locked (as bwrap's --cap-drop ALL does above this tier)."""
    for directory in SETPRIV_DIRS:
        path = os.path.join(directory, "setpriv")
        if os.access(path, os.X_OK):
            return [path, "--bounding-set=-all", "--inh-caps=-all", "--clear-groups",
                    "--securebits=+noroot,+noroot_locked", "--"]
    raise HostError("run as root at KernelNoNamespaces, sbx drops every capability with setpriv, which is missing",
                    "apt-get install util-linux")


def _syscall(number: int, *args) -> int:
    # Safe here: only the mount calls below, by root, on a private clone of the caller's
    # own bind source, attached under a root-only directory.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(ctypes.c_long(number), *args)
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def sandbox_uid() -> int:
    """This process's sandbox identity: an unprivileged host uid chosen at random, once, from
    a range no account uses. Not 65534: any host process running as nobody would then own
    the idmapped view of the caller's workdir while bwrap sets up. (Its sandboxes share it,
    and with it the profile's nproc limit.)"""
    global _sandbox_uid
    if _sandbox_uid is None:
        _sandbox_uid = SANDBOX_UID_BASE + int.from_bytes(os.urandom(4), "little") % SANDBOX_UID_SPAN
    return _sandbox_uid


def _idmap_userns() -> int:
    """A user namespace whose only mapping is the host's root as ``sandbox_uid()``: the
    idmap of every staged mount, made once per process. A child enters a new user
    namespace, we write its map (root may map any id), keep a descriptor, end the child."""
    global _userns_fd
    if _userns_fd is not None:
        return _userns_fd
    import time

    uid = sandbox_uid()
    own = os.stat("/proc/self/ns/user").st_ino
    read_end, write_end = os.pipe()
    try:
        # cat blocks on the pipe until we close it: the namespace exists as long as we need.
        child = os.posix_spawn("/usr/bin/unshare", ["unshare", "--user", "--", "/bin/cat"], {},
                               file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0)])
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        raise SetupError(f"could not start /usr/bin/unshare for an idmapped mount: {exc.strerror}",
                         "apt-get install util-linux") from None
    os.close(read_end)
    try:
        deadline = time.monotonic() + 5
        while os.stat(f"/proc/{child}/ns/user").st_ino == own:
            if time.monotonic() > deadline or os.waitpid(child, os.WNOHANG)[0]:
                raise OSError(0, "the child did not enter a new user namespace")
            time.sleep(0.0005)
        for name, text in (("uid_map", f"0 {uid} 1\n"), ("setgroups", "deny\n"), ("gid_map", f"0 {uid} 1\n")):
            with open(f"/proc/{child}/{name}", "w") as f:
                f.write(text)
        _userns_fd = os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SetupError(f"could not create the user namespace for an idmapped mount: {exc.strerror}",
                         "run sbx as a regular user instead of root") from None
    finally:
        os.close(write_end)
        try:
            os.kill(child, 9)
            os.waitpid(child, 0)
        except OSError:
            pass
    return _userns_fd


def stage_idmapped(source_fd: int, source: str, read_only: bool = False) -> tuple[str, int]:
    """Attach an idmapped clone of the directory ``source_fd`` pins (named ``source`` in
    messages) under STAGING_ROOT; (the staging directory, an O_PATH descriptor on the
    staged mount) -- release with ``release``."""
    import ctypes

    sweep_stale()
    userns = _idmap_userns()
    import stat

    # 0711: bwrap, running as the sandbox uid, must traverse it to bind the staged mount;
    # nobody can list it, and each entry's name has 96 random bits.
    os.makedirs(STAGING_ROOT, mode=0o711, exist_ok=True)
    os.chmod(STAGING_ROOT, 0o711)
    target = os.path.join(STAGING_ROOT, f"{os.getpid()}-{os.urandom(12).hex()}")
    is_dir = stat.S_ISDIR(os.fstat(source_fd).st_mode)
    if is_dir:
        os.mkdir(target, 0o700)
    else:  # a file is mounted over a file
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    tree = -1
    try:
        tree = _syscall(_OPEN_TREE, ctypes.c_int(source_fd), ctypes.c_char_p(b""),
                        ctypes.c_uint(_OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_EMPTY_PATH))

        class MountAttr(ctypes.Structure):
            _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                        ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

        # A read-only bind is read-only on the staged clone too, not only inside the sandbox.
        attr = MountAttr(_MOUNT_ATTR_IDMAP | (_MOUNT_ATTR_RDONLY if read_only else 0), 0, 0, userns)
        _syscall(_MOUNT_SETATTR, ctypes.c_int(tree), ctypes.c_char_p(b""), ctypes.c_uint(_AT_EMPTY_PATH),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
        _syscall(_MOVE_MOUNT, ctypes.c_int(tree), ctypes.c_char_p(b""), ctypes.c_int(_AT_FDCWD),
                 ctypes.c_char_p(os.fsencode(target)), ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH))
    except OSError as exc:
        (os.rmdir if is_dir else os.unlink)(target)
        raise SetupError(f"could not show {source} to the sandbox's unprivileged uid through an idmapped mount: "
                         f"{exc.strerror}",
                         "use a filesystem with idmapped mounts (Linux 5.12+: ext4, xfs, btrfs, tmpfs 6.3+), "
                         "or run sbx as a regular user") from None
    finally:
        if tree >= 0:
            os.close(tree)
    return target, os.open(target, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)


def release(target: str) -> None:
    """Detach a staged mount (the sandbox keeps its own copy) and remove its directory."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(ctypes.c_char_p(os.fsencode(target)), ctypes.c_int(_MNT_DETACH))
    for remove in (os.rmdir, os.unlink):
        try:
            remove(target)
            return
        except OSError:
            pass


def sweep_stale() -> None:
    """Release staged mounts left by sbx processes that no longer exist."""
    try:
        entries = os.listdir(STAGING_ROOT)
    except OSError:
        return
    for entry in entries:
        pid = entry.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            release(os.path.join(STAGING_ROOT, entry))


_pending = None  # a queue.SimpleQueue of staging directories for the releaser thread


def release_in_background(targets: list[str]) -> None:
    """Release staged mounts from one long-lived daemon thread: an unmount can wait for
    the kernel (an RCU grace period), and the caller may be an event loop's thread. What a
    process leaves pending when it exits is swept by the next launch (its pid is dead)."""
    global _pending
    import threading

    if _pending is None:
        import queue

        _pending = queue.SimpleQueue()

        def releaser() -> None:
            while True:
                release(_pending.get())

        threading.Thread(target=releaser, name="sbx-idmap-release", daemon=True).start()
    for target in targets:
        _pending.put(target)
