"""``sbx verify``: run, on this host, the checks that prove the sandbox enforces what it claims.

For each spawn path (the CLI, the library's ``spawn``), each kernel tier the host resolves
(and the kernel tiers below it forced: KernelSeccompOnly, KernelNoNamespaces), and -- when invoked as root -- as root and as uid 65534:
fd 7 is opened in the caller without close-on-exec and a probe lists its descriptors with
fcntl(F_GETFD) up to RLIMIT_NOFILE. Every case runs its positive controls first (the probe
outside sbx sees fd 7; a ``--preserve-fd 7`` run sees it inside); a case whose control
fails is INCONCLUSIVE, never PASS. Also: the Landlock preserved-directory-fd check and the
seccomp probe, each with its control. Exit 0 only when every case passed.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from . import probes
from .harness import SYSTEM_PYTHON, UNPRIV_UID, User
from .integrity import import_root
from .probes_src import source
from .tiers import Tier

FD7 = "exec 7</etc/hostname"
REFUSED = {1, 13, 38}  # EPERM, EACCES, ENOSYS

LIBRARY_DRIVER = """
import json, sys
from sandbox import Sandbox
p = json.loads(sys.argv[1])
sb = Sandbox(p["profile"], p["workdir"], tier=p["tier"], allow_degraded=True)
r = sb.run(p["argv"], preserve_fds=p["preserve"], capture_output=True, text=True)
print(json.dumps({"tier": r.tier.name, "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}))
"""


@dataclass
class CaseResult:
    check: str
    path: str
    tier: str
    user: str
    result: str  # PASS, FAIL, INCONCLUSIVE
    detail: str


def stage_package_copy(dest: Path) -> Path:
    """Copy sbx and its launch-time dependency where an unprivileged uid can read them."""
    package = Path(__file__).resolve().parent
    shutil.copytree(package, dest / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    from .profile import list_profiles

    (dest / "profiles").mkdir()
    for name, path in list_profiles().items():
        shutil.copy(path, dest / "profiles" / f"{name}.toml")
    import pyseccomp

    shutil.copy(pyseccomp.__file__, dest / "pyseccomp.py")
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return dest


def _json_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _tier_from_verbose(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("sbx: tier "):
            return line.split()[2]
    return "unknown"


def _sandboxed(user: User, path: str, tier: Tier, workdir: str, argv: list[str], preserve: list[int],
               fds: str) -> tuple[str, subprocess.CompletedProcess, dict | None]:
    """Run ``argv`` through one spawn path; (tier it reported, process, the probe's JSON)."""
    if path == "cli":
        flags = ["--verbose", "--tier", tier.name, "--allow-degraded", "--workdir", workdir]
        for fd in preserve:
            flags += ["--preserve-fd", str(fd)]
        out = user.run("run", *flags, "--", *argv, fds=fds)
        return _tier_from_verbose(out.stderr), out, _json_line(out.stdout)
    params = {"profile": "strict", "workdir": workdir, "tier": tier.name, "argv": argv, "preserve": preserve}
    out = user.run_argv(user.python_argv(LIBRARY_DRIVER, json.dumps(params)), fds=fds)
    driver = _json_line(out.stdout) or {}
    inner = subprocess.CompletedProcess(argv, driver.get("returncode", out.returncode),
                                        driver.get("stdout", ""), driver.get("stderr", out.stderr))
    return driver.get("tier", "unknown"), inner, _json_line(inner.stdout or "")


def fd_hygiene_case(user: User, path: str, tier: Tier, scratch: Path) -> CaseResult:
    probe = ["python3", "-I", "-S", "-c", source("fdprobe")]
    result = CaseResult("fd hygiene: fd 7 not visible", path, tier.name, user.label, "INCONCLUSIVE", "")
    outside = _json_line(user.run_argv([SYSTEM_PYTHON, "-I", "-S", "-c", source("fdprobe")], fds=FD7).stdout)
    if not outside or 7 not in outside["fds"]:
        result.detail = "control failed: the probe outside sbx did not see fd 7"
        return result
    workdir = str(user.workdir(scratch))
    ran_at, _, kept = _sandboxed(user, path, tier, workdir, probe, [7], FD7)
    if ran_at != tier.name or not kept or kept["fds"] != [0, 1, 2, 7]:
        result.detail = f"control failed: a --preserve-fd 7 run (tier {ran_at}) saw {kept and kept['fds']}"
        return result
    ran_at, proc, seen = _sandboxed(user, path, tier, workdir, probe, [], FD7)
    if ran_at != tier.name or seen is None:
        result.result, result.detail = "FAIL", f"the run did not complete at {tier.name}: {proc.stderr.strip()[-200:]}"
    elif seen["fds"] == [0, 1, 2]:
        result.result = "PASS"
        result.detail = f"outside saw {outside['fds']}; preserved saw [0, 1, 2, 7]; unpreserved saw [0, 1, 2]"
    else:
        result.result, result.detail = "FAIL", f"the sandboxed probe saw {seen['fds']}: {seen['first_bytes']}"
    return result


def landlock_case(user: User, scratch: Path, tier: Tier = Tier.KernelFull,
                  control_tier: Tier = Tier.KernelSeccompOnly) -> CaseResult:
    result = CaseResult("Landlock: preserved directory fd cannot be read through", "cli",
                        tier.name, user.label, "INCONCLUSIVE", "")
    secret_dir = Path(tempfile.mkdtemp(prefix="sbx-verify-", dir="/var/tmp"))
    try:
        secret_dir.chmod(0o755)
        (secret_dir / "secret").write_text("verify-secret\n")
        (secret_dir / "secret").chmod(0o644)
        workdir = str(user.workdir(scratch))
        argv = ["cat", "/proc/self/fd/8/secret"]
        fds = f"exec 8<{secret_dir}"
        ran_at, control, _ = _sandboxed(user, "cli", control_tier, workdir, argv, [8], fds)
        if ran_at != control_tier.name or control.stdout != "verify-secret\n":
            result.detail = "control failed: without Landlock the directory fd did not read through"
            return result
        ran_at, guarded, _ = _sandboxed(user, "cli", tier, workdir, argv, [8], fds)
        if ran_at == tier.name and guarded.returncode != 0 and "verify-secret" not in guarded.stdout:
            result.result = "PASS"
            result.detail = f"readable at {control_tier.name} (control); denied at {tier.name}"
        else:
            result.result = "FAIL"
            result.detail = f"at {ran_at} the read returned {guarded.returncode}: {guarded.stdout[:60]!r}"
        return result
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)


def seccomp_case(user: User, tier: Tier, control: dict, scratch: Path) -> CaseResult:
    result = CaseResult("seccomp: denied calls refused, required calls reach the kernel", "cli", tier.name,
                        user.label, "INCONCLUSIVE", "")
    ran_at, proc, inside = _sandboxed(user, "cli", tier, str(user.workdir(scratch)),
                                      ["python3", "-I", "-S", "-c", source("syscalls")], [], "")
    if ran_at != tier.name or inside is None:
        result.result, result.detail = "FAIL", f"the probe did not run at {tier.name}: {proc.stderr.strip()[-200:]}"
        return result
    not_refused = [n for n, a in inside["denied"].items() if a["result"] != -1 or a["errno"] not in REFUSED]
    blocked = [n for n, a in inside["required"].items() if a != control["required"][n]]
    same_as_kernel = [n for n, a in inside["denied"].items() if a == control["denied"][n]]
    if not_refused or blocked:
        result.result = "FAIL"
        result.detail = f"not refused: {not_refused}; required calls blocked: {blocked}"
    elif len(same_as_kernel) == len(inside["denied"]):
        result.detail = "control failed: outside the sandbox the kernel answered every call the same way"
    else:
        result.result = "PASS"
        result.detail = (f"{len(inside['denied'])} calls refused; fcntl, getrlimit, prlimit64, pread64 reached "
                         "the kernel" + (f"; the kernel itself refuses {same_as_kernel} to the control's user"
                                         if same_as_kernel else ""))
    return result


def run_verification() -> dict:
    return report_of(*collect_cases())


def report_of(facts: dict, cases: list[CaseResult]) -> dict:
    """The report; it passed only when there were cases and every one is a PASS."""
    return {"host": facts, "cases": [asdict(c) for c in cases],
            "passed": bool(cases) and all(c.result == "PASS" for c in cases)}


def collect_cases() -> tuple[dict, list[CaseResult]]:
    caps = probes.host_capabilities(refresh=True)
    host_tier = probes.resolve_tier(caps)
    # Each kernel tier at or below the host's: on a host with namespaces, the weaker ones forced.
    tiers = [t for t in (Tier.KernelFull, Tier.KernelSeccompOnly, Tier.KernelNoNamespaces) if t <= host_tier]
    scratch = Path(tempfile.mkdtemp(prefix="sbx-verify-"))
    scratch.chmod(0o755)
    cases: list[CaseResult] = []
    try:
        me = User("root" if os.geteuid() == 0 else f"uid {os.geteuid()}", sys.executable, dict(os.environ),
                  import_root())
        users = [me]
        if os.geteuid() == 0:
            staged = stage_package_copy(Path(tempfile.mkdtemp(prefix="pkg-", dir=scratch)))
            users.append(User("nobody", SYSTEM_PYTHON, {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(staged),
                                                        "LANG": "C.UTF-8"}, str(staged), UNPRIV_UID))
        control = _json_line(me.run_argv([SYSTEM_PYTHON, "-I", "-S", "-c", source("syscalls")]).stdout) or {}
        for user in users:
            for path in ("cli", "library"):
                for tier in tiers:
                    cases.append(fd_hygiene_case(user, path, tier, scratch))
            # The control: the same read at a tier without Landlock (forced lower, so always possible).
            no_landlock = Tier.KernelSeccompOnly if Tier.KernelSeccompOnly in tiers else Tier.EnvironmentOnly
            for tier in (t for t in tiers if t.uses_landlock):
                cases.append(landlock_case(user, scratch, tier, no_landlock))
            for tier in tiers:
                cases.append(seccomp_case(user, tier, control, scratch) if control else
                             CaseResult("seccomp", "cli", tier.name, user.label, "INCONCLUSIVE",
                                        "control failed: the probe did not run outside the sandbox"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    facts = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
             "kernel": platform.release(), "machine": platform.machine(),
             "bwrap": f"{caps.bwrap_path} {caps.bwrap_version}", "landlock_abi": caps.landlock_abi,
             "tier": host_tier.name, "uid": os.geteuid()}
    if not tiers:
        cases.append(CaseResult("kernel tiers", "-", host_tier.name, "-", "INCONCLUSIVE",
                                "this host resolves no kernel tier: nothing kernel-enforced to verify"))
    return facts, cases


def render_table(report: dict) -> str:
    lines = ["host: " + ", ".join(f"{k}={v}" for k, v in report["host"].items()), ""]
    for case in report["cases"]:
        lines.append(f"{case['result']:<12} {case['check']} [{case['path']}, {case['tier']}, {case['user']}]")
        lines.append(f"{'':<12}   {case['detail']}")
    lines.append("")
    lines.append("verdict: " + ("every case passed" if report["passed"] else "NOT every case passed"))
    return "\n".join(lines)


def render_markdown(report: dict) -> str:
    out = ["# sbx verification record", "", "| host fact | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in report["host"].items()]
    out += ["", "| result | check | spawn path | tier | user | detail |", "|---|---|---|---|---|---|"]
    for c in report["cases"]:
        detail = c["detail"].replace("|", "\\|")
        out.append(f"| {c['result']} | {c['check']} | {c['path']} | {c['tier']} | {c['user']} | {detail} |")
    out += ["", "Verdict: " + ("**every case passed**." if report["passed"] else "**not every case passed**."), ""]
    return "\n".join(out)


def cmd_verify(args) -> int:
    from .errors import UsageError

    if args.output:  # refuse before spending the run, and create nothing on the way
        directory = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK) or os.path.isdir(args.output):
            raise UsageError(f"--output {args.output}: cannot write a file there",
                             "name a file in an existing, writable directory")
    report = run_verification()
    print(json.dumps(report, indent=2) if args.json else render_table(report))
    if args.output:
        try:
            Path(args.output).write_text(render_markdown(report), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output {args.output}: {exc.strerror}",
                             "name a file in an existing, writable directory") from None
    return 0 if report["passed"] else 1
