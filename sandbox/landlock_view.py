"""The filesystem view as Landlock grants alone, for KernelNoNamespaces (no mount namespace).

Pure: the planner's ``Mount`` entries and directory listings gathered by ``hostview`` go in,
Landlock rules come out. With mounts, a deeper entry covers a shallower one (a ``hide`` over
``/``, a read-only bind inside the workdir). Landlock only adds rights: a rule on ``/``
grants everything beneath it, hidden paths included. So a grant whose subtree holds a deeper
entry with fewer rights is not made on its own path: it is made on each sibling along the
way down to that entry (the complement), which needs the listings of those directories.

- ``ro-bind``/``bind``/``proc`` entries grant what they grant at KernelFull;
- ``hide-dir``/``hide-file``, ``tmpfs`` and ``dev`` grant nothing from the host;
- the tmpfs entries become one private directory (read-write), named by ``PRIVATE_TMP``
  until launch creates it; ``/dev`` becomes a few character devices: read-write on
  /dev/null, /dev/zero and /dev/full, read on /dev/urandom and /dev/random;
- ``symlink`` and ``data`` entries need no grant (links are followed to granted targets);
- a listed entry that is a symlink is never granted (stage 2 opens rule paths following
  links: a link to a hidden path would grant the hidden path); nor is a socket, FIFO or
  device outside /dev; a directory that could not be listed gets nothing (fail closed).
"""

from __future__ import annotations

import os

from . import landlock_rights as ll

PRIVATE_TMP = "<private temp dir>"  # launch.prepare puts the created directory's path here
DEVICES_RW = ("/dev/null", "/dev/zero", "/dev/full")
DEVICES_RO = ("/dev/urandom", "/dev/random")
NO_GRANT_OPS = ("hide-dir", "hide-file", "tmpfs", "dev")


def _under(path: str, root: str) -> bool:
    return root == "/" and path != "/" or path.startswith(root.rstrip("/") + "/")


def dirs_to_list(paths) -> list[str]:
    """Every proper ancestor of ``paths``: the directories a complement may need listed."""
    found: dict[str, None] = {}
    for path in paths:
        path = os.path.normpath("/" + str(path).lstrip("/"))
        while path != "/":
            path = os.path.dirname(path)
            found[path] = None
    return list(found)


def layered(mounts, abi: int) -> list[tuple[str, int, bool]]:
    """(path, rights, optional) per view entry, the last entry at a path winning as the last
    mount does; 0 rights for entries that grant nothing from the host."""
    entries: dict[str, tuple[int, bool]] = {}
    for m in mounts:
        if m.op in NO_GRANT_OPS:
            entries[m.path] = (0, False)
        elif m.op in ("ro-bind", "bind", "proc") and m.grant:
            entries[m.path] = (ll.grant_mask(m.grant, abi), bool(m.optional))
    return [(path, bits, optional) for path, (bits, optional) in entries.items()]


def complement(root: str, bits: int, carve: list[str], listings: dict) -> list[tuple[str, int, bool]]:
    """Rules granting ``bits`` on ``root``'s subtree except the subtrees at ``carve``."""
    if root in carve:
        return []
    if not any(_under(c, root) for c in carve):
        return [(root, bits, True)]
    rules: list[tuple[str, int, bool]] = []
    for name, kind in listings.get(root, ()):
        if kind not in ("dir", "file"):
            continue
        rules += complement(os.path.join(root, name), bits, carve, listings)
    return rules


def rules(mounts, abi: int, listings: dict, private_tmp: bool, devices: bool) -> list[tuple[str, int, bool]]:
    """The Landlock rules that express ``mounts`` without mounting anything."""
    entries = layered(mounts, abi)
    out: list[tuple[str, int, bool]] = []
    for path, bits, optional in entries:
        if not bits:
            continue
        # Deeper entries that do not have every right of this one are cut out of its grant.
        carve = [p for p, b, _ in entries if _under(p, path) and bits & ~b]
        if carve:
            out += complement(path, bits, carve, listings)
        else:
            out.append((path, bits, optional))
    if devices:
        out += [(d, ll.grant_mask("device", abi), True) for d in DEVICES_RW]
        out += [(d, ll.grant_mask("read-noexec", abi), True) for d in DEVICES_RO]
    if private_tmp:
        out.append((PRIVATE_TMP, ll.grant_mask("read-write", abi), False))
    return out
