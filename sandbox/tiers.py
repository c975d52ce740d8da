"""Enforcement tiers, ordered weakest to strongest."""

from __future__ import annotations

import enum

from .errors import UsageError


class Tier(enum.IntEnum):
    EnvironmentOnly = 0
    KernelNoNamespaces = 1
    KernelSeccompOnly = 2
    KernelFull = 3

    def __str__(self) -> str:
        return self.name

    @property
    def uses_namespaces(self) -> bool:
        """bwrap's namespaces and mounts: the two tiers above KernelNoNamespaces."""
        return self >= Tier.KernelSeccompOnly

    @property
    def uses_bwrap(self) -> bool:
        return self.uses_namespaces

    @property
    def uses_seccomp(self) -> bool:
        return self >= Tier.KernelNoNamespaces

    @property
    def uses_landlock(self) -> bool:
        # Not monotonic: KernelNoNamespaces has Landlock (its only filesystem boundary),
        # KernelSeccompOnly has namespaces instead.
        return self in (Tier.KernelNoNamespaces, Tier.KernelFull)

    @classmethod
    def parse(cls, name: str) -> Tier:
        for tier in cls:
            if tier.name.lower() == name.strip().lower():
                return tier
        names = ", ".join(t.name for t in cls)
        raise UsageError(f"unknown tier {name!r}", f"use one of: {names}")


# What KernelNoNamespaces does not give, said the same way by doctor, --dry-run and the README.
NO_NAMESPACES_LIMITS: tuple[str, ...] = (
    "no IPC namespace: SysV IPC and POSIX message queues would be the host's, so seccomp refuses them; "
    "calls that act on another process (prlimit, setpriority, ioprio_set, sched_set*) work on the command's "
    "own process only",
    "no pid namespace: the command sees the host's processes, their command lines and the host's sockets "
    "in /proc; stage 2's supervisor (a child subreaper outside every layer) kills whatever the command "
    "leaves behind when it exits or times out, setsid and double forks included, unless a command below "
    "Landlock ABI 6 kills the supervisor first",
    "no mount namespace: the profile's view is expressed as Landlock grants; hidden paths are refused by "
    "Landlock, not masked (they exist, and stat and path walks still see their names, sizes and times); "
    "Landlock cannot confine metadata changes, so seccomp refuses chmod, chown and xattr changes, "
    "times other than now, file-flag ioctls, leases and inotify and dnotify watches, everywhere",
    "no network namespace: without --share-net, seccomp refuses socket() for every family (AF_UNIX too: "
    "Landlock does not mediate connecting to a host daemon's unix socket) and Landlock (ABI 4+) denies TCP "
    "bind and connect",
    "no tmpfs: /tmp and the profile's other tmpfs entries become one private directory on the host's /tmp "
    "(TMPDIR), created and removed by sbx, without a size limit; /dev/shm is not available",
    "no uid switch: the command runs as the caller (a root caller keeps uid 0 with every capability dropped, "
    "and the profile's nproc limit does not bind uid 0)",
)
NO_SIGNAL_SCOPE = ("Landlock ABI below 6: signals to the caller's other processes (same uid) and abstract unix "
                   "sockets outside the sandbox cannot be blocked")
