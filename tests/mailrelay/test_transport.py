"""AiohttpTransport against real servers: what each answer becomes, the breaker under it, timeouts and bodies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bastion_core import BreakerState, CircuitBreaker, Guard
from mailrelay._delivery import Attempt
from mailrelay._transport import STREAMED_BODY_BYTES, AiohttpTransport, env_proxy
from mailrelay.testing import FakeClock, ScriptedResponse, WebhookReceiver, free_port

HEADERS = {"Content-Type": "application/json", "User-Agent": "MailRelay/test"}

Open = Callable[..., Awaitable[AiohttpTransport]]


@pytest.fixture
def receiver() -> AsyncIterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running  # type: ignore[misc]


@pytest.fixture
def breaker() -> CircuitBreaker:
    return CircuitBreaker("webhook", threshold=0.5, min_requests=2, wait_secs=60, clock=FakeClock())


@pytest.fixture
async def transport_to() -> AsyncIterator[Callable[..., AiohttpTransport]]:
    opened: list[AiohttpTransport] = []

    def make(url: str, breaker: CircuitBreaker, *, timeout: float = 5.0) -> AiohttpTransport:
        transport = AiohttpTransport.open(url=url, guard=Guard(breaker=breaker), timeout=timeout)
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        await transport.close()


async def test_2xx_arrives_with_the_exact_body_and_headers(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    attempt = await transport_to(receiver.url, breaker).post(b'{"a":1}', HEADERS)
    assert attempt == Attempt(status=200)
    (request,) = receiver.requests
    assert (request.method, request.path, request.body) == ("POST", "/webhook", b'{"a":1}')
    assert request.header("Content-Type") == "application/json"
    assert request.header("User-Agent") == "MailRelay/test"


async def test_a_big_body_is_streamed_with_its_length(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    body = bytes(range(256)) * (STREAMED_BODY_BYTES // 256 + 1000)
    assert (await transport_to(receiver.url, breaker).post(body, HEADERS)).status == 200
    (request,) = receiver.requests
    assert request.body == body
    assert request.header("Content-Length") == str(len(body))
    assert request.header("Transfer-Encoding") is None


async def test_5xx_and_retry_after_count_as_a_failure(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    receiver.script(ScriptedResponse(status=503, headers={"Retry-After": "5"}), 503)
    transport = transport_to(receiver.url, breaker)
    assert await transport.post(b"{}", HEADERS) == Attempt(status=503, retry_after="5")
    assert await transport.post(b"{}", HEADERS) == Attempt(status=503)
    assert breaker.state is BreakerState.OPEN


async def test_4xx_is_an_answer_and_never_opens_the_breaker(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    receiver.script(422, 422, 422)
    transport = transport_to(receiver.url, breaker)
    for _ in range(3):
        assert await transport.post(b"{}", HEADERS) == Attempt(status=422)
    assert breaker.state is BreakerState.CLOSED


async def test_redirects_are_not_followed(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    receiver.script(ScriptedResponse(status=307, headers={"Location": receiver.url}))
    assert (await transport_to(receiver.url, breaker).post(b"{}", HEADERS)).status == 307
    assert len(receiver.requests) == 1


async def test_refused_connection_is_a_connect_error_and_a_failure(
    breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    transport = transport_to(f"http://127.0.0.1:{free_port()}/webhook", breaker)
    assert await transport.post(b"{}", HEADERS) == Attempt(error="connection error: ConnectError")
    assert await transport.post(b"{}", HEADERS) == Attempt(error="connection error: ConnectError")
    assert breaker.state is BreakerState.OPEN


async def test_a_slow_receiver_is_a_timeout_and_a_failure(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    receiver.script(ScriptedResponse(status=200, delay=1.0), ScriptedResponse(status=200, delay=1.0))
    transport = transport_to(receiver.url, breaker, timeout=0.2)
    assert await transport.post(b"{}", HEADERS) == Attempt(error="timeout")
    assert await transport.post(b"{}", HEADERS) == Attempt(error="timeout")
    assert breaker.state is BreakerState.OPEN


async def test_open_circuit_sends_nothing(
    receiver: WebhookReceiver, breaker: CircuitBreaker, transport_to: Callable[..., AiohttpTransport]
) -> None:
    for _ in range(2):
        breaker.record(breaker.admit(), success=False)
    attempt = await transport_to(receiver.url, breaker).post(b"{}", HEADERS)
    assert attempt == Attempt(error="circuit open", circuit_open=True)
    assert receiver.requests == []


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
    then: Callable[[asyncio.StreamWriter], Awaitable[None]],
    breaker: CircuitBreaker,
    transport_to: Callable[..., AiohttpTransport],
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


def test_proxy_from_the_environment_is_chosen_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "internal.example")
    assert env_proxy("https://hooks.example.com/mail") == "http://proxy.example:3128"
    assert env_proxy("https://internal.example/mail") is None
    assert env_proxy("http://hooks.example.com/mail") is None  # no http_proxy set
