"""S3 attachment delivery through the real `mailrelay` process against a real S3 API server (moto)."""

from __future__ import annotations

import datetime
import json
import re
import smtplib
import time
import urllib.parse
from collections.abc import Callable
from email import policy
from email.message import EmailMessage
from typing import Any

import httpx
import pytest

from mailrelay.testing import WebhookReceiver, free_port
from tests.e2e.mailrelay.support import AWS_ENVIRONMENT, TARGET, RelayProcess
from tests.mailrelay.servers import S3_REGION, S3Server, silent_tcp_server

BUCKET = "relay-attachments"
PRESIGN_SECS = 2
INLINE_MAX = 16
KEY = re.compile(
    r"^mail/(\d{4})/(\d{2})/(\d{2})/[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}-(.+)$"
)
STORE_FAILED = (451, "4.3.0 Attachment storage unavailable, try again later")


@pytest.fixture(scope="module")
def s3_relay(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, s3_server: S3Server) -> RelayProcess:
    s3_server.client().create_bucket(Bucket=BUCKET)
    return start_relay(
        environment=AWS_ENVIRONMENT,
        WEBHOOK_URL=receiver.url,
        ATTACHMENT_DELIVERY="s3",
        S3_BUCKET=BUCKET,
        S3_PREFIX="mail/",
        S3_ENDPOINT_URL=s3_server.url,
        S3_REGION=S3_REGION,
        S3_PRESIGN_SECS=str(PRESIGN_SECS),
        S3_INLINE_MAX_BYTES=str(INLINE_MAX),
    )


def with_attachments(*attachments: tuple[str, str, bytes]) -> bytes:
    message = EmailMessage()
    message["From"] = "al@example.org"
    message["To"] = TARGET
    message["Subject"] = "files"
    message.set_content("see attached\n")
    for filename, content_type, data in attachments:
        major, minor = content_type.split("/")
        message.add_attachment(data, maintype=major, subtype=minor, filename=filename)
    return message.as_bytes(policy=policy.SMTP)


def attachments_of(webhook: WebhookReceiver) -> list[dict[str, Any]]:
    (request,) = webhook.wait_for(1)
    entries: list[dict[str, Any]] = json.loads(request.body)["attachments"]
    return entries


def send(relay: RelayProcess, raw: bytes) -> None:
    with relay.smtp() as smtp:
        assert smtp.sendmail("al@example.org", [TARGET], raw) == {}


def test_attachment_is_uploaded_and_the_entry_names_it(
    s3_relay: RelayProcess, webhook: WebhookReceiver, s3_server: S3Server
) -> None:
    pdf = b"%PDF-1.7\n" + bytes(range(256)) * 8
    before = datetime.datetime.now(datetime.UTC).date()
    send(s3_relay, with_attachments(("../Quarterly report.pdf", "application/pdf", pdf)))
    (entry,) = attachments_of(webhook)
    assert set(entry) == {"filename", "content_type", "size_bytes", "delivery", "url", "presigned_url"}
    assert (entry["filename"], entry["content_type"], entry["size_bytes"], entry["delivery"]) == (
        "../Quarterly report.pdf",
        "application/pdf",
        len(pdf),
        "s3",
    )
    bucket, _, key = entry["url"].removeprefix("s3://").partition("/")
    match = KEY.match(key)
    assert bucket == BUCKET and match is not None
    assert datetime.date(*map(int, match.groups()[:3])) in (before, datetime.datetime.now(datetime.UTC).date())
    assert match.group(4) == "Quarterly_report.pdf"
    stored = s3_server.client().get_object(Bucket=BUCKET, Key=key)
    assert stored["Body"].read() == pdf
    response = httpx.get(entry["presigned_url"], timeout=10)  # a plain GET, no AWS client
    assert (response.status_code, response.content) == (200, pdf)


def test_presigned_url_expires(s3_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(s3_relay, with_attachments(("a.bin", "application/octet-stream", b"x" * 100)))
    (entry,) = attachments_of(webhook)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(entry["presigned_url"]).query))
    assert query["X-Amz-Expires"] == str(PRESIGN_SECS)
    signed = datetime.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    assert httpx.get(entry["presigned_url"], timeout=10).status_code == 200
    expired_after = signed.timestamp() + PRESIGN_SECS + 1  # X-Amz-Date has whole seconds
    time.sleep(max(0.0, expired_after - time.time()) + 0.1)
    response = httpx.get(entry["presigned_url"], timeout=10)
    assert response.status_code == 403
    assert b"<Code>AccessDenied</Code><Message>Request has expired</Message>" in response.content


def test_small_attachments_stay_inline_big_ones_go_to_s3(s3_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(
        s3_relay,
        with_attachments(
            ("small.txt", "text/plain", b"x" * INLINE_MAX), ("big.txt", "text/plain", b"y" * (INLINE_MAX + 1))
        ),
    )
    small, big = attachments_of(webhook)
    assert (small["delivery"], small["data_base64"]) == ("inline", "eHh4eHh4eHh4eHh4eHh4eA==")
    assert "url" not in small
    assert big["delivery"] == "s3" and "data_base64" not in big


def test_hostile_file_names_become_safe_keys(s3_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    names = ["..\\..\\boot.ini", "a\x00b.exe", "x" * 500 + ".pdf", "日本語.txt"]
    send(s3_relay, with_attachments(*[(name, "application/octet-stream", b"z" * 32) for name in names]))
    entries = attachments_of(webhook)
    keys = [KEY.match(e["url"].removeprefix(f"s3://{BUCKET}/")) for e in entries]
    assert [k.group(4) if k else None for k in keys] == ["boot.ini", "b.exe", "x" * 96 + ".pdf", "_.txt"]


def test_s3_outage_gives_451_and_nothing_is_posted(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, webhook: WebhookReceiver
) -> None:
    relay = start_relay(
        environment=AWS_ENVIRONMENT,
        WEBHOOK_URL=receiver.url,
        ATTACHMENT_DELIVERY="s3",
        S3_BUCKET=BUCKET,
        S3_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        S3_REGION=S3_REGION,
        S3_TIMEOUT="1",
    )
    with relay.smtp() as smtp, pytest.raises(smtplib.SMTPDataError) as caught:
        smtp.sendmail("al@example.org", [TARGET], with_attachments(("a.pdf", "application/pdf", b"%PDF")))
    assert (caught.value.smtp_code, caught.value.smtp_error.decode()) == STORE_FAILED
    assert webhook.requests == []
    assert relay.events("message_deferred")[-1]["error"] == "connection error"
    send(relay, b"Subject: no attachment\r\n\r\nneeds no S3\r\n")  # mail without attachments still flows
    assert len(webhook.wait_for(1)) == 1


def test_s3_that_never_answers_gives_451(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, webhook: WebhookReceiver
) -> None:
    with silent_tcp_server() as port:
        relay = start_relay(
            environment=AWS_ENVIRONMENT,
            WEBHOOK_URL=receiver.url,
            ATTACHMENT_DELIVERY="s3",
            S3_BUCKET=BUCKET,
            S3_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            S3_REGION=S3_REGION,
            S3_TIMEOUT="0.5",
        )
        with relay.smtp() as smtp, pytest.raises(smtplib.SMTPDataError) as caught:
            smtp.sendmail("al@example.org", [TARGET], with_attachments(("a.pdf", "application/pdf", b"%PDF")))
    assert (caught.value.smtp_code, caught.value.smtp_error.decode()) == STORE_FAILED
    assert webhook.requests == []
    assert relay.events("message_deferred")[-1]["error"] == "timeout"
