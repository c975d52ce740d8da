"""Landlock access rights: the bits of each ABI and the sets our grants use.

The ``landlock`` package covers filesystem rights up to ABI 5; network rules (ABI 4) and
scopes (ABI 6) are ours. Values follow include/uapi/linux/landlock.h; a test checks the
filesystem bits against the package's ``FSAccess``. Pure data: no syscalls here.
"""

from __future__ import annotations

# name -> (bit, first ABI that handles it)
FS_RIGHTS: dict[str, tuple[int, int]] = {
    "execute": (1 << 0, 1), "write_file": (1 << 1, 1), "read_file": (1 << 2, 1),
    "read_dir": (1 << 3, 1), "remove_dir": (1 << 4, 1), "remove_file": (1 << 5, 1),
    "make_char": (1 << 6, 1), "make_dir": (1 << 7, 1), "make_reg": (1 << 8, 1),
    "make_sock": (1 << 9, 1), "make_fifo": (1 << 10, 1), "make_block": (1 << 11, 1),
    "make_sym": (1 << 12, 1), "refer": (1 << 13, 2), "truncate": (1 << 14, 3),
    "ioctl_dev": (1 << 15, 5),
}
NET_RIGHTS: dict[str, tuple[int, int]] = {"bind_tcp": (1 << 0, 4), "connect_tcp": (1 << 1, 4)}
SCOPES: dict[str, tuple[int, int]] = {"abstract_unix_socket": (1 << 0, 6), "signal": (1 << 1, 6)}

# Rights that may appear on a rule for a file rather than a directory.
FILE_ONLY_NAMES = ("execute", "write_file", "read_file", "truncate", "ioctl_dev")


def mask(table: dict[str, tuple[int, int]], names, abi: int) -> int:
    """The bits of ``names`` that ABI ``abi`` knows."""
    return sum(table[n][0] for n in names if table[n][1] <= abi)


def handled_fs(abi: int) -> int:
    return mask(FS_RIGHTS, FS_RIGHTS, abi)


def file_rights(abi: int) -> int:
    return mask(FS_RIGHTS, FILE_ONLY_NAMES, abi)


# The grant kinds the planner hands out, by name.
GRANT_NAMES: dict[str, tuple[str, ...]] = {
    "read": ("execute", "read_file", "read_dir"),
    "read-noexec": ("read_file", "read_dir"),
    "read-write": tuple(FS_RIGHTS),
    "device": ("read_file", "write_file", "read_dir", "ioctl_dev", "truncate"),
    "list": ("read_dir",),
}


def grant_mask(kind: str, abi: int) -> int:
    return mask(FS_RIGHTS, GRANT_NAMES[kind], abi)


def names(table: dict[str, tuple[int, int]], bits: int) -> list[str]:
    return [n for n, (bit, _) in table.items() if bits & bit]


def missing_at(abi: int) -> list[str]:
    """Rights and scopes sbx would use that this ABI does not have (for reports)."""
    missing = []
    for table, label in ((FS_RIGHTS, "fs"), (NET_RIGHTS, "net"), (SCOPES, "scope")):
        missing += [f"{label}:{n} (ABI {need})" for n, (_, need) in table.items() if need > abi]
    return missing
