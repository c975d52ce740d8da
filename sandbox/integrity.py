"""What a sandboxed command must never be able to write: the host state sbx trusts later.

A later run reads sbx's package and interpreter, its profiles, its per-user cache and the
bwrap binary. If a writable bind overlapped any of them, a command could change what the
next run enforces or run its own code on the host. ``protected_paths`` names them; the
planner refuses any writable workdir or bind that contains one of them, equals one, or
lies inside one (compared by device and inode along the whole ancestry, so a symlink or
a second mount of the same directory does not get past the check).
"""

from __future__ import annotations

import os
import sys

from . import cache
from .hostview import Protected, protect

# Never writable inside a sandbox: these directories and everything beneath them...
SYSTEM_TREES = ("/usr", "/etc", "/boot", "/proc", "/sys", "/dev", "/run", "/root", "/opt",
                "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/snap", "/nix",
                "/var/lib", "/var/cache", "/var/log", "/var/spool", "/var/mail", "/var/backups", "/var/opt",
                "/var/local", "/var/run", "/var/lock")
# ...and these directories themselves (what lies beneath, a project under /home, is fine).
SYSTEM_EXACT = ("/", "/home", "/tmp", "/var", "/var/tmp", "/mnt", "/media", "/srv")


def installation_paths() -> list[tuple[str, str]]:
    """sbx's own code: the package, the directory it was imported from (a site-packages
    or the checkout), and the interpreter's prefixes (a venv's included)."""
    package = os.path.dirname(os.path.realpath(__file__))
    found = [("sbx's package", package), ("the directory sbx is imported from", os.path.dirname(package))]
    for label, prefix in (("the Python environment running sbx", sys.prefix),
                          ("the Python installation running sbx", sys.base_prefix)):
        found.append((label, prefix))
    found.append(("the Python interpreter running sbx", sys.executable))
    source = installed_from()
    if source:
        found.append(("the checkout sbx was installed from (its next install runs its code)", source))
    return found


def installed_from() -> str | None:
    """The local directory pip installed this copy of sbx from (PEP 610's direct_url.json),
    e.g. the checkout that scripts/bootstrap.sh reinstalls from when its sources change."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    try:
        infos = [e for e in os.listdir(root) if e.startswith("sbx-") and e.endswith(".dist-info")]
    except OSError:
        return None
    for info in infos:
        try:
            with open(os.path.join(root, info, "direct_url.json"), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        url = _json_string(text, "url")
        if url and url.startswith("file://"):
            return _percent_decode(url[len("file://"):]) or None
    return None


def protected_paths(profile_files: tuple[str, ...] = (), bwrap: str | None = None) -> tuple[Protected, ...]:
    """Every host path a later run trusts; see the module docstring."""
    from .profile import profile_dirs

    entries = installation_paths()
    entries += [("a directory sbx loads profiles from", d) for d in profile_dirs()]
    entries += [("the profile this run loads", f) for f in profile_files]
    entries += [("sbx's cache", d) for d in cache.every_candidate()]
    if bwrap:
        entries.append(("the bwrap binary sbx runs", bwrap))
    entries += [("a system directory", d) for d in SYSTEM_TREES]
    exact = [("a system directory", d) for d in SYSTEM_EXACT]
    seen: dict[str, Protected] = {}
    for (label, path), tree in [*((e, True) for e in entries), *((e, False) for e in exact)]:
        if path and os.path.isabs(path):
            entry = protect(label, path, tree)
            seen.setdefault(entry.path, entry)
    return tuple(seen.values())


def overlap(chain: tuple, protected: Protected) -> str | None:
    """How a writable path with identity ``chain`` overlaps ``protected``, or None.

    "contains": the writable path is the protected one or one of its ancestors (so the
    command could replace or rename what a later run reads); "inside": it lies beneath it.
    """
    if not chain:
        return None
    if chain[0] in protected.chain:
        return "contains"
    if protected.tree and protected.exists and protected.chain and protected.chain[0] in chain:
        return "inside"
    return None


def overlaps(chain: tuple, protected: tuple[Protected, ...]) -> list[tuple[str, Protected]]:
    """Every protected path the writable path with identity ``chain`` overlaps, and how."""
    found = []
    for entry in protected:
        how = overlap(chain, entry)
        if how:
            found.append((how, entry))
    return found



def isolated_python(python: str, import_root: str, code: str) -> list[str]:
    """argv that runs ``code`` in ``python`` isolated from the cwd and the environment
    (``-I``: no cwd or script directory on sys.path, no PYTHON* variables, no user site),
    importing sbx from ``import_root`` only. Every Python process sbx starts on the host
    goes through here, so a module planted in the caller's directory is never imported."""
    boot = f"import sys; sys.path.insert(0, {import_root!r})\n"
    return [python, "-I", "-c", boot + code]


def import_root() -> str:
    """The directory this copy of sbx is imported from."""
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


CLI_MAIN = "from sandbox.cli import entry; entry()"


_JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _json_string(text: str, key: str) -> str | None:
    """The string value of ``key`` in a small flat JSON object, without importing json
    (and the re module it pulls in) on every tool call's start-up."""
    at = text.find(f'"{key}"')
    if at < 0:
        return None
    at = text.find('"', text.find(":", at) + 1)
    if at < 0:
        return None
    out, i = [], at + 1
    while i < len(text):
        char = text[i]
        if char == '"':
            return "".join(out)
        if char == "\\":
            code = text[i + 1:i + 2]
            if code == "u":
                try:
                    out.append(chr(int(text[i + 2:i + 6], 16)))
                except ValueError:
                    return None
                i += 6
                continue
            if code not in _JSON_ESCAPES:
                return None
            out.append(_JSON_ESCAPES[code])
            i += 2
            continue
        out.append(char)
        i += 1
    return None


def _percent_decode(text: str) -> str:
    raw, i = bytearray(), 0
    while i < len(text):
        if text[i] == "%" and i + 2 < len(text) and all(c in "0123456789abcdefABCDEF" for c in text[i + 1:i + 3]):
            raw.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            raw += text[i].encode("utf-8", "surrogateescape")
            i += 1
    return os.fsdecode(bytes(raw))
