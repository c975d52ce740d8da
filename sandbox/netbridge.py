"""The network allowlist's bridge: the one way out of a sandbox's private network namespace.

Stage 2 makes a TCP listener on 127.0.0.1 inside the namespace and sends it here over a
socketpair (``hand_over_proxy_listener`` in stage2.c); the front end serves it with the
proxy in netproxy.py, which decides every connection against the allowlist before it
resolves a name. So the command gets no descriptor, no unix socket and no process of the
bridge: what it can reach is a port on its own loopback, and everything that arrives
there is checked on the host side.

Only runs with an allowlist import this module (it brings asyncio with netproxy).
"""

from __future__ import annotations

import array
import os
import select
import socket
import time
from collections.abc import Callable

from .errors import SetupError

HANDOVER_TIMEOUT = 30.0  # seconds for stage 2 to send the listener; it does so before exec


def _receive_fds(channel: socket.socket) -> list[int]:
    """The descriptors of one message, received close-on-exec (MSG_CMSG_CLOEXEC): the
    listener must never leak into another child of this process. Not socket.recv_fds: in
    Python 3.11 it drops its flags argument."""
    ints = array.array("i")
    try:
        _, ancdata, _, _ = channel.recvmsg(1, socket.CMSG_SPACE(2 * ints.itemsize), socket.MSG_CMSG_CLOEXEC)
    except OSError:
        return []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            ints.frombytes(data[:len(data) - len(data) % ints.itemsize])
    return list(ints)


class NetworkBridge:
    """One sandbox's proxy: the channel to stage 2, then the served listener."""

    def __init__(self, rules: tuple, on_event: Callable | None = None, resolver: Callable | None = None) -> None:
        self.rules, self.on_event, self.resolver = rules, on_event, resolver
        # SEQPACKET: one message carries the descriptor, and EOF is unambiguous.
        self._channel, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Close-on-exec; launch passes it to the child alone and closes it as one of its own.
        self.child_fd = child.detach()
        self._handle = None

    def start(self) -> None:
        """Receive the listener from stage 2 and serve it. Returns without serving when
        stage 2 ended first (its status record says why); raises SetupError when nothing
        arrived in HANDOVER_TIMEOUT seconds (the caller then kills the sandbox)."""
        deadline = time.monotonic() + HANDOVER_TIMEOUT
        poller = select.poll()
        poller.register(self._channel.fileno(), select.POLLIN)
        while not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            if time.monotonic() >= deadline:
                self.close()
                raise SetupError("the network bridge did not arrive from stage 2 in time",
                                 "run 'sbx doctor'; the host may be overloaded")
        fds = _receive_fds(self._channel)
        self._channel.close()
        if not fds:
            return  # stage 2 failed before the bridge: its error record explains
        for extra in fds[1:]:
            os.close(extra)
        listener = socket.socket(fileno=fds[0])
        if listener.family != socket.AF_INET or listener.type != socket.SOCK_STREAM:
            listener.close()
            raise SetupError("stage 2 sent something other than a TCP listener as the network bridge",
                             "this is a bug in sbx: report it")
        from .netproxy import service

        self._handle = service().serve(listener, self.rules, on_event=self.on_event, resolver=self.resolver)

    def close(self) -> None:
        """The sandbox ended: stop serving (every open connection is cut), close the channel."""
        self._channel.close()
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()
