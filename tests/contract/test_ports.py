"""Loopback ports for the local servers: a port taken between choosing and binding is replaced."""

from __future__ import annotations

import errno
import socket

import pytest

from tiered_training.contract import ports


def test_a_port_taken_before_the_bind_is_replaced_by_another(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        free = ports.loopback_port()
        drawn = iter([busy, free])
        monkeypatch.setattr(ports, "loopback_port", lambda: next(drawn))

        def start(port: int) -> socket.socket:
            server = socket.socket()
            try:
                server.bind(("127.0.0.1", port))
            except OSError:
                server.close()
                raise
            return server

        server, port = ports.serve_on_free_port(start)
        with server:
            assert port == free and server.getsockname()[1] == free


def test_other_errors_and_the_last_attempt_are_not_retried():
    calls = []

    def refuse(port: int):
        calls.append(port)
        raise OSError(errno.EACCES, "permission denied")

    with pytest.raises(OSError) as raised:
        ports.serve_on_free_port(refuse)
    assert raised.value.errno == errno.EACCES and len(calls) == 1

    def always_taken(port: int):
        calls.append(port)
        raise OSError(errno.EADDRINUSE, "address already in use")

    calls.clear()
    with pytest.raises(OSError):
        ports.serve_on_free_port(always_taken, attempts=3)
    assert len(calls) == 3


def test_a_moto_server_on_a_taken_port_fails_instead_of_waiting_forever():
    pytest.importorskip("moto")
    from tiered_training.rehearse.s3 import start_moto

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError) as raised:
            start_moto(taken.getsockname()[1])
    assert raised.value.errno == errno.EADDRINUSE
