"""Property-based fuzzing of sbx's error contract: every input ends in a clean sbx error.

The CLI either succeeds or prints exactly ``sbx: error: CODE: cause`` and ``sbx: remedy: ...``
and returns 125; the library returns, or raises a ``SandboxError`` (whose argument checks are
also ``TypeError``/``ValueError``). Any other exception escaping sbx is a bug, so these tests
let it propagate. Three groups, each on a bounded budget: the CLI parser and ``main`` (always
``--dry-run``: nothing is launched), the profile loader, and the ``Sandbox`` arguments; then
the exact inputs that were once tracebacks.

Paths that only exist while the module runs (the workdir, a symlink, a non-UTF-8 directory)
appear in the strategies as ``Ref("name")`` and are resolved per example, so a failing
example prints, and can be pinned with ``@example``, independently of the scratch directory.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from sandbox import Sandbox, Tier
from sandbox.cli import Arguments, main, parse
from sandbox.errors import ArgumentTypeError, ArgumentValueError, ProfileError, SandboxError, UsageError
from sandbox.profile import SCHEMA, Profile, list_profiles, load_profile

TRACEBACK = "Traceback (most recent call last)"
ERROR_LINE = re.compile(r"sbx: error: [a-z][a-z0-9-]*: .+")
REMEDY_LINE = re.compile(r"sbx: remedy: .+")
WARNING_PREFIX = "sbx: warning: "


# Hypothesis keeps caches (its Unicode tables, the constants its pytest plugin collects from the
# test modules while collecting) in .hypothesis/ of the directory pytest started in, the checkout:
# keep them in /tmp instead, for this process, removed when it exits. Set at import, since the
# plugin writes during collection, before any fixture runs.
HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="sbx-fuzz-hypothesis-", dir="/tmp")
set_hypothesis_home_dir(HYPOTHESIS_HOME)
atexit.register(shutil.rmtree, HYPOTHESIS_HOME, ignore_errors=True)


def budget(examples: int) -> settings:
    """A bounded run: no deadline (the first examples pay for host probes), no example
    database (nothing written next to the checkout or the scratch directory)."""
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# --------------------------------------------------------------------------------------
# Scratch paths, created once per module under /tmp


class Ref:
    """A path (or other value) that exists only while the module runs; see ``Scratch``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Ref({self.name!r})"


class Scratch:
    """Everything the fuzzers point at, below one ``mkdtemp`` directory in /tmp.

    The workdir is ``root/work`` (the tests run with it as the current directory); sbx's
    cache is redirected to ``root/cache`` for the module, so fuzzed profiles do not fill the
    user's cache; profile files live in ``root/profiles``, outside the workdir (sbx refuses
    a workdir that holds the profile it loads).
    """

    def __init__(self) -> None:
        root = tempfile.mkdtemp(prefix="sbx-fuzz-", dir="/tmp")
        os.chmod(root, 0o755)
        self.root = root
        self.good = os.path.join(root, "work")
        self.profiles = os.path.join(root, "profiles")
        self.cache = os.path.join(root, "cache")
        for directory in (self.good, os.path.join(self.good, "sub"), self.profiles):
            os.mkdir(directory)
            os.chmod(directory, 0o755)
        os.symlink("/usr/share", os.path.join(root, "link"))
        os.symlink(self.good, os.path.join(root, "link-to-work"))
        os.symlink(os.path.join(root, "nowhere"), os.path.join(root, "dangling"))
        with open(os.path.join(root, "file.txt"), "w") as f:
            f.write("not a directory\n")
        raw_root = os.fsencode(root)
        os.mkdir(raw_root + b"/dir-\xff\xfe")  # a name that is not UTF-8
        with open(os.path.join(self.profiles, "ok.toml"), "w") as f:
            f.write('extends = "strict"\ndescription = "fuzz"\n')
        with open(os.path.join(self.profiles, "broken.toml"), "w") as f:
            f.write('extends = "strict"\n[seccomp\n')
        with open("/usr/bin/true", "rb") as f:
            true_sha = hashlib.sha256(f.read()).hexdigest()
        self.refs: dict[str, object] = {
            "good": self.good,
            "good-bytes": os.fsencode(self.good),
            "good-pathlib": Path(self.good),
            "sub": os.path.join(self.good, "sub"),
            "dotdot": os.path.join(self.good, "sub", ".."),
            "dotdot-out": os.path.join(self.good, "..", "..", "..", "etc"),
            "root": root,  # holds sbx's cache: never writable inside
            "cache": self.cache,
            "link": os.path.join(root, "link"),
            "link-to-work": os.path.join(root, "link-to-work"),
            "dangling": os.path.join(root, "dangling"),
            "file": os.path.join(root, "file.txt"),
            "missing": os.path.join(root, "missing", "deeper"),
            "nonutf8": os.fsdecode(raw_root + b"/dir-\xff\xfe"),
            "nonutf8-bytes": raw_root + b"/dir-\xff\xfe",
            "nonutf8-missing": os.fsdecode(raw_root + b"/miss-\xc3"),
            "long-name": os.path.join(self.good, "n" * 300),
            "long-path": self.good + "/d" * 2100,
            "profile-ok": os.path.join(self.profiles, "ok.toml"),
            "profile-broken": os.path.join(self.profiles, "broken.toml"),
            "closed-fd": _closed_fd(),
            "true-sha": true_sha,
        }

    def resolve(self, value: object) -> object:
        """``value`` with every ``Ref`` replaced, inside lists, tuples, sets and dicts too."""
        if isinstance(value, Ref):
            return self.refs[value.name]
        if type(value) in (list, tuple, set, frozenset):  # exactly: a Profile is a namedtuple, left alone
            return type(value)(self.resolve(v) for v in value)
        if type(value) is dict:
            return {self.resolve(k): self.resolve(v) for k, v in value.items()}
        return value

    def text(self, value: object) -> str:
        """A CLI token: a resolved ``Ref`` as text (bytes through ``os.fsdecode``)."""
        value = self.resolve(value)
        return os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)

    def remove(self) -> None:
        shutil.rmtree(os.fsencode(self.root), ignore_errors=True)


def _closed_fd() -> int:
    """A descriptor number that is not open in this process."""
    for number in range(700, 1000):
        try:
            fcntl.fcntl(number, fcntl.F_GETFD)
        except OSError:
            return number
    raise AssertionError("no closed descriptor number between 700 and 1000")


@pytest.fixture(scope="module")
def scratch():
    made = Scratch()
    previous = os.getcwd()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SBX_CACHE_DIR", made.cache)
        os.chdir(made.good)
        try:
            yield made
        finally:
            os.chdir(previous)
            made.remove()


@pytest.fixture(scope="module")
def valid_sandbox(scratch):
    """One valid sandbox for the per-call fuzzers: strict, the scratch workdir."""
    return Sandbox("strict", scratch.good)


@pytest.fixture(scope="module")
def thread_errors():
    """Exceptions raised in any thread while the module runs: an exception in one of sbx's
    own threads (its deadline watchdog, its unmount thread) escapes sbx just as much."""
    import threading

    seen: list[threading.ExceptHookArgs] = []
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        seen.append(args)
        previous(args)

    threading.excepthook = hook
    yield seen
    threading.excepthook = previous


# --------------------------------------------------------------------------------------
# Checks


def assert_sbx_error(exc: SandboxError) -> None:
    """A SandboxError carries a code, a message and a remedy, and renders as two labelled parts."""
    assert isinstance(exc.code, str) and exc.code, exc
    assert isinstance(exc.message, str) and exc.message, exc
    assert isinstance(exc.remedy, str) and exc.remedy, exc
    assert exc.render().startswith(f"sbx: error: {exc.code}: "), exc.render()
    assert "\nsbx: remedy: " in exc.render(), exc.render()


def sbx_call(function, *args, **kwargs):
    """Call into the library: its value, or None after a clean SandboxError. A TypeError or
    ValueError that is not a SandboxError (not sbx's own validation) fails the test; any
    other exception propagates and fails it with its traceback."""
    try:
        value = function(*args, **kwargs)
    except SandboxError as exc:
        assert_sbx_error(exc)
        event(f"{getattr(function, '__name__', '?')}: {exc.code}")  # --hypothesis-show-statistics shows how deep examples get
        return None
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{getattr(function, '__qualname__', function)} raised {type(exc).__name__}, which is "
                             f"not sbx's own validation (not a SandboxError): {exc}") from exc
    event(f"{getattr(function, '__name__', '?')}: returned")
    return value


def assert_cli_contract(status: int, out: str, err: str, allowed: tuple[int, ...] = (0, 125)) -> None:
    """The CLI's contract: 0, or exactly one error line and one remedy line with 125. A
    warning (a run below the profile's floor) may come first; it is printed before planning."""
    assert TRACEBACK not in out and TRACEBACK not in err, (out, err)
    assert status in allowed, (status, err)
    lines = [line for line in err.split("\n") if line and not line.startswith(WARNING_PREFIX)]
    if status == 0:
        assert lines == [], err
        return
    assert len(lines) == 2, f"expected an error line and a remedy line, got: {err!r}"
    assert ERROR_LINE.fullmatch(lines[0]), lines
    assert REMEDY_LINE.fullmatch(lines[1]), lines


def run_main(capfdbinary, argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` with its output captured as bytes, as a terminal takes it. Python's
    stdout under a UTF-8 locale other than C/POSIX (en_US.UTF-8, for one) is strict: sbx's
    main() makes it write an undecodable path as the bytes it is (surrogateescape), and
    stderr escape what it cannot encode. Once found: a UnicodeEncodeError there."""
    sys.stdout.reconfigure(errors="strict")
    sys.stderr.reconfigure(errors="strict")
    capfdbinary.readouterr()  # drop what an earlier example left
    status = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    captured = capfdbinary.readouterr()
    return status, captured.out.decode("utf-8", "surrogateescape"), captured.err.decode("utf-8", "surrogateescape")


def mostly(usual: st.SearchStrategy, unusual: st.SearchStrategy) -> st.SearchStrategy:
    """Usual values three times in four, so that most examples get past the first check."""
    return st.one_of(usual, usual, usual, unusual)


# --------------------------------------------------------------------------------------
# 1. The CLI parser and main

NO_NUL = st.characters(codec="utf-8", exclude_characters="\x00")  # what a command line can hold, as str
TEXT = st.text(NO_NUL, max_size=24)
RAW = st.binary(max_size=24).map(lambda b: os.fsdecode(b.replace(b"\0", b"")))  # what sys.argv holds for non-UTF-8
JUNK = st.one_of(TEXT, RAW)

RUN_FLAGS = ["--profile", "--workdir", "--ro-bind", "--bind", "--share-net", "--setenv", "--timeout", "--tier",
             "--allow-degraded", "--preserve-fd", "--exe-sha256", "--dry-run", "--verbose"]
OTHER_FLAGS = ["--json", "--output", "--help", "--version", "-h", "--", "-", "---", "--no-such-flag"]
COMMANDS = ["run", "doctor", "profiles", "verify", "list", "show"]

PATH_REFS = ["good", "good", "good", "sub", "dotdot", "dotdot-out", "root", "cache", "link", "link-to-work",
             "dangling", "file", "missing", "nonutf8", "nonutf8-missing", "long-name", "long-path"]
CLI_PATHS = mostly(
    st.sampled_from([Ref("good"), Ref("sub"), Ref("nonutf8"), "/usr/share", "sub", "/etc/hostname"]),
    st.one_of(st.sampled_from([Ref(name) for name in PATH_REFS]),
              st.sampled_from(["/", "//etc", "/usr", "/tmp", "/proc/self", "/dev/null", "/etc/shadow", ".", "..",
                               "./sub", "relative/missing", "~", "", " ", "/nonexistent-sbx-fuzz", "/tmp/../etc",
                               "/" + "x" * 5000, "/nonexistent-sbx-fuzz\nsbx: remedy: forged", "/tmp/a\rb",
                               "/tmp/\u2028"]),
              JUNK),
)
CLI_VALUES = {
    "--profile": mostly(st.sampled_from(["strict", "standard", Ref("profile-ok")]),
                        st.one_of(st.sampled_from(["Strict", "", "nonexistent", "strict.toml", "/nonexistent/p.toml",
                                                   "../p.toml", "/", "/etc/passwd", Ref("profile-broken"), Ref("good"),
                                                   Ref("file")]), JUNK)),
    "--workdir": CLI_PATHS,
    "--ro-bind": CLI_PATHS,
    "--bind": CLI_PATHS,
    "--setenv": mostly(st.one_of(st.sampled_from(["A=B", "A=", "A==B", "PATH=/nonexistent", "LANG=C", "\u00e9=\u00e8"]),
                                 st.builds("{}={}".format, TEXT.filter(lambda k: k and "=" not in k), TEXT)),
                       st.one_of(st.sampled_from(["=x", "noequals", "=", ""]), JUNK)),
    "--timeout": mostly(st.one_of(st.sampled_from(["30", "0.5", "1e300", "1e-3", "7"]),
                                  st.floats(min_value=1e-9, allow_infinity=False).map(str)),
                        st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e400", "1e-400", "1_0", " 5 ",
                                                   "", "abc", "0x10", "\u0661", "-0"]),
                                  st.floats().map(str), st.integers().map(str), JUNK)),
    "--tier": mostly(st.sampled_from([t.name for t in Tier] + ["kernelfull", "KERNELFULL", " KernelFull "]),
                     st.one_of(st.sampled_from(["Kernel", "", "2", "KernelFull\n"]), JUNK)),
    "--preserve-fd": mostly(st.sampled_from(["7", "3", "99", str(2 ** 31 - 1), Ref("closed-fd")]),
                            st.one_of(st.sampled_from(["0", "1", "2", "\u00b9", "\u0663", "-1", "+7", " 7", "0x7", "",
                                                       "99999999999", str(2 ** 31), str(2 ** 64), "9" * 400]),
                                      st.integers().map(str), JUNK)),
    "--exe-sha256": st.one_of(st.sampled_from(["", "0" * 64, "zz", Ref("true-sha")]), JUNK),
}
OTHER_VALUES = {"--json": JUNK, "--output": st.one_of(st.sampled_from(["/nonexistent-sbx-fuzz/record.md", ""]), JUNK)}


def cli_option(run_only: bool = False):
    """One generated option: ("flag", name), ("sep", name, value) or ("eq", name, value),
    or ("raw", token) for junk such as an unknown flag or a stray positional. ``run_only``:
    mostly ``sbx run``'s own options, for examples that should get past the parser."""
    values = CLI_VALUES if run_only else {**CLI_VALUES, **OTHER_VALUES}
    valued = [st.tuples(st.sampled_from(["sep", "eq"]), st.just(name), v) for name, v in values.items()]
    flags = st.tuples(st.just("flag"), st.sampled_from(RUN_FLAGS + (["--no-such-flag", "-h"] if run_only else OTHER_FLAGS)))
    commands = [c for c in COMMANDS if c not in ("verify", "doctor")] if run_only else COMMANDS
    raw = st.tuples(st.just("raw"), st.one_of(st.sampled_from(commands), JUNK))
    return st.one_of(flags, raw, *valued)


def cli_tokens(scratch: Scratch, options: list[tuple]) -> list[str]:
    tokens: list[str] = []
    for option in options:
        if option[0] == "eq":
            tokens.append(f"{option[1]}={scratch.text(option[2])}")
        elif option[0] == "sep":
            tokens += [option[1], scratch.text(option[2])]
        else:
            tokens.append(scratch.text(option[1]))
    return tokens


@budget(1000)
@given(head=st.one_of(st.sampled_from(COMMANDS + ["-h", "--help", "--version", "--"]), JUNK),
       options=st.lists(cli_option(), max_size=8))
@example(head="run", options=[("sep", "--preserve-fd", "\u00b9"), ("raw", "--"), ("raw", "true")])
@example(head="run", options=[("sep", "--timeout", "nan"), ("sep", "--workdir", Ref("nonutf8"))])
def test_parse_returns_arguments_or_raises_a_sandbox_error(scratch, capsys, head, options):
    argv = [scratch.text(head), *cli_tokens(scratch, options)]
    try:
        result = parse(argv)
    except SandboxError as exc:
        assert_sbx_error(exc)
    else:
        assert result is None or isinstance(result, Arguments), result
    finally:
        capsys.readouterr()  # help and --version print; nothing to check there


@budget(800)
@given(options=st.lists(cli_option(run_only=True), max_size=6),  # never verify or doctor: both are slow
       with_workdir=st.sampled_from([True, True, True, False]))
@example(options=[("sep", "--preserve-fd", "\u00b9")], with_workdir=True)
@example(options=[("sep", "--tier", "KernelSeccompOnly"), ("flag", "--allow-degraded"), ("sep", "--preserve-fd", "1")],
         with_workdir=True)
@example(options=[("sep", "--timeout", "1e400"), ("sep", "--bind", Ref("link"))], with_workdir=True)
# Found by this test: the dry-run plan printed to a strict UTF-8 stdout raises UnicodeEncodeError
# for a workdir (or command) whose name is not UTF-8; a path with a newline splits the error line.
@example(options=[("sep", "--workdir", Ref("nonutf8"))], with_workdir=False)
@example(options=[("sep", "--workdir", "/nonexistent-sbx-fuzz\nsbx: remedy: forged")], with_workdir=False)
def test_main_dry_run_succeeds_or_prints_one_clean_error(scratch, capfdbinary, options, with_workdir):
    argv = ["run", "--dry-run", *(["--workdir", scratch.good] if with_workdir else []),
            *cli_tokens(scratch, options), "--", "true"]
    status, out, err = run_main(capfdbinary, argv)
    code = re.search(r"^sbx: error: ([a-z0-9-]+):", err, re.MULTILINE)
    event(f"exit {status}" + (f" {code.group(1)}" if code else ""))
    assert_cli_contract(status, out, err)


# --------------------------------------------------------------------------------------
# 2. The profile loader


class Raw:
    """A TOML fragment written as is (a datetime, a hex number, a literal string...)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text!r})"


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")  # NUL included: "\u0000" is valid TOML
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value: object) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise AssertionError(f"no TOML for {value!r}")


STRICT_PATH = list_profiles()["strict"]
ABS_PATHS = ["/usr", "/usr/share", "/etc/hostname", "/etc/shadow", "/nonexistent-sbx-fuzz", "/tmp", "/", "//etc",
             "/usr/../etc", "/proc/self", "/dev/null", "/run", "/home", "/tmp/x y", "/a\0b"]
TOML_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)  # TOML is UTF-8: no lone surrogates
BIG_INTS = [0, 1, 15, 16, 1024, 64 << 20, (64 << 20) - 1, 1 << 20, (1 << 20) + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64,
            2 ** 200, 10 ** 400, -1, -(2 ** 63)]
TOML_SCALARS = st.one_of(
    TOML_TEXT, st.integers(), st.sampled_from(BIG_INTS), st.floats(), st.booleans(),
    st.sampled_from(["", "unlimited", "/a\0b", "a\0", "\0", "empty", "rw", "KernelFull"]),
    st.sampled_from([Raw("1979-05-27T07:32:00Z"), Raw("1979-05-27"), Raw("07:32:00"), Raw("0x7f"), Raw("0o17"),
                     Raw("1_000"), Raw("'literal \\ string'"), Raw('"""multi\nline"""'), Raw("-0.0"), Raw("+inf")]),
)
TOML_ANY = st.recursive(TOML_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                              st.dictionaries(TOML_TEXT, inner, max_size=3)),
                        max_leaves=8)
SYSCALLS = ["read", "write", "mount", "ptrace", "clone", "clone3", "execve", "exit_group", "not_a_syscall_sbx", "",
            "READ", "socket", "bpf"]

# Values that look right for each key (the schema's own checks decide); anything else comes from TOML_ANY.
PLAUSIBLE: dict[tuple[str | None, str], st.SearchStrategy] = {
    (None, "description"): TOML_TEXT,
    (None, "extends"): st.sampled_from(["strict", "standard", "strict", "profile.toml", "./profile.toml", "parent.toml",
                                        "missing-sbx-fuzz", "../missing.toml", "sub/parent.toml", ".", "", "Strict",
                                        STRICT_PATH, "/nonexistent/p.toml"]),
    (None, "tier_floor"): st.sampled_from([t.name for t in Tier] + ["kernelfull", "Strongest", ""]),
    ("filesystem", "root"): st.sampled_from(["empty", "host-ro", "host-rw", ""]),
    ("filesystem", "workdir"): st.sampled_from(["rw", "ro", "none", "RW"]),
    ("filesystem", "tmpfs_size_mib"): st.sampled_from(BIG_INTS),
    ("filesystem", "shm_size_mib"): st.sampled_from(BIG_INTS),
    ("environment", "keep"): st.lists(st.sampled_from(["LANG", "LC_*", "PATH", "*", "", "A=B", "TERM", "\u00e9"]),
                                      max_size=4),
    ("environment", "set"): st.one_of(
        st.dictionaries(TOML_TEXT, TOML_TEXT, max_size=3),
        st.sampled_from([{"PATH": "/usr/bin:/bin"}, {"A=B": "x"}, {"": "x"}, {"X": "a\0b"}, {"X\0": "y"},
                         {"HOME": 5}, {"LD_PRELOAD": "/x.so"}])),
    ("seccomp", "mode"): st.sampled_from(["allowlist", "denylist", "bogus"]),
    ("seccomp", "allow"): st.lists(st.sampled_from(SYSCALLS), max_size=3),
    ("seccomp", "deny"): st.lists(st.sampled_from(SYSCALLS), max_size=3),
    ("run", "timeout"): st.sampled_from([0, 0.5, 30, -1, 1e300, math.inf, math.nan, 2 ** 64, 10 ** 400, 1e-9]),
}
for _table, _keys in SCHEMA.items():
    for _key, (_description, _check) in _keys.items():
        if (_table, _key) in PLAUSIBLE:
            continue
        if _table == "rlimits":
            PLAUSIBLE[(_table, _key)] = st.sampled_from(BIG_INTS + ["unlimited", "Unlimited", 1.5])
        elif "path" in _description:
            PLAUSIBLE[(_table, _key)] = st.lists(st.sampled_from(ABS_PATHS + ["relative", ""]), max_size=4)
        elif _description == "true or false":
            PLAUSIBLE[(_table, _key)] = st.booleans()
        else:
            PLAUSIBLE[(_table, _key)] = TOML_SCALARS

TABLES = [t for t in SCHEMA if t is not None]


def value_for(table: str | None, key: str, plausible_only: bool) -> st.SearchStrategy:
    plausible = PLAUSIBLE.get((table, key))
    if plausible is None:
        return TOML_ANY
    return plausible if plausible_only else st.one_of(plausible, plausible, TOML_ANY)


MANGLES = ["[", "]]", "= =", '"', "[seccomp", "key", "\n[namespaces]\nuser = true\n[namespaces]\n", "\n[[rlimits]]\n",
           "x = 1\nx = 2\n", "\t\u0000", "\ufeff", "'''", "{", "\\u0000", "\n= 1\n"]


@st.composite
def profile_documents(draw, plausible_only: bool = False) -> bytes:
    """A profile file's bytes: random tables and keys of SCHEMA (plus unknown ones), each set
    to a plausible or arbitrary value, in a few TOML forms; sometimes broken on purpose."""
    top: list[str] = []
    sections: list[str] = []
    top_keys = sorted(SCHEMA[None]) + ([] if plausible_only else ["bogus"])
    chosen_top = draw(st.lists(st.sampled_from(top_keys), unique=True, max_size=3))
    for key in chosen_top:
        top.append(f"{key} = {toml_value(draw(value_for(None, key, plausible_only)))}")
    if plausible_only and "extends" not in chosen_top and draw(st.booleans()):
        top.append(f"extends = {toml_string(draw(st.sampled_from(['strict', 'standard'])))}")
    tables = TABLES + ([] if plausible_only else ["bogus_table"])
    for table in draw(st.lists(st.sampled_from(tables), unique=True, max_size=4)):
        keys = sorted(SCHEMA.get(table, {})) + ([] if plausible_only else ["bogus_key"])
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=4))
        items = {key: draw(value_for(table, key, plausible_only)) for key in chosen}
        form = "section" if plausible_only else draw(st.sampled_from(["section", "section", "inline", "dotted",
                                                                      "scalar", "array"]))
        if form == "section":
            sections.append(f"\n[{table}]")
            sections += [f"{toml_string(k)} = {toml_value(v)}" for k, v in items.items()]
        elif form == "inline":
            top.append(f"{table} = {toml_value(items)}")
        elif form == "dotted":
            top += [f"{table}.{toml_string(k)} = {toml_value(v)}" for k, v in items.items()]
        elif form == "scalar":
            top.append(f"{table} = {toml_value(draw(TOML_SCALARS))}")
        else:
            sections.append(f"\n[[{table}]]")
            sections += [f"{toml_string(k)} = {toml_value(v)}" for k, v in items.items()]
    data = "\n".join(top + sections).encode() + b"\n"
    if plausible_only:
        return data
    mangle = draw(st.sampled_from(["none", "none", "none", "none", "truncate", "insert", "bytes", "random"]))
    if mangle == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif mangle == "insert":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from(MANGLES)).encode() + data[at:]
    elif mangle == "bytes":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + data[at:]
    elif mangle == "random":
        data = draw(st.binary(max_size=64))
    return data


def write_profiles(directory: str, document: bytes, parent: bytes | None) -> str:
    """``profile.toml`` (and ``parent.toml``, which may extend it back) in ``directory``."""
    path = os.path.join(directory, "profile.toml")
    with open(path, "wb") as f:
        f.write(document)
    if parent is not None:
        with open(os.path.join(directory, "parent.toml"), "wb") as f:
            f.write(parent)
    return path


def load_or_profile_error(path: str) -> Profile | None:
    try:
        profile = load_profile(path)
    except ProfileError as exc:  # any other exception, SandboxError or not, fails the test
        assert_sbx_error(exc)
        assert exc.code == "profile", exc.code
        event("profile refused")
        return None
    event("profile loaded")
    assert isinstance(profile, Profile), profile
    return profile


@budget(600)
@given(document=profile_documents(), parent=st.none() | profile_documents())
@example(document=b'extends = "profile.toml"\n', parent=None)  # a cycle through itself
@example(document=b'extends = "parent.toml"\n', parent=b'extends = "./profile.toml"\n')  # a cycle of two
@example(document=b'extends = "."\n', parent=None)
@example(document=b'[filesystem]\nbinds = ["/a\\u0000b"]\n', parent=None)
@example(document=b'description = "\xff"\n', parent=None)
@example(document=b'[run]\ntimeout = 1' + b"0" * 400 + b"\n", parent=None)
def test_profile_loader_returns_a_profile_or_a_profile_error(scratch, document, parent):
    directory = tempfile.mkdtemp(dir=scratch.profiles)
    try:
        profile = load_or_profile_error(write_profiles(directory, document, parent))
        if profile is not None:
            assert isinstance(profile.to_toml(), str)
    finally:
        shutil.rmtree(directory)


@budget(80)
@given(document=profile_documents(plausible_only=True))
@example(document=b'extends = "strict"\n[run]\ntimeout = 1' + b"0" * 400 + b"\n")  # found: OverflowError in Profile.timeout
@example(document=b'extends = "strict"\n[run]\ntimeout = inf\n')
def test_loaded_profiles_plan_or_raise_a_sandbox_error(scratch, document):
    directory = tempfile.mkdtemp(dir=scratch.profiles)
    try:
        profile = load_or_profile_error(write_profiles(directory, document, None))
        if profile is None:
            return
        assert isinstance(profile.to_toml(), str)
        sandbox = sbx_call(Sandbox, profile, scratch.good)
        if sandbox is not None:
            sbx_call(sandbox.plan, ["true"])
    finally:
        shutil.rmtree(directory)


# --------------------------------------------------------------------------------------
# 3. Sandbox arguments

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([2 ** 63, 2 ** 200, 10 ** 400, -(10 ** 400)]),
    st.sampled_from([0.0, -0.0, -1.0, 0.5, 1e-300, 1e300, math.inf, -math.inf, math.nan]), st.floats(),
    st.text(max_size=12), st.binary(max_size=12),
    st.sampled_from(["", "/", "/tmp\0x", b"/tmp\0x", "\0", "strict", "true", "KernelFull", Path("/tmp"), Path("x"),
                     Tier.KernelFull, Tier.EnvironmentOnly, b"\xff", "\udcff", "\ud800", 1j, Ellipsis]),
    st.builds(object),
)
CONTAINERS = st.one_of(
    st.lists(SCALARS, max_size=4), st.lists(SCALARS, max_size=4).map(tuple), st.sets(SCALARS, max_size=3),
    st.frozensets(SCALARS, max_size=3), st.dictionaries(SCALARS, SCALARS, max_size=3), st.iterables(SCALARS, max_size=3),
    st.lists(st.lists(SCALARS, max_size=2), max_size=2),
)
ANYTHING = st.one_of(SCALARS, CONTAINERS)

LIB_PATHS = st.one_of(
    st.sampled_from([Ref(name) for name in PATH_REFS + ["good-bytes", "good-pathlib", "nonutf8-bytes"]]),
    st.sampled_from(["/", "//etc", "/usr/share", "/usr", "/tmp", "/dev/null", ".", "sub", "", "/tmp\0x", b"/tmp\0x",
                     b"/usr/share", Path("/usr/share"), Path("sub"), "/nonexistent-sbx-fuzz", "/" + "x" * 5000]),
    JUNK,
)


def arguments_with_junk(required: dict[str, st.SearchStrategy], optional: dict[str, st.SearchStrategy]):
    """Keyword arguments: plausible values for the required keys and a random subset of the
    optional ones; in half the examples, one or two of them replaced by anything at all."""
    names = sorted({*required, *optional})
    junk = st.one_of(st.just({}), st.dictionaries(st.sampled_from(names), ANYTHING, min_size=1, max_size=2))
    return st.builds(lambda base, replaced: {**base, **replaced}, st.fixed_dictionaries(required, optional=optional), junk)


SANDBOX_KWARGS = arguments_with_junk({}, {
    "profile": mostly(st.one_of(st.sampled_from(["strict", "standard", b"strict", Path("strict"), Ref("profile-ok")]),
                                st.builds(load_profile, st.sampled_from(["strict", "standard"]))),
                      st.sampled_from(["Strict", "", "nonexistent", "/nonexistent/p.toml", "strict.toml",
                                       Ref("profile-broken"), Ref("good"), Ref("file")])),
    "workdir": mostly(st.sampled_from([Ref("good"), Ref("good-bytes"), Ref("good-pathlib"), Ref("sub")]), LIB_PATHS),
    "tier": mostly(st.sampled_from([None, *Tier, *(t.name for t in Tier), "kernelfull", " KernelFull "]),
                   st.sampled_from(["Kernel", "", 5, 2, 2.0, "\ud800", "\udcff"])),
    "allow_degraded": st.booleans(),
    "ro_binds": mostly(st.lists(st.sampled_from([Ref("sub"), "/usr/share", b"/usr/share", Path("/etc/hostname")]),
                                max_size=2),
                       st.one_of(st.lists(LIB_PATHS, max_size=3), st.lists(LIB_PATHS, max_size=3).map(tuple))),
    "binds": mostly(st.lists(st.sampled_from([Ref("sub"), Ref("nonutf8")]), max_size=2), st.lists(LIB_PATHS, max_size=3)),
    "share_net": st.booleans(),
    "setenv": mostly(st.one_of(st.none(), st.dictionaries(TEXT, TEXT, max_size=3)),
                     st.sampled_from([{"A": "B"}, {"": "x"}, {"A=B": "c"}, {"A": "\0"}, {"A\0": "b"}, {1: "x"},
                                      {"A": 1}, {b"A": b"B"}, {"A": None}, ["A=B"], "A=B"])),
    "timeout": mostly(st.sampled_from([None, 0.5, 30, 1e300, 2 ** 64]),
                      st.sampled_from([0, -1, math.nan, math.inf, -math.inf, "1", True, 10 ** 400])),
})


@budget(600)
@given(kwargs=SANDBOX_KWARGS)
@example(kwargs={"binds": ["/tmp\0x"]})
@example(kwargs={"tier": 5})
@example(kwargs={"workdir": Ref("nonutf8-bytes")})
@example(kwargs={"timeout": 10 ** 400})  # found by this test: OverflowError from float() in arguments.timeout
def test_sandbox_constructor_returns_or_raises_a_sandbox_error(scratch, kwargs):
    sandbox = sbx_call(Sandbox, **scratch.resolve(kwargs))
    if sandbox is not None:
        assert isinstance(sandbox, Sandbox)
        sbx_call(sandbox.plan, ["true"])


ARGV = mostly(
    st.lists(st.one_of(st.sampled_from(["true", "false", "/bin/true", "/nonexistent", "-l", "\udcff", Path("/bin/true"),
                                        b"/bin/true", b"\xff"]), JUNK), min_size=1, max_size=4)
    .filter(lambda argv: argv[0] != ""),
    st.one_of(st.lists(st.sampled_from(["", "a\0b", "\ud800", 5, None, 3.0, "true"]), max_size=3),
              st.lists(st.sampled_from(["true", "x"]), max_size=3).map(tuple),
              st.sampled_from(["true", b"true", Path("/bin/true"), [], ()])),
)
FDS = mostly(st.sampled_from([[], (), [Ref("closed-fd")], [7], [3], [2 ** 31 - 1]]),
             st.one_of(st.sampled_from([[0], [1], [2], [2 ** 31], [2 ** 40], [-1], ["7"], [3.0], [True], None, True, 7,
                                        "7", b"7", {7}, {7: 7}]),
                       st.lists(st.integers(), max_size=3)))
ENV = mostly(st.one_of(st.none(), st.dictionaries(TEXT.filter(lambda k: k and "=" not in k), TEXT, max_size=3)),
             st.sampled_from([{"A": 1}, {1: "A"}, {"": "x"}, {"A=B": "x"}, {"A": "\0"}, {b"A": "x"}, {"A\ud800": "x"},
                              ["A=B"], "A=B"]))


@budget(800)
@given(call=arguments_with_junk({"argv": ARGV}, {"preserve_fds": FDS, "env": ENV}))
@example(call={"argv": ["true"], "preserve_fds": ["7"]})
@example(call={"argv": ["true"], "preserve_fds": [3.0]})
@example(call={"argv": ["true"], "preserve_fds": None})
@example(call={"argv": [5]})
def test_plan_returns_a_plan_or_raises_a_sandbox_error(scratch, valid_sandbox, call):
    call = scratch.resolve(call)
    plan = sbx_call(valid_sandbox.plan, call.pop("argv"), **call)
    if plan is not None:
        assert isinstance(plan.describe(), str)


RUN_ARGV = st.sampled_from([["true"], ["false"], ["/nonexistent"], [Path("/bin/true")], [b"/bin/true"], [5], ["a\x00b"],
                            [], "true", ("true",), [""], [None], ["true", "\udcff"], ["\udcff"], ["\ud800"],
                            ["true", "\ud800"], ["/tmp"]])
RUN_CALL = st.fixed_dictionaries({}, optional={
    "preserve_fds": st.sampled_from([[7], [Ref("closed-fd")], [1], [2 ** 40], ["7"], [3.0], None, True, []]),
    "env": st.sampled_from([None, {"A": "B"}, {"A": 1}, {"": "x"}, ["A=B"]]),
    "exe_sha256": st.sampled_from([None, 5, "", "0" * 64, "zz", Ref("true-sha"), b"00"]),
    "timeout": st.sampled_from([None, 0, -1, math.nan, math.inf, 0.5, "1", True, 10 ** 400]),
})


@budget(60)
@given(argv=RUN_ARGV, call=RUN_CALL)
@example(argv=["true"], call={"timeout": 10 ** 400})  # found by this test: OverflowError in arguments.timeout
@example(argv=["\ud800"], call={"exe_sha256": "0" * 64})  # found: UnicodeEncodeError from os.stat in verified_exe
def test_run_returns_a_result_or_raises_a_sandbox_error(scratch, valid_sandbox, thread_errors, argv, call):
    call = scratch.resolve(call)
    timeout = call.get("timeout")
    try:
        result = sbx_call(valid_sandbox.run, scratch.resolve(argv), capture_output=True, **call)
    except subprocess.TimeoutExpired:  # run()'s documented answer to a (valid) timeout that passed
        assert isinstance(timeout, (int, float)) and 0 < timeout < math.inf, timeout
        return
    finally:
        assert not thread_errors, [f"{e.exc_type.__name__} in thread {e.thread}: {e.exc_value}" for e in thread_errors]
    if result is not None:
        assert isinstance(result.returncode, int), result


# Timeouts that sbx accepts but then has to wait for: found by the run fuzzer (a huge but valid
# timeout). They run in a child process, because the failure kills sbx's deadline thread for
# the rest of the process, and a pytest process without it would not end later tests' sleeps.
TIMEOUT_CHILD = r"""
import json, sys, time
from sandbox import Sandbox
from sandbox.errors import SandboxError
workdir, profile, timeout = sys.argv[1:]
try:
    result = Sandbox(profile, workdir, timeout=None if timeout == "none" else float(timeout)).run(["true"]).returncode
except SandboxError as exc:
    result = exc.code
time.sleep(0.3)  # sbx's own threads act on what they were given
print(json.dumps(result))
"""


@pytest.mark.parametrize("how, timeout", [
    ("cli", "3000000"),  # 35 days: poll() takes at most 2**31-1 ms
    ("cli", "1e300"),
    ("cli-profile", "inf"),  # [run] timeout = inf passes the profile's check
    ("library", "1e300"),
    ("library-profile", "inf"),
])
def test_accepted_timeouts_end_cleanly_in_a_child_process(scratch, how, timeout):
    profile = os.path.join(scratch.profiles, f"timeout-{how}.toml")
    with open(profile, "w") as f:
        f.write(f'extends = "strict"\n[run]\ntimeout = {timeout}\n')
    if how.startswith("cli"):
        argv = [sys.executable, "-I", "-m", "sandbox", "run", "--workdir", scratch.good,
                *(["--profile", profile] if how == "cli-profile" else ["--timeout", timeout]), "--", "true"]
    else:
        argv = [sys.executable, "-I", "-c", TIMEOUT_CHILD, scratch.good,
                *([profile, "none"] if how == "library-profile" else ["strict", timeout])]
    child = subprocess.run(argv, capture_output=True, text=True, errors="backslashreplace", timeout=60)
    assert TRACEBACK not in child.stderr, child.stderr
    if how.startswith("cli"):
        assert_cli_contract(child.returncode, child.stdout, child.stderr)
    else:
        assert child.returncode == 0, child.stderr
        assert json.loads(child.stdout) == 0 or isinstance(json.loads(child.stdout), str), child.stdout  # ran, or refused


# --------------------------------------------------------------------------------------
# Inputs that were once tracebacks, each pinned on its own


def test_inputs_that_were_once_tracebacks(scratch, valid_sandbox, capfdbinary):
    # The CLI: a non-ASCII digit as a descriptor number is a usage error, not int()'s ValueError.
    status, out, err = run_main(capfdbinary, ["run", "--preserve-fd", "\u00b9", "--", "true"])
    assert_cli_contract(status, out, err, allowed=(125,))
    assert err.startswith("sbx: error: usage: --preserve-fd '\u00b9'"), err

    # The CLI, for real (not --dry-run): a workdir whose name is not UTF-8 runs.
    raw_workdir = os.fsencode(scratch.root) + b"/regress-\xff"
    os.mkdir(raw_workdir)
    os.chmod(raw_workdir, 0o755)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    status, out, err = run_main(capfdbinary, ["run", "--workdir", os.fsdecode(raw_workdir), "--", "true"])
    assert_cli_contract(status, out, err, allowed=(0,))
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # main() put the test's handlers back
    # ...and through the library, given as bytes.
    assert Sandbox("strict", raw_workdir).run(["true"]).returncode == 0

    # The library: each refusal is sbx's own, also the TypeError/ValueError Python code expects.
    def refused(kind: type[Exception], named: str, function, *args, **kwargs) -> None:
        with pytest.raises(kind) as caught:
            function(*args, **kwargs)
        assert isinstance(caught.value, SandboxError) and isinstance(caught.value, UsageError), caught.value
        assert named in caught.value.message, (named, caught.value.message)
        assert_sbx_error(caught.value)

    refused(ArgumentValueError, "binds[0]", Sandbox, "strict", scratch.good, binds=["/tmp\0x"])
    refused(ArgumentTypeError, "tier", Sandbox, "strict", scratch.good, tier=5)
    refused(ArgumentValueError, "timeout", Sandbox, "strict", scratch.good, timeout=0)
    refused(ArgumentValueError, "timeout", Sandbox, "strict", scratch.good, timeout=-1)
    for call in (valid_sandbox.plan, valid_sandbox.run):
        refused(ArgumentTypeError, "preserve_fds[0]", call, ["true"], preserve_fds=["7"])
        refused(ArgumentTypeError, "preserve_fds[0]", call, ["true"], preserve_fds=[3.0])
        refused(ArgumentTypeError, "preserve_fds", call, ["true"], preserve_fds=None)
        refused(ArgumentTypeError, "argv[0]", call, [5])
    refused(ArgumentTypeError, "exe_sha256", valid_sandbox.run, ["true"], exe_sha256=5)
    refused(ArgumentValueError, "timeout", valid_sandbox.run, ["true"], timeout=0)
    refused(ArgumentValueError, "timeout", valid_sandbox.run, ["true"], timeout=-1)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentValueError, ValueError)
    assert valid_sandbox.run([Path("/bin/true")]).returncode == 0
