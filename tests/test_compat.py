"""CPython's own tests as the judge of "real programs work inside strict": a small, fast
subset of scripts/compat.py, so that a change to the seccomp policy or the view that
breaks real programs fails CI. Needs the distribution's test package (the test bootstrap
installs it)."""

from __future__ import annotations

import importlib.util

from conftest import REPO

SUBSET = ["test_selectors", "test_socketserver", "test_getpass", "test_pwd", "test_grp"]


def load_compat():
    spec = importlib.util.spec_from_file_location("compat", REPO / "scripts" / "compat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_test_fails_only_under_sbx(tmp_path):
    compat = load_compat()
    assert compat.testsuite_missing() is None, "CPython's test package is missing: run the test bootstrap"
    report = compat.compare(SUBSET, str(tmp_path))
    # Control: under bare bwrap with the same view the tests ran, and most passed.
    assert report["bare_passed"] >= 80, report
    assert report["sbx_only_failures"] == {}, report["sbx_only_failures"]
    assert report["sbx_passed"] == report["bare_passed"]
