"""sbx verify: runs the procedure on this host, and its verdict logic cannot pass vacuously."""

from __future__ import annotations

import json

import pytest

from sandbox import verify
from sandbox.tiers import Tier


def test_verify_passes_on_this_host_and_writes_a_record(root_runner, tmp_path):
    record = tmp_path / "record.md"
    result = root_runner.run("verify", "--json", "--output", str(record), timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    report = json.loads(result.stdout)
    assert report["host"]["tier"] == "KernelFull"
    assert report["passed"] and all(c["result"] == "PASS" for c in report["cases"])
    seen = {(c["check"].split(":")[0], c["path"], c["tier"], c["user"]) for c in report["cases"]}
    for user in ("root", "nobody"):
        for path in ("cli", "library"):
            for tier in ("KernelFull", "KernelSeccompOnly", "KernelNoNamespaces"):
                assert ("fd hygiene", path, tier, user) in seen
        for tier in ("KernelFull", "KernelNoNamespaces"):
            assert ("Landlock", "cli", tier, user) in seen
            assert ("seccomp", "cli", tier, user) in seen
    text = record.read_text()
    assert text.startswith("# sbx verification record") and "every case passed" in text


def _me() -> verify.User:
    import os
    import sys
    from pathlib import Path

    return verify.User("root", sys.executable, dict(os.environ), str(Path(verify.__file__).resolve().parent.parent))


def test_a_failed_control_is_inconclusive_not_pass(monkeypatch, tmp_path):
    monkeypatch.setattr(verify, "FD7", ":")  # nothing opened on fd 7: the control cannot see it
    case = verify.fd_hygiene_case(_me(), "cli", Tier.KernelFull, tmp_path)
    assert case.result == "INCONCLUSIVE" and "control failed" in case.detail


def test_a_visible_descriptor_is_a_fail(monkeypatch, tmp_path):
    real = verify._sandboxed

    def leaky(user, path, tier, workdir, argv, preserve, fds):
        ran_at, proc, seen = real(user, path, tier, workdir, argv, [7], fds)  # as if hygiene kept fd 7
        return ran_at, proc, seen

    monkeypatch.setattr(verify, "_sandboxed", leaky)
    case = verify.fd_hygiene_case(_me(), "cli", Tier.KernelFull, tmp_path)
    assert case.result == "FAIL" and "[0, 1, 2, 7]" in case.detail


@pytest.mark.parametrize("results, status", [
    (["PASS", "PASS"], 0), (["PASS", "FAIL"], 1), (["PASS", "INCONCLUSIVE"], 1), ([], 1)])
def test_exit_status_is_nonzero_unless_every_case_passed(monkeypatch, capsys, results, status):
    cases = [verify.CaseResult("check", "cli", "KernelFull", "root", r, "") for r in results]
    monkeypatch.setattr(verify, "collect_cases", lambda: ({"tier": "KernelFull"}, cases))
    assert verify.cmd_verify(type("Args", (), {"json": True, "output": None})()) == status
    assert json.loads(capsys.readouterr().out)["passed"] is (status == 0)
