"""WebhookClient over a scripted transport: headers, signing per attempt, what each answer means, retries, waits.

The transport itself (aiohttp, the breaker, timeouts, bodies) is tested against real servers in test_transport.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from mailrelay._delivery import (
    BREAKER_OPEN_REASON,
    Attempt,
    WebhookClient,
    is_retryable_status,
    judge,
)
from mailrelay._signing import compute_signature
from mailrelay._target import DeliveryOutcome, Verdict

BODY = b'{"sender":"a@example.org"}'


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_retryable(status: int) -> None:
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", [200, 301, 400, 401, 403, 404, 409, 410, 413, 422])
def test_not_retryable(status: int) -> None:
    assert not is_retryable_status(status)


@pytest.mark.parametrize(
    ("attempt", "verdict"),
    [
        pytest.param(Attempt(status=204), Verdict.DELIVERED, id="2xx"),
        pytest.param(Attempt(status=503), Verdict.RETRY, id="5xx"),
        pytest.param(Attempt(status=429), Verdict.RETRY, id="429"),
        pytest.param(Attempt(error="timeout"), Verdict.RETRY, id="timeout"),
        pytest.param(Attempt(status=422), Verdict.REJECTED, id="4xx"),
        pytest.param(Attempt(status=302), Verdict.UNEXPECTED, id="3xx"),
        pytest.param(Attempt(error="circuit open", circuit_open=True), Verdict.CIRCUIT_OPEN, id="circuit-open"),
    ],
)
def test_judge(attempt: Attempt, verdict: Verdict) -> None:
    assert judge(attempt) is verdict


class Script:
    """A WebhookTransport answering from a list (a status or an Attempt each) and recording each request."""

    def __init__(self, *answers: int | Attempt) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[bytes, dict[str, str]]] = []

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt:
        self.requests.append((body, dict(headers)))
        answer = self.answers.pop(0) if self.answers else 200
        return answer if isinstance(answer, Attempt) else Attempt(status=answer)


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def webhook(script: Script, sleeps: Sleeps, **options: object) -> WebhookClient:
    ticks = iter(range(1_700_000_000, 1_700_000_100))
    return WebhookClient(
        transport=script,
        user_agent="MailRelay/9.9.9",
        sleep=sleeps,
        random=lambda: 1.0,
        wall_clock=lambda: float(next(ticks)),
        **options,  # type: ignore[arg-type]
    )


async def test_success_on_first_attempt_with_headers() -> None:
    script, sleeps = Script(200), Sleeps()
    result = await webhook(script, sleeps).deliver(BODY, delivery_id="d1")
    assert (result.outcome, result.attempts, result.status) == (DeliveryOutcome.DELIVERED, 1, 200)
    ((body, headers),) = script.requests
    assert body == BODY
    assert headers == {
        "Content-Type": "application/json",
        "User-Agent": "MailRelay/9.9.9",
        "X-MailRelay-Delivery-Id": "d1",
    }
    assert sleeps.waits == []


async def test_signature_is_recomputed_for_each_attempt() -> None:
    script, sleeps = Script(500, 200), Sleeps()
    result = await webhook(script, sleeps, secret="k").deliver(BODY, delivery_id="d2")
    assert result.outcome is DeliveryOutcome.DELIVERED
    (_, first), (_, second) = script.requests
    assert first["X-MailRelay-Timestamp"] != second["X-MailRelay-Timestamp"]
    for body, headers in script.requests:
        timestamp = int(headers["X-MailRelay-Timestamp"])
        assert headers["X-MailRelay-Signature-256"] == compute_signature("k", timestamp, body)
        assert headers["X-MailRelay-Delivery-Id"] == "d2"


async def test_big_bodies_are_signed_on_a_worker_thread_with_the_same_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offloaded: list[int] = []
    real_to_thread = asyncio.to_thread

    async def recording_to_thread(function: object, /, *args: object, **kwargs: object) -> object:
        offloaded.append(len(args[0]))  # type: ignore[arg-type]
        return await real_to_thread(function, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("mailrelay._delivery.asyncio.to_thread", recording_to_thread)
    big = b"x" * 1000
    script = Script(200, 200)
    client = webhook(script, Sleeps(), secret="k", offload_bytes=999)
    await client.attempt(big, delivery_id="big")
    await client.attempt(BODY, delivery_id="small")
    assert offloaded == [1000]
    for body, headers in script.requests:
        timestamp = int(headers["X-MailRelay-Timestamp"])
        assert headers["X-MailRelay-Signature-256"] == compute_signature("k", timestamp, body)


async def test_500_500_200_takes_three_attempts_with_growing_waits() -> None:
    script, sleeps = Script(500, 500, 200), Sleeps()
    result = await webhook(script, sleeps, backoff_base=1.0).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.DELIVERED, 3)
    assert sleeps.waits == [1.0, 2.0]


async def test_retries_exhausted_is_temporary_failure() -> None:
    script, sleeps = Script(503, 503, 503, 503, 200), Sleeps()
    result = await webhook(script, sleeps, max_retries=3).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts, result.status) == (DeliveryOutcome.TEMPORARY_FAILURE, 4, 503)
    assert result.reason == "Webhook delivery failed (HTTP 503), try again later"
    assert len(script.requests) == 4


async def test_zero_retries_means_one_attempt() -> None:
    script, sleeps = Script(500), Sleeps()
    result = await webhook(script, sleeps, max_retries=0).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.TEMPORARY_FAILURE, 1)


@pytest.mark.parametrize("status", [408, 429, 500, 502])
async def test_retryable_statuses(status: int) -> None:
    script, sleeps = Script(status, 200), Sleeps()
    result = await webhook(script, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.DELIVERED, 2)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
async def test_other_4xx_is_rejected_without_retry(status: int) -> None:
    script, sleeps = Script(status), Sleeps()
    result = await webhook(script, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts, result.status) == (DeliveryOutcome.REJECTED, 1, status)
    assert result.reason == f"Webhook refused the message (HTTP {status})"
    assert sleeps.waits == []


async def test_redirect_is_a_temporary_failure_without_retry() -> None:
    script, sleeps = Script(302), Sleeps()
    result = await webhook(script, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.TEMPORARY_FAILURE, 1)
    assert result.reason == "Webhook answered HTTP 302, try again later"


@pytest.mark.parametrize("problem", ["connection error: ConnectError", "timeout"])
async def test_network_errors_are_retried(problem: str) -> None:
    failure = Attempt(error=problem)
    script, sleeps = Script(failure, failure, 200), Sleeps()
    result = await webhook(script, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts) == (DeliveryOutcome.DELIVERED, 3)
    failed = await webhook(Script(failure, failure, failure, failure), Sleeps()).deliver(BODY, delivery_id="d")
    assert failed.outcome is DeliveryOutcome.TEMPORARY_FAILURE
    assert failed.reason == f"Webhook delivery failed ({problem}), try again later"


async def test_retry_after_is_honoured() -> None:
    script = Script(Attempt(status=429, retry_after="7"), Attempt(status=503, retry_after="x"))
    sleeps = Sleeps()
    result = await webhook(script, sleeps, backoff_base=0.5).deliver(BODY, delivery_id="d")
    assert result.outcome is DeliveryOutcome.DELIVERED
    assert sleeps.waits == [7.0, 1.0]  # the server's 7 s, then plain backoff for an unparsable value


async def test_open_circuit_ends_the_delivery_at_once() -> None:
    refused = Attempt(error="circuit open", circuit_open=True)
    script, sleeps = Script(500, refused), Sleeps()
    result = await webhook(script, sleeps).deliver(BODY, delivery_id="d")
    assert (result.outcome, result.attempts, result.reason) == (
        DeliveryOutcome.TEMPORARY_FAILURE,
        1,
        BREAKER_OPEN_REASON,
    )
    assert result.posted
    first_refused = await webhook(Script(refused), Sleeps()).deliver(BODY, delivery_id="d")
    assert (first_refused.attempts, first_refused.posted) == (0, False)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.example/m", "https://hooks.example/…"),
        ("https://hooks.example", "https://hooks.example"),
        ("https://u:pw@hooks.example:8443/?token=t", "https://hooks.example:8443/…"),
        ("http://[::1]:9000/webhook", "http://[::1]:9000/…"),
    ],
)
def test_the_webhook_label_keeps_the_origin_and_a_hash(url: str, shown: str) -> None:
    import hashlib

    from mailrelay._delivery import webhook_label

    assert webhook_label(url) == f"{shown} #{hashlib.sha256(url.encode()).hexdigest()[:8]}"
