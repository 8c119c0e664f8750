"""MAIL_RELAY_RAW=s3 through the real `mailrelay` process and a real S3 API server (moto): the message as received
is an .eml object the payload points at, downloadable with its presigned URL."""

from __future__ import annotations

import json
from collections.abc import Callable
from email import policy
from email.message import EmailMessage

import httpx
import pytest

from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import AWS_ENVIRONMENT, TARGET, RelayProcess
from tests.mailrelay.servers import S3_REGION, S3Server

BUCKET = "relay-raw"


@pytest.fixture(scope="module")
def raw_relay(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, s3_server: S3Server) -> RelayProcess:
    s3_server.client().create_bucket(Bucket=BUCKET)
    return start_relay(
        environment=AWS_ENVIRONMENT,
        WEBHOOK_URL=receiver.url,
        RAW="s3",
        S3_BUCKET=BUCKET,
        S3_PREFIX="raw/",
        S3_ENDPOINT_URL=s3_server.url,
        S3_REGION=S3_REGION,
        S3_PRESIGN_SECS="600",
    )


def test_the_raw_message_is_stored_and_referenced(
    raw_relay: RelayProcess, webhook: WebhookReceiver, s3_server: S3Server
) -> None:
    message = EmailMessage()
    message["From"] = "Al <al@example.org>"
    message["To"] = TARGET
    message["Subject"] = "keep me whole"
    message["Message-ID"] = "<raw-1@example.org>"
    message.set_content("see attached\n")
    message.add_attachment(b"%PDF-1.7", maintype="application", subtype="pdf", filename="a.pdf")
    sent = message.as_bytes(policy=policy.SMTP)
    with raw_relay.smtp() as smtp:
        assert smtp.sendmail("al@example.org", [TARGET], sent) == {}
    (request,) = webhook.wait_for(1)
    payload = json.loads(request.body)
    assert list(payload)[-2:] == ["raw_url", "raw_presigned_url"]
    assert payload["attachments"][0]["delivery"] == "inline"  # attachments keep their own delivery
    prefix = f"s3://{BUCKET}/raw/"
    assert payload["raw_url"].startswith(prefix) and payload["raw_url"].endswith("-message.eml")
    stored = s3_server.client().get_object(Bucket=BUCKET, Key=payload["raw_url"].removeprefix(f"s3://{BUCKET}/"))
    assert stored["Body"].read() == sent
    assert stored["ContentType"] == "message/rfc822"
    assert stored["Metadata"] == {"delivery-id": request.header("X-MailRelay-Delivery-Id")}
    assert httpx.get(payload["raw_presigned_url"], timeout=10).content == sent
