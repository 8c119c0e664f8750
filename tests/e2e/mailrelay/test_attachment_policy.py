"""The attachment policy through the real `mailrelay` process: every rule with both actions, hostile names and
content, many attachments."""

from __future__ import annotations

import base64
import json
import smtplib
import struct
from collections.abc import Callable
from typing import Any

import pytest

from mailrelay.smtp import _replies as r
from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import MAX_ATTACHMENT_SIZE, TARGET, RelayProcess

RULES = {
    "ATTACHMENT_MAX_BYTES": "1000",
    "ATTACHMENT_MAX_TOTAL_BYTES": "1500",
    "ATTACHMENT_MAX_COUNT": "3",
    "ATTACHMENT_ALLOWED_TYPES": "image/*, application/pdf, text/plain",
    "ATTACHMENT_DENIED_TYPES": "image/svg+xml",
    "ATTACHMENT_DENIED_EXTENSIONS": "exe,js,bat",
}
PE = b"MZ" + b"\x00" * 58 + struct.pack("<I", 64) + b"PE\x00\x00" + b"\x00" * 64
Attachment = tuple[str, str, bytes]  # Content-Disposition filename parameter as sent, Content-Type, data
OK: Attachment = ("ok.txt", "text/plain", b"0123456789")


@pytest.fixture(scope="module")
def drop_relay(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver) -> RelayProcess:
    return start_relay(WEBHOOK_URL=receiver.url, **RULES)  # POLICY_ACTION defaults to drop


@pytest.fixture(scope="module")
def reject_relay(start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver) -> RelayProcess:
    return start_relay(WEBHOOK_URL=receiver.url, ATTACHMENT_POLICY_ACTION="reject", **RULES)


def mime(*attachments: Attachment) -> bytes:
    parts = [b"Content-Type: text/plain\r\n\r\nsee attached\r\n"]
    for filename, content_type, data in attachments:
        encoded = base64.encodebytes(data).replace(b"\n", b"\r\n")
        name = f'; filename="{filename}"'
        parts.append(
            f"Content-Type: {content_type}\r\nContent-Transfer-Encoding: base64\r\n"
            f"Content-Disposition: attachment{name}\r\n\r\n".encode("utf-8", "surrogateescape")
            + encoded
        )
    body = b"".join(b"--b\r\n" + part for part in parts) + b"--b--\r\n"
    return b"From: al@example.org\r\nSubject: files\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n" + body


def send(relay: RelayProcess, raw: bytes) -> None:
    with relay.smtp() as smtp:
        assert smtp.sendmail("al@example.org", [TARGET], raw) == {}


def delivered(webhook: WebhookReceiver) -> list[dict[str, Any]]:
    (request,) = webhook.wait_for(1)
    entries: list[dict[str, Any]] = json.loads(request.body).get("attachments", [])
    return entries


# (the message's attachments, the rule the last one breaks, the reject reply)
CASES = [
    pytest.param(
        [OK, ("big.pdf", "application/pdf", b"x" * 1001)], "max_bytes", r.ATTACHMENT_TOO_LARGE, id="max_bytes"
    ),
    pytest.param(
        [OK, ("a.pdf", "application/pdf", b"a" * 800), ("b.pdf", "application/pdf", b"b" * 800)],
        "max_total_bytes",
        r.ATTACHMENTS_TOO_LARGE,
        id="max_total_bytes",
    ),
    pytest.param(
        [
            OK,
            ("1.pdf", "application/pdf", b"1"),
            ("2.pdf", "application/pdf", b"2"),
            ("3.pdf", "application/pdf", b"3"),
        ],
        "max_count",
        r.TOO_MANY_ATTACHMENTS,
        id="max_count",
    ),
    pytest.param(
        [OK, ("pic.svg", "Image/SVG+XML; charset=utf-8", b"<svg/>")],
        "denied_type",
        r.ATTACHMENT_TYPE_REFUSED,
        id="denied_type",
    ),
    pytest.param(
        [OK, ("data.csv", "text/csv", b"a,b")], "type_not_allowed", r.ATTACHMENT_TYPE_REFUSED, id="type_not_allowed"
    ),
    pytest.param(
        [OK, ("invoice.pdf.exe", "application/pdf", b"%PDF")],
        "denied_extension",
        r.ATTACHMENT_EXTENSION_REFUSED,
        id="denied_extension",
    ),
    pytest.param(
        [OK, ("photo.png", "image/png", PE)], "type_not_allowed", r.ATTACHMENT_TYPE_REFUSED, id="lying_content_type"
    ),
]


@pytest.mark.parametrize(("attachments", "rule", "reply"), CASES)
def test_drop_delivers_the_message_without_the_breaking_attachment(
    drop_relay: RelayProcess, webhook: WebhookReceiver, attachments: list[Attachment], rule: str, reply: r.Reply
) -> None:
    send(drop_relay, mime(*attachments))
    assert [e["filename"] for e in delivered(webhook)] == [a[0] for a in attachments[:-1]]
    filename, content_type, data = attachments[-1]
    event = drop_relay.events("attachment_dropped")[-1]
    assert {k: event[k] for k in ("rule", "filename", "content_type", "size")} == {
        "rule": rule,
        "filename": filename,
        "content_type": content_type.split(";")[0].lower(),
        "size": len(data),
    }
    assert drop_relay.events("message_relayed")[-1]["attachments_dropped"] == 1


@pytest.mark.parametrize(("attachments", "rule", "reply"), CASES)
def test_reject_refuses_the_message(
    reject_relay: RelayProcess, webhook: WebhookReceiver, attachments: list[Attachment], rule: str, reply: r.Reply
) -> None:
    with reject_relay.smtp() as smtp, pytest.raises(smtplib.SMTPDataError) as caught:
        smtp.sendmail("al@example.org", [TARGET], mime(*attachments))
    assert (caught.value.smtp_code, caught.value.smtp_error.decode()) == (reply.code, reply.text)
    assert webhook.requests == []
    assert reject_relay.events("message_refused")[-1]["rule"] == rule


def test_reject_replies_are_exact() -> None:
    assert [str(reply) for reply in r.ATTACHMENT_POLICY_REPLIES.values()] == [
        "552 5.3.4 Attachment size exceeds fixed limit",
        "552 5.3.4 Total size of attachments exceeds fixed limit",
        "552 5.3.4 Too many attachments",
        "554 5.7.1 Attachment type not allowed",
        "554 5.7.1 Attachment type not allowed",
        "554 5.7.1 Attachment file name extension not allowed",
    ]


def test_messages_within_every_rule_pass_both(
    drop_relay: RelayProcess, reject_relay: RelayProcess, webhook: WebhookReceiver
) -> None:
    fine = [OK, ("scan.PDF", "application/pdf", b"x" * 1000), ("logo.png", "image/png", b"\x89PNG\r\n")]
    for relay in (drop_relay, reject_relay):
        webhook.reset()
        send(relay, mime(*fine))
        assert [e["filename"] for e in delivered(webhook)] == [a[0] for a in fine]


def test_old_limit_name_still_sets_the_per_attachment_limit(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    """The shared relay sets MAIL_RELAY_MAX_ATTACHMENT_SIZE, the old name of ATTACHMENT_MAX_BYTES."""
    send(
        relay,
        mime(
            ("fits.bin", "application/octet-stream", b"f" * MAX_ATTACHMENT_SIZE),
            ("over.bin", "application/octet-stream", b"o" * (MAX_ATTACHMENT_SIZE + 1)),
        ),
    )
    assert [(e["filename"], e["size_bytes"]) for e in delivered(webhook)] == [("fits.bin", MAX_ATTACHMENT_SIZE)]
    assert relay.events("attachment_dropped")[-1]["rule"] == "max_bytes"


# ---- hostile input through the default policy (no type or extension rules)


def test_a_thousand_tiny_attachments(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(relay, mime(*[(f"{n}.txt", "text/plain", b"t") for n in range(1000)]))
    entries = delivered(webhook)
    assert len(entries) == 1000
    assert (entries[999]["filename"], entries[999]["data_base64"]) == ("999.txt", "dA==")


def test_a_thousand_tiny_attachments_with_a_count_limit(drop_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(drop_relay, mime(*[(f"{n}.txt", "text/plain", b"t") for n in range(1000)]))
    assert [e["filename"] for e in delivered(webhook)] == ["0.txt", "1.txt", "2.txt"]
    assert drop_relay.events("message_relayed")[-1]["attachments_dropped"] == 997


@pytest.mark.parametrize(
    ("header_name", "decoded"),
    [
        pytest.param('filename="../../etc/passwd"', "../../etc/passwd", id="path-separators"),
        pytest.param('filename="C:\\\\evil.bat"', "C:\\evil.bat", id="backslashes"),
        pytest.param("filename*=UTF-8''r%C3%A9sum%C3%A9%2Epdf", "résumé.pdf", id="rfc2231"),
        pytest.param("filename*0*=UTF-8''a%00b; filename*1=.txt", "a\x00b.txt", id="rfc2231-nul"),
        pytest.param('filename="' + "n" * 500 + '.txt"', "n" * 500 + ".txt", id="500-characters"),
    ],
)
def test_hostile_file_names_arrive_decoded(
    relay: RelayProcess, webhook: WebhookReceiver, header_name: str, decoded: str
) -> None:
    raw = (
        b"From: al@example.org\r\nSubject: names\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n"
        b"--b\r\nContent-Type: text/plain\r\n\r\nhi\r\n--b\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Disposition: attachment; {header_name}\r\n\r\ndata\r\n--b--\r\n".encode()
    )
    send(relay, raw)
    assert [e["filename"] for e in delivered(webhook)] == [decoded]


def test_denied_extension_is_found_in_rfc2231_and_nul_names(drop_relay: RelayProcess, webhook: WebhookReceiver) -> None:
    raw = (
        b"From: al@example.org\r\nSubject: names\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n"
        b"--b\r\nContent-Type: text/plain\r\n\r\nhi\r\n"
        b"--b\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment; filename*=UTF-8''x%2Eexe%00.pdf\r\n"
        b"\r\ndata\r\n"
        b"--b\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment; filename*=UTF-8''ok%2Epdf\r\n"
        b"\r\ndata\r\n--b--\r\n"
    )
    send(drop_relay, raw)
    assert [e["filename"] for e in delivered(webhook)] == ["ok.pdf"]
    assert drop_relay.events("attachment_dropped")[-1]["filename"] == "x.exe\\x00.pdf"
