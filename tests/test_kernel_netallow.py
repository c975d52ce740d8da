"""The network allowlist, end to end: a private network namespace whose one way out is sbx's
proxy. Local servers on the host's 127.0.0.1 stand in for the internet, reached by name
through a resolver the test injects into the proxy (a Python callable on the host: nothing
inside can reach it). As root and as uid 65534, at both kernel tiers, each with a control.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import subprocess
import threading
import zipfile

import pytest
from conftest import SYSTEM_PYTHON, parse_json_line, verbose_tier

TIERS = ["KernelFull", "KernelSeccompOnly"]
EPERM, ECONNREFUSED = 1, 111

# Runs inside the sandbox (the system python3): every way out it can think of.
CLIENT = r"""
import json, os, socket, sys
echo_port = int(sys.argv[1])
proxy = ("127.0.0.1", 3128)
out = {"env": {k: os.environ.get(k) for k in ("HTTP_PROXY", "https_proxy", "ALL_PROXY", "NO_PROXY")}}
def attempt(name, fn):
    try:
        out[name] = fn()
    except OSError as exc:
        out[name] = exc.errno
def read_head(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data
def connect_http(host, port):
    s = socket.create_connection(proxy, timeout=10)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = read_head(s)
    status = head.split(b"\r\n")[0].decode()
    if " 200 " not in status:
        rest = head.split(b"\r\n\r\n", 1)[1] + s.recv(4096)
        return [status, rest.decode().strip()]
    s.sendall(b"hello\n")
    return [status, s.recv(100).decode()]
def connect_socks(host, port):
    s = socket.create_connection(proxy, timeout=10)
    s.sendall(b"\x05\x01\x00")
    assert s.recv(2) == b"\x05\x00"
    name = host.encode()
    s.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + port.to_bytes(2, "big"))
    reply = s.recv(10)
    if reply[1] != 0:
        return ["refused", reply[1]]
    s.sendall(b"socks\n")
    return ["ok", s.recv(100).decode()]
attempt("http_allowed", lambda: connect_http("echo.test", echo_port))
attempt("socks_allowed", lambda: connect_socks("echo.test", echo_port))
attempt("http_denied", lambda: connect_http("denied.test", 443))
attempt("socks_denied", lambda: connect_socks("denied.test", echo_port))
attempt("direct", lambda: socket.create_connection(("127.0.0.1", echo_port), timeout=5).close() or "connected")
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close() or "opened")
attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close() or "opened")
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close() or "opened")
attempt("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close() or "opened")
attempt("socketpair", lambda: len(socket.socketpair()))
attempt("dgram_pair", lambda: len(socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)))
attempt("raw_pair", lambda: len(socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW)))  # AF_UNIX makes it DGRAM
def local_server():
    server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
    client = socket.create_connection(server.getsockname(), timeout=5)
    peer, _ = server.accept(); client.sendall(b"ping")
    return peer.recv(4).decode()
attempt("loopback", local_server)
print(json.dumps(out))
"""

# Runs on the host as the test's user: local servers, the injected resolver, the sandbox.
HOST = r"""
import asyncio, json, socket, socketserver, sys, threading, http.server, functools
from sandbox import Sandbox
cfg = json.loads(sys.argv[1])

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        line = self.request.recv(100)
        self.request.sendall(b"echo:" + line)

echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
echo.daemon_threads = True
threading.Thread(target=echo.serve_forever, daemon=True).start()
echo_port = echo.server_address[1]
index = None
if cfg.get("index_dir"):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=cfg["index_dir"])
    handler.log_message = lambda *a: None
    index = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=index.serve_forever, daemon=True).start()

asked = []
async def resolver(host, port):
    asked.append(host)
    if host in ("echo.test", "pkg.test"):
        return ["127.0.0.1"]
    raise LookupError(f"{host}: no such test host")

events = []
allow = [f"echo.test:{echo_port}"] + ([f"pkg.test:{index.server_address[1]}"] if index else []) + cfg["extra_allow"]
sandbox = Sandbox("strict", cfg["workdir"], tier=cfg["tier"], allow_degraded=True, allow_hosts=allow,
                  on_network_event=lambda e: events.append(e._asdict()), network_resolver=resolver,
                  ro_binds=cfg["ro_binds"])
if index:
    argv = [a.replace("PORT", str(index.server_address[1])) for a in cfg["argv"]]
else:
    argv = cfg["argv"] + [str(echo_port)]
result = sandbox.run(argv, capture_output=True, text=True, timeout=120)
print(json.dumps({"tier": str(result.tier), "status": result.returncode, "stdout": result.stdout,
                  "stderr": result.stderr[-3000:], "asked": asked, "events": events, "echo_port": echo_port}))
"""


def run_host(runner, tier: str, argv: list[str], *, index_dir: str = "", ro_binds=(), extra_allow=()) -> dict:
    workdir = runner.workdir()
    cfg = {"workdir": str(workdir), "tier": tier, "argv": argv, "index_dir": index_dir, "ro_binds": list(ro_binds),
           "extra_allow": list(extra_allow)}
    done = runner.run_argv(runner.python_argv(HOST, json.dumps(cfg)), timeout=300)
    assert done.returncode == 0, done.stderr
    return parse_json_line(done.stdout)


@pytest.fixture(scope="module")
def client_control():
    """Positive control gating the tests: outside any sandbox, the client's probes that the
    sandbox must refuse (UDP, AF_UNIX, a direct connect to the server) all succeed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepter = threading.Thread(target=lambda: server.accept()[0].sendall(b"x"), daemon=True)
    accepter.start()
    seen = parse_json_line(subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", CLIENT, str(port)], capture_output=True,
                                          text=True, timeout=60).stdout)
    server.close()
    assert (seen["direct"], seen["udp"], seen["udp6"], seen["unix"], seen["dgram_pair"], seen["raw_pair"],
            seen["loopback"]) == ("connected", "opened", "opened", "opened", 2, 2, "ping"), seen
    return seen


@pytest.mark.parametrize("tier", TIERS)
def test_only_allowed_hosts_are_reached_and_only_through_the_proxy(runner, tier, client_control):
    seen = run_host(runner, tier, [SYSTEM_PYTHON, "-I", "-S", "-c", CLIENT])
    assert seen["tier"] == tier, seen
    assert seen["status"] == 0, seen
    inside = parse_json_line(seen["stdout"])
    # Allowed, over HTTP CONNECT and SOCKS5: the host's echo server answers.
    assert inside["http_allowed"] == ["HTTP/1.1 200 Connection established", "echo:hello\n"], inside
    assert inside["socks_allowed"] == ["ok", "echo:socks\n"], inside
    # Denied: 403 stating the reason, SOCKS "not allowed by ruleset", and never resolved.
    status, body = inside["http_denied"]
    assert status.startswith("HTTP/1.1 403") and "denied.test:443" in body and "allowlist" in body, inside
    assert inside["socks_denied"] == ["refused", 2], inside
    assert "denied.test" not in seen["asked"] and "echo.test" in seen["asked"], seen["asked"]
    # The server's own address is not reachable: 127.0.0.1 inside is the sandbox's own loopback.
    assert inside["direct"] == ECONNREFUSED, inside
    # UDP, raw and new unix sockets are refused; socketpair and loopback TCP still work.
    assert (inside["udp"], inside["udp6"], inside["raw"], inside["unix"]) == (EPERM, EPERM, EPERM, EPERM), inside
    # A datagram pair could sendto() any unix datagram socket in the view: refused too.
    assert inside["dgram_pair"] == EPERM and inside["raw_pair"] == EPERM, inside
    assert inside["socketpair"] == 2 and inside["loopback"] == "ping", inside
    assert inside["env"] == {"HTTP_PROXY": "http://127.0.0.1:3128", "https_proxy": "http://127.0.0.1:3128",
                             "ALL_PROXY": "socks5h://127.0.0.1:3128", "NO_PROXY": "localhost,127.0.0.1,::1"}
    decisions = {(e["action"], e["protocol"], e["host"]) for e in seen["events"]}
    assert {("allow", "http-connect", "echo.test"), ("allow", "socks5", "echo.test"),
            ("deny", "http-connect", "denied.test"), ("deny", "socks5", "denied.test")} <= decisions, seen["events"]


def test_without_an_allowlist_unix_sockets_stay_open(root_runner, client_control):
    """Control for the AF_UNIX rule: strict without an allowlist (loopback mode) lets the same
    client make a unix socket, so the refusal above is the allowlist's seccomp rule."""
    workdir = root_runner.workdir()
    done = root_runner.run("run", "--workdir", str(workdir), "--", SYSTEM_PYTHON, "-I", "-S", "-c", CLIENT, "9")
    inside = parse_json_line(done.stdout)
    assert inside["unix"] == "opened" and inside["udp"] == "opened", inside
    assert inside["http_allowed"] == ECONNREFUSED, inside  # and no proxy listens without an allowlist


def _wheel() -> tuple[str, bytes]:
    name = "sbxdemo-1.0-py3-none-any.whl"
    files = {"sbxdemo/__init__.py": b"GREETING = 'installed through the allowlist'\n",
             "sbxdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sbxdemo\nVersion: 1.0\n",
             "sbxdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: sbx-tests\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n"}
    record = ""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
            digest = hashlib.sha256(data).digest()
            import base64

            record += f"{path},sha256={base64.urlsafe_b64encode(digest).rstrip(b'=').decode()},{len(data)}\n"
        record += "sbxdemo-1.0.dist-info/RECORD,,\n"
        wheel.writestr("sbxdemo-1.0.dist-info/RECORD", record)
    return name, buffer.getvalue()


@pytest.mark.parametrize("tier", TIERS)
def test_pip_installs_from_a_package_index_served_under_an_allowed_name(runner, tier):
    import os
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    index = Path(tempfile.mkdtemp(prefix="sbx-index-", dir="/tmp"))  # the server may run as uid 65534
    os.chmod(index, 0o755)
    name, data = _wheel()
    (index / "simple" / "sbxdemo").mkdir(parents=True)
    (index / name).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    (index / "simple" / "sbxdemo" / "index.html").write_text(
        f'<html><body><a href="/{name}#sha256={sha}">{name}</a></body></html>\n')
    for path in index.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    venv = os.path.dirname(os.path.dirname(sys.executable))  # the suite's venv: it has pip
    probe = ("import sys; sys.path.insert(0, 'target'); import sbxdemo; print(sbxdemo.GREETING)")
    argv = ["/bin/sh", "-c",
            f"{sys.executable} -I -m pip install --quiet --no-cache-dir --disable-pip-version-check "
            "--trusted-host pkg.test --index-url http://pkg.test:PORT/simple/ --target target sbxdemo"
            f" && {SYSTEM_PYTHON} -I -S -c \"{probe}\""]
    try:
        seen = run_host(runner, tier, argv, index_dir=str(index), ro_binds=[venv])
    finally:
        shutil.rmtree(index)
    assert seen["tier"] == tier
    assert seen["status"] == 0, seen
    assert seen["stdout"].strip().endswith("installed through the allowlist"), seen
    assert any(e["action"] == "allow" and e["protocol"] == "http" and e["host"] == "pkg.test" for e in seen["events"])


def test_cli_allows_a_listed_address_and_logs_every_decision(root_runner, client_control, tmp_path):
    """The CLI, with no injected resolver: an IP literal the user listed is reached; a name
    that is not listed is denied; both are in --net-log (JSON lines) and on --verbose."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def serve() -> None:
        peer, _ = server.accept()
        peer.sendall(b"echo:" + peer.recv(100))
        peer.close()

    threading.Thread(target=serve, daemon=True).start()
    workdir = root_runner.workdir()
    log = tmp_path / "net.jsonl"
    client = CLIENT.replace('connect_http("echo.test"', 'connect_http("127.0.0.1"')
    done = root_runner.run("run", "--verbose", "--workdir", str(workdir), "--allow-host", f"127.0.0.1:{port}",
                           "--net-log", str(log), "--", SYSTEM_PYTHON, "-I", "-S", "-c", client, str(port))
    server.close()
    assert done.returncode == 0, done.stderr
    assert verbose_tier(done.stderr) == "KernelFull"
    inside = parse_json_line(done.stdout)
    assert inside["http_allowed"] == ["HTTP/1.1 200 Connection established", "echo:hello\n"], inside
    assert inside["http_denied"][0].startswith("HTTP/1.1 403"), inside
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [list(e) for e in events][0] == ["time", "action", "protocol", "host", "port", "reason"]
    assert ("allow", "127.0.0.1", port) in {(e["action"], e["host"], e["port"]) for e in events}, events
    assert ("deny", "denied.test", 443) in {(e["action"], e["host"], e["port"]) for e in events}, events
    assert f"sbx: net: allow 127.0.0.1:{port} (http-connect)" in done.stderr, done.stderr
    assert "sbx: net: deny denied.test:443 (http-connect): " in done.stderr, done.stderr


def test_dry_run_shows_the_allowlist_and_the_socket_rule(root_runner):
    workdir = root_runner.workdir()
    done = root_runner.run("run", "--dry-run", "--workdir", str(workdir), "--allow-host", "pypi.org",
                           "--allow-host", "*.pythonhosted.org", "--", "true")
    assert done.returncode == 0, done.stderr
    assert "network: allowlist through sbx's proxy at 127.0.0.1:3128" in done.stdout
    assert "allowed: pypi.org, *.pythonhosted.org" in done.stdout
    assert "new AF_UNIX sockets, datagram (UDP)" in done.stdout
    assert "HTTPS_PROXY=http://127.0.0.1:3128" in done.stdout


@pytest.mark.parametrize("argv, code, text", [
    (["--allow-host", "pypi.org", "--share-net"], "usage", "the host network is shared"),
    (["--allow-host", "*"], "usage", "*"),
    (["--allow-host", "https://pypi.org"], "usage", "https://pypi.org"),
    (["--allow-host", "pypi.org:0"], "usage", "pypi.org:0"),
    (["--net-log", "/tmp/x.jsonl"], "usage", "--net-log without a network allowlist"),
    (["--allow-host", "pypi.org", "--tier", "EnvironmentOnly", "--allow-degraded"], "usage", "EnvironmentOnly"),
    (["--allow-host", "pypi.org", "--tier", "KernelNoNamespaces", "--allow-degraded"], "usage", "KernelNoNamespaces"),
])
def test_bad_allowlist_requests_are_refused_cleanly(root_runner, argv, code, text):
    workdir = root_runner.workdir()
    done = root_runner.run("run", "--workdir", str(workdir), *argv, "--", "true")
    assert done.returncode == 125, done
    assert done.stderr.startswith(f"sbx: error: {code}: "), done.stderr
    assert text in done.stderr.splitlines()[0] and "Traceback" not in done.stderr, done.stderr
    assert "sbx: remedy: " in done.stderr


def test_net_log_refuses_a_fifo_without_blocking(root_runner, tmp_path):
    import os

    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    workdir = root_runner.workdir()
    done = root_runner.run("run", "--workdir", str(workdir), "--allow-host", "pypi.org", "--net-log", str(fifo),
                           "--", "true", timeout=30)
    assert done.returncode == 125 and "is not a regular file" in done.stderr, done


def test_doctor_check_passes_here_and_fails_without_a_network_namespace():
    from sandbox.netcheck import allowlist_check
    from sandbox.tiers import Tier

    passed = allowlist_check(Tier.KernelFull)
    assert passed.ok, passed
    refused = allowlist_check(Tier.EnvironmentOnly)  # the control: a tier that cannot have it
    assert not refused.ok and "no network namespace" in refused.detail, refused


def _bridge_listeners() -> list[int]:
    """This process's descriptors that are a sandbox's bridge listener (127.0.0.1:3128)."""
    import os

    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with probe:
            try:
                if probe.family == socket.AF_INET and probe.getsockname() == ("127.0.0.1", 3128):
                    found.append(fd)
            except OSError:
                pass
    return found


def test_the_bridge_listener_never_leaks_into_other_children_of_the_host(tmp_path):
    """The listener sbx receives is close-on-exec in the host process, and gone when the
    sandbox ends (the control: it is there, and found, while the sandbox runs)."""
    import os

    from sandbox import Sandbox

    sandbox = Sandbox("strict", str(tmp_path), allow_hosts=["pypi.org"])
    process = sandbox.spawn(["sleep", "30"])
    try:
        listeners = _bridge_listeners()
        assert len(listeners) == 1, listeners
        assert not os.get_inheritable(listeners[0])
    finally:
        process.kill_sandbox()
        process.wait()
    assert _bridge_listeners() == []


def test_net_log_never_follows_a_planted_directory_link_nor_lies_where_the_sandbox_writes(root_runner, tmp_path):
    """An earlier run could plant ``logs -> /somewhere`` in its workdir; and a log inside the
    workdir could be rewritten by the command it records. Both are refused, nothing written."""
    workdir = root_runner.workdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "net.jsonl").write_text("precious\n")
    (workdir / "logs").symlink_to(victim)
    elsewhere = tmp_path / "real"
    elsewhere.mkdir()
    for log, text in ((workdir / "logs" / "net.jsonl", "without following a link"),
                      (workdir / "net.jsonl", "which the sandbox can write")):
        done = root_runner.run("run", "--workdir", str(workdir), "--allow-host", "pypi.org", "--net-log", str(log),
                               "--", "true")
        assert done.returncode == 125 and text in done.stderr and "Traceback" not in done.stderr, done
    assert (victim / "net.jsonl").read_text() == "precious\n" and not (workdir / "net.jsonl").exists()
    # A hard link whose other name is in the workdir: refused before anything is truncated.
    (workdir / "target").write_text("precious\n")
    linked = elsewhere / "linked.jsonl"
    linked.hardlink_to(workdir / "target")
    done = root_runner.run("run", "--workdir", str(workdir), "--allow-host", "pypi.org", "--net-log", str(linked),
                           "--", "true")
    assert done.returncode == 125 and "hard links" in done.stderr, done
    assert (workdir / "target").read_text() == "precious\n"
    linked.unlink()
    # Control: the same run with the log in a plain directory outside the workdir is fine.
    done = root_runner.run("run", "--workdir", str(workdir), "--allow-host", "pypi.org", "--net-log",
                           str(elsewhere / "net.jsonl"), "--", "true")
    assert done.returncode == 0 and (elsewhere / "net.jsonl").exists(), done
