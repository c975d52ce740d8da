"""Stage 2's input and output, defined once: what the planner and launcher send to
``sbx-stage2`` (sandbox/stage2.c) and what it answers on the status pipe.

Config (a memfd; every integer little-endian)::

    b"SBX2", u32 version (1), then records until EOF: u16 tag, u32 payload length, payload

    1  STATUS_FD      i32                                  required, first
    2  CWD            path bytes                           optional
    3  ARGV           NUL-terminated strings (at least one) required
    4  ENV            NUL-terminated "NAME=VALUE" strings  optional
    5  SEARCH_PATH    bytes, ':'-separated                 optional
    6  RLIMIT         i32 resource, i64 soft, i64 hard     repeatable; -1 is infinity
    7  LANDLOCK       u32 abi, u64 fs, u64 net, u64 scoped, u64 file_rights
    8  LANDLOCK_RULE  u64 access, u8 optional, path bytes  repeatable, after LANDLOCK
    9  SECCOMP_FD     i32                                  optional
    10 EXE_FD         i32                                  optional
    11 PROXY_LISTEN   i32 channel fd, u16 port             optional: the network bridge's
                      listener on 127.0.0.1:port goes to the front end over the channel
    12 SUPERVISE      empty                                optional: fork a supervisor that
                      kills what the command leaves behind (tiers without a pid namespace)
    0x7F FAULT        step name                            test builds only

Status frames: 1 byte kind, u32 payload length, payload. ``S`` (started, empty), ``N``
(``layer\\0message``), ``E`` (``layer\\0detail\\0errno\\0exit``, numbers in decimal).

Imported on every tool call, so only cheap modules: no ``struct``, no ``typing``, no
dataclasses. Strings travel as ``os.fsencode`` makes them (surrogateescape), so a path
that is not UTF-8 arrives as the same bytes and comes back as the same str.
"""

from __future__ import annotations

import os
from collections import namedtuple

EXIT_SETUP_FAILED = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

RLIMIT_NUMBERS = {"RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_DATA": 2, "RLIMIT_STACK": 3, "RLIMIT_CORE": 4,
                  "RLIMIT_NPROC": 6, "RLIMIT_NOFILE": 7, "RLIMIT_MEMLOCK": 8, "RLIMIT_AS": 9}

MAGIC = b"SBX2"
VERSION = 1

TAG_STATUS_FD = 1
TAG_CWD = 2
TAG_ARGV = 3
TAG_ENV = 4
TAG_SEARCH_PATH = 5
TAG_RLIMIT = 6
TAG_LANDLOCK = 7
TAG_LANDLOCK_RULE = 8
TAG_SECCOMP_FD = 9
TAG_EXE_FD = 10
TAG_PROXY_LISTEN = 11
TAG_SUPERVISE = 12
TAG_FAULT = 0x7F

DEFAULT_SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
BPF_MAXINSNS = 4096  # the kernel's limit per program
_SOCK_FILTER_SIZE = 8

Stage2Config = namedtuple(
    "Stage2Config",
    "status_fd argv env cwd search_path rlimits landlock seccomp_fd exe_fd proxy_listen supervise fault",
    defaults=((), None, DEFAULT_SEARCH_PATH, (), None, None, None, None, False, None),
)
Stage2Config.__doc__ = """Everything stage 2 needs. ``env``: (name, value) pairs; ``rlimits``:
(resource number, soft, hard) with -1 for infinity; ``landlock``: a LandlockSpec or None;
``proxy_listen``: (channel fd, port) for the network bridge, or None; ``supervise``: stage 2
stays as the command's parent and kills what it leaves behind (no pid namespace);
``fault``: a step name that a -DSBX_STAGE2_FAULTS build fails with EPERM (tests only)."""

LandlockSpec = namedtuple("LandlockSpec", "abi fs net scoped file_rights rules", defaults=((),))
LandlockSpec.__doc__ = """The ruleset: the minimum kernel ABI, the handled fs/net rights and
scopes, the rights allowed on a rule for a file, and rules as (path, access, optional);
a missing optional path is skipped."""

StatusRecord = namedtuple("StatusRecord", "kind layer detail errno exit")
StatusRecord.__doc__ = """One status frame. ``kind`` is "started", "note" or "error"; a note's
message is in ``detail``; ``errno`` is 0 and ``exit`` None where a frame has none."""

_KINDS = {b"S": "started", b"N": "note", b"E": "error"}
_INT32_MAX = (1 << 31) - 1
_INT64_MAX = (1 << 63) - 1
_UINT32_MAX = (1 << 32) - 1
_UINT64_MAX = (1 << 64) - 1


def _int(value, field: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{field} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{field} is {value}, outside [{low}, {high}]")
    return value


def _fd(value, field: str) -> bytes:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{field} must be an int file descriptor, not {type(value).__name__}")
    if not 0 <= value <= _INT32_MAX:
        raise ValueError(f"{field} is {value}, not a file descriptor number")
    return value.to_bytes(4, "little")


def _bytes(value, field: str, *, empty: bool = True) -> bytes:
    try:
        data = os.fsencode(value)
    except (TypeError, UnicodeError) as exc:
        raise ValueError(f"{field} cannot be encoded: {exc}") from None
    if b"\0" in data:
        raise ValueError(f"{field} contains a NUL byte")
    if not data and not empty:
        raise ValueError(f"{field} is empty")
    return data


def _record(tag: int, payload: bytes) -> bytes:
    if len(payload) > _UINT32_MAX:
        raise ValueError(f"config record {tag} is larger than 4 GiB")
    return tag.to_bytes(2, "little") + len(payload).to_bytes(4, "little") + payload


def _strings(items: list[bytes]) -> bytes:
    return b"".join(item + b"\0" for item in items)


def _landlock_records(spec, field: str) -> list[bytes]:
    if not isinstance(spec, LandlockSpec):
        raise ValueError(f"{field} must be a LandlockSpec, not {type(spec).__name__}")
    header = (_int(spec.abi, f"{field}.abi", 0, _UINT32_MAX).to_bytes(4, "little")
              + _int(spec.fs, f"{field}.fs", 0, _UINT64_MAX).to_bytes(8, "little")
              + _int(spec.net, f"{field}.net", 0, _UINT64_MAX).to_bytes(8, "little")
              + _int(spec.scoped, f"{field}.scoped", 0, _UINT64_MAX).to_bytes(8, "little")
              + _int(spec.file_rights, f"{field}.file_rights", 0, _UINT64_MAX).to_bytes(8, "little"))
    records = [_record(TAG_LANDLOCK, header)]
    for i, rule in enumerate(spec.rules):
        where = f"{field}.rules[{i}]"
        try:
            path, access, optional = rule
        except (TypeError, ValueError):
            raise ValueError(f"{where} must be a (path, access, optional) triple") from None
        raw = _bytes(path, f"{where}.path", empty=False)
        if not raw.startswith(b"/"):
            raise ValueError(f"{where}.path is not absolute: {path!r}")
        if optional not in (True, False):  # 0 and 1 compare equal to False and True
            raise ValueError(f"{where}.optional must be a bool, not {optional!r}")
        payload = (_int(access, f"{where}.access", 0, _UINT64_MAX).to_bytes(8, "little")
                   + (b"\1" if optional else b"\0") + raw)
        records.append(_record(TAG_LANDLOCK_RULE, payload))
    return records


def encode_config(cfg: Stage2Config) -> bytes:
    """The config bytes for ``cfg``; ValueError naming the field for anything stage 2
    could not represent."""
    out = [MAGIC, VERSION.to_bytes(4, "little"), _record(TAG_STATUS_FD, _fd(cfg.status_fd, "status_fd"))]

    if cfg.cwd is not None:
        out.append(_record(TAG_CWD, _bytes(cfg.cwd, "cwd", empty=False)))

    if isinstance(cfg.argv, (str, bytes)) or not cfg.argv:
        raise ValueError("argv must be a non-empty sequence of strings")
    out.append(_record(TAG_ARGV, _strings([_bytes(a, f"argv[{i}]") for i, a in enumerate(cfg.argv)])))

    env = cfg.env.items() if hasattr(cfg.env, "items") else cfg.env
    entries = []
    for i, pair in enumerate(env):
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise ValueError(f"env[{i}] must be a (name, value) pair") from None
        raw_name = _bytes(name, f"env[{i}] name", empty=False)
        if b"=" in raw_name:
            raise ValueError(f"env[{i}] name contains '=': {name!r}")
        entries.append(raw_name + b"=" + _bytes(value, f"env[{i}] value ({name!r})"))
    if entries:
        out.append(_record(TAG_ENV, _strings(entries)))

    if cfg.search_path is not None:
        out.append(_record(TAG_SEARCH_PATH, _bytes(cfg.search_path, "search_path")))

    for i, limit in enumerate(cfg.rlimits):
        try:
            resource, soft, hard = limit
        except (TypeError, ValueError):
            raise ValueError(f"rlimits[{i}] must be a (resource, soft, hard) triple") from None
        payload = (_int(resource, f"rlimits[{i}] resource", 0, _INT32_MAX).to_bytes(4, "little")
                   + _int(soft, f"rlimits[{i}] soft", -1, _INT64_MAX).to_bytes(8, "little", signed=True)
                   + _int(hard, f"rlimits[{i}] hard", -1, _INT64_MAX).to_bytes(8, "little", signed=True))
        out.append(_record(TAG_RLIMIT, payload))

    if cfg.landlock is not None:
        out += _landlock_records(cfg.landlock, "landlock")
    if cfg.seccomp_fd is not None:
        out.append(_record(TAG_SECCOMP_FD, _fd(cfg.seccomp_fd, "seccomp_fd")))
    if cfg.exe_fd is not None:
        out.append(_record(TAG_EXE_FD, _fd(cfg.exe_fd, "exe_fd")))
    if cfg.proxy_listen is not None:
        try:
            channel, port = cfg.proxy_listen
        except (TypeError, ValueError):
            raise ValueError("proxy_listen must be a (channel fd, port) pair") from None
        out.append(_record(TAG_PROXY_LISTEN, _fd(channel, "proxy_listen channel")
                           + _int(port, "proxy_listen port", 1, 65535).to_bytes(2, "little")))
    if cfg.supervise not in (True, False):
        raise ValueError(f"supervise must be a bool, not {cfg.supervise!r}")
    if cfg.supervise:
        out.append(_record(TAG_SUPERVISE, b""))
    if cfg.fault is not None:
        out.append(_record(TAG_FAULT, _bytes(cfg.fault, "fault", empty=False)))
    return b"".join(out)


def frame_programs(programs: list[bytes]) -> bytes:
    """The seccomp descriptor's contents: each BPF program (raw ``struct sock_filter``
    array, native byte order) behind its u32 little-endian length, loaded in this order."""
    if not programs:
        raise ValueError("programs is empty: stage 2 would report that no BPF program arrived")
    out = []
    for i, program in enumerate(programs):
        try:
            data = bytes(program)
        except TypeError:
            raise ValueError(f"programs[{i}] is not bytes") from None
        if not data or len(data) % _SOCK_FILTER_SIZE:
            raise ValueError(f"programs[{i}] has {len(data)} bytes, not a positive multiple of {_SOCK_FILTER_SIZE}")
        if len(data) // _SOCK_FILTER_SIZE > BPF_MAXINSNS:
            raise ValueError(f"programs[{i}] has {len(data) // _SOCK_FILTER_SIZE} instructions, above {BPF_MAXINSNS}")
        out.append(len(data).to_bytes(4, "little") + data)
    return b"".join(out)


def _decimal(raw: bytes) -> int:
    if not raw or not raw.lstrip(b"-").isdigit():
        raise ValueError(raw)
    return int(raw)


def parse_status(data: bytes) -> list[StatusRecord]:
    """The records in ``data``; a truncated or malformed tail is dropped, never raised."""
    records, offset = [], 0
    while offset + 5 <= len(data):
        kind = _KINDS.get(bytes(data[offset:offset + 1]))
        size = int.from_bytes(data[offset + 1:offset + 5], "little")
        payload = bytes(data[offset + 5:offset + 5 + size])
        if kind is None or len(payload) != size:
            break
        fields = payload.split(b"\0")
        try:
            if kind == "started":
                if payload:
                    break
                record = StatusRecord(kind, "", "", 0, None)
            elif kind == "note":
                if len(fields) != 2:
                    break
                record = StatusRecord(kind, os.fsdecode(fields[0]), os.fsdecode(fields[1]), 0, None)
            else:
                if len(fields) != 4:
                    break
                record = StatusRecord(kind, os.fsdecode(fields[0]), os.fsdecode(fields[1]),
                                      _decimal(fields[2]), _decimal(fields[3]))
        except ValueError:
            break
        records.append(record)
        offset += 5 + size
    return records
