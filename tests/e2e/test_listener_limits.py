"""End to end: the HTTP/1.1 listener's limits in a real ``bastion run`` process, over raw sockets.

Head size and header count (431), header read timeout (plain close), keep-alive timeout (close) and the
connection cap (503 at the accept). Every socket has a timeout and is closed by the test that opened it.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

from tests.bastion.test_listener import HEADERS_TOO_LARGE, TOO_MANY_CONNECTIONS
from tests.conftest import BastionProcess

APP = "tests.e2e.apps.listener_app:service"
MAX_HEADER_BYTES = 4096
MAX_HEADERS = 20
HEADER_READ_TIMEOUT_SECS = 1
KEEP_ALIVE_TIMEOUT_SECS = 1
REQUEST_TIMEOUT_SECS = 1
# A timeout must have struck by then: its own length plus a generous margin for a loaded machine.
CLOSE_WITHIN_SECS = 4.0
ENV = {
    "SERVICE_TOKEN_ENABLED": "false",
    "SERVICE_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
    "SERVICE_MAX_HEADERS": str(MAX_HEADERS),
    "SERVICE_HEADER_READ_TIMEOUT_SECS": str(HEADER_READ_TIMEOUT_SECS),
    "SERVICE_KEEP_ALIVE_TIMEOUT_SECS": str(KEEP_ALIVE_TIMEOUT_SECS),
    "SERVICE_MIDDLEWARE_TIMEOUT_SECS": str(REQUEST_TIMEOUT_SECS),
}
PING = b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\n\r\n"
PING_AND_CLOSE = b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


@pytest.fixture(scope="module")
def listener(module_bastion_process: Callable[..., BastionProcess]) -> BastionProcess:
    return module_bastion_process(APP, env=ENV)


@pytest.fixture
def connect(listener: BastionProcess) -> Iterator[Callable[[], socket.socket]]:
    """Factory: a socket connected to the module's process, with a timeout; closed after the test."""
    opened: list[socket.socket] = []

    def open_socket() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", listener.port), timeout=CLOSE_WITHIN_SECS)
        opened.append(sock)
        return sock

    yield open_socket
    for sock in opened:
        sock.close()


def read_to_eof(sock: socket.socket) -> bytes:
    """Everything until the server closes (a socket timeout fails the test)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response with a content-length, leaving the connection open: (head, body)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a full response head: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    match = re.search(rb"\r\ncontent-length: (\d+)", head, re.IGNORECASE)
    assert match is not None, head
    while len(body) < int(match.group(1)):
        chunk = sock.recv(65536)
        assert chunk, "closed inside a response body"
        body += chunk
    return head, body


def head_of_size(size: int) -> bytes:
    """A canonical GET head of exactly ``size`` bytes that asks for the connection to close."""
    start = b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Pad: "
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


def is_closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed: EOF, or a reset because the client wrote after the close."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_head_of_max_header_bytes_is_served(connect: Callable[[], socket.socket]) -> None:
    sock = connect()
    sock.sendall(head_of_size(MAX_HEADER_BYTES))
    reply = read_to_eof(sock)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b'{"pong":true}')


def test_header_value_over_max_header_bytes_gets_431_and_close(connect: Callable[[], socket.socket]) -> None:
    sock = connect()
    sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n\r\n")
    assert read_to_eof(sock) == HEADERS_TOO_LARGE


def test_one_header_more_than_max_headers_gets_431_and_close(connect: Callable[[], socket.socket]) -> None:
    sock = connect()
    headers = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS))  # with Host: MAX_HEADERS + 1
    sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n")
    assert read_to_eof(sock) == HEADERS_TOO_LARGE


def test_10mb_header_value_is_refused_before_it_is_all_sent(connect: Callable[[], socket.socket]) -> None:
    """The header line never ends: the server answers while the value is still arriving.

    The client stops sending as soon as the answer is readable (polling 50 ms after each 64 KB chunk), so
    everything it did not send was never needed for the refusal.
    """
    sock = connect()
    sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nX-Big: ")
    chunk, total, sent = b"a" * 65536, 10 * 1024 * 1024, 0
    while sent < total:
        sock.sendall(chunk)
        sent += len(chunk)
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            break
    assert sent < total
    assert read_to_eof(sock) == HEADERS_TOO_LARGE


def rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


def test_30_unfinished_10mb_headers_do_not_hold_their_bytes(listener: BastionProcess) -> None:
    """30 clients each send a 10 MiB header value and hold on; the server's memory stays far below 300 MiB.

    Without the bound the parser keeps every unfinished value for as long as its client waits (about
    320 MB). RSS is sampled while the clients send and wait; the bound (100 MiB of growth) leaves a wide
    margin for allocator noise.
    """
    before = rss_mib(listener.proc.pid)
    peak = before
    running = threading.Event()
    running.set()

    def sample() -> None:
        nonlocal peak
        while running.is_set():
            peak = max(peak, rss_mib(listener.proc.pid))
            time.sleep(0.01)

    def send_and_hold() -> None:
        with closing(socket.create_connection(("127.0.0.1", listener.port), timeout=10)) as sock:
            sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nX-Big: ")
            chunk = b"a" * 65536
            # Either way the socket ends: the server answers and closes, or the 10 s timeout strikes.
            with contextlib.suppress(OSError):
                for _ in range(160):  # 10 MiB
                    sock.sendall(chunk)
                read_to_eof(sock)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(30) as pool:
            for future in [pool.submit(send_and_hold) for _ in range(30)]:
                future.result()
    finally:
        running.clear()
        sampler.join()
    assert peak - before < 100


def test_half_sent_header_line_is_closed_after_header_read_timeout(
    connect: Callable[[], socket.socket],
) -> None:
    slow = connect()
    slow.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nX-Slow: abc")
    other = connect()
    other.sendall(PING_AND_CLOSE)
    assert read_to_eof(other).startswith(b"HTTP/1.1 200 OK\r\n")
    assert read_to_eof(slow) == b""


def test_trickled_head_is_closed_although_bytes_keep_arriving(connect: Callable[[], socket.socket]) -> None:
    sock = connect()
    sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    deadline = time.monotonic() + CLOSE_WITHIN_SECS
    closed = False
    while not closed and time.monotonic() < deadline:
        try:
            sock.sendall(b"a")
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        readable, _, _ = select.select([sock], [], [], 0.2)
        closed = bool(readable) and is_closed_by_server(sock)
    assert closed


def test_a_body_sent_too_slowly_is_408_then_close(connect: Callable[[], socket.socket]) -> None:
    """The head arrived, the body does not (slowloris on the body): 408 after middleware.timeout_secs, not 504."""
    sock = connect()
    sock.sendall(
        b"POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    received = read_to_eof(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n")  # read_to_eof: then the server closed
    assert body == b'{"error":"Request body not received within 1s","code":"REQUEST_TIMEOUT","status":408}'


def test_an_answer_before_the_body_arrived_ends_the_connection(connect: Callable[[], socket.socket]) -> None:
    """A refusal that does not read the body (here a 404) is followed by FIN: a client trickling the rest of its
    body cannot hold the connection, and what it still sends is dropped, not parsed as a next request."""
    sock = connect()
    sock.sendall(b"POST /api/v1/nowhere HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
    head, _ = read_response(sock)
    assert head.startswith(b"HTTP/1.1 404 ")
    sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\n\r\n")  # body bytes to the server: dropped
    assert read_to_eof(sock) == b""


def test_a_pipelined_request_whose_body_comes_later_is_answered(connect: Callable[[], socket.socket]) -> None:
    """The GET's response completes while the POST behind it still waits for its body: only the POST's own
    answer may decide whether its body was left unread."""
    sock = connect()
    sock.sendall(
        PING + b"POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n"
    )
    first, _ = read_response(sock)
    assert first.startswith(b"HTTP/1.1 200 ")
    sock.sendall(b'{"a": "b"}')
    second, body = read_response(sock)
    assert second.startswith(b"HTTP/1.1 200 ")
    assert body == b'{"keys":1}'


def test_silent_connection_is_closed_after_header_read_timeout(connect: Callable[[], socket.socket]) -> None:
    assert read_to_eof(connect()) == b""


def test_second_request_on_a_kept_alive_connection_has_the_same_header_deadline(
    connect: Callable[[], socket.socket],
) -> None:
    sock = connect()
    sock.sendall(PING)
    head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close" not in head.lower()
    assert body == b'{"pong":true}'
    sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nX-Slow: abc")
    assert read_to_eof(sock) == b""


def test_idle_kept_alive_connection_is_closed_after_keep_alive_timeout(
    connect: Callable[[], socket.socket],
) -> None:
    sock = connect()
    sock.sendall(PING)
    head, _ = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert read_to_eof(sock) == b""


def held_connection(port: int, deadline: float) -> socket.socket:
    """A connection that has had one keep-alive ping answered, so the server has accepted and counts it."""
    while True:
        sock = socket.socket()
        sock.settimeout(CLOSE_WITHIN_SECS)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(PING)
            head, _ = read_response(sock)
        except ConnectionRefusedError:  # not listening yet
            sock.close()
            assert time.monotonic() < deadline, "bastion never started listening"
            time.sleep(0.05)
            continue
        except BaseException:
            sock.close()
            raise
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        return sock


def test_connection_over_max_connections_gets_503_until_one_closes(
    bastion_process: Callable[..., BastionProcess],
) -> None:
    env = {
        **ENV,
        "SERVICE_MAX_CONNECTIONS": "2",
        # The held connections must outlive the test's steps, however slow the machine.
        "SERVICE_HEADER_READ_TIMEOUT_SECS": "60",
        "SERVICE_KEEP_ALIVE_TIMEOUT_SECS": "60",
    }
    # Not waited for over HTTP: a health check's connection would count against the cap of 2.
    process = bastion_process(APP, env=env, wait=False)
    deadline = time.monotonic() + 20
    held = [held_connection(process.port, deadline)]
    try:
        held.append(held_connection(process.port, deadline))
        with closing(socket.create_connection(("127.0.0.1", process.port), timeout=CLOSE_WITHIN_SECS)) as third:
            third.sendall(PING)
            assert read_to_eof(third) == TOO_MANY_CONNECTIONS
    finally:
        for sock in held:
            sock.close()
    # The server notices the closes asynchronously; until it has, a new connection is still over the cap.
    reply = TOO_MANY_CONNECTIONS
    while reply == TOO_MANY_CONNECTIONS and time.monotonic() < deadline:
        with closing(socket.create_connection(("127.0.0.1", process.port), timeout=CLOSE_WITHIN_SECS)) as sock:
            sock.sendall(PING_AND_CLOSE)
            reply = read_to_eof(sock)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b'{"pong":true}')
