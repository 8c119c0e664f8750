"""End to end: the HTTP/1.1 listener's limits in a real ``bastion run`` process, over raw sockets.

Head size and header count (431), header read timeout (plain close), keep-alive timeout (close), the
connection cap (503 at the accept), RFC 9112 framing (400, 501), the pipelined-request queue, and quiet logs
for what clients do. Every socket has a timeout and is closed by the test that opened it.
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

from bastion._listener import raw_response
from bastion.errors import BadRequest, BastionError, TransferCodingNotImplemented
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
    """A refusal that does not read the body (here a 404) says ``connection: close`` and is followed by FIN: a client
    trickling the rest of its body cannot hold the connection, and what it still sends is dropped, not parsed as a
    next request."""
    sock = connect()
    sock.sendall(b"POST /api/v1/nowhere HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
    head, _ = read_response(sock)
    assert head.startswith(b"HTTP/1.1 404 ")
    assert b"\r\nconnection: close\r\n" in head + b"\r\n"  # announced: a client does not reuse the connection
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


@pytest.mark.parametrize(
    ("request_bytes", "error"),
    [
        pytest.param(b"GET /api/v1/ping HTTP/1.1\r\n\r\n", BadRequest("Missing Host header"), id="http11-without-host"),
        pytest.param(
            b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n",
            BadRequest("More than one Host header"),
            id="two-host-headers",
        ),
        pytest.param(
            b"POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            TransferCodingNotImplemented(),
            id="gzip-then-chunked",
        ),
        pytest.param(
            b"POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity, chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n",
            TransferCodingNotImplemented(),
            id="identity-then-chunked",
        ),
        pytest.param(
            b"POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: x-unknown\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            TransferCodingNotImplemented(),
            id="unknown-coding-on-its-own-line",
        ),
        pytest.param(
            b"POST /api/v1/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n{}",
            BadRequest("Transfer-Encoding must end with chunked"),
            id="coding-without-chunked",
        ),
        pytest.param(
            b"POST /api/v1/echo HTTP/1.0\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            BadRequest("Transfer-Encoding in an HTTP/1.0 request"),
            id="http10-with-transfer-encoding",
        ),
    ],
)
def test_framing_rfc_9112_forbids_gets_one_answer_then_close(
    connect: Callable[[], socket.socket], request_bytes: bytes, error: BastionError
) -> None:
    """The answer is the listener's, in the error shape; the request pipelined behind is never served."""
    sock = connect()
    sock.sendall(request_bytes + PING)
    assert read_to_eof(sock) == raw_response(error)


def test_http10_without_host_is_served(connect: Callable[[], socket.socket]) -> None:
    sock = connect()
    sock.sendall(b"GET /api/v1/ping HTTP/1.0\r\n\r\n")
    reply = read_to_eof(sock)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b'{"pong":true}')


def test_a_refused_request_is_answered_after_the_pipelined_ones_before_it(connect: Callable[[], socket.socket]) -> None:
    sock = connect()
    sock.sendall(PING + b"GET /api/v1/count/1 HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n" + PING)
    first, _, rest = read_to_eof(sock).partition(b'{"pong":true}')
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest == raw_response(BadRequest("More than one Host header"))


def test_an_unparseable_request_gets_400_in_the_error_shape(connect: Callable[[], socket.socket]) -> None:
    sock = connect()
    sock.sendall(b"GET /api/v1/ping HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n")
    assert read_to_eof(sock) == raw_response(BadRequest("Invalid HTTP request"))


QUIET_ENV = {
    **ENV,
    "SERVICE_RATE_LIMIT_ENABLED": "false",
    "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
    "SERVICE_HEADER_READ_TIMEOUT_SECS": "60",
    "SERVICE_KEEP_ALIVE_TIMEOUT_SECS": "60",
}


def count_requests(first: int, last: int) -> bytes:
    return b"".join(b"GET /api/v1/count/%d HTTP/1.1\r\nHost: t\r\n\r\n" % n for n in range(first, last))


def send_until_stalled(sock: socket.socket, data: bytes, *, stall_secs: float = 1.0) -> int:
    """Send ``data`` without reading anything, until it is all sent or the server has taken nothing for
    ``stall_secs`` (it stopped reading); how many bytes went out."""
    sock.setblocking(False)
    sent, stalled_since = 0, None
    try:
        while sent < len(data):
            try:
                sent += sock.send(data[sent : sent + 65536])
                stalled_since = None
            except BlockingIOError:
                now = time.monotonic()
                stalled_since = stalled_since or now
                if now - stalled_since > stall_secs:
                    break
                time.sleep(0.01)
    finally:
        sock.setblocking(True)
    return sent


def error_lines(output: str) -> list[str]:
    """The log lines at error level or with a traceback."""
    return [
        line
        for line in output.splitlines()
        if "Traceback" in line or '"level":"error"' in line or '"level":"critical"' in line
    ]


def test_a_client_pipelining_without_reading_makes_the_server_hold_a_bounded_queue(
    bastion_process: Callable[..., BastionProcess],
) -> None:
    """20,000 pipelined requests and no reading: the server stops reading once its queue is full (its memory
    hardly moves; unbounded, the queue held them all: 40 MiB more). Read afterwards, every answer arrives, in
    order, and the connection still serves."""
    process = bastion_process(APP, env=QUIET_ENV)
    total = 20_000
    with closing(socket.create_connection(("127.0.0.1", process.port), timeout=60)) as warm:
        warm.sendall(count_requests(0, 2000))  # allocator pools and code paths warmed by the same traffic
        received = b""
        while received.count(b'{"n":') < 2000:
            received += warm.recv(1 << 20)
    before = rss_mib(process.proc.pid)
    requests = count_requests(0, total)
    with closing(socket.create_connection(("127.0.0.1", process.port), timeout=60)) as sock:
        sent = send_until_stalled(sock, requests)
        time.sleep(0.5)  # let the server parse whatever it took
        grown = rss_mib(process.proc.pid) - before
        assert grown < 10, f"{grown} MiB more after {sent} bytes of requests sent and no answer read"
        answers: list[bytes] = []
        reader = threading.Thread(target=lambda: answers.append(read_answers(sock, total)))
        reader.start()
        sock.sendall(requests[sent:])
        reader.join(60)
        assert answers, "not every answer arrived"
        assert [int(n) for n in re.findall(rb'\{"n":(\d+)\}', answers[0])] == list(range(total))
        assert answers[0].count(b"HTTP/1.1 200 OK\r\n") == total
        sock.sendall(PING)
        head, body = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == b'{"pong":true}'
    assert error_lines(process.output()) == []


def read_answers(sock: socket.socket, count: int) -> bytes:
    """Everything the server sends until ``count`` answers of /count have arrived."""
    marker = b'{"n":'
    received, seen = bytearray(), 0
    while seen < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        start = max(0, len(received) - len(marker) + 1)  # a marker may straddle two chunks
        received += chunk
        seen += received.count(marker, start)
    return bytes(received)


def test_a_pipelining_client_that_leaves_without_reading_is_not_an_error(
    bastion_process: Callable[..., BastionProcess],
) -> None:
    """The server is writing answers nobody reads when the client closes: no error line, no traceback (uvicorn
    marks only the last request parsed as disconnected; the one being answered failed on the closed transport)."""
    process = bastion_process(APP, env=QUIET_ENV)
    for _ in range(2):
        with closing(socket.socket()) as sock:
            # A small receive buffer: the unread answers soon fill it, and the server's write waits.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(10)
            sock.connect(("127.0.0.1", process.port))
            send_until_stalled(sock, count_requests(0, 20_000), stall_secs=0.5)
            time.sleep(1.0)  # the server is answering, its write waiting on the full buffer, when the client leaves
    with closing(socket.create_connection(("127.0.0.1", process.port), timeout=10)) as sock:
        sock.sendall(PING_AND_CLOSE)
        assert read_to_eof(sock).endswith(b'{"pong":true}')
    time.sleep(0.5)  # the server notices the closes asynchronously
    assert error_lines(process.output()) == []
