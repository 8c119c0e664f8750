"""Webhook delivery end to end: signing, retries, 451/554 replies and the circuit breaker."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import smtplib
import time
from collections.abc import Callable

import pytest

import mailrelay
from mailrelay._delivery import webhook_label
from mailrelay.testing import ScriptedResponse, WebhookReceiver
from tests.e2e.mailrelay.support import SECRET, TARGET, RelayProcess

MESSAGE = b"From: alice@example.org\r\nSubject: deliver me\r\n\r\nbody\r\n"
DELIVERED = (250, b"OK: Message accepted for delivery")


def failed(problem: str) -> tuple[int, bytes]:
    return 451, f"4.3.0 Webhook delivery failed ({problem}), try again later".encode()


def transaction(relay: RelayProcess, message: bytes = MESSAGE) -> tuple[int, bytes]:
    """MAIL, RCPT, DATA on a fresh connection; the final reply to DATA."""
    with relay.smtp() as smtp:
        smtp.ehlo()
        assert smtp.mail("alice@example.org") == (250, b"OK")
        assert smtp.rcpt(TARGET) == (250, b"OK")
        return smtp.data(message)


def test_request_headers_and_signature_verify(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    assert transaction(relay) == DELIVERED
    (request,) = webhook.wait_for(1)
    assert request.method == "POST"
    assert request.header("Content-Type") == "application/json"
    assert request.header("User-Agent") == f"MailRelay/{mailrelay.__version__}"
    timestamp = request.header("X-MailRelay-Timestamp")
    assert timestamp is not None and timestamp.isdigit()
    expected = hmac.new(SECRET.encode(), timestamp.encode() + b"." + request.body, hashlib.sha256).hexdigest()
    assert request.header("X-MailRelay-Signature-256") == f"sha256={expected}"
    assert re.fullmatch(r"[0-9a-f]{32}", request.header("X-MailRelay-Delivery-Id") or "")
    assert json.loads(request.body)["subject"] == "deliver me"


def test_each_message_is_logged_as_one_json_event_without_secrets(
    relay: RelayProcess, webhook: WebhookReceiver
) -> None:
    assert transaction(relay) == DELIVERED
    (request,) = webhook.wait_for(1)
    delivery_id = request.header("X-MailRelay-Delivery-Id")
    (event,) = [e for e in relay.events("message_relayed") if e["delivery_id"] == delivery_id]
    assert event["level"] == "info"
    assert event["logger"] == "mailrelay.relay"
    assert (event["outcome"], event["attempts"], event["status"]) == ("delivered", 1, 200)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", event["timestamp"])
    assert SECRET not in relay.logs()
    assert "deliver me" not in relay.logs()  # nothing of the message itself
    # at LOG_LEVEL=DEBUG too, the libraries underneath (aiosmtpd, httpx, httpcore, asyncio) stay quiet
    assert {event["logger"].split(".")[0] for event in relay.events()} == {"mailrelay"}


def test_no_signature_headers_without_secret(
    start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=webhook.url)
    assert transaction(relay) == DELIVERED
    (request,) = webhook.wait_for(1)
    assert request.header("X-MailRelay-Timestamp") is None
    assert request.header("X-MailRelay-Signature-256") is None
    assert request.header("X-MailRelay-Delivery-Id") is not None


def test_500_twice_then_200_is_250_after_exactly_three_posts(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    webhook.script(500, 500, 200)
    assert transaction(relay) == DELIVERED
    requests = webhook.wait_for(3)
    assert len(requests) == 3
    assert len({r.body for r in requests}) == 1
    assert len({r.header("X-MailRelay-Delivery-Id") for r in requests}) == 1
    for request in requests:  # each attempt carries a valid signature over the bytes it sent
        timestamp = request.header("X-MailRelay-Timestamp") or ""
        digest = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + request.body, hashlib.sha256).hexdigest()
        assert request.header("X-MailRelay-Signature-256") == f"sha256={digest}"


def test_retry_after_and_429_are_honoured(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    webhook.script(ScriptedResponse(status=429, headers={"Retry-After": "0"}), 503, 200)
    assert transaction(relay) == DELIVERED
    assert len(webhook.wait_for(3)) == 3


def test_webhook_down_is_451_and_nothing_delivered(
    start_relay: Callable[..., RelayProcess], dead_url: str, webhook: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=dead_url)
    assert transaction(relay) == failed("connection error: ConnectError")
    assert webhook.requests == []
    retries = relay.events("webhook_retry_scheduled")
    assert [event["attempt"] for event in retries] == [1, 2, 3]  # 1 attempt + 3 retries
    assert {event["problem"] for event in retries} == {"connection error: ConnectError"}
    assert {event["webhook"] for event in retries} == {webhook_label(dead_url)}  # which webhook it could not reach
    (exhausted,) = relay.events("webhook_retries_exhausted")
    assert (exhausted["webhook"], exhausted["attempts"]) == (webhook_label(dead_url), 4)
    (relayed,) = relay.events("message_relayed")
    assert (relayed["outcome"], relayed["attempts"], relayed["status"]) == ("temporary_failure", 4, None)


def test_persistent_500_is_451_after_all_retries(
    start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=webhook.url, WEBHOOK_MAX_RETRIES="2")
    webhook.reset(default=500)
    assert transaction(relay) == failed("HTTP 500")
    assert len(webhook.wait_for(3)) == 3
    (exhausted,) = relay.events("webhook_retries_exhausted")
    assert (exhausted["webhook"], exhausted["problem"]) == (webhook_label(webhook.url), "HTTP 500")


def test_the_log_names_the_webhook_by_origin_and_hash_only(
    start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver
) -> None:
    """Password, query and path can all be secrets (Slack-style capability URLs keep the secret in the path)."""
    secret_url = webhook.url.replace("http://", "http://relay:s3cret@", 1) + "/T0/B0/path-secret?token=abc"
    relay = start_relay(WEBHOOK_URL=secret_url, WEBHOOK_MAX_RETRIES="0")
    webhook.reset(default=400)
    assert transaction(relay) == (554, b"5.6.0 Webhook refused the message (HTTP 400)")  # the reply names no URL
    (answer,) = relay.events("webhook_final_answer")
    origin = webhook.url.split("/", 3)[:3]
    assert answer["webhook"] == f"{'/'.join(origin)}/… #{hashlib.sha256(secret_url.encode()).hexdigest()[:8]}"
    assert not any(secret in relay.logs() for secret in ("s3cret", "token=abc", "path-secret"))


def test_webhook_timeout_is_retried_then_451(
    start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver
) -> None:
    relay = start_relay(WEBHOOK_URL=webhook.url, WEBHOOK_TIMEOUT="0.3", WEBHOOK_MAX_RETRIES="1")
    webhook.script(ScriptedResponse(status=200, delay=1.0), ScriptedResponse(status=200, delay=1.0))
    assert transaction(relay) == failed("timeout")


@pytest.mark.parametrize("status", [400, 404, 422])
def test_other_4xx_is_554(relay: RelayProcess, webhook: WebhookReceiver, status: int) -> None:
    webhook.script(status)
    assert transaction(relay) == (554, f"5.6.0 Webhook refused the message (HTTP {status})".encode())
    assert len(webhook.wait_for(1)) == 1  # never retried


def test_attachment_over_limit_with_reject_is_552_and_not_posted(
    start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver
) -> None:
    """The limit's old name and POLICY_ACTION=reject give the 552 of earlier releases (the default action drops)."""
    relay = start_relay(WEBHOOK_URL=webhook.url, MAX_ATTACHMENT_SIZE="20000", ATTACHMENT_POLICY_ACTION="reject")
    blob = base64.encodebytes(b"\x00" * 30_000).replace(b"\n", b"\r\n")
    message = (
        b"Subject: big\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b1\r\n\r\n"
        b"--b1\r\nContent-Type: text/plain\r\n\r\nsee file\r\n"
        b"--b1\r\nContent-Type: application/octet-stream\r\n"
        b'Content-Disposition: attachment; filename="big.bin"\r\nContent-Transfer-Encoding: base64\r\n\r\n'
        + blob
        + b"--b1--\r\n"
    )
    assert transaction(relay, message) == (552, b"5.3.4 Attachment size exceeds fixed limit")
    assert webhook.requests == []


def test_open_breaker_answers_451_at_once_without_posting(
    start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver
) -> None:
    relay = start_relay(
        WEBHOOK_URL=webhook.url,
        WEBHOOK_MAX_RETRIES="0",
        CIRCUIT_BREAKER_FAILURE_RATE="0.5",
        CIRCUIT_BREAKER_MIN_REQUESTS="2",
        CIRCUIT_BREAKER_RESET="600",
    )
    webhook.reset(default=500)
    assert transaction(relay) == failed("HTTP 500")
    assert transaction(relay) == failed("HTTP 500")  # 2 of the last 2 attempts failed: 1.0 > 0.5 opens it
    assert len(webhook.wait_for(2)) == 2
    assert transaction(relay) == (451, b"4.3.0 Webhook temporarily unavailable (circuit open), try again later")
    assert len(webhook.requests) == 2  # the third message never reached the webhook


def test_4xx_answers_never_open_the_breaker(start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver) -> None:
    relay = start_relay(WEBHOOK_URL=webhook.url, WEBHOOK_MAX_RETRIES="0", CIRCUIT_BREAKER_MIN_REQUESTS="2")
    webhook.reset(default=422)
    refused = (554, b"5.6.0 Webhook refused the message (HTTP 422)")
    assert [transaction(relay) for _ in range(4)] == [refused] * 4
    webhook.reset(default=200)
    assert transaction(relay) == DELIVERED


def test_breaker_half_open_probe_closes_it(start_relay: Callable[..., RelayProcess], webhook: WebhookReceiver) -> None:
    relay = start_relay(
        WEBHOOK_URL=webhook.url,
        WEBHOOK_MAX_RETRIES="0",
        CIRCUIT_BREAKER_MIN_REQUESTS="1",
        CIRCUIT_BREAKER_RESET="0.2",
    )
    webhook.script(500)
    assert transaction(relay) == failed("HTTP 500")  # the failure opens the breaker
    time.sleep(0.3)  # longer than CIRCUIT_BREAKER_RESET: the next message is the half-open probe
    assert transaction(relay) == DELIVERED
    assert transaction(relay) == DELIVERED  # closed again
    assert len(webhook.requests) == 3


def test_many_recipients_one_post(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        refused = smtp.sendmail("alice@example.org", [TARGET, "support@example.test"], MESSAGE)
    assert refused == {}
    assert len(webhook.wait_for(1, timeout=1)) == 1


def test_sendmail_raises_for_451(start_relay: Callable[..., RelayProcess], dead_url: str) -> None:
    relay = start_relay(WEBHOOK_URL=dead_url, WEBHOOK_MAX_RETRIES="0")
    with relay.smtp() as smtp, pytest.raises(smtplib.SMTPDataError) as caught:
        smtp.sendmail("alice@example.org", [TARGET], MESSAGE)
    assert caught.value.smtp_code == 451
