"""Payload v2 through real SMTP to a real receiver: every field, one POST per transaction, hostile headers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import dkim
import pytest

from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import SECOND_TARGET, TARGET, RelayProcess
from tests.mailrelay.servers import DnsZone, rsa_key_pair

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
def v2_relay(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, dns_zone: DnsZone) -> RelayProcess:
    """Payload v2 with DMARC in monitor mode against the test DNS server (where example.org has no records)."""
    return start_relay(
        WEBHOOK_URL=receiver.url,
        PAYLOAD_VERSION="2",
        MAX_MESSAGE_SIZE="4000000",
        DMARC_MODE="monitor",
        DNS_SERVERS=f"127.0.0.1:{dns_zone.port}",
        DNS_TIMEOUT="0.5",
    )


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
        "dmarc_result": "none",
        "spf": "none",
        "dkim": "none",
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


def test_spf_and_dkim_verdicts_beside_dmarc(
    v2_relay: RelayProcess, webhook: WebhookReceiver, dns_zone: DnsZone
) -> None:
    """An aligned DKIM pass is enough for DMARC; v2 still reports the SPF verdict (here a fail)."""
    private, public = rsa_key_pair(1024)
    dns_zone.txt("_dmarc.v2-auth.test", "v=DMARC1; p=reject")
    dns_zone.txt("sel._domainkey.v2-auth.test", public)
    dns_zone.txt("v2-auth.test", "v=spf1 ip4:192.0.2.1 -all")
    raw = f"From: Al <al@v2-auth.test>\r\nTo: {TARGET}\r\nSubject: auth\r\n\r\nbody\r\n".encode()
    raw = dkim.sign(raw, b"sel", b"v2-auth.test", private, include_headers=[b"from", b"subject", b"to"]) + raw
    with v2_relay.smtp() as smtp:
        assert smtp.sendmail("al@v2-auth.test", [TARGET], raw) == {}
    payload = delivered(webhook)
    assert {key: payload[key] for key in ("dmarc_result", "authenticated_from", "spf", "dkim")} == {
        "dmarc_result": "pass",
        "authenticated_from": "al@v2-auth.test",
        "spf": "fail",
        "dkim": "pass",
    }


def test_a_plus_address_carries_its_tag(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, webhook: WebhookReceiver
) -> None:
    """A `user+*@domain` target takes every tag of the address; v2 says which one (`recipient_tag`)."""
    relay = start_relay(WEBHOOK_URL=receiver.url, PAYLOAD_VERSION="2", TARGET_EMAILS="tickets+*@example.test")
    with relay.smtp() as smtp:
        assert smtp.sendmail("a@example.org", ["tickets+4411@example.test"], b"Subject: tagged\r\n\r\nhi\r\n") == {}
    payload = delivered(webhook)
    assert (payload["recipient"], payload["recipients"], payload["recipient_tag"]) == (
        "tickets+4411@example.test",
        ["tickets+4411@example.test"],
        "4411",
    )
