"""The filesystem view and Landlock, with positive controls, as root and as uid 65534."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading

import pytest
from conftest import ACCESS_PROBE, SYSTEM_PYTHON, UNPRIV_UID, parse_json_line, verbose_tier

TIER_ARGS = {
    "KernelFull": [],
    "KernelSeccompOnly": ["--tier", "KernelSeccompOnly", "--allow-degraded"],
}


@pytest.fixture
def host_secret(runner):
    """A host file outside every bind, readable by the runner's user outside the sandbox."""
    directory = tempfile.mkdtemp(prefix="sbx-secret-", dir="/var/tmp")
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "secret.txt")
    with open(path, "w") as f:
        f.write("host secret\n")
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(directory)


def _probe(runner, args, workdir, reads, writes):
    return runner.run("run", "--verbose", *args, "--workdir", str(workdir), "--", "python3", "-I", "-S", "-c",
                      ACCESS_PROBE, ",".join(reads), ",".join(writes))


@pytest.mark.parametrize("tier", TIER_ARGS)
def test_writes_land_only_in_the_workdir_and_secrets_stay_hidden(runner, tier, host_secret):
    workdir = runner.workdir()
    outside_targets = ["/usr/sbx-probe", "/etc/sbx-probe", "/sbx-probe", os.path.dirname(host_secret) + "/new"]
    reads = [host_secret, "/etc/shadow", "/root/.bashrc", "/etc/hostname"]
    inside = str(workdir / "written.txt")

    # Positive control: outside the sandbox the same user reads the secret and /etc/hostname.
    control = subprocess.run(["setpriv", f"--reuid={runner.uid}", f"--regid={runner.uid}", "--clear-groups", "--",
                              SYSTEM_PYTHON, "-I", "-S", "-c", ACCESS_PROBE, ",".join(reads), ""]
                             if runner.uid is not None else
                             [SYSTEM_PYTHON, "-I", "-S", "-c", ACCESS_PROBE, ",".join(reads), ""],
                             capture_output=True, text=True, check=True)
    seen_outside = parse_json_line(control.stdout)["read"]
    assert seen_outside[host_secret] == "ok"
    if runner.uid is None:
        assert seen_outside["/etc/shadow"] == "ok"

    result = _probe(runner, TIER_ARGS[tier], workdir, reads, [inside, *outside_targets])
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == tier
    seen = parse_json_line(result.stdout)
    assert seen["write"][inside] == "ok"
    with open(inside) as f:
        assert f.read() == "sbx was here\n"  # it landed on the host
    for target in outside_targets:
        assert seen["write"][target] != "ok", target
        assert not os.path.exists(target), target
    for secret in (host_secret, "/etc/shadow", "/root/.bashrc"):
        assert seen["read"][secret] != "ok", secret


def test_tmp_is_private(runner):
    workdir = runner.workdir()
    marker = f"/tmp/sbx-private-{os.getpid()}"
    result = _probe(runner, [], workdir, [], [marker])
    assert verbose_tier(result.stderr) == "KernelFull"
    assert parse_json_line(result.stdout)["write"][marker] == "ok"  # a tmpfs inside (the control)
    assert not os.path.exists(marker)  # never the host's /tmp


NET_PROBE = r"""
import json, socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
    s.close()
    print(json.dumps({"connect": "ok"}))
except OSError as exc:
    print(json.dumps({"connect": exc.strerror or str(exc)}))
"""


@pytest.mark.parametrize("tier", TIER_ARGS)
def test_no_network_from_inside_strict(runner, tier):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    def accept_until_closed() -> None:
        try:
            while True:
                server.accept()[0].close()
        except OSError:
            pass  # the test closed the listener

    accepter = threading.Thread(target=accept_until_closed, daemon=True)
    accepter.start()
    try:
        # Positive control: the same probe outside the sandbox reaches the listener.
        control = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", NET_PROBE, str(port)],
                                 capture_output=True, text=True, check=True)
        assert parse_json_line(control.stdout)["connect"] == "ok"
        result = runner.run("run", "--verbose", *TIER_ARGS[tier], "--workdir", str(runner.workdir()), "--",
                            "python3", "-I", "-S", "-c", NET_PROBE, str(port))
        assert result.returncode == 0, result.stderr
        assert verbose_tier(result.stderr) == tier
        assert parse_json_line(result.stdout)["connect"] != "ok"
    finally:
        server.close()


def test_runs_as_an_unprivileged_uid_inside(runner):
    result = runner.run("run", "--verbose", "--workdir", str(runner.workdir()), "--", "id", "-u")
    assert result.returncode == 0, result.stderr
    assert verbose_tier(result.stderr) == "KernelFull"
    inside = int(result.stdout.strip())
    assert inside != 0
    assert inside == (runner.uid if runner.uid is not None else UNPRIV_UID)
