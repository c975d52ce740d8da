"""The network allowlist's proxy: the host side of a sandbox's only way out.

A sandboxed command lives in a private network namespace whose only interface is ``lo``.
sbx hands the host a TCP listener that was created inside that namespace; this module
serves it. Every connection speaks HTTP (``CONNECT host:port`` or an absolute-form
``GET http://host/...``) or SOCKS5, and every request is decided against the run's
allowlist *before* its name is resolved, so a denied name never reaches DNS.

- **Allowlist.** ``parse_allow`` turns an entry (``pypi.org``, ``github.com:443``,
  ``*.pythonhosted.org``, ``10.0.0.5:8080``, ``[::1]:8080``) into an ``AllowRule``;
  ``decide`` is the pure decision. A rule without a port allows 80 and 443 only.
- **One destination per connection.** Every byte read from a client connection goes only
  to the one destination that was checked for that connection: the proxy reads one request
  head, decides it, and from then on relays the rest of the stream verbatim to that
  destination. A second request pipelined behind the first, or a ``CONNECT`` spoken inside
  an allowed tunnel, reaches the host that was checked, never another.
- **Resolution.** ``SystemResolver`` drops host-local addresses (loopback, link-local such
  as the cloud metadata address 169.254.169.254, ...), so an allowed public name cannot be
  pointed at the host's own services. The proxy connects to the exact addresses it was
  given: nothing is resolved twice.
- **One thread.** ``ProxyService`` runs one asyncio loop in one daemon thread for the whole
  process; ``serve`` returns a ``ProxyHandle`` per listener, and ``ProxyHandle.close`` cuts
  every connection of that listener.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import inspect
import ipaddress
import json
import math
import re
import socket
import threading
import time
from collections import namedtuple
from collections.abc import Awaitable, Callable, Iterable

from .errors import ArgumentTypeError, ArgumentValueError, UsageError

HEAD_TIMEOUT = 30.0  # seconds a client has to send its whole request head (slowloris bound)
HEAD_LIMIT = 64 * 1024  # bytes of an HTTP request head
RELAY_WRITE_BUFFER = 256 * 1024  # per direction: pause the sender past this (throughput vs memory)
LINGER_SECONDS = 2.0  # how long a finished connection may take to flush and see the peer's EOF
DEFAULT_PORTS = (80, 443)  # what a rule without a port allows
MAX_EVENT_HOST = 255  # characters of a requested host kept in an event

ALLOW, DENY, ERROR = "allow", "deny", "error"
HTTP_CONNECT, HTTP, SOCKS5 = "http-connect", "http", "socks5"
UNIDENTIFIED = "tcp"  # an event's protocol before the first byte said which one the client speaks

ACCEPTED_FORMS = (
    "write HOST, HOST:PORT, *.SUFFIX, *.SUFFIX:PORT, IPV4, IPV4:PORT, [IPV6] or [IPV6]:PORT "
    "(e.g. pypi.org, github.com:443, *.pythonhosted.org, 10.0.0.5:8080, [::1]:8080); "
    "an entry without a port allows ports 80 and 443"
)

# ---------------------------------------------------------------------------------------
# The allowlist


class AllowRule(namedtuple("AllowRule", "host port")):
    """One allowlist entry: ``host`` is a lower-case name, a ``*.suffix`` wildcard or a
    canonical IP literal (IPv6 without brackets); ``port`` is 1..65535 or None (80 and 443)."""

    __slots__ = ()

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


class _MalformedHost(ValueError):
    """A requested host that is not a well-formed name or IP literal (the text says why)."""


_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")  # not int(): it takes "+80", " 80", "8_0" and non-ASCII digits
_IP_CHARACTERS = frozenset("0123456789abcdef:.")


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address in a form ipaddress accepts, else None. Scoped IPv6
    (``fe80::1%eth0``) and anything but hex digits, dots and colons are not addresses here."""
    if not text or not set(text) <= _IP_CHARACTERS:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _looks_numeric(name: str) -> bool:
    """Whether the C library would read ``name`` as an IPv4 address in a legacy form
    (``127.1``, ``0x7f000001``, ``0177.0.0.1``): such a "name" is an address in disguise, so
    it can never be a name (no top-level domain is all digits either)."""
    if name.rpartition(".")[2].isdigit():
        return True
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


def _name_problem(name: str) -> str | None:
    """Why ``name`` (lower case, no trailing dot) is not a host name, or None."""
    if not name:
        return "the host is empty"
    if len(name) > 253:
        return "the name is longer than 253 characters"
    for label in name.split("."):
        if not label:
            return "the name has an empty label (two dots in a row, or a leading dot)"
        if len(label) > 63:
            return "the name has a label longer than 63 characters"
        if not _LABEL.match(label):
            return "a label is not letters, digits and inner hyphens"
    if _looks_numeric(name):
        return "a numeric host must be a dotted-quad IPv4 address (like 10.0.0.5)"
    return None


def _normalise_host(host: object) -> tuple[str, bool]:
    """A requested host as ``(canonical text, is an IP literal)``: lower case, one trailing
    dot and the brackets of an IPv6 literal stripped, IP literals in ipaddress's canonical
    form. Raises _MalformedHost."""
    if isinstance(host, bytes | bytearray):
        try:
            host = bytes(host).decode("ascii")
        except UnicodeDecodeError:
            raise _MalformedHost("malformed host name (non-ASCII)") from None
    if not isinstance(host, str):
        raise _MalformedHost("malformed host name")
    if len(host) > 260:
        raise _MalformedHost("malformed host name (too long)")
    # ASCII first: str.lower() maps some non-ASCII letters onto ASCII ones (KELVIN SIGN -> "k").
    if not host.isascii() or any(c <= " " or c == "\x7f" for c in host):
        raise _MalformedHost("malformed host name (spaces, control or non-ASCII characters)")
    text = host.lower()
    if text.startswith("["):
        address = _parse_ip(text[1:-1]) if text.endswith("]") else None
        if not isinstance(address, ipaddress.IPv6Address):
            raise _MalformedHost("malformed host name (brackets must hold an IPv6 address)")
        return str(address), True
    if text.endswith("."):
        text = text[:-1]
    address = _parse_ip(text)
    if address is not None:
        return str(address), True
    problem = _name_problem(text)
    if problem is not None:
        raise _MalformedHost(f"malformed host name ({problem})")
    return text, False


def _authority(host: str, port: int | None = None) -> str:
    """``host[:port]`` with an IPv6 literal in brackets."""
    text = f"[{host}]" if ":" in host else host
    return text if port is None else f"{text}:{port}"


def _entry_port(entry: str, text: str) -> int:
    if not text:
        raise _refuse_entry(entry, "the port is empty after ':'")
    if not _PORT.match(text) or not 1 <= int(text) <= 65535:
        raise _refuse_entry(entry, "the port is not a number from 1 to 65535")
    return int(text)


def _refuse_entry(entry: object, why: str) -> UsageError:
    shown = repr(entry)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return UsageError(f"network allowlist entry {shown} is refused: {why}", ACCEPTED_FORMS)


def parse_allow(entry: str) -> AllowRule:
    """One allowlist entry as an AllowRule; raises UsageError naming the entry and why."""
    if not isinstance(entry, str):
        raise _refuse_entry(entry, f"it is a {type(entry).__name__}, not a string")
    if not entry:
        raise _refuse_entry(entry, "it is empty")
    if len(entry) > 300:
        raise _refuse_entry(entry, "it is longer than any host name")
    if not entry.isascii():
        raise _refuse_entry(entry, "it holds non-ASCII characters (write an international name in its xn-- form)")
    if any(c <= " " or c == "\x7f" for c in entry):
        raise _refuse_entry(entry, "it holds whitespace or control characters")
    if "://" in entry:
        raise _refuse_entry(entry, "a URL scheme is not part of an entry: write the host (and port) alone")
    if "@" in entry:
        raise _refuse_entry(entry, "user information is not part of an entry")
    if any(c in entry for c in "/?#"):
        raise _refuse_entry(entry, "a path is not part of an entry: write the host (and port) alone")
    if entry.startswith("["):
        inner, bracket, rest = entry[1:].partition("]")
        if not bracket:
            raise _refuse_entry(entry, "the '[' is not closed")
        if rest and not rest.startswith(":"):
            raise _refuse_entry(entry, "only ':PORT' may follow ']'")
        address = _parse_ip(inner.lower())
        if not isinstance(address, ipaddress.IPv6Address):
            raise _refuse_entry(entry, "the brackets do not hold an IPv6 address")
        return AllowRule(str(address), _entry_port(entry, rest[1:]) if rest else None)
    if entry.count(":") > 1:
        raise _refuse_entry(entry, "an IPv6 address must be written in brackets, as [::1] or [::1]:8080")
    host, colon, port_text = entry.partition(":")
    port = _entry_port(entry, port_text) if colon else None
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if host.startswith("*."):
        suffix = host[2:]
        if "*" in suffix:
            raise _refuse_entry(entry, "'*' may only appear once, as a leading '*.'")
        problem = _name_problem(suffix)
        if problem is not None:
            raise _refuse_entry(entry, problem)
        if "." not in suffix:
            raise _refuse_entry(entry, "a wildcard needs a suffix of at least two labels (*.example.org, not *.org)")
        return AllowRule(host, port)
    if "*" in host:
        raise _refuse_entry(entry, "'*' is only allowed as a leading '*.' (as in *.example.org)")
    address = _parse_ip(host)
    if isinstance(address, ipaddress.IPv4Address):
        return AllowRule(str(address), port)
    problem = _name_problem(host)
    if problem is not None:
        raise _refuse_entry(entry, problem)
    return AllowRule(host, port)


def parse_allowlist(entries: Iterable[str | AllowRule]) -> tuple[AllowRule, ...]:
    """Every entry parsed (an AllowRule is checked again through its text), duplicates
    dropped, order kept."""
    if isinstance(entries, str | bytes):
        raise UsageError("the network allowlist must be a list of entries, not one string",
                         "pass a list, e.g. ['pypi.org', '*.pythonhosted.org']")
    try:
        items = list(entries)
    except TypeError:
        raise UsageError(f"the network allowlist must be a list of entries, not a {type(entries).__name__}",
                         "pass a list, e.g. ['pypi.org', '*.pythonhosted.org']") from None
    rules = [parse_allow(str(item) if isinstance(item, AllowRule) else item) for item in items]
    return tuple(dict.fromkeys(rules))


def _decision(rules: Iterable[AllowRule], host: object, port: object) -> tuple[str | None, bool]:
    """``(reason or None, whether the request was malformed)``; see decide."""
    try:
        canonical, is_ip = _normalise_host(host)
    except _MalformedHost as error:
        return str(error), True
    if type(port) is not int or not 1 <= port <= 65535:
        return "malformed port", True
    for rule in rules:
        if port not in (DEFAULT_PORTS if rule.port is None else (rule.port,)):
            continue
        if is_ip:
            # Only an IP-literal rule allows an address; rule hosts are canonical, and a name
            # rule never equals an address (a numeric name is refused).
            if rule.host == canonical and _parse_ip(rule.host) is not None:
                return None, False
        elif rule.host.startswith("*."):
            if canonical.endswith(rule.host[1:]):  # strictly below the suffix: "x.org" != ".x.org"
                return None, False
        elif rule.host == canonical:
            return None, False
    return f"{_authority(canonical, port)} is not in this sandbox's network allowlist", False


def decide(rules: Iterable[AllowRule], host: str, port: int) -> str | None:
    """None when ``rules`` allow ``host``:``port``, else the reason. Pure: no resolution.

    ``host`` is what the client asked for; it is normalised (case, one trailing dot, IPv6
    brackets, canonical IP form) and a malformed one is refused. A name matches an equal
    rule or a ``*.suffix`` rule it lies strictly below; an IP literal only an equal IP rule."""
    return _decision(rules, host, port)[0]


# ---------------------------------------------------------------------------------------
# Events


class NetEvent(namedtuple("NetEvent", "time action protocol host port reason")):
    """One decision: ``action`` is allow, deny or error; ``protocol`` is http-connect, http or
    socks5 (tcp before the client said which); ``reason`` is empty on allow."""

    __slots__ = ()

    def to_json(self) -> str:
        return json.dumps(self._asdict())  # ASCII escapes: always one line


def _event_host(host: object) -> str:
    if host == "" or host is None:
        return ""
    try:
        return _normalise_host(host)[0]
    except _MalformedHost:
        return repr(host)[:MAX_EVENT_HOST]


# ---------------------------------------------------------------------------------------
# Resolution

Resolver = Callable[[str, int], Awaitable[list[str]]]

_NAT64_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # Linux connects 0.0.0.0 to the host itself
_METADATA_ADDRESSES = frozenset({  # cloud metadata services outside the link-local range
    ipaddress.IPv6Address("fd00:ec2::254"),  # AWS over IPv6
    ipaddress.IPv4Address("100.100.100.200"),  # Alibaba Cloud
})


def _is_host_local(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a connection to ``address`` would reach this host or its link rather than
    the internet: what an allowed public name must never resolve to. An IPv6 address that
    carries an IPv4 one (mapped, NAT64, 6to4) is judged by the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return _is_host_local(address.ipv4_mapped)
        if address in _NAT64_PREFIX:  # before the general checks: ipaddress counts 64:ff9b::/96 as reserved
            return _is_host_local(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if int(address) >> 32 == 0:
            return True  # ::, ::1 and the deprecated IPv4-compatible ::a.b.c.d
        if address.sixtofour is not None and _is_host_local(address.sixtofour):
            return True
    elif address in _THIS_NETWORK:
        return True
    return (address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast
            or address.is_reserved or address in _METADATA_ADDRESSES)


# Where a container's host, a cluster's services, a VPN and a home router live: RFC 1918,
# shared address space (CGNAT, Tailscale) and IPv6 unique-local. Not ipaddress's is_private,
# which also covers documentation and benchmarking ranges that some networks route.
_PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7",
    "fec0::/10",  # deprecated site-local: still routed inside some networks
    "2001::/32",  # Teredo: an obfuscated IPv4 address inside, never a plain public host
))


def _embedded_ipv4(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches (mapped, IPv4-compatible, NAT64, 6to4), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64_PREFIX or (int(address) >> 32 == 0 and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _same_host_forms(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> set[str]:
    """``address`` and the IPv4 address it carries, as canonical strings: what a list of
    addresses is checked against, so ``::ffff:192.0.2.2`` counts as ``192.0.2.2``."""
    embedded = _embedded_ipv4(address)
    return {str(address)} | ({str(embedded)} if embedded is not None else set())
HOST_ADDRESS_TTL = 5.0  # seconds the host's own interface addresses are cached


def _is_private(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is in a private network (see _PRIVATE_NETWORKS); an IPv6 address
    that carries an IPv4 one (mapped, NAT64, 6to4) is judged by that one."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return _is_private(address.ipv4_mapped)
        if address in _NAT64_PREFIX:
            return _is_private(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address.sixtofour is not None and _is_private(address.sixtofour):
            return True
    return any(address.version == network.version and address in network for network in _PRIVATE_NETWORKS)


_host_addresses_cache: tuple[float, frozenset[str]] = (0.0, frozenset())


def host_addresses() -> frozenset[str]:
    """The addresses of this host's own interfaces (IPv4 from the kernel's LOCAL routes,
    IPv6 from if_inet6): an allowed name that resolves to one would reach the host's own
    services on a public address too. Cached for a few seconds."""
    global _host_addresses_cache
    now = time.monotonic()
    stamp, cached = _host_addresses_cache
    if now - stamp < HOST_ADDRESS_TTL:
        return cached
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie") as trie:
            previous = ""
            for line in trie:
                text = line.strip()
                if text.startswith("/32 host LOCAL") and previous:
                    found.add(previous)
                elif text.startswith(("|--", "+--")):
                    previous = text.split()[-1]
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as inet6:
            for line in inet6:
                hexed = line.split()[0] if line.split() else ""
                if len(hexed) == 32:
                    found.add(str(ipaddress.IPv6Address(int(hexed, 16))))
    except (OSError, ValueError):
        pass
    _host_addresses_cache = (now, frozenset(found))
    return _host_addresses_cache[1]


class SystemResolver:
    """The default resolver: getaddrinfo, minus every host-local, private and own-interface
    address, except those listed in ``listed`` (IP-literal allowlist entries: the user
    named that address, so a name resolving to it may reach it)."""

    def __init__(self, getaddrinfo: Callable | None = None, listed: Iterable[str] = ()) -> None:
        self._getaddrinfo = getaddrinfo  # None: the running loop's
        self._listed = frozenset(str(_parse_ip(a)) for a in listed if _parse_ip(a) is not None)

    async def __call__(self, host: str, port: int) -> list[str]:
        try:
            if self._getaddrinfo is None:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            else:
                infos = self._getaddrinfo(host, port, type=socket.SOCK_STREAM)
                if inspect.isawaitable(infos):
                    infos = await infos
        except (OSError, UnicodeError, ValueError) as error:
            raise LookupError(str(error) or type(error).__name__) from error
        addresses: list[str] = []
        for family, _type, _proto, _canonname, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            address = _parse_ip(str(sockaddr[0]).lower())  # a scoped "fe80::1%eth0" is not an address here
            if address is None:
                continue
            forms = _same_host_forms(address)
            if not forms & self._listed and (_is_host_local(address) or _is_private(address)
                                             or forms & host_addresses()):
                continue
            if str(address) not in addresses:
                addresses.append(str(address))
        if not addresses:
            raise LookupError("resolves only to host-local or private addresses (list the address itself to allow it)"
                              if infos else "no addresses")
        return addresses


# ---------------------------------------------------------------------------------------
# Requests


class _Refused(Exception):
    """A request refused before any decision on its destination could be made (malformed,
    unsupported), with what to tell the client."""

    def __init__(self, protocol: str, reason: str, host: object = "", port: int = 0, *,
                 http_status: int = 400, socks_reply: int | None = 0x01) -> None:
        super().__init__(reason)
        self.protocol, self.reason, self.host, self.port = protocol, reason, host, port
        self.http_status, self.socks_reply = http_status, socks_reply


class _Request(namedtuple("_Request", "protocol host port upstream_head")):
    """A parsed request: the destination as asked for, and for plain HTTP the rewritten head
    to send first (None until the host is known to be well formed)."""

    __slots__ = ()


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_HTTP_VERSION = re.compile(r"HTTP/1\.[01]\Z")
_HOP_BY_HOP = frozenset({"proxy-connection", "proxy-authorization", "connection", "keep-alive", "te", "trailer", "upgrade"})
# Connection may name other headers as hop-by-hop; these stay, whatever it says (the proxy
# writes its own Host, and dropping a length would change how the upstream frames the body).
_NEVER_HOP_BY_HOP = frozenset({"host", "content-length", "transfer-encoding"})
_HTTP_REASONS = {200: "Connection established", 400: "Bad Request", 403: "Forbidden", 408: "Request Timeout",
                 431: "Request Header Fields Too Large", 502: "Bad Gateway"}


def _split_authority(text: str) -> tuple[str, int | None]:
    """``host[:port]`` or ``[v6][:port]`` as (host text, port or None); ValueError if malformed.
    The host is left for _normalise_host to judge."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unclosed '['")
        host, rest = text[:end + 1], text[end + 1:]
    else:
        if text.count(":") > 1:
            raise ValueError("an IPv6 address must be in brackets")
        host, colon, port_text = text.partition(":")
        rest = ":" + port_text if colon else ""
    if not host:
        raise ValueError("no host")
    if not rest:
        return host, None
    if not rest.startswith(":") or not _PORT.match(rest[1:]) or not 1 <= int(rest[1:]) <= 65535:
        raise ValueError("malformed port")
    return host, int(rest[1:])


def _same_destination(left: tuple[str, int], right: tuple[str, int]) -> bool:
    try:
        return _normalise_host(left[0])[0] == _normalise_host(right[0])[0] and left[1] == right[1]
    except _MalformedHost:
        return False


def _has_controls(text: str) -> bool:
    return any(c < " " and c != "\t" or c == "\x7f" for c in text)


def _parse_http_head(head: bytes) -> _Request:
    """An HTTP/1 request head (through its final CRLF CRLF) as a _Request; raises _Refused.

    CONNECT gives the tunnel's destination. An absolute-form http:// request gives its
    destination and the head to send there: origin-form request line, the proxy's own Host
    (the checked authority), no hop-by-hop headers, ``Connection: close``."""
    text = head.decode("latin-1")  # lossless: header values go back out byte for byte
    lines = text[:-4].split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise _Refused(HTTP, "bare CR or LF in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not _HTTP_VERSION.match(parts[2]):
        raise _Refused(HTTP, "malformed request line (expected METHOD TARGET HTTP/1.x)")
    method, target, version = parts
    protocol = HTTP_CONNECT if method == "CONNECT" else HTTP
    if not target or not target.isascii() or _has_controls(target):
        raise _Refused(protocol, "malformed request target", target)
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise _Refused(protocol, "obsolete header line folding", target)
        name, colon, value = line.partition(":")
        value = value.strip(" \t")
        if not colon or not _TOKEN.match(name) or _has_controls(value):
            raise _Refused(protocol, "malformed header line", target)
        headers.append((name, value))
    if method == "CONNECT":
        try:
            host, port = _split_authority(target)
        except ValueError as error:
            raise _Refused(HTTP_CONNECT, f"malformed CONNECT target ({error})", target) from None
        if port is None:
            raise _Refused(HTTP_CONNECT, "a CONNECT target needs a port (host:port)", host)
        return _Request(HTTP_CONNECT, host, port, None)
    lowered = target.lower()
    if lowered.startswith("https://"):
        raise _Refused(HTTP, "https:// URLs go through a CONNECT tunnel: set the client's HTTPS proxy (https_proxy)")
    if not lowered.startswith("http://"):
        if target.startswith("/") or target == "*":
            raise _Refused(HTTP, "this is a proxy: the request target must be an absolute http:// URL")
        raise _Refused(HTTP, "only http:// URLs can be proxied (and https:// through CONNECT)")
    rest = target[len("http://"):]
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, path = rest[:end], rest[end:].partition("#")[0]
    if not path.startswith("/"):
        path = "/" + path
    if "@" in authority:
        raise _Refused(HTTP, "user information in the URL is not supported")
    try:
        host, port = _split_authority(authority)
    except ValueError as error:
        raise _Refused(HTTP, f"malformed URL authority ({error})", authority) from None
    port = 80 if port is None else port
    host_headers = [value for name, value in headers if name.lower() == "host"]
    if len(host_headers) > 1:
        raise _Refused(HTTP, "more than one Host header", host, port)
    if host_headers:
        try:
            header_host, header_port = _split_authority(host_headers[0])
        except ValueError:
            raise _Refused(HTTP, "malformed Host header", host, port) from None
        if not _same_destination((header_host, 80 if header_port is None else header_port), (host, port)):
            raise _Refused(HTTP, "the Host header names another host than the URL", host, port)
    try:
        canonical = _normalise_host(host)[0]
    except _MalformedHost:
        return _Request(HTTP, host, port, None)  # decide refuses it; nothing is ever sent
    listed = {token.strip().lower() for name, value in headers if name.lower() == "connection" for token in value.split(",")}
    dropped = _HOP_BY_HOP | (listed - _NEVER_HOP_BY_HOP) | {"host"}
    out = [f"{method} {path} {version}", f"Host: {_authority(canonical, None if port == 80 else port)}"]
    out += [f"{name}: {value}" for name, value in headers if name.lower() not in dropped]
    out += ["Connection: close", "", ""]
    return _Request(HTTP, host, port, "\r\n".join(out).encode("latin-1"))


def _http_reply(status: int, reason: str) -> bytes:
    body = ("sbx: " + "".join(c if " " <= c < "\x7f" else repr(c)[1:-1] for c in reason) + "\n").encode("ascii")
    return (f"HTTP/1.1 {status} {_HTTP_REASONS[status]}\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("ascii") + body


_SOCKS_COMMANDS = {0x01: "CONNECT", 0x02: "BIND", 0x03: "UDP ASSOCIATE"}
_SOCKS_SUCCEEDED, _SOCKS_FAILURE, _SOCKS_NOT_ALLOWED = 0x00, 0x01, 0x02
_SOCKS_NETWORK_UNREACHABLE, _SOCKS_HOST_UNREACHABLE, _SOCKS_REFUSED = 0x03, 0x04, 0x05
_SOCKS_COMMAND_NOT_SUPPORTED, _SOCKS_ADDRESS_TYPE_NOT_SUPPORTED = 0x07, 0x08


def _socks_reply(code: int) -> bytes:
    # The bound address is not the client's business (it would be the host's): 0.0.0.0:0.
    return bytes([0x05, code, 0x00, 0x01, 0, 0, 0, 0, 0, 0])


async def _read_socks_request(client: _Endpoint) -> _Request:
    """A SOCKS5 greeting (the client's methods; the reply picks one) and request."""
    _version, method_count = await client.read_exactly(2)
    methods = await client.read_exactly(method_count)
    if 0x00 not in methods:
        client.transport.write(b"\x05\xff")
        raise _Refused(SOCKS5, "no acceptable SOCKS5 method (only 'no authentication' is offered)", socks_reply=None)
    client.transport.write(b"\x05\x00")
    version, command, _reserved, address_type = await client.read_exactly(4)
    if version != 0x05:
        raise _Refused(SOCKS5, "malformed SOCKS5 request")
    if address_type == 0x01:
        host: str = str(ipaddress.IPv4Address(await client.read_exactly(4)))
    elif address_type == 0x04:
        host = str(ipaddress.IPv6Address(await client.read_exactly(16)))
    elif address_type == 0x03:
        # latin-1 keeps every byte, so decide sees (and refuses) NUL, spaces or non-ASCII.
        host = (await client.read_exactly((await client.read_exactly(1))[0])).decode("latin-1")
    else:
        raise _Refused(SOCKS5, "unsupported SOCKS5 address type", socks_reply=_SOCKS_ADDRESS_TYPE_NOT_SUPPORTED)
    port = int.from_bytes(await client.read_exactly(2), "big")
    if command != 0x01:
        name = _SOCKS_COMMANDS.get(command, f"0x{command:02x}")
        raise _Refused(SOCKS5, f"SOCKS5 command {name} is not supported (only CONNECT)", host, port,
                       socks_reply=_SOCKS_COMMAND_NOT_SUPPORTED)
    return _Request(SOCKS5, host, port, None)


async def _read_http_request(client: _Endpoint) -> _Request:
    head = await client.read_head()
    if head is None:
        raise _Refused(HTTP, f"the request head is larger than {HEAD_LIMIT // 1024} KiB", http_status=431)
    return _parse_http_head(head)


class _UpstreamError(Exception):
    """Resolving or connecting failed; ``socks_reply`` says which way."""

    def __init__(self, reason: str, socks_reply: int) -> None:
        super().__init__(reason)
        self.reason, self.socks_reply = reason, socks_reply


def _socks_code_for(error: BaseException | None) -> int:
    if isinstance(error, ConnectionRefusedError):
        return _SOCKS_REFUSED
    if isinstance(error, OSError) and error.errno == errno.ENETUNREACH:
        return _SOCKS_NETWORK_UNREACHABLE
    if isinstance(error, TimeoutError) or (isinstance(error, OSError) and error.errno == errno.EHOSTUNREACH):
        return _SOCKS_HOST_UNREACHABLE
    return _SOCKS_FAILURE


# ---------------------------------------------------------------------------------------
# Serving


class _Endpoint(asyncio.Protocol):
    """One side of a proxied connection (the client's, or the upstream's).

    Until ``start_relaying`` it buffers what arrives, for the request parsers; after it, every byte
    goes straight to the peer's transport, with the peer's write buffer pausing this side's
    reading (flow control) and an EOF passed on as an EOF (half-close). Protocol callbacks,
    not streams: relaying from data_received costs no task switch per chunk."""

    def __init__(self, on_connected: Callable[[_Endpoint], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.eof = False  # the remote side finished sending
        self.lost = False  # the transport is gone
        self.peer: _Endpoint | None = None
        self.on_change: Callable[[], None] | None = None  # the relay's, once relaying
        self._on_connected = on_connected
        self._buffer = bytearray()
        self._scanned = 0  # how far the buffer has been searched for the end of a head
        self._discarding = False
        self._waiter: asyncio.Future | None = None

    # -- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self._on_connected is not None:
            self._on_connected(self)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            if not self.peer.transport.is_closing():  # else the relay is ending: drop, never write to a dead transport
                self.peer.transport.write(data)
            return
        if self._discarding:
            return  # input after a refusal goes nowhere
        self._buffer += data
        if len(self._buffer) > HEAD_LIMIT + 4:
            self.transport.pause_reading()  # enough to parse or refuse; the rest waits in the kernel
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        if self.peer is not None and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
        self._wake()
        return True  # keep the transport: the reply, or the other direction, still flows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.transport.resume_reading()

    # -- waiting
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self.on_change is not None:
            self.on_change()

    async def changed(self) -> None:
        """Return at the next arrival of data, EOF or loss."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # -- reading a request
    def _take(self, count: int) -> bytes:
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        self._scanned = 0
        if not self.lost:
            self.transport.resume_reading()
        return data

    async def read_exactly(self, count: int) -> bytes:
        while len(self._buffer) < count:
            if self.eof or self.lost:
                raise asyncio.IncompleteReadError(bytes(self._buffer), count)
            await self.changed()
        return self._take(count)

    async def peek_first_byte(self) -> bytes:
        """The first byte, left in the buffer; b"" when the client closed without sending any."""
        while not self._buffer:
            if self.eof or self.lost:
                return b""
            await self.changed()
        return bytes(self._buffer[:1])

    async def read_head(self) -> bytes | None:
        """Through the first CRLF CRLF; None when no head ends within HEAD_LIMIT bytes."""
        while True:
            end = self._buffer.find(b"\r\n\r\n", max(0, self._scanned - 3))
            if 0 <= end <= HEAD_LIMIT - 4:
                return self._take(end + 4)
            if end > HEAD_LIMIT - 4 or len(self._buffer) > HEAD_LIMIT:
                return None
            self._scanned = len(self._buffer)  # a trickling client costs no rescans
            if self.eof or self.lost:
                raise asyncio.IncompleteReadError(bytes(self._buffer), None)
            await self.changed()

    # -- after the request
    def link(self, peer: _Endpoint) -> None:
        """Make ``peer`` the destination of everything from this side (see start_relaying)."""
        self.peer = peer
        self.transport.set_write_buffer_limits(high=RELAY_WRITE_BUFFER)

    def start_relaying(self) -> None:
        """Send the peer what is already buffered (bytes the client sent right behind its
        request), and an EOF that already came; from now on data_received forwards."""
        pending, self._buffer = bytes(self._buffer), bytearray()
        if pending:
            self.peer.transport.write(pending)
        if self.eof and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
        if not self.lost:
            self.transport.resume_reading()

    async def discard_until_eof(self) -> None:
        """Drop whatever the client still sends until it closes its side."""
        self._discarding = True
        self._buffer.clear()
        if not self.lost:
            self.transport.resume_reading()
        while not (self.eof or self.lost):
            await self.changed()


class _Relay:
    """Waits on the two sides of a relayed connection."""

    def __init__(self, client: _Endpoint, upstream: _Endpoint) -> None:
        self.client, self.upstream = client, upstream
        self._changed: asyncio.Future | None = None
        client.on_change = upstream.on_change = self._wake

    def _wake(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._changed = asyncio.get_running_loop().create_future()
            try:
                await self._changed
            finally:
                self._changed = None

    async def run(self, response_ends_it: bool) -> bool:
        """Relay until both sides have finished sending (True), or until one connection is
        lost (False: a reset). For plain HTTP, the upstream's EOF ends the exchange; the client
        then gets a short linger to close its side (it was sent Connection: close)."""
        client, upstream = self.client, self.upstream
        client.link(upstream)
        upstream.link(client)  # both linked before any write, so flow control reaches the right side
        client.start_relaying()
        upstream.start_relaying()
        lost = lambda: client.lost or upstream.lost  # noqa: E731
        await self.until(lambda: lost() or (upstream.eof and (client.eof or response_ends_it)))
        if lost():
            return False
        if not client.eof:
            try:
                async with asyncio.timeout(LINGER_SECONDS):
                    await self.until(lambda: lost() or client.eof)
            except TimeoutError:
                pass
        return not lost()


class _Connection:
    """One client connection: its task and every transport it opened, to cut on close."""

    __slots__ = ("task", "transports")

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self.task: asyncio.Task | None = None
        self.transports = [transport]

    def abort(self) -> None:
        for transport in self.transports:
            transport.abort()


def _swallow(task: asyncio.Future) -> None:
    """A done callback that marks a task's exception as seen (no 'never retrieved' noise)."""
    if not task.cancelled():
        task.exception()


async def _close_in_order(*endpoints: _Endpoint) -> None:
    """Close after flushing what is buffered, for at most LINGER_SECONDS (the caller aborts
    whatever is left)."""
    for endpoint in endpoints:
        endpoint.transport.close()
    try:
        async with asyncio.timeout(LINGER_SECONDS):
            for endpoint in endpoints:
                while not endpoint.lost:
                    await endpoint.changed()
    except TimeoutError:
        pass


class ProxyHandle:
    """One served listener. ``close`` stops it and cuts its connections."""

    def __init__(self, service: ProxyService, rules: tuple[AllowRule, ...], on_event: Callable[[NetEvent], object] | None,
                 resolver: Resolver, connect_timeout: float, max_connections: int, head_timeout: float) -> None:
        self._service = service
        self._rules = rules
        self._on_event = on_event
        self._resolver = resolver
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._head_timeout = head_timeout
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()  # touched on the proxy thread only
        self._closing = False
        self._closed: asyncio.Event | None = None
        self._close_task: asyncio.Task | None = None

    @property
    def connections(self) -> int:
        """Open client connections now."""
        return len(self._connections)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, close the listener, abort every open connection and wait (up to
        ``timeout`` seconds) for that. Thread-safe and idempotent; on the proxy thread itself
        (an on_event callback) the close is scheduled and this returns at once."""
        loop = self._service._loop
        if loop is None or loop.is_closed():
            return
        if self._service._on_proxy_thread():
            self._close_task = loop.create_task(self._close())  # referenced: the loop keeps only a weak one
            return
        future = asyncio.run_coroutine_threadsafe(self._close(), loop)
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            pass  # bounded on purpose: the loop is stuck (a blocking on_event); everything is already cut

    async def _start(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Endpoint(self._accept), sock=listener)

    async def _close(self) -> None:
        if self._closed is not None:
            await self._closed.wait()
            return
        self._closed = asyncio.Event()
        self._closing = True
        if self._server is not None:
            self._server.close()  # closes the listener
        tasks = []
        for connection in list(self._connections):
            connection.abort()
            if connection.task is not None:
                connection.task.cancel()
                tasks.append(connection.task)
        if tasks:
            await asyncio.wait(tasks)
        self._closed.set()

    def _emit(self, action: str, protocol: str, host: object, port: object, reason: str) -> None:
        if self._on_event is None:
            return
        event = NetEvent(time.time(), action, protocol, _event_host(host),
                         port if type(port) is int and 0 <= port <= 65535 else 0, reason)
        try:
            self._on_event(event)
        except BaseException:  # the caller's callback must never take the proxy down
            pass

    def _finished(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        self._service.active -= 1

    def _accept(self, client: _Endpoint) -> None:
        """Called for each accepted connection."""
        if self._closing:
            client.transport.abort()
            return
        if (len(self._connections) >= min(self._max_connections, self._service.share)
                or self._service.active >= self._service.budget):
            client.transport.close()
            self._emit(DENY, UNIDENTIFIED, "", 0, "too many connections")
            return
        connection = _Connection(client.transport)
        self._connections.add(connection)
        self._service.active += 1
        connection.task = asyncio.get_running_loop().create_task(self._serve_connection(connection, client))
        connection.task.add_done_callback(lambda task: self._finished(connection))
        connection.task.add_done_callback(_swallow)

    async def _serve_connection(self, connection: _Connection, client: _Endpoint) -> None:
        try:
            await self._handle(connection, client)
        except Exception as error:  # one connection's failure is its own, never the loop's
            if not isinstance(error, OSError | asyncio.IncompleteReadError):
                self._emit(ERROR, UNIDENTIFIED, "", 0, f"internal proxy error: {type(error).__name__}: {error}")
        finally:
            connection.abort()  # a no-op on transports that were closed in order

    async def _handle(self, connection: _Connection, client: _Endpoint) -> None:
        protocol = UNIDENTIFIED
        try:
            async with asyncio.timeout(self._head_timeout):
                first = await client.peek_first_byte()
                if not first:
                    return
                protocol = SOCKS5 if first == b"\x05" else HTTP
                request = await (_read_socks_request(client) if protocol == SOCKS5 else _read_http_request(client))
        except TimeoutError:
            reason = f"no complete request within {self._head_timeout:g} s"
            self._emit(DENY, protocol, "", 0, reason)
            await self._refuse(client, protocol, 408, None, reason)
            return
        except _Refused as refusal:
            self._emit(DENY, refusal.protocol, refusal.host, refusal.port, refusal.reason)
            await self._refuse(client, refusal.protocol, refusal.http_status, refusal.socks_reply, refusal.reason)
            return
        except asyncio.IncompleteReadError:
            if protocol == HTTP:
                reason = "the connection ended inside the request head"
                self._emit(DENY, protocol, "", 0, reason)
                await self._refuse(client, protocol, 400, None, reason)
            return

        reason, malformed = _decision(self._rules, request.host, request.port)
        if reason is not None:
            self._emit(DENY, request.protocol, request.host, request.port, reason)
            await self._refuse(client, request.protocol, 400 if malformed else 403, _SOCKS_NOT_ALLOWED, reason)
            return
        # Allowed: only now may the name be resolved.
        host, is_ip = _normalise_host(request.host)
        try:
            upstream = await self._open_upstream(connection, host, is_ip, request.port)
        except _UpstreamError as failure:
            self._emit(ERROR, request.protocol, host, request.port, failure.reason)
            await self._refuse(client, request.protocol, 502, failure.socks_reply, failure.reason)
            return
        if request.protocol == HTTP_CONNECT:
            client.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        elif request.protocol == SOCKS5:
            client.transport.write(_socks_reply(_SOCKS_SUCCEEDED))
        else:
            upstream.transport.write(request.upstream_head)
        self._emit(ALLOW, request.protocol, host, request.port, "")
        # From here on the client's stream (including whatever it already sent behind the head)
        # goes to this upstream and nowhere else.
        if await _Relay(client, upstream).run(response_ends_it=request.protocol == HTTP):
            await _close_in_order(client, upstream)

    async def _open_upstream(self, connection: _Connection, host: str, is_ip: bool, port: int) -> _Endpoint:
        if is_ip:
            addresses = [host]
        else:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    answer = self._resolver(host, port)
                    addresses = list(await answer if inspect.isawaitable(answer) else answer)  # a plain function works too
            except TimeoutError:
                raise _UpstreamError(f"resolving {host} timed out", _SOCKS_HOST_UNREACHABLE) from None
            except Exception as error:  # the resolver is the caller's code: any failure is a failed lookup
                raise _UpstreamError(f"cannot resolve {host}: {error or type(error).__name__}", _SOCKS_HOST_UNREACHABLE) from None
            # Addresses only: a name here would be resolved again, unchecked.
            if not addresses or not all(isinstance(a, str) and _parse_ip(a.lower()) is not None for a in addresses):
                raise _UpstreamError(f"the resolver gave no usable address for {host}", _SOCKS_HOST_UNREACHABLE)
        loop = asyncio.get_running_loop()
        last_error: BaseException | None = None
        for address in addresses:
            canonical = str(_parse_ip(address.lower()))
            family = socket.AF_INET6 if ":" in canonical else socket.AF_INET
            upstream_socket = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream_socket.setblocking(False)
                async with asyncio.timeout(self._connect_timeout):
                    await loop.sock_connect(upstream_socket, (canonical, port))
            except (OSError, TimeoutError) as error:
                upstream_socket.close()
                last_error = error
                continue
            except BaseException:
                upstream_socket.close()
                raise
            transport, upstream = await loop.create_connection(_Endpoint, sock=upstream_socket)
            connection.transports.append(transport)
            return upstream
        why = "timed out" if isinstance(last_error, TimeoutError) else (getattr(last_error, "strerror", None) or str(last_error))
        raise _UpstreamError(f"cannot connect to {_authority(host, port)}: {why}", _socks_code_for(last_error))

    async def _refuse(self, client: _Endpoint, protocol: str, http_status: int, socks_reply: int | None, reason: str) -> None:
        """Tell the client why (an HTTP status with the reason, or a SOCKS5 reply code), then
        close after a short linger, so that unread input does not turn the close into a reset
        that destroys the reply."""
        if client.lost:
            return
        if protocol == SOCKS5:
            if socks_reply is not None:
                client.transport.write(_socks_reply(socks_reply))
        elif protocol != UNIDENTIFIED:
            client.transport.write(_http_reply(http_status, reason))
        if client.transport.can_write_eof():
            client.transport.write_eof()
        try:
            async with asyncio.timeout(LINGER_SECONDS):
                await client.discard_until_eof()
        except TimeoutError:
            return
        await _close_in_order(client)


def descriptor_budget() -> int:
    """How many client connections this process may hold at once: a quarter of what the
    descriptor limit leaves after 64 for everything else (each one uses two)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        soft = 1 << 20
    return max(8, (soft - 64) // 4)


def _quiet_exception_handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """What asyncio could not hand to a connection (an accept that hit the descriptor limit,
    a transport closed under it) goes to the ``sbx`` logger at debug level, without a
    traceback: a sandbox must not be able to flood its caller's stderr."""
    import logging

    logging.getLogger("sbx").debug("sbx: proxy: %s", context.get("message", "asyncio error"))


class ProxyService:
    """One asyncio loop in one daemon thread (started by the first serve) for every served
    listener of the process."""

    def __init__(self, budget: int | None = None) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Every client connection costs this process two descriptors (client and upstream),
        # whichever sandbox it came from: the total is capped below the descriptor limit, so
        # sandboxes cannot starve the process that runs them (the CLI, an agent runtime).
        self.budget = budget if budget is not None else descriptor_budget()
        # No one listener may take more than a quarter of it: one sandbox holding idle
        # connections must not lock every other sandbox of the process out.
        self.share = max(2, self.budget // 4)
        self.active = 0  # client connections of every handle; touched on the proxy thread only

    def _on_proxy_thread(self) -> bool:
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                loop.set_exception_handler(_quiet_exception_handler)
                thread = threading.Thread(target=loop.run_forever, name="sbx-netproxy", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def serve(self, listener: socket.socket, rules: Iterable[AllowRule | str], *,
              on_event: Callable[[NetEvent], object] | None = None, resolver: Resolver | None = None,
              connect_timeout: float = 10.0, max_connections: int = 256, head_timeout: float = HEAD_TIMEOUT) -> ProxyHandle:
        """Serve ``listener`` (a listening SOCK_STREAM socket; this takes ownership and closes
        it, also when the arguments are refused) under ``rules``; returns once it is served.

        ``on_event`` gets a NetEvent per decision, on the proxy thread: it must be quick, and
        whatever it raises is ignored. ``resolver`` maps an allowed name to the IP addresses
        to try (default SystemResolver()); it is trusted as given, and a plain function works
        too but holds the proxy thread while it runs. ``connect_timeout`` bounds the resolution
        and each connection attempt; ``head_timeout`` bounds the time to receive a request head;
        ``max_connections`` caps this listener's concurrent clients."""
        try:
            if not isinstance(listener, socket.socket):
                raise ArgumentTypeError(f"the proxy listener must be a socket, not a {type(listener).__name__}")
            if listener.type != socket.SOCK_STREAM or not listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                raise ArgumentValueError("the proxy listener must be a listening stream socket")
            parsed = parse_allowlist(rules)
            for name, value in (("connect_timeout", connect_timeout), ("head_timeout", head_timeout)):
                if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
                    raise ArgumentValueError(f"{name} must be a positive number of seconds, not {value!r}")
            if type(max_connections) is not int or max_connections < 1:
                raise ArgumentValueError(f"max_connections must be a positive integer, not {max_connections!r}")
            if on_event is not None and not callable(on_event):
                raise ArgumentTypeError("on_event must be callable")
            if resolver is not None and not callable(resolver):
                raise ArgumentTypeError("resolver must be callable")
            if self._on_proxy_thread():
                raise RuntimeError("serve() cannot be called on the proxy's own thread")
            listener.setblocking(False)
        except BaseException:
            if isinstance(listener, socket.socket):
                listener.close()
            raise
        listed = [rule.host for rule in parsed if _parse_ip(rule.host) is not None]
        handle = ProxyHandle(self, parsed, on_event, resolver or SystemResolver(listed=listed), float(connect_timeout),
                             max_connections, float(head_timeout))
        future = asyncio.run_coroutine_threadsafe(handle._start(listener), self._ensure_loop())
        try:
            future.result()
        except BaseException:
            listener.close()
            raise
        return handle


_service: ProxyService | None = None
_service_lock = threading.Lock()


def service() -> ProxyService:
    """The process-wide ProxyService."""
    global _service
    with _service_lock:
        if _service is None:
            _service = ProxyService()
        return _service
