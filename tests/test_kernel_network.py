"""Real programs inside strict: loopback in the private network namespace, the /etc tables
getaddrinfo and friends read, a hostname that resolves; and what stays closed. As root and
as uid 65534, at both kernel tiers, each with a control."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading

import pytest
from conftest import SYSTEM_PYTHON, fresh_dir_with, parse_json_line, verbose_tier

TIER_ARGS = {"KernelFull": [], "KernelSeccompOnly": ["--tier", "KernelSeccompOnly", "--allow-degraded"]}

# What a test suite, a dev server or a language server does on 127.0.0.1 and ::1.
NET_PROBE = r"""
import json, socket
out = {}
def attempt(name, fn):
    try:
        out[name] = fn()
    except OSError as exc:
        out[name] = exc.errno
def tcp(family, host):
    server = socket.socket(family)
    server.bind((host, 0)); server.listen()
    client = socket.create_connection((host, server.getsockname()[1]), timeout=5)
    peer, _ = server.accept(); client.sendall(b"ping")
    return peer.recv(4).decode()
def udp():
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind(("127.0.0.1", 0))
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b.sendto(b"dgram", a.getsockname())
    return a.recv(5).decode()
attempt("tcp4", lambda: tcp(socket.AF_INET, "127.0.0.1"))
attempt("tcp6", lambda: tcp(socket.AF_INET6, "::1"))
attempt("udp4", udp)
attempt("interfaces", lambda: [name for _, name in socket.if_nameindex()])
attempt("hostname", lambda: socket.gethostbyname(socket.gethostname()))
attempt("http_port", lambda: socket.getservbyname("http"))
attempt("tcp_proto", lambda: socket.getprotobyname("tcp"))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close() or "opened")
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close() or "opened")
attempt("netlink_audit", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9).close() or "opened")
attempt("outside", lambda: socket.create_connection(("192.0.2.1", 80), timeout=2).close() or "connected")
attempt("socketpair_vsock", lambda: socket.socketpair(40, socket.SOCK_STREAM) and "made")
print(json.dumps(out))
"""
EPERM = 1


@pytest.fixture(scope="module")
def loopback_control():
    """Positive control gating the loopback tests: outside sbx the probe's loopback parts work."""
    seen = parse_json_line(subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", NET_PROBE], capture_output=True,
                                          text=True, check=True).stdout)
    assert (seen["tcp4"], seen["tcp6"], seen["udp4"], seen["http_port"], seen["tcp_proto"]) == (
        "ping", "ping", "dgram", 80, 6), seen
    return seen


@pytest.fixture(scope="module")
def profiles():
    path = fresh_dir_with("sbx-net-profiles-", {"noloop.toml": ('extends = "strict"\n[network]\nloopback = false\n',
                                                                 0o644)}, parent="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def probe(runner, *flags: str) -> tuple[str, dict]:
    result = runner.run("run", "--verbose", *flags, "--workdir", str(runner.workdir()), "--",
                        "python3", "-I", "-S", "-c", NET_PROBE)
    assert result.returncode == 0, result.stderr
    return verbose_tier(result.stderr), parse_json_line(result.stdout)


@pytest.mark.parametrize("tier", TIER_ARGS)
def test_loopback_works_inside_and_nothing_else_is_there(runner, tier, loopback_control):
    ran_at, seen = probe(runner, *TIER_ARGS[tier])
    assert ran_at == tier
    assert (seen["tcp4"], seen["tcp6"], seen["udp4"]) == ("ping", "ping", "dgram"), seen
    assert seen["interfaces"] == ["lo"]  # netlink routing works (if_nameindex), and lo is all there is
    assert seen["outside"] != "connected"  # no route out of the namespace
    assert seen["raw"] == seen["packet"] == seen["netlink_audit"] == seen["socketpair_vsock"] == EPERM, seen


def test_the_sandboxs_hostname_and_the_service_tables_resolve(runner, loopback_control):
    ran_at, seen = probe(runner)
    assert ran_at == "KernelFull"
    assert (seen["hostname"], seen["http_port"], seen["tcp_proto"]) == ("127.0.0.1", 80, 6), seen


def test_loopback_false_keeps_only_unix_sockets(runner, profiles, loopback_control):
    ran_at, seen = probe(runner, "--profile", str(profiles / "noloop.toml"))
    assert ran_at == "KernelFull"
    assert seen["tcp4"] == seen["tcp6"] == seen["udp4"] == EPERM, seen


def test_a_host_listener_on_loopback_is_not_reachable(runner):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in range(3)], daemon=True).start()
    code = f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached')\n" \
           "except OSError as e:\n print('refused', e.errno)"
    try:
        # Control: outside sbx the same connect reaches the host's listener.
        assert subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True).stdout.startswith(
            "reached")
        result = runner.run("run", "--workdir", str(runner.workdir()), "--", "python3", "-I", "-S", "-c", code)
        assert result.stdout.startswith("refused"), result.stdout + result.stderr
    finally:
        server.close()


def test_dry_run_says_loopback_only(root_runner, tmp_path):
    result = root_runner.run("run", "--dry-run", "--workdir", str(tmp_path), "--", "true")
    assert "network: loopback only" in result.stdout and "nothing leaves it" in result.stdout
    data = json.dumps(result.stdout)
    assert "AF_NETLINK for NETLINK_ROUTE only" in json.loads(data)
