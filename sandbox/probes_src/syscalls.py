# Calls each system call with arguments the kernel itself rejects with a distinctive errno
# (EBADF, EFAULT, EINVAL, ESRCH, ...), so the answer tells who refused it: a seccomp
# denial answers EPERM or ENOSYS before the kernel looks at the arguments. x86_64 numbers.
import ctypes
import json
import socket

libc = ctypes.CDLL(None, use_errno=True)
BAD = ctypes.c_void_p(1)  # an unmapped user pointer: EFAULT if the kernel reads it
L = ctypes.c_long

CALLS = {
    # name: (number, args)
    "ptrace": (101, (L(2), L(0x7FFFFFF0), L(0), L(0))),
    "process_vm_readv": (310, (L(0x7FFFFFF0), BAD, L(1), BAD, L(1), L(0))),
    "process_vm_writev": (311, (L(0x7FFFFFF0), BAD, L(1), BAD, L(1), L(0))),
    "mount": (165, (BAD, BAD, BAD, L(0), BAD)),
    "umount2": (166, (BAD, L(-1))),
    "pivot_root": (155, (BAD, BAD)),
    "open_tree": (428, (L(-1), BAD, L(-1))),
    "move_mount": (429, (L(-1), BAD, L(-1), BAD, L(-1))),
    "fsopen": (430, (BAD, L(-1))),
    "fsconfig": (431, (L(-1), L(-1), BAD, BAD, L(0))),
    "fsmount": (432, (L(-1), L(-1), L(-1))),
    "fspick": (433, (L(-1), BAD, L(-1))),
    "mount_setattr": (442, (L(-1), BAD, L(-1), BAD, L(0))),
    "unshare": (272, (L(-1),)),
    "setns": (308, (L(-1), L(0))),
    "keyctl": (250, (L(-1), L(0), L(0), L(0), L(0))),
    "add_key": (248, (BAD, BAD, BAD, L(0), L(0))),
    "request_key": (249, (BAD, BAD, BAD, L(0))),
    "bpf": (321, (L(-1), BAD, L(0))),
    "perf_event_open": (298, (BAD, L(0), L(-1), L(-1), L(0))),
    "userfaultfd": (323, (L(-1),)),
    "io_uring_setup": (425, (L(0), BAD)),
    "io_uring_enter": (426, (L(-1), L(0), L(0), L(0), BAD, L(0))),
    "io_uring_register": (427, (L(-1), L(-1), BAD, L(0))),
    "kexec_load": (246, (L(0), L(-1), BAD, L(-1))),
    "kexec_file_load": (320, (L(-1), L(-1), L(0), BAD, L(-1))),
    "init_module": (175, (BAD, L(0), BAD)),
    "finit_module": (313, (L(-1), BAD, L(-1))),
    "delete_module": (176, (BAD, L(0))),
    "ioctl_TIOCSTI": (16, (L(-1), L(0x5412), BAD)),
    "ioctl_TIOCSTI_high_bits": (16, (L(-1), L(0x100005412), BAD)),
    "ioctl_TIOCLINUX": (16, (L(-1), L(0x541C), BAD)),
    "ioctl_TIOCEXCL": (16, (L(-1), L(0x540C), BAD)),
    "ioctl_TIOCSETD": (16, (L(-1), L(0x5423), BAD)),
    "clone_newuser": (56, (L(0x10000000 | 0x00000200 | 0x00010000), L(0), L(0), L(0), L(0))),
    "clone3": (435, (BAD, L(0))),
}
REQUIRED = {
    "fcntl": (72, (L(-1), L(1))),  # F_GETFD on a bad fd: EBADF
    "getrlimit": (97, (L(7), ctypes.byref((ctypes.c_ulong * 2)()))),  # RLIMIT_NOFILE: 0
    "prlimit64": (302, (L(0), L(7), L(0), ctypes.byref((ctypes.c_ulong * 2)()))),
    "pread64": (17, (L(-1), BAD, L(1), L(0))),
}


def call(number, args):
    ctypes.set_errno(0)
    result = libc.syscall(L(number), *args)
    return {"result": result, "errno": ctypes.get_errno() if result == -1 else 0}


out = {"denied": {n: call(*spec) for n, spec in CALLS.items()},
       "required": {n: call(*spec) for n, spec in REQUIRED.items()}}
try:  # inet sockets work on the sandbox's loopback; packet sockets never do
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.close()
    out["denied"]["socket_packet"] = {"result": 0, "errno": 0}
except OSError as exc:
    out["denied"]["socket_packet"] = {"result": -1, "errno": exc.errno}
print(json.dumps(out))
