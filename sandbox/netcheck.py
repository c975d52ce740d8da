"""``sbx doctor``'s check of the network allowlist: a real run, not a guess.

It starts a one-shot server on the host's 127.0.0.1, names it ``doctor.sbx.test`` through
an injected resolver, and runs a client in a strict sandbox that allows only that name: the
client must get through by HTTP CONNECT, and be refused for a name that is not listed.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading

from .errors import SandboxError
from .probes import Check

ALLOWED, DENIED = "doctor.sbx.test", "denied.sbx.test"

CLIENT = r"""
import socket, sys
def connect(host, port):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    status = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else "none"
    if status == "200":
        s.sendall(b"ping")
        status += ":" + s.recv(4).decode()
    return status
print(connect(sys.argv[1], int(sys.argv[2])), connect(sys.argv[3], 443))
"""


def allowlist_check(tier) -> Check:
    """Whether a sandbox at ``tier`` reaches an allowed host through the proxy, and only it."""
    name = "network-allowlist"
    if not tier.uses_bwrap:
        return Check(name, False, f"tier {tier.name} has no network namespace, so an allowlist is refused",
                     "run where bwrap can create user namespaces (see the checks above)")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(30)
    port = server.getsockname()[1]

    def answer() -> None:
        try:
            peer, _ = server.accept()
            with peer:
                peer.sendall(peer.recv(4))
        except OSError:
            pass

    async def resolver(host: str, _port: int) -> list[str]:
        if host == ALLOWED:
            return ["127.0.0.1"]
        raise LookupError(host)

    threading.Thread(target=answer, daemon=True).start()
    workdir = tempfile.mkdtemp(prefix="sbx-doctor-")
    python = os.path.realpath(sys.executable)
    # The interpreter's own prefix, shown read-only when strict's /usr does not hold it.
    extra = [] if python.startswith("/usr/") else [sys.base_prefix]
    try:
        from .api import Sandbox

        sandbox = Sandbox("strict", workdir, tier=tier, allow_degraded=True, ro_binds=extra,
                          allow_hosts=[f"{ALLOWED}:{port}"], network_resolver=resolver)
        result = sandbox.run([python, "-I", "-S", "-c", CLIENT, ALLOWED, str(port), DENIED],
                             capture_output=True, text=True, timeout=30)
    except SandboxError as exc:
        return Check(name, False, f"a sandbox with an allowlist could not run: {exc}", exc.remedy)
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    said = result.stdout.split()
    if result.returncode == 0 and said == ["200:ping", "403"]:
        return Check(name, True, "an allowed name is reached through the proxy, another is refused (403)")
    return Check(name, False, f"the proxy check failed (status {result.returncode}, saw {said}; "
                 f"{result.stderr.strip()[-200:]})", "run 'sbx verify' and report the output")
