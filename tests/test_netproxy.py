"""The network allowlist's proxy (sandbox/netproxy.py): parsing, the pure decision, and the
served proxy end to end over the host's 127.0.0.1.

A plain listener on 127.0.0.1:0 stands in for the one sbx makes inside a sandbox's network
namespace; upstreams are small threaded servers on 127.0.0.1; names like "pkg.test" resolve
through a recording resolver, which lets every test check that a denied name never reached it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import queue
import socket
import struct
import threading
import time

import pytest

from sandbox.errors import UsageError
from sandbox.netproxy import AllowRule, NetEvent, SystemResolver, decide, parse_allow, parse_allowlist, service

WAIT = 5.0  # seconds any single expected thing may take before a test fails


# ---------------------------------------------------------------------------------------
# Helpers


class Upstream:
    """A threaded TCP server on 127.0.0.1. ``echo``: sends back what it reads until EOF.
    ``http``: reads to EOF, records it, answers one fixed response and closes."""

    RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\nConnection: close\r\n\r\nupstream"

    def __init__(self, mode: str, address: str = "127.0.0.1") -> None:
        self.mode = mode
        self.server = socket.create_server((address, 0), family=socket.AF_INET6 if ":" in address else socket.AF_INET)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.received: list[bytes] = []
        self.eofs = 0  # connections that ended with the client's EOF (not a timeout or a reset)
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(WAIT)
        data = bytearray()
        try:
            while chunk := conn.recv(1 << 18):
                if self.mode == "echo":
                    conn.sendall(chunk)
                data += chunk
            self.eofs += 1
            if self.mode == "http":
                conn.sendall(self.RESPONSE)
        except OSError:
            pass
        finally:
            self.received.append(bytes(data))
            conn.close()
            self.done.set()

    def close(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close alone would not
        except OSError:
            pass
        self.server.close()


class RecordingResolver:
    """Test names to 127.0.0.1; records every call (a denied name must never appear)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        if host not in self.names:
            raise LookupError(f"{host} is not a test name")
        return [self.names[host]]


class Proxy:
    """A listener on 127.0.0.1:0 served by the process-wide ProxyService."""

    def __init__(self, rules, *, on_event=None, resolver="recording", **options) -> None:
        self.events: queue.Queue[NetEvent] = queue.Queue()
        self.clients: list[socket.socket] = []
        self.resolver = RecordingResolver({"pkg.test": "127.0.0.1", "other.test": "127.0.0.1", "gone.test": "127.0.0.1"})
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self.handle = service().serve(listener, rules, on_event=on_event or self.events.put,
                                      resolver=self.resolver if resolver == "recording" else resolver, **options)

    def connect(self) -> socket.socket:
        self.clients.append(socket.create_connection(("127.0.0.1", self.port), timeout=WAIT))
        return self.clients[-1]

    def event(self) -> NetEvent:
        return self.events.get(timeout=WAIT)

    def no_more_events(self) -> None:
        with pytest.raises(queue.Empty):
            self.events.get(timeout=0.05)


@pytest.fixture
def proxies():
    made: list[Proxy] = []

    def make(rules, **options) -> Proxy:
        made.append(Proxy(rules, **options))
        return made[-1]

    yield make
    for proxy in made:
        proxy.handle.close()
        for client in proxy.clients:
            client.close()


@pytest.fixture
def upstreams():
    made: list[Upstream] = []

    def make(mode: str = "echo", address: str = "127.0.0.1") -> Upstream:
        made.append(Upstream(mode, address))
        return made[-1]

    yield make
    for upstream in made:
        upstream.close()


def read_until_close(client: socket.socket) -> bytes:
    data = bytearray()
    try:
        while chunk := client.recv(1 << 16):
            data += chunk
    except ConnectionResetError:
        pass
    return bytes(data)


def read_head(client: socket.socket) -> bytes:
    data = bytearray()
    while b"\r\n\r\n" not in data:
        chunk = client.recv(1)
        assert chunk, f"closed after {bytes(data)!r}"
        data += chunk
    return bytes(data)


def recv_exactly(client: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = client.recv(count - len(data))
        assert chunk, f"closed after {bytes(data)!r}"
        data += chunk
    return bytes(data)


def socks_request(client: socket.socket, address: bytes, port: int, *, command: int = 1, address_type: int = 3) -> bytes:
    """Greets (no authentication), sends a request, returns the 10-byte reply."""
    client.sendall(b"\x05\x01\x00")
    assert recv_exactly(client, 2) == b"\x05\x00"
    if address_type == 3:
        address = bytes([len(address)]) + address
    client.sendall(bytes([5, command, 0, address_type]) + address + struct.pack(">H", port))
    return recv_exactly(client, 10)


def closed_port() -> int:
    """A port of 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return unused.getsockname()[1]


def wait_until(condition, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------
# parse_allow


@pytest.mark.parametrize("entry, host, port, text", [
    ("pypi.org", "pypi.org", None, "pypi.org"),
    ("PyPI.Org.", "pypi.org", None, "pypi.org"),
    ("github.com:443", "github.com", 443, "github.com:443"),
    ("*.pythonhosted.org", "*.pythonhosted.org", None, "*.pythonhosted.org"),
    ("*.X.org:8443", "*.x.org", 8443, "*.x.org:8443"),
    ("10.0.0.5", "10.0.0.5", None, "10.0.0.5"),
    ("10.0.0.5:8080", "10.0.0.5", 8080, "10.0.0.5:8080"),
    ("[::1]", "::1", None, "[::1]"),
    ("[::1]:8080", "::1", 8080, "[::1]:8080"),
    ("[2001:DB8:0::1]:443", "2001:db8::1", 443, "[2001:db8::1]:443"),
    ("xn--bcher-kva.example:65535", "xn--bcher-kva.example", 65535, "xn--bcher-kva.example:65535"),
    ("a-b.c1", "a-b.c1", None, "a-b.c1"),
    ("localhost:1", "localhost", 1, "localhost:1"),
])
def test_parse_allow_accepts_each_form_and_prints_it_canonically(entry, host, port, text):
    rule = parse_allow(entry)
    assert rule == AllowRule(host, port)
    assert str(rule) == text
    assert parse_allow(str(rule)) == rule  # the canonical text parses to the same rule


@pytest.mark.parametrize("entry", [
    "", " pypi.org", "pypi.org ", "py pi.org", "pypi.org\n", "pypi\x00.org", "pypi.org\t", "pypi.\x7forg", "bücher.example",
    "*", "*:443", "*.", "*.com", "*.com:443", "a.*.org", "*a.org", "*.*.org", "pypi.*", "**.x.org",
    "a..b", ".a.b", "-a.org", "a-.org", "a_b.org", "x" * 64 + ".org", ".".join(["a" * 63] * 4) + ".b",
    "pypi.org:0", "pypi.org:65536", "pypi.org:", "pypi.org:http", "pypi.org:+80", "pypi.org:99999999", "pypi.org:4_43",
    "pypi.org:443:1", "https://pypi.org", "http://pypi.org:80", "user@pypi.org", "pypi.org/simple", "pypi.org?x",
    "::1", "2001:db8::1", "[::1", "[::1]x", "[::1]:", "[10.0.0.5]", "[fe80::1%eth0]", "[pypi.org]",
    "127.1", "0x7f000001", "0177.0.0.1", "010.0.0.5", "1.2.3.4.5", "999.1.1.1", "example.123",
])
def test_parse_allow_refuses_malformed_entries(entry):
    with pytest.raises(UsageError) as refused:
        parse_allow(entry)
    assert repr(entry)[:60] in refused.value.message or len(repr(entry)) > 80
    assert "is refused: " in refused.value.message
    assert "HOST:PORT" in refused.value.remedy


@pytest.mark.parametrize("entry, why", [
    ("https://pypi.org", "URL scheme"), ("2001:db8::1", "in brackets"), ("::1", "in brackets"), ("*.com", "two labels"),
    ("pypi.org:", "empty"), ("user@pypi.org", "user information"), ("pypi.org/simple", "a path"), ("127.1", "dotted-quad"),
])
def test_parse_allow_says_why(entry, why):
    with pytest.raises(UsageError, match=why):
        parse_allow(entry)


@pytest.mark.parametrize("entry", [None, 443, b"pypi.org", ["pypi.org"]])
def test_parse_allow_refuses_what_is_not_a_string(entry):
    with pytest.raises(UsageError, match="not a string"):
        parse_allow(entry)


def test_parse_allowlist_deduplicates_in_order_and_refuses_one_string():
    rules = parse_allowlist(["b.org", "A.org", "a.org.", AllowRule("b.org", None), "a.org:443"])
    assert rules == (AllowRule("b.org", None), AllowRule("a.org", None), AllowRule("a.org", 443))
    with pytest.raises(UsageError, match="not one string"):
        parse_allowlist("pypi.org")
    with pytest.raises(UsageError):
        parse_allowlist([AllowRule("*", None)])  # a hand-made rule is checked too


# ---------------------------------------------------------------------------------------
# decide


def rules_of(*entries: str) -> tuple[AllowRule, ...]:
    return parse_allowlist(entries)


def test_decide_exact_names_with_the_default_ports():
    rules = rules_of("pypi.org", "github.com:22")
    assert decide(rules, "pypi.org", 443) is None
    assert decide(rules, "pypi.org", 80) is None
    assert decide(rules, "PyPI.ORG.", 443) is None  # case and one trailing dot do not matter
    assert decide(rules, "pypi.org", 8080) == "pypi.org:8080 is not in this sandbox's network allowlist"
    assert decide(rules, "github.com", 22) is None
    assert decide(rules, "github.com", 443) is not None  # an explicit port is the only port
    assert decide(rules, "files.pypi.org", 443) is not None  # exact means exact
    assert decide(rules, "evil.example", 443) == "evil.example:443 is not in this sandbox's network allowlist"
    assert decide((), "pypi.org", 443) is not None


def test_decide_wildcards_match_strictly_below_the_suffix():
    rules = rules_of("*.x.org")
    assert decide(rules, "a.x.org", 443) is None
    assert decide(rules, "a.b.x.org", 80) is None
    assert decide(rules, "x.org", 443) is not None
    assert decide(rules, "evilx.org", 443) is not None
    assert decide(rules, "x.org.evil.example", 443) is not None
    assert decide(rules, "a.x.org", 22) is not None


def test_decide_ip_literals_need_an_equal_ip_rule():
    rules = rules_of("10.0.0.5:8080", "[2001:db8::1]", "pypi.org")
    assert decide(rules, "10.0.0.5", 8080) is None
    assert decide(rules, "10.0.0.6", 8080) is not None
    assert decide(rules, "[2001:DB8:0:0::1]", 443) is None  # brackets, case and zero runs are canonicalised
    assert decide(rules, "2001:db8::1", 80) is None
    assert decide(rules, "[2001:db8::1]", 8080) == "[2001:db8::1]:8080 is not in this sandbox's network allowlist"
    assert decide(rules_of("*.0.org", "pypi.org"), "151.101.0.223", 443) is not None  # a name rule never allows an IP
    assert decide(rules, "::ffff:10.0.0.5", 8080) is not None  # another spelling of the address is another literal


@pytest.mark.parametrize("host", [
    "", ".", "pypi.org\x00", "pypi.org\x00.evil.example", "pypi .org", " pypi.org", "pypi.org\r\n", "a..b", "pypi.org..",
    ".pypi.org", "x" * 64 + ".org", ".".join(["a" * 63] * 4) + ".b", "\u212a.pypi.org", "pypı.org", "pypi.org:443",
    "[pypi.org]", "[10.0.0.5]", "[::1", "fe80::1%eth0", "*.pypi.org", "pypi_org", "127.1", "0x7f000001", "0177.0.0.1",
    "2130706433", None, 443, b"pypi.org\xff",
])
def test_decide_refuses_malformed_hosts(host):
    rules = rules_of("pypi.org", "*.pypi.org")  # these would allow the well-formed neighbours
    reason = decide(rules, host, 443)
    assert reason is not None and reason.startswith("malformed host name"), reason


@pytest.mark.parametrize("port", [0, -1, 65536, "443", 443.0, True, None])
def test_decide_refuses_malformed_ports(port):
    assert decide(rules_of("pypi.org:443", "pypi.org"), "pypi.org", port) == "malformed port"


def test_decide_accepts_bytes_of_a_well_formed_name():
    assert decide(rules_of("pypi.org"), b"pypi.org", 443) is None


def test_net_event_is_one_json_line_in_field_order():
    event = NetEvent(1.5, "deny", "socks5", "'a\\nb'", 0, "malformed host name\n(x)")
    line = event.to_json()
    assert "\n" not in line
    assert list(json.loads(line)) == ["time", "action", "protocol", "host", "port", "reason"]
    assert json.loads(line)["reason"] == "malformed host name\n(x)"


# ---------------------------------------------------------------------------------------
# SystemResolver


def fake_getaddrinfo(*addresses: str):
    def getaddrinfo(host, port, type=0):
        assert type == socket.SOCK_STREAM
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port, 0, 0) if ":" in a else (a, port)) for a in addresses]
    return getaddrinfo


def resolve(resolver: SystemResolver, host: str = "pkg.test", port: int = 443):
    return asyncio.run(resolver(host, port))


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "169.254.169.254", "::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1",
    "fe80::1", "0.0.0.0", "0.1.2.3", "::", "224.0.0.1", "ff02::1", "240.0.0.1", "255.255.255.255", "fd00:ec2::254",
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "2002:a9fe:a9fe::1", "100.100.100.200",
])
def test_system_resolver_drops_host_local_addresses(address):
    with pytest.raises(LookupError, match="resolves only to host-local or private addresses"):
        resolve(SystemResolver(fake_getaddrinfo(address)))


def test_system_resolver_keeps_public_addresses_in_order_without_duplicates():
    resolver = SystemResolver(fake_getaddrinfo("127.0.0.1", "151.101.0.223", "2a04:4e42::223", "151.101.0.223", "169.254.169.254",
                                               "64:ff9b::9765:df", "::ffff:151.101.0.223", "10.1.2.3"))
    # NAT64 and mapped forms of a public address reach that address; private ones are dropped.
    assert resolve(resolver) == ["151.101.0.223", "2a04:4e42::223", "64:ff9b::9765:df", "::ffff:9765:df"]


@pytest.mark.parametrize("address", ["10.1.2.3", "172.17.0.1", "192.168.1.1", "100.64.0.1", "fd12:3456::1",
                                     "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:c0a8:101::1", "fec0::1",
                                     "2001:0:4136:e378:8000:63bf:3fff:fdd2"])
def test_system_resolver_drops_private_addresses_unless_listed(address):
    """A container's host (172.17.0.1), a cluster's services, a home router: reachable only
    when the user lists the address itself as an IP-literal entry."""
    with pytest.raises(LookupError, match="list the address itself"):
        resolve(SystemResolver(fake_getaddrinfo(address)))
    listed = str(ipaddress.ip_address(address))
    assert resolve(SystemResolver(fake_getaddrinfo(address), listed=[listed])) == [listed]


@pytest.mark.parametrize("address", ["203.0.113.80", "198.51.100.7", "172.32.0.1", "100.128.0.1", "192.169.0.1"])
def test_system_resolver_keeps_addresses_just_outside_the_private_networks(address, monkeypatch):
    import sandbox.netproxy as netproxy

    monkeypatch.setattr(netproxy, "host_addresses", lambda: frozenset())
    assert resolve(SystemResolver(fake_getaddrinfo(address))) == [address]


def test_system_resolver_drops_the_hosts_own_interface_addresses(monkeypatch):
    import sandbox.netproxy as netproxy

    # Control: a public address passes while it is not one of this host's own.
    assert resolve(SystemResolver(fake_getaddrinfo("151.101.0.223"))) == ["151.101.0.223"]
    monkeypatch.setattr(netproxy, "host_addresses", lambda: frozenset({"151.101.0.223"}))
    # The address itself, and every IPv6 form that reaches it (a dual-stack socket connects
    # ::ffff:a.b.c.d to a.b.c.d): mapped, NAT64, 6to4.
    for form in ("151.101.0.223", "::ffff:151.101.0.223", "64:ff9b::9765:df", "2002:9765:df::1"):
        with pytest.raises(LookupError):
            resolve(SystemResolver(fake_getaddrinfo(form)))


def test_host_addresses_reads_this_hosts_interfaces():
    from sandbox.netproxy import host_addresses

    found = host_addresses()
    assert "127.0.0.1" in found and "::1" in found, found


def test_system_resolver_turns_failures_into_lookup_errors():
    def failing(host, port, type=0):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(LookupError, match="not known"):
        resolve(SystemResolver(failing))

    async def asynchronous(host, port, type=0):
        return fake_getaddrinfo("151.101.0.223")(host, port, type)

    assert resolve(SystemResolver(asynchronous)) == ["151.101.0.223"]


# ---------------------------------------------------------------------------------------
# CONNECT


def test_allowed_connect_relays_both_ways_intact(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    client = proxy.connect()
    client.sendall(f"CONNECT pkg.test:{upstream.port} HTTP/1.1\r\nHost: pkg.test:{upstream.port}\r\n\r\n".encode())
    assert read_head(client) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert proxy.event()[1:] == ("allow", "http-connect", "pkg.test", upstream.port, "")
    payload = os.urandom(4 * 1024 * 1024)
    sender = threading.Thread(target=lambda: (client.sendall(payload), client.shutdown(socket.SHUT_WR)))
    sender.start()
    echoed = read_until_close(client)  # the upstream's EOF comes through after our own
    sender.join()
    assert len(echoed) == len(payload) and echoed == payload
    assert upstream.eofs == 1  # our half-close reached the upstream as an EOF
    assert proxy.resolver.calls == [("pkg.test", upstream.port)]
    wait_until(lambda: proxy.handle.connections == 0)


def test_connect_to_an_ipv6_literal_in_brackets_is_decided_on_the_address(proxies, upstreams):
    upstream = upstreams("echo", "::1")
    proxy = proxies([f"[::1]:{upstream.port}"])
    client = proxy.connect()
    client.sendall(f"CONNECT [0:0::1]:{upstream.port} HTTP/1.1\r\n\r\nping".encode())
    assert read_head(client) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert recv_exactly(client, 4) == b"ping"
    assert proxy.event()[1:4] == ("allow", "http-connect", "::1")
    assert proxy.resolver.calls == []  # an address is never resolved
    client = proxy.connect()
    client.sendall(f"CONNECT [::2]:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    assert read_until_close(client).startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert proxy.event()[1:] == ("deny", "http-connect", "::2", upstream.port,
                                 f"[::2]:{upstream.port} is not in this sandbox's network allowlist")


def test_denied_connect_is_403_with_the_reason_and_never_resolved(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    client = proxy.connect()
    client.sendall(f"CONNECT evil.test:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    reply = read_until_close(client)
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 403 Forbidden"
    assert b"Content-Type: text/plain" in lines and b"Connection: close" in lines
    assert f"Content-Length: {len(body)}".encode() in lines
    assert body == f"sbx: evil.test:{upstream.port} is not in this sandbox's network allowlist\n".encode()
    event = proxy.event()
    assert event[1:] == ("deny", "http-connect", "evil.test", upstream.port,
                         f"evil.test:{upstream.port} is not in this sandbox's network allowlist")
    assert isinstance(event.time, float) and abs(event.time - time.time()) < 60
    assert proxy.resolver.calls == []
    assert upstream.connections == 0


def test_a_denied_request_with_a_body_gets_its_reply_and_no_reset(proxies):
    # The proxy never reads the body; closing on unread input would reset the connection, and
    # the client would fail in its upload instead of reading the 403. It lingers (discarding)
    # until the client has sent everything.
    proxy = proxies(["pkg.test:443"])
    client = proxy.connect()
    body = bytes(4 * 1024 * 1024)
    upload_errors = []

    def upload():
        try:
            client.sendall(f"POST http://evil.test/ HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            client.shutdown(socket.SHUT_WR)
        except OSError as error:
            upload_errors.append(error)

    sender = threading.Thread(target=upload)
    sender.start()
    reply = read_until_close(client)
    sender.join()
    assert upload_errors == []
    assert reply.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert reply.endswith(b"sbx: evil.test:80 is not in this sandbox's network allowlist\n")


def test_malformed_connect_host_is_400_and_reported_safely(proxies):
    proxy = proxies(["pkg.test:443", "*.pkg.test:443"])
    client = proxy.connect()
    client.sendall(b"CONNECT pkg.test\x01.evil:443 HTTP/1.1\r\n\r\n")
    assert read_until_close(client).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    event = proxy.event()
    assert event.action == "deny" and event.reason.startswith("malformed")
    assert event.host == repr("pkg.test\x01.evil:443")  # the target as asked, shown safely, not raw
    assert proxy.resolver.calls == []


def test_second_connect_inside_an_allowed_tunnel_goes_to_the_checked_host(proxies, upstreams):
    allowed, other = upstreams("echo"), upstreams("echo")
    proxy = proxies([f"pkg.test:{allowed.port}", f"other.test:{other.port}"])
    client = proxy.connect()
    inner = f"CONNECT other.test:{other.port} HTTP/1.1\r\n\r\nhello".encode()
    # Pipelined: the inner CONNECT is sent before the proxy has even answered the first.
    client.sendall(f"CONNECT pkg.test:{allowed.port} HTTP/1.1\r\n\r\n".encode() + inner)
    client.shutdown(socket.SHUT_WR)
    assert read_until_close(client) == b"HTTP/1.1 200 Connection established\r\n\r\n" + inner  # echoed by the first
    assert allowed.done.wait(WAIT) and allowed.received == [inner]
    assert other.connections == 0
    assert proxy.resolver.calls == [("pkg.test", allowed.port)]


def test_connect_failure_is_502_and_an_error_event(proxies, upstreams):
    port = closed_port()
    proxy = proxies([f"pkg.test:{port}", f"nowhere.test:{port}"])
    client = proxy.connect()
    client.sendall(f"CONNECT pkg.test:{port} HTTP/1.1\r\n\r\n".encode())
    reply = read_until_close(client)
    assert reply.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and b"cannot connect to pkg.test" in reply
    event = proxy.event()
    assert event[1:4] == ("error", "http-connect", "pkg.test") and "cannot connect" in event.reason
    client = proxy.connect()
    client.sendall(f"CONNECT nowhere.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert read_until_close(client).startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert proxy.event()[1:4] == ("error", "http-connect", "nowhere.test")


def test_a_plain_function_resolver_works_too(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"pkg.test:{upstream.port}"], resolver=lambda host, port: ["127.0.0.1"])
    client = proxy.connect()
    client.sendall(f"CONNECT pkg.test:{upstream.port} HTTP/1.1\r\n\r\nping".encode())
    assert read_head(client) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert recv_exactly(client, 4) == b"ping"


def test_a_resolver_answer_that_is_not_an_address_is_not_resolved_again(proxies, upstreams):
    upstream = upstreams("echo")

    async def naming_resolver(host, port):
        return ["localhost"]

    proxy = proxies([f"pkg.test:{upstream.port}"], resolver=naming_resolver)
    client = proxy.connect()
    client.sendall(f"CONNECT pkg.test:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    assert read_until_close(client).startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert proxy.event().reason == "the resolver gave no usable address for pkg.test"
    assert upstream.connections == 0


def test_default_resolver_never_connects_an_allowed_name_to_this_host(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"localhost:{upstream.port}"], resolver=None)  # SystemResolver: /etc/hosts says loopback
    client = proxy.connect()
    client.sendall(f"CONNECT localhost:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    reply = read_until_close(client)
    assert reply.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert proxy.event()[1:3] == ("error", "http-connect")
    assert upstream.connections == 0


# ---------------------------------------------------------------------------------------
# Plain HTTP


def test_plain_http_reaches_the_upstream_in_origin_form_with_connection_close(proxies, upstreams):
    upstream = upstreams("http")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    client = proxy.connect()
    client.sendall((f"GET http://PKG.test:{upstream.port}/simple/x?y=1#frag HTTP/1.1\r\n"
                    f"Host: pkg.test:{upstream.port}\r\nUser-Agent: t\r\nProxy-Connection: keep-alive\r\n"
                    "Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
                    "Keep-Alive: 5\r\nTE: trailers\r\nTrailer: x\r\nUpgrade: h2c\r\nX-Keep: 2\r\n\r\n").encode())
    client.shutdown(socket.SHUT_WR)
    assert read_until_close(client) == Upstream.RESPONSE
    assert upstream.done.wait(WAIT)
    assert upstream.received == [(f"GET /simple/x?y=1 HTTP/1.1\r\nHost: pkg.test:{upstream.port}\r\nUser-Agent: t\r\n"
                                  "X-Keep: 2\r\nConnection: close\r\n\r\n").encode()]
    assert proxy.event()[1:] == ("allow", "http", "pkg.test", upstream.port, "")


def test_plain_http_without_a_host_header_gets_the_checked_one(proxies, upstreams):
    upstream = upstreams("http")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    client = proxy.connect()
    # Connection may not strip the framing or the proxy's own Host.
    client.sendall(f"POST http://pkg.test:{upstream.port} HTTP/1.0\r\nContent-Length: 4\r\nConnection: Content-Length, host\r\n"
                   "\r\nbody".encode())
    client.shutdown(socket.SHUT_WR)
    assert read_until_close(client) == Upstream.RESPONSE
    assert upstream.done.wait(WAIT)
    assert upstream.received == [(f"POST / HTTP/1.0\r\nHost: pkg.test:{upstream.port}\r\nContent-Length: 4\r\n"
                                  "Connection: close\r\n\r\nbody").encode()]


@pytest.mark.parametrize("host_header", ["other.test:{port}", "pkg.test", "pkg.test:1", "evil.test", "pkg.test:{port}\r\nHost: x"])
def test_plain_http_with_another_host_header_is_400_and_reaches_nobody(proxies, upstreams, host_header):
    upstream = upstreams("http")
    proxy = proxies([f"pkg.test:{upstream.port}", f"other.test:{upstream.port}"])
    client = proxy.connect()
    host_header = host_header.format(port=upstream.port)
    client.sendall(f"GET http://pkg.test:{upstream.port}/ HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode())
    assert read_until_close(client).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert proxy.event().action == "deny"
    assert upstream.connections == 0 and proxy.resolver.calls == []


def test_plain_http_host_header_with_the_default_port_is_the_same_authority(proxies):
    # Port 80 is the URL's default: "Host: pkg.test" names the same place; decided, then denied.
    proxy = proxies(["other.test"])
    client = proxy.connect()
    client.sendall(b"GET http://pkg.test/ HTTP/1.1\r\nHost: PKG.test:80\r\n\r\n")
    assert read_until_close(client).startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert proxy.event()[1:4] == ("deny", "http", "pkg.test")


def test_a_request_pipelined_behind_a_plain_one_goes_to_the_same_host(proxies, upstreams):
    allowed, other = upstreams("http"), upstreams("http")
    proxy = proxies([f"pkg.test:{allowed.port}", f"other.test:{other.port}"])
    client = proxy.connect()
    second = f"GET http://other.test:{other.port}/steal HTTP/1.1\r\nHost: other.test:{other.port}\r\n\r\n".encode()
    client.sendall(f"GET http://pkg.test:{allowed.port}/ HTTP/1.1\r\n\r\n".encode() + second)
    client.shutdown(socket.SHUT_WR)
    assert read_until_close(client) == Upstream.RESPONSE
    assert allowed.done.wait(WAIT)
    assert allowed.received[0].endswith(b"Connection: close\r\n\r\n" + second)  # verbatim, to the checked host
    assert other.connections == 0
    assert proxy.resolver.calls == [("pkg.test", allowed.port)]


@pytest.mark.parametrize("request_head, why", [
    (b"GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n", b"absolute http:// URL"),
    (b"GET https://pkg.test/ HTTP/1.1\r\n\r\n", b"https:// URLs go through a CONNECT tunnel"),
    (b"GET ftp://pkg.test/ HTTP/1.1\r\n\r\n", b"only http://"),
    (b"GET http://user@pkg.test/ HTTP/1.1\r\n\r\n", b"user information"),
    (b"GET http://pkg.test/ HTTP/2.0\r\n\r\n", b"request line"),
    (b"GET  http://pkg.test/ HTTP/1.1\r\n\r\n", b"request line"),
    (b"GET http://pkg.test/ HTTP/1.1\r\nX: a\nHost: evil.test\r\n\r\n", b"bare CR or LF"),
    (b"GET http://pkg.test/ HTTP/1.1\r\nX: a\r\n Host: evil.test\r\n\r\n", b"folding"),
    (b"GET http://pkg.test/ HTTP/1.1\r\nX : a\r\n\r\n", b"header line"),
    (b"CONNECT pkg.test HTTP/1.1\r\n\r\n", b"needs a port"),
    (b"CONNECT ::1:443 HTTP/1.1\r\n\r\n", b"brackets"),
    (b"CONNECT pkg.test:0 HTTP/1.1\r\n\r\n", b"malformed port"),
])
def test_malformed_or_unsupported_http_requests_are_400(proxies, upstreams, request_head, why):
    proxy = proxies(["pkg.test", "pkg.test:443", "[::1]:443"])
    client = proxy.connect()
    client.sendall(request_head)
    reply = read_until_close(client)
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n"), reply
    assert why in reply.partition(b"\r\n\r\n")[2]
    assert proxy.event().action == "deny"
    assert proxy.resolver.calls == []


def test_an_oversized_request_head_is_refused(proxies):
    proxy = proxies(["pkg.test"])
    client = proxy.connect()
    client.sendall(b"GET http://pkg.test/ HTTP/1.1\r\nX: " + b"a" * (70 * 1024))
    assert read_until_close(client).startswith(b"HTTP/1.1 431 ")
    assert proxy.event().action == "deny"
    assert proxy.resolver.calls == []


# ---------------------------------------------------------------------------------------
# SOCKS5


def test_socks5_domain_connect_relays(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    client = proxy.connect()
    assert socks_request(client, b"pkg.test", upstream.port) == b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    client.sendall(b"ping")
    assert recv_exactly(client, 4) == b"ping"
    assert proxy.event()[1:] == ("allow", "socks5", "pkg.test", upstream.port, "")
    assert proxy.resolver.calls == [("pkg.test", upstream.port)]


def test_socks5_ipv4_literal_connects_only_when_that_address_is_listed(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"127.0.0.1:{upstream.port}"])
    client = proxy.connect()
    assert socks_request(client, socket.inet_aton("127.0.0.1"), upstream.port, address_type=1)[1] == 0x00
    client.sendall(b"ping")
    assert recv_exactly(client, 4) == b"ping"
    assert proxy.event()[1:4] == ("allow", "socks5", "127.0.0.1")
    client = proxy.connect()
    reply = socks_request(client, socket.inet_aton("127.0.0.2"), upstream.port, address_type=1)
    assert reply[:2] == b"\x05\x02"
    assert read_until_close(client) == b""
    assert proxy.event()[1:] == ("deny", "socks5", "127.0.0.2", upstream.port,
                                 f"127.0.0.2:{upstream.port} is not in this sandbox's network allowlist")
    assert proxy.resolver.calls == []
    assert upstream.connections == 1


def test_socks5_denied_name_is_refused_before_resolution(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    client = proxy.connect()
    assert socks_request(client, b"other.test", upstream.port)[:2] == b"\x05\x02"
    assert socks_request(proxy.connect(), b"pkg.test\x00.evil", upstream.port)[:2] == b"\x05\x02"
    assert [proxy.event().action, proxy.event().action] == ["deny", "deny"]
    assert proxy.resolver.calls == [] and upstream.connections == 0


@pytest.mark.parametrize("command, name", [(2, "BIND"), (3, "UDP ASSOCIATE")])
def test_socks5_bind_and_udp_associate_are_not_supported(proxies, upstreams, command, name):
    upstream = upstreams("echo")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    client = proxy.connect()
    assert socks_request(client, b"pkg.test", upstream.port, command=command)[:2] == b"\x05\x07"
    event = proxy.event()
    assert event[1:4] == ("deny", "socks5", "pkg.test") and name in event.reason
    assert proxy.resolver.calls == [] and upstream.connections == 0


def test_socks5_without_the_no_authentication_method_is_refused(proxies):
    proxy = proxies(["pkg.test"])
    client = proxy.connect()
    client.sendall(b"\x05\x01\x02")  # username/password only
    assert read_until_close(client) == b"\x05\xff"
    assert proxy.event()[1:3] == ("deny", "socks5")


def test_socks5_failures_map_to_reply_codes(proxies, upstreams):
    port = closed_port()
    proxy = proxies([f"pkg.test:{port}", f"nowhere.test:{port}"])
    assert socks_request(proxy.connect(), b"pkg.test", port)[:2] == b"\x05\x05"  # connection refused
    assert socks_request(proxy.connect(), b"nowhere.test", port)[:2] == b"\x05\x04"  # name does not resolve
    assert [proxy.event().action, proxy.event().action] == ["error", "error"]


# ---------------------------------------------------------------------------------------
# Robustness and lifetime


def test_an_on_event_that_raises_does_not_break_the_connection(proxies, upstreams):
    upstream = upstreams("echo")
    calls = []

    def on_event(event):
        calls.append(event)
        raise RuntimeError("the caller's bug")

    proxy = proxies([f"pkg.test:{upstream.port}"], on_event=on_event)
    client = proxy.connect()
    client.sendall(f"CONNECT pkg.test:{upstream.port} HTTP/1.1\r\n\r\nping".encode())
    assert read_head(client) == b"HTTP/1.1 200 Connection established\r\n\r\n"
    assert recv_exactly(client, 4) == b"ping"
    assert [event.action for event in calls] == ["allow"]
    denied = proxy.connect()  # and the proxy goes on serving
    denied.sendall(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
    assert read_until_close(denied).startswith(b"HTTP/1.1 403 ")


def test_a_client_that_does_not_read_holds_the_upstream_back(proxies):
    # Flow control: the proxy stops reading the upstream while the client's side is full, so
    # a fast upstream and a slow client cost kernel buffers and a bounded proxy buffer, not
    # everything the upstream has.
    total, sent = 256 * 1024 * 1024, [0]
    flood_server = socket.create_server(("127.0.0.1", 0))
    port = flood_server.getsockname()[1]

    def flood():
        conn, _ = flood_server.accept()
        chunk = bytes(1024 * 1024)
        try:
            while sent[0] < total:
                conn.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=flood, daemon=True).start()
    proxy = proxies([f"pkg.test:{port}"])
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    proxy.clients.append(client)
    client.settimeout(WAIT)
    client.connect(("127.0.0.1", proxy.port))
    client.sendall(f"CONNECT pkg.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert read_head(client).startswith(b"HTTP/1.1 200 ")
    while True:  # until the upstream is stalled (or has sent everything)
        before = sent[0]
        time.sleep(0.2)
        if sent[0] in (before, total):
            break
    assert sent[0] < total // 2
    proxy.handle.close()
    flood_server.close()


def test_close_stops_the_listener_and_cuts_open_tunnels(proxies, upstreams):
    upstream = upstreams("echo")
    proxy = proxies([f"pkg.test:{upstream.port}"])
    tunnel = proxy.connect()
    tunnel.sendall(f"CONNECT pkg.test:{upstream.port} HTTP/1.1\r\n\r\nping".encode())
    assert read_head(tunnel).startswith(b"HTTP/1.1 200 ")
    assert recv_exactly(tunnel, 4) == b"ping"
    idle = proxy.connect()  # a client that has not sent its request yet
    wait_until(lambda: proxy.handle.connections == 2)
    started = time.monotonic()
    proxy.handle.close()
    assert time.monotonic() - started < 1.0
    assert proxy.handle.connections == 0
    assert read_until_close(tunnel) == b""
    assert read_until_close(idle) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT)
    assert upstream.done.wait(WAIT)  # the upstream side was cut too
    proxy.handle.close()  # idempotent


def test_close_from_several_threads_at_once(proxies):
    proxy = proxies(["pkg.test"])
    idle = proxy.connect()
    wait_until(lambda: proxy.handle.connections == 1)
    closers = [threading.Thread(target=proxy.handle.close) for _ in range(4)]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(WAIT)
    assert not any(closer.is_alive() for closer in closers)
    assert proxy.handle.connections == 0 and read_until_close(idle) == b""


def test_close_called_from_on_event_is_scheduled_not_deadlocked(proxies):
    handles = []
    proxy = proxies(["pkg.test"], on_event=lambda event: handles[0].close())  # runs on the proxy thread
    handles.append(proxy.handle)
    client = proxy.connect()
    started = time.monotonic()
    client.sendall(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
    read_until_close(client)
    wait_until(lambda: proxy.handle.connections == 0)
    assert time.monotonic() - started < 2.0  # a close that waited on its own thread would stall the loop
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT)


def test_a_slow_request_head_is_cut_at_the_head_timeout(proxies):
    proxy = proxies(["pkg.test"], head_timeout=0.3)
    client = proxy.connect()
    client.sendall(b"CONNECT pkg.test:443 HTTP/1.1\r\n")  # ... and never the end of the head
    started = time.monotonic()
    reply = read_until_close(client)
    assert 0.2 < time.monotonic() - started < 3.0
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert proxy.event()[1:3] == ("deny", "http")
    client.close()  # ends the proxy's linger
    silent = proxy.connect()  # one that sends nothing at all
    assert read_until_close(silent) == b""
    silent.close()
    assert proxy.event()[1:] == ("deny", "tcp", "", 0, "no complete request within 0.3 s")
    wait_until(lambda: proxy.handle.connections == 0)
    assert proxy.resolver.calls == []


def test_connections_beyond_the_maximum_are_closed_at_once(proxies):
    proxy = proxies(["pkg.test"], max_connections=2)
    held = [proxy.connect(), proxy.connect()]
    wait_until(lambda: proxy.handle.connections == 2)
    extra = proxy.connect()
    assert read_until_close(extra) == b""
    assert proxy.event()[1:] == ("deny", "tcp", "", 0, "too many connections")
    held[0].close()
    wait_until(lambda: proxy.handle.connections == 1)
    again = proxy.connect()
    again.sendall(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
    assert read_until_close(again).startswith(b"HTTP/1.1 403 ")


def test_serve_refuses_bad_arguments_and_closes_the_listener():
    listener = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(UsageError):
        service().serve(listener, ["*"])
    assert listener.fileno() == -1
    unbound = socket.socket()
    with pytest.raises(ValueError):
        service().serve(unbound, ["pypi.org"])
    assert unbound.fileno() == -1
    with pytest.raises(ValueError):
        service().serve(socket.create_server(("127.0.0.1", 0)), ["pypi.org"], max_connections=0)


class TwoListeners:
    """Two sandboxes' listeners on one private ProxyService with ``budget``: ``connect(i)``
    opens a client to listener i; everything is closed by ``close``."""

    def __init__(self, budget: int) -> None:
        from sandbox.netproxy import ProxyService

        self.service = ProxyService(budget=budget)
        self.events: queue.Queue = queue.Queue()
        self.handles, self.ports, self.clients = [], [], []
        for _ in range(2):
            listener = socket.create_server(("127.0.0.1", 0))
            self.ports.append(listener.getsockname()[1])
            self.handles.append(self.service.serve(listener, ["pkg.test"], on_event=self.events.put,
                                                   max_connections=100))

    def connect(self, index: int) -> socket.socket:
        self.clients.append(socket.create_connection(("127.0.0.1", self.ports[index]), timeout=WAIT))
        return self.clients[-1]

    def assert_refused_then_served(self, refused: socket.socket, served: socket.socket) -> None:
        assert read_until_close(refused) == b""
        assert self.events.get(timeout=WAIT)[1:] == ("deny", "tcp", "", 0, "too many connections")
        served.sendall(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
        assert read_until_close(served).startswith(b"HTTP/1.1 403 ")

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for handle in self.handles:
            handle.close()


def test_no_listener_takes_more_than_its_share_of_the_budget():
    """One sandbox holding idle connections cannot lock the others out: each listener gets
    at most a quarter of the process's budget, and another listener is still served."""
    two = TwoListeners(budget=8)
    try:
        assert two.service.share == 2
        two.connect(0), two.connect(0)
        wait_until(lambda: two.service.active == 2)
        two.assert_refused_then_served(two.connect(0), two.connect(1))
    finally:
        two.close()


def test_the_process_wide_budget_caps_connections_across_every_listener():
    """Two sandboxes' listeners share one descriptor budget: the third connection overall is
    refused even though each listener is under its own share; a freed slot is reused."""
    from sandbox.netproxy import descriptor_budget

    assert 8 <= descriptor_budget() < 1 << 20
    two = TwoListeners(budget=2)
    try:
        first = two.connect(0)
        two.connect(1)
        wait_until(lambda: two.service.active == 2)
        refused = two.connect(1)
        first.close()
        wait_until(lambda: two.service.active == 1)
        two.assert_refused_then_served(refused, two.connect(1))
    finally:
        two.close()
