"""Payload v2 through real SMTP to a real receiver: every field, one POST per transaction, hostile headers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import SECOND_TARGET, TARGET, RelayProcess

MESSAGE = (
    b"From: Anna Schmidt <anna@example.org>\r\n"
    b"To: Inbox <inbox@example.test>, =?utf-8?q?Support_=C3=A9quipe?= <support@example.test>\r\n"
    b"Cc: Tom <tom@example.com>\r\n"
    b"Reply-To: anna+replies@example.org\r\n"
    b"Subject: Re: Invoice 4411\r\n"
    b"Date: Tue, 24 Nov 2026 09:41:07 +0100\r\n"
    b"Message-ID: <CAF3x9-reply@mail.example.org>\r\n"
    b"In-Reply-To: <ticket-4411@example.test>\r\n"
    b"References: <ticket-4400@example.test>\r\n <ticket-4411@example.test>\r\n"
    b"MIME-Version: 1.0\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"\r\n"
    b"Thanks, that fixed it.\r\n"
    b"\r\n"
    b"-- \r\n"
    b"Anna Schmidt\r\n"
    b"\r\n"
    b"On Mon, Nov 23, 2026 at 4:12 PM Support <support@example.test> wrote:\r\n"
    b"> We corrected the VAT number.\r\n"
)


@pytest.fixture(scope="module")
def v2_relay(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver) -> RelayProcess:
    return start_relay(WEBHOOK_URL=receiver.url, PAYLOAD_VERSION="2", MAX_MESSAGE_SIZE="4000000")


def delivered(webhook: WebhookReceiver) -> dict[str, Any]:
    requests = webhook.wait_for(1)
    assert len(requests) == 1
    payload: dict[str, Any] = json.loads(requests[0].body)
    return payload


def test_every_field_of_a_reply(v2_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    with v2_relay.smtp() as smtp:
        smtp.ehlo("mx.example.org")
        assert smtp.sendmail("anna@example.org", [TARGET, SECOND_TARGET], MESSAGE) == {}
    payload = delivered(webhook)
    assert payload == {
        "payload_version": 2,
        "message_id": "CAF3x9-reply@mail.example.org",
        "in_reply_to": "ticket-4411@example.test",
        "references": ["ticket-4400@example.test", "ticket-4411@example.test"],
        "date": "2026-11-24T09:41:07+01:00",
        "sender": "anna@example.org",
        "sender_name": "Anna Schmidt",
        "recipient": TARGET,
        "recipients": [TARGET, SECOND_TARGET],
        "to": [
            {"address": "inbox@example.test", "name": "Inbox"},
            {"address": "support@example.test", "name": "Support équipe"},
        ],
        "cc": [{"address": "tom@example.com", "name": "Tom"}],
        "reply_to": [{"address": "anna+replies@example.org"}],
        "subject": "Re: Invoice 4411",
        "body": payload["text_body"],
        "text_body": (
            "Thanks, that fixed it.\n\n-- \nAnna Schmidt\n\n"
            "On Mon, Nov 23, 2026 at 4:12 PM Support <support@example.test> wrote:\n> We corrected the VAT number.\n"
        ),
        "stripped_text": "Thanks, that fixed it.",
        "stripped_signature": "Anna Schmidt",
        "client_ip": "127.0.0.1",
        "helo": "mx.example.org",
        "size_bytes": payload["size_bytes"],
    }
    assert len(MESSAGE) <= payload["size_bytes"] <= len(MESSAGE) + 2


def test_sender_text_part_is_kept_beside_html(v2_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    message = (
        b"From: a@example.org\r\nSubject: both\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/alternative; boundary="b"\r\n\r\n'
        b"--b\r\nContent-Type: text/plain\r\n\r\nmy *own* text\r\n"
        b"--b\r\nContent-Type: text/html\r\n\r\n<p>my <b>own</b> text</p>\r\n--b--\r\n"
    )
    with v2_relay.smtp() as smtp:
        assert smtp.sendmail("a@example.org", [TARGET], message) == {}
    payload = delivered(webhook)
    assert (payload["text_body"], payload["body"], payload["stripped_text"]) == (
        "my *own* text",
        "my **own** text\n\n",
        "my *own* text",
    )


FOLDED_100_KB = "\r\n ".join(["m" * 900] * 112)  # SMTP lines end at 1000 bytes: a 100 KB id arrives folded


def test_hostile_headers_give_a_bounded_payload(v2_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    references = "\r\n".join(f" <r{n}@example.org>" for n in range(10_000))
    message = (
        "From: a@example.org\r\n"
        "To: =?utf-8?q?Evil=00=1B=5B2J=0D=0AName?= <x@example.test>, bad@@x, <>, undisclosed:;\r\n"
        "Cc: @, (only a comment), c@example.org\r\n"
        f"Message-ID: <{FOLDED_100_KB}@example.org>\r\n"
        f"References:{references}\r\n"
        "Subject: hostile\r\n\r\nbody\r\n"
    ).encode()
    with v2_relay.smtp() as smtp:
        assert smtp.sendmail("a@example.org", [TARGET], message) == {}
    payload = delivered(webhook)
    assert "message_id" not in payload
    assert len(payload["references"]) == 100
    assert payload["references"][0] == "r0@example.org"
    assert payload["references"][-1] == "r9999@example.org"
    assert payload["to"] == [{"address": "x@example.test", "name": "Evil [2J Name"}]
    assert payload["cc"] == [{"address": "c@example.org"}]
