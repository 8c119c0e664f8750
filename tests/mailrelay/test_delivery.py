"""WebhookClient with httpx.MockTransport: headers, signing per attempt, retry decisions, waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from mailrelay._delivery import DeliveryOutcome, WebhookClient, is_retryable_status
from mailrelay._signing import compute_signature

BODY = b'{"sender":"a@example.org"}'
URL = "https://hooks.example.com/mail"

MakeClient = Callable[[Callable[[httpx.Request], httpx.Response]], httpx.AsyncClient]


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_retryable(status: int) -> None:
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", [200, 301, 400, 401, 403, 404, 409, 410, 413, 422])
def test_not_retryable(status: int) -> None:
    assert not is_retryable_status(status)


class Script:
    """Answers requests from a list of statuses/exceptions and records them."""

    def __init__(self, *answers: int | Exception | httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if self.answers else 200
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return httpx.Response(answer)


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def webhook(client: httpx.AsyncClient, sleeps: Sleeps, **options: object) -> WebhookClient:
    ticks = iter(range(1_700_000_000, 1_700_000_100))
    return WebhookClient(
        client=client,
        url=URL,
        user_agent="MailRelay/9.9.9",
        sleep=sleeps,
        random=lambda: 1.0,
        wall_clock=lambda: float(next(ticks)),
        **options,  # type: ignore[arg-type]
    )


async def test_success_on_first_attempt_with_headers(make_client: MakeClient) -> None:
    script, sleeps = Script(200), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps).deliver(BODY, delivery_id="d1")
    assert (result.outcome, result.attempts, result.status) == (DeliveryOutcome.DELIVERED, 1, 200)
    (request,) = script.requests
    assert request.method == "POST"
    assert str(request.url) == URL
    assert request.content == BODY
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"] == "MailRelay/9.9.9"
    assert request.headers["x-mailrelay-delivery-id"] == "d1"
    assert "x-mailrelay-signature-256" not in request.headers
    assert "x-mailrelay-timestamp" not in request.headers
    assert sleeps.waits == []


async def test_signature_is_recomputed_for_each_attempt(make_client: MakeClient) -> None:
    script, sleeps = Script(500, 200), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps, secret="k").deliver(BODY, delivery_id="d2")
    assert result.outcome is DeliveryOutcome.DELIVERED
    first, second = script.requests
    assert first.headers["x-mailrelay-timestamp"] != second.headers["x-mailrelay-timestamp"]
    for request in script.requests:
        timestamp = int(request.headers["x-mailrelay-timestamp"])
        assert request.headers["x-mailrelay-signature-256"] == compute_signature("k", timestamp, request.content)
        assert request.headers["x-mailrelay-delivery-id"] == "d2"


async def test_500_500_200_takes_three_attempts_with_growing_waits(make_client: MakeClient) -> None:
    script, sleeps = Script(500, 500, 200), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps, backoff_base=1.0).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.DELIVERED, 3)
    assert sleeps.waits == [1.0, 2.0]


async def test_retries_exhausted_is_temporary_failure(make_client: MakeClient) -> None:
    script, sleeps = Script(503, 503, 503, 503, 200), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps, max_retries=3).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts, result.status) == (DeliveryOutcome.TEMPORARY_FAILURE, 4, 503)
    assert "HTTP 503" in result.reason
    assert len(script.requests) == 4


async def test_zero_retries_means_one_attempt(make_client: MakeClient) -> None:
    script, sleeps = Script(500), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps, max_retries=0).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.TEMPORARY_FAILURE, 1)


@pytest.mark.parametrize("status", [408, 429, 500, 502])
async def test_retryable_statuses(make_client: MakeClient, status: int) -> None:
    script, sleeps = Script(status, 200), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.DELIVERED, 2)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
async def test_other_4xx_is_rejected_without_retry(make_client: MakeClient, status: int) -> None:
    script, sleeps = Script(status), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts, result.status) == (DeliveryOutcome.REJECTED, 1, status)
    assert sleeps.waits == []


async def test_redirect_is_a_temporary_failure_without_retry(make_client: MakeClient) -> None:
    script, sleeps = Script(httpx.Response(302, headers={"Location": "https://elsewhere"})), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.TEMPORARY_FAILURE, 1)


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (httpx.ConnectError("refused"), "connection error"),
        (httpx.ReadTimeout("slow"), "timeout"),
        (httpx.RemoteProtocolError("bad"), "connection error"),
    ],
)
async def test_network_errors_are_retried(make_client: MakeClient, error: Exception, words: str) -> None:
    script, sleeps = Script(error, error, 200), Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.DELIVERED, 3)
    script2 = Script(error, error, error, error)
    async with make_client(script2) as client:
        failed = await webhook(client, Sleeps()).deliver(BODY, delivery_id="d")
    assert failed.outcome is DeliveryOutcome.TEMPORARY_FAILURE
    assert words in failed.reason


async def test_retry_after_is_honoured(make_client: MakeClient) -> None:
    script = Script(
        httpx.Response(429, headers={"Retry-After": "7"}), httpx.Response(503, headers={"Retry-After": "x"})
    )
    sleeps = Sleeps()
    async with make_client(script) as client:
        result = await webhook(client, sleeps, backoff_base=0.5).deliver(BODY, delivery_id="d")
    assert result.outcome is DeliveryOutcome.DELIVERED
    assert sleeps.waits == [7.0, 1.0]  # the server's 7 s, then plain backoff for an unparsable value


async def test_per_attempt_timeout_bounds_a_hanging_receiver() -> None:
    import asyncio

    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200)

    sleeps = Sleeps()
    async with httpx.AsyncClient(transport=httpx.MockTransport(hang)) as client:
        result = await webhook(client, sleeps, timeout=0.01, max_retries=1).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.TEMPORARY_FAILURE, 2)
    assert "timeout" in result.reason


class StalledBody(httpx.AsyncByteStream):
    """A response body that sends a few bytes of its announced length, then fails or never ends."""

    def __init__(self, failure: Exception | None) -> None:
        self.failure = failure

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"abc"
        if self.failure is not None:
            raise self.failure
        await asyncio.sleep(3600)


@pytest.mark.parametrize(
    "failure",
    [pytest.param(httpx.RemoteProtocolError("peer closed"), id="cut-short"), pytest.param(None, id="stalls")],
)
async def test_2xx_whose_body_is_cut_short_or_stalls_is_still_delivered(failure: Exception | None) -> None:
    """The status line is the answer: retrying after a 200 would post the message twice."""
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, headers={"Content-Length": "10"}, stream=StalledBody(failure))

    sleeps = Sleeps()
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        result = await webhook(client, sleeps, timeout=0.05).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts, result.status) == (DeliveryOutcome.DELIVERED, 1, 200)
    assert len(requests) == 1
    assert sleeps.waits == []
