"""Loopback ports for local servers: the rehearsal's moto server and torchrun's rendezvous.

Binding port 0 and releasing it hands out a port of the kernel's ephemeral range, which the
kernel may give to the next outgoing connection or ``bind(0)`` (gloo opens many) before the
server binds it. Ports below that range are never assigned automatically: one that is free now
stays free unless a process asks for it by number. So a port is drawn at random below the
ephemeral range and checked by binding it.
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LOWEST = 10_000
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # Linux; "32768 60999" by default


def ephemeral_start() -> int:
    try:
        return int(RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # the Linux default (IANA's dynamic range starts at 49152)


def loopback_port(attempts: int = 100) -> int:
    """A free 127.0.0.1 TCP port outside the ephemeral range (one of it if none is free there)."""
    top = ephemeral_start()
    draw = random.SystemRandom()
    for _ in range(attempts if top > LOWEST + 100 else 0):
        port = draw.randrange(LOWEST, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free: int = s.getsockname()[1]  # (host, port) for AF_INET
        return free


def serve_on_free_port(start: Callable[[int], T], attempts: int = 5) -> tuple[T, int]:
    """``start(port)`` on a free loopback port, and that port. Another process may take the port between
    :func:`loopback_port` and ``start``'s bind: on "address already in use" another port is drawn."""
    for attempt in range(attempts):
        port = loopback_port()
        try:
            return start(port), port
        except OSError as error:
            if error.errno != errno.EADDRINUSE or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
