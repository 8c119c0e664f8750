"""Http11Transport (the webhook's own HTTP/1.1 client) against real servers on loopback: the same answers as
AiohttpTransport (tests/mailrelay/test_transport.py), plus its keep-alive rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bastion_core import BreakerState, CircuitBreaker, Guard
from mailrelay._delivery import Attempt
from mailrelay._http_client import (
    BAD_RESPONSE,
    CONNECT_ERROR,
    DISCONNECTED,
    Http11Transport,
    open_webhook_transport,
)
from mailrelay._transport import STREAMED_BODY_BYTES, AiohttpTransport
from mailrelay.testing import FakeClock, ScriptedResponse, WebhookReceiver, free_port

HEADERS = {"Content-Type": "application/json", "User-Agent": "MailRelay/test"}
Make = Callable[..., Http11Transport]


@pytest.fixture
def receiver() -> AsyncIterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running  # type: ignore[misc]


@pytest.fixture
def breaker() -> CircuitBreaker:
    return CircuitBreaker("webhook", threshold=0.5, min_requests=2, wait_secs=60, clock=FakeClock())


@pytest.fixture
async def transport_to() -> AsyncIterator[Make]:
    opened: list[Http11Transport] = []

    def make(url: str, breaker: CircuitBreaker, *, timeout: float = 5.0) -> Http11Transport:
        transport = Http11Transport(url=url, guard=Guard(breaker=breaker), timeout=timeout)
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        await transport.close()


async def test_2xx_arrives_with_the_exact_body_and_headers(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Make
) -> None:
    attempt = await transport_to(receiver.url, breaker).post(b'{"a":1}', HEADERS)
    assert attempt == Attempt(status=200)
    (request,) = receiver.requests
    assert (request.method, request.path, request.body) == ("POST", "/webhook", b'{"a":1}')
    assert request.header("Content-Type") == "application/json"
    assert request.header("User-Agent") == "MailRelay/test"
    assert request.header("Content-Length") == "7"


async def test_a_big_body_is_streamed_with_its_length(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Make
) -> None:
    body = bytes(range(256)) * (STREAMED_BODY_BYTES // 256 + 1000)
    assert (await transport_to(receiver.url, breaker).post(body, HEADERS)).status == 200
    (request,) = receiver.requests
    assert request.body == body
    assert request.header("Transfer-Encoding") is None


async def test_5xx_and_retry_after_count_as_a_failure(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Make
) -> None:
    receiver.script(ScriptedResponse(status=503, headers={"Retry-After": "5"}), 503)
    transport = transport_to(receiver.url, breaker)
    assert await transport.post(b"{}", HEADERS) == Attempt(status=503, retry_after="5")
    assert await transport.post(b"{}", HEADERS) == Attempt(status=503)
    assert breaker.state is BreakerState.OPEN


async def test_4xx_and_redirects_are_answers(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Make
) -> None:
    receiver.script(422, 422, ScriptedResponse(status=307, headers={"Location": receiver.url}))
    transport = transport_to(receiver.url, breaker)
    assert [(await transport.post(b"{}", HEADERS)).status for _ in range(3)] == [422, 422, 307]
    assert len(receiver.requests) == 3
    assert breaker.state is BreakerState.CLOSED


async def test_refused_connection_is_a_connect_error_and_a_failure(breaker: CircuitBreaker, transport_to: Make) -> None:
    transport = transport_to(f"http://127.0.0.1:{free_port()}/webhook", breaker)
    assert await transport.post(b"{}", HEADERS) == Attempt(error=CONNECT_ERROR)
    assert await transport.post(b"{}", HEADERS) == Attempt(error=CONNECT_ERROR)
    assert breaker.state is BreakerState.OPEN


async def test_a_slow_receiver_is_a_timeout_and_a_failure(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Make
) -> None:
    receiver.script(ScriptedResponse(status=200, delay=1.0), ScriptedResponse(status=200, delay=1.0))
    transport = transport_to(receiver.url, breaker, timeout=0.2)
    assert await transport.post(b"{}", HEADERS) == Attempt(error="timeout")
    assert await transport.post(b"{}", HEADERS) == Attempt(error="timeout")
    assert breaker.state is BreakerState.OPEN


async def test_open_circuit_sends_nothing(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Make
) -> None:
    for _ in range(2):
        breaker.record(breaker.admit(), success=False)
    attempt = await transport_to(receiver.url, breaker).post(b"{}", HEADERS)
    assert attempt == Attempt(error="circuit open", circuit_open=True)
    assert receiver.requests == []


class _Scripted:
    """A server answering each request with the next bytes of `answers` (then closing when told), counting
    connections."""

    def __init__(self, answers: list[bytes], *, close_after: bool = False) -> None:
        self.answers = answers
        self.close_after = close_after
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(self.answers.pop(0))
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def _served(script: _Scripted) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"


async def _posts(script: _Scripted, make: Make, breaker: CircuitBreaker, count: int) -> list[Attempt]:
    server, url = await _served(script)
    try:
        transport = make(url, breaker, timeout=1.0)
        return [await transport.post(b"{}", HEADERS) for _ in range(count)]
    finally:
        server.close()
        for writer in script.writers:
            writer.close()
        await server.wait_closed()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def test_one_connection_carries_every_post(breaker: CircuitBreaker, transport_to: Make) -> None:
    script = _Scripted([OK, b"HTTP/1.1 204 No Content\r\n\r\n", OK])
    assert [a.status for a in await _posts(script, transport_to, breaker, 3)] == [200, 204, 200]
    assert script.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", id="connection-close"),
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", id="http-1.0"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", id="chunked"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + b"x" * 70000, id="big-body"),
    ],
)
async def test_a_connection_that_cannot_be_reused_is_replaced(
    answer: bytes, breaker: CircuitBreaker, transport_to: Make
) -> None:
    script = _Scripted([answer, answer])
    assert [a.status for a in await _posts(script, transport_to, breaker, 2)] == [200, 200]
    assert script.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_used(
    breaker: CircuitBreaker, transport_to: Make
) -> None:
    script = _Scripted([OK, OK], close_after=True)
    server, url = await _served(script)
    try:
        transport = transport_to(url, breaker)
        assert await transport.post(b"{}", HEADERS) == Attempt(status=200)
        await asyncio.sleep(0.05)  # the server's close arrives
        assert await transport.post(b"{}", HEADERS) == Attempt(status=200)
    finally:
        server.close()
        await server.wait_closed()
    assert script.connections == 2


async def test_interim_answers_are_skipped(breaker: CircuitBreaker, transport_to: Make) -> None:
    script = _Scripted([b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK])
    assert await _posts(script, transport_to, breaker, 1) == [Attempt(status=200)]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        pytest.param(b"", DISCONNECTED, id="closed-without-answer"),
        pytest.param(b"HTTP/1.1 200", DISCONNECTED, id="head-cut-short"),
        pytest.param(b"SMTP 200 OK\r\n\r\n", BAD_RESPONSE, id="not-http"),
        pytest.param(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", BAD_RESPONSE, id="broken-field"),
    ],
)
async def test_no_answer_is_a_connection_error_and_a_failure(
    answer: bytes, problem: str, breaker: CircuitBreaker, transport_to: Make
) -> None:
    script = _Scripted([answer, answer], close_after=True)
    assert await _posts(script, transport_to, breaker, 2) == [Attempt(error=problem)] * 2
    assert breaker.state is BreakerState.OPEN


async def test_a_head_without_end_is_bounded(breaker: CircuitBreaker, transport_to: Make) -> None:
    script = _Scripted([b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"x" * 70_000])
    assert await _posts(script, transport_to, breaker, 1) == [Attempt(error=BAD_RESPONSE)]


async def _answer_200_then(
    server_side: Callable[[asyncio.StreamWriter], Awaitable[None]], writers: list[asyncio.StreamWriter]
) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await server_side(writer)

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _cut_short(writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _stall(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(5)
    writer.close()


@pytest.mark.parametrize("then", [pytest.param(_cut_short, id="cut-short"), pytest.param(_stall, id="stalls")])
async def test_2xx_whose_body_is_cut_short_or_stalls_is_still_a_2xx(
    then: Callable[[asyncio.StreamWriter], Awaitable[None]], breaker: CircuitBreaker, transport_to: Make
) -> None:
    """The status line is the answer: retrying after a 200 would post the message twice."""
    writers: list[asyncio.StreamWriter] = []
    server = await _answer_200_then(then, writers)
    port = server.sockets[0].getsockname()[1]
    try:
        attempt = await transport_to(f"http://127.0.0.1:{port}/webhook", breaker, timeout=0.3).post(b"{}", HEADERS)
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()
    assert attempt == Attempt(status=200)
    assert breaker.snapshot().failure_rate == 0.0


async def test_a_proxy_in_the_environment_chooses_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = Guard(breaker=CircuitBreaker("webhook"))
    direct = open_webhook_transport(url="https://hooks.example.com/mail", guard=guard, timeout=5)
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    proxied = open_webhook_transport(url="https://hooks.example.com/mail", guard=guard, timeout=5)
    assert isinstance(direct, Http11Transport)
    assert isinstance(proxied, AiohttpTransport)
    await direct.close()
    await proxied.close()


async def test_credentials_in_the_url_become_basic_auth_and_the_path_is_percent_encoded(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Make
) -> None:
    url = receiver.url.replace("http://", "http://hook%40user:s3cret@") + "/caf\u00e9%20x?a=b c"
    assert (await transport_to(url, breaker).post(b"{}", HEADERS)).status == 200
    (request,) = receiver.requests
    assert request.header("Authorization") == "Basic aG9va0B1c2VyOnMzY3JldA=="  # hook@user:s3cret
    assert request.path == "/webhook/caf%C3%A9%20x?a=b+c"  # what aiohttp (yarl) sends
