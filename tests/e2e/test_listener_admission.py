"""End to end: which connections the listener admits, in a real ``bastion run`` process, over raw sockets.

Every connection counts against ``service.max_connections`` for as long as it lives, whatever it speaks (HTTP/1.1,
WebSocket, HTTP/2); one client address holds at most ``service.max_connections_per_ip`` of them. The attacker
connects from 127.0.0.2, the legitimate client from 127.0.0.1. Every socket has a timeout and is closed by the
test that opened it.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import RemoteSettingsChanged

from bastion_core.testing import free_port
from tests.bastion.test_listener import TOO_MANY_CONNECTIONS, TOO_MANY_FROM_ADDRESS
from tests.conftest import BastionProcess
from tests.e2e.test_listener_limits import APP, error_lines, read_response, read_to_eof

EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")
WS_APP = "tests.e2e.apps.ws_service:service"
ATTACKER, LEGIT = "127.0.0.2", "127.0.0.1"
TIMEOUT_SECS = 10.0
# Held connections must outlive the test's steps, however slow the machine.
HOLD = {"SERVICE_HEADER_READ_TIMEOUT_SECS": "60", "SERVICE_KEEP_ALIVE_TIMEOUT_SECS": "60"}
HOLD_ENV = {**HOLD, "SERVICE_TOKEN_ENABLED": "false"}
HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
HEALTH_AND_CLOSE = b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


def connect_from(source: str, port: int) -> socket.socket:
    """A connection from loopback address ``source`` to the server on 127.0.0.1."""
    sock = socket.socket()
    sock.settimeout(TIMEOUT_SECS)
    try:
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    """Sockets the test registers (``sockets.enter_context(sock)``) are closed after it."""
    with ExitStack() as stack:
        yield stack


def served_connection(source: str, port: int) -> socket.socket:
    """A connection with one keep-alive request answered: admitted, and counted by the server."""
    sock = connect_from(source, port)
    sock.sendall(HEALTH)
    head, _ = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
    return sock


def h2_connection(port: int, source: str = LEGIT) -> socket.socket:
    """A raw HTTP/2 connection past the handshake (preface and SETTINGS both ways): handed to gRPC, counted."""
    sock = connect_from(source, port)
    client = H2Connection(H2Configuration(client_side=True))
    client.initiate_connection()
    sock.sendall(client.data_to_send())
    while not any(isinstance(event, RemoteSettingsChanged) for event in client.receive_data(sock.recv(65536))):
        pass
    sock.sendall(client.data_to_send())
    return sock


def websocket_connection(port: int) -> socket.socket:
    """An open WebSocket (``101`` read) on the ws service's ``/api/v2/notes/live``, which waits for a message."""
    sock = connect_from(LEGIT, port)
    key = base64.b64encode(os.urandom(16))
    sock.sendall(
        b"GET /api/v2/notes/live HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101 "), head
    return sock


def eventually_served(port: int, deadline: float) -> bytes:
    """The answer to a fresh connection's request once the server has noticed the closes that free a slot."""
    reply = TOO_MANY_CONNECTIONS
    while reply == TOO_MANY_CONNECTIONS and time.monotonic() < deadline:
        with closing(connect_from(LEGIT, port)) as sock:
            sock.sendall(HEALTH_AND_CLOSE)
            reply = read_to_eof(sock)
    return reply


def per_address_cap_holds(port: int, cap: int) -> bool:
    """Whether the attacker address gets exactly ``cap`` connections served and the next one refused."""
    with ExitStack() as stack:
        try:
            for _ in range(cap):
                stack.enter_context(served_connection(ATTACKER, port))
        except AssertionError:
            return False  # an earlier connection's close not noticed yet
        extra = stack.enter_context(connect_from(ATTACKER, port))
        return read_to_eof(extra) == TOO_MANY_FROM_ADDRESS


def test_an_address_over_its_cap_gets_429_at_once_and_the_others_are_served(
    bastion_process: Callable[..., BastionProcess], sockets: ExitStack
) -> None:
    """The attacker holds 4 connections (the cap): its next two are answered 429 at the accept, without sending a
    byte; the legitimate address is served; once the attacker closes, it has its 4 slots back, exactly."""
    process = bastion_process(APP, env={**HOLD_ENV, "SERVICE_MAX_CONNECTIONS_PER_IP": "4"})
    held = [sockets.enter_context(served_connection(ATTACKER, process.port)) for _ in range(4)]
    for _ in range(2):
        with closing(connect_from(ATTACKER, process.port)) as refused:
            assert read_to_eof(refused) == TOO_MANY_FROM_ADDRESS
    with closing(connect_from(LEGIT, process.port)) as legit:
        legit.sendall(HEALTH_AND_CLOSE)
        assert read_to_eof(legit).startswith(b"HTTP/1.1 200 OK\r\n")
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 20
    while not per_address_cap_holds(process.port, 4):
        assert time.monotonic() < deadline, "the attacker's slots never came back"
        time.sleep(0.05)
    assert '"reason":"max_connections_per_ip"' in process.output()


def test_http2_connections_count_against_max_connections(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], sockets: ExitStack
) -> None:
    """Two HTTP/2 connections fill a cap of 2: an HTTP/1.1 connection is refused 503; closing one frees a slot."""
    env = {**key_env, **HOLD, "SERVICE_MAX_CONNECTIONS": "2"}
    process = bastion_process(*EXAMPLE, env=env, wait=False)  # a health check's connection would count
    deadline = time.monotonic() + 20
    first = sockets.enter_context(retry_until_listening(lambda: h2_connection(process.port), deadline))
    sockets.enter_context(h2_connection(process.port))
    with closing(connect_from(LEGIT, process.port)) as third:
        third.sendall(HEALTH)
        assert read_to_eof(third) == TOO_MANY_CONNECTIONS
    first.close()
    assert eventually_served(process.port, deadline).startswith(b"HTTP/1.1 200 OK\r\n")


def retry_until_listening(connect: Callable[[], socket.socket], deadline: float) -> socket.socket:
    while True:
        try:
            return connect()
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "bastion never started listening"
            time.sleep(0.05)


def test_the_separate_grpc_port_applies_both_caps_and_closes_without_a_byte(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], sockets: ExitStack
) -> None:
    grpc_port = free_port()
    env = {
        **key_env,
        **HOLD,
        "SERVICE_GRPC_USE_SEPARATE_PORT": "true",
        "SERVICE_GRPC_PORT": str(grpc_port),
        "SERVICE_MAX_CONNECTIONS": "3",
        "SERVICE_MAX_CONNECTIONS_PER_IP": "2",
    }
    bastion_process(*EXAMPLE, env=env)
    held = [sockets.enter_context(h2_connection(grpc_port, ATTACKER)) for _ in range(2)]
    with closing(connect_from(ATTACKER, grpc_port)) as over_address:
        assert read_to_eof(over_address) == b""
    sockets.enter_context(h2_connection(grpc_port, LEGIT))
    with closing(connect_from(LEGIT, grpc_port)) as over_total:
        assert read_to_eof(over_total) == b""
    held[0].close()
    deadline = time.monotonic() + 20
    while True:
        try:
            sockets.enter_context(h2_connection(grpc_port, ATTACKER))
            break
        except (ConnectionError, AssertionError):
            assert time.monotonic() < deadline, "the closed connection's slot never came back"
            time.sleep(0.05)


def test_a_websocket_counts_against_max_connections_until_it_closes(
    bastion_process: Callable[..., BastionProcess], sockets: ExitStack
) -> None:
    process = bastion_process(WS_APP, env={**HOLD_ENV, "SERVICE_MAX_CONNECTIONS": "2"}, wait=False)
    deadline = time.monotonic() + 20
    websocket = sockets.enter_context(retry_until_listening(lambda: websocket_connection(process.port), deadline))
    sockets.enter_context(served_connection(LEGIT, process.port))
    with closing(connect_from(LEGIT, process.port)) as third:
        third.sendall(HEALTH)
        assert read_to_eof(third) == TOO_MANY_CONNECTIONS
    websocket.close()
    assert eventually_served(process.port, deadline).startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_text_message_that_is_not_utf8_closes_1007_without_an_error_line(
    bastion_process: Callable[..., BastionProcess], sockets: ExitStack
) -> None:
    process = bastion_process(WS_APP, env=HOLD_ENV)
    websocket = sockets.enter_context(websocket_connection(process.port))
    payload, mask = b"\xff\xfe", b"\x01\x02\x03\x04"
    websocket.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    assert read_to_eof(websocket) == b"\x88\x02\x03\xef"  # a close frame, code 1007 (invalid payload data)
    process.wait_for_output('"event":"websocket_invalid_utf8"')
    assert error_lines(process.output()) == []
