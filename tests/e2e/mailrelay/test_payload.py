"""The webhook payload for typical messages, as the real receiver sees it."""

from __future__ import annotations

import base64
import json
from email import policy
from email.message import EmailMessage, Message
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

from mailrelay.testing import WebhookReceiver
from tests.e2e.mailrelay.support import SECOND_TARGET, TARGET, RelayProcess


def wire(message: Message) -> bytes:
    """The message with CRLF line endings, as a mail client sends it."""
    return message.as_bytes(policy=policy.SMTP)


def send(relay: RelayProcess, message: bytes, *, sender: str = "alice@example.org", to: str = TARGET) -> None:
    with relay.smtp() as smtp:
        smtp.ehlo()
        refused = smtp.sendmail(sender, [to], message)
    assert refused == {}


def delivered(webhook: WebhookReceiver) -> dict[str, Any]:
    requests = webhook.wait_for(1)
    assert len(requests) == 1
    payload: dict[str, Any] = json.loads(requests[0].body)
    return payload


def test_plain_text_message(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    message = EmailMessage()
    message["From"] = "Alice Example <alice@example.org>"
    message["To"] = TARGET
    message["Subject"] = "Plain hello"
    message.set_content("Hello Bob,\nplain text here.\n")
    send(relay, wire(message))
    assert delivered(webhook) == {
        "sender": "alice@example.org",
        "sender_name": "Alice Example",
        "recipient": TARGET,
        "subject": "Plain hello",
        "body": "Hello Bob,\nplain text here.\n",
    }


def test_html_only_message_gets_text_body_from_html(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    html = "<html><body><h1>Title</h1><p>Hello <b>world</b>.</p></body></html>"
    message = MIMEText(html, "html", "utf-8")
    message["From"] = "bob@example.org"
    message["Subject"] = "HTML only"
    send(relay, wire(message), sender="bob@example.org")
    payload = delivered(webhook)
    assert payload["html_body"] == html
    assert payload["body"] == "# Title\n\nHello **world**.\n\n"
    assert "sender_name" not in payload  # From has only an address


def test_multipart_alternative_uses_html_for_body(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    message = MIMEMultipart("alternative")
    message["From"] = '"Carol" <carol@example.org>'
    message["Subject"] = "Both"
    message.attach(MIMEText("plain version", "plain", "utf-8"))
    message.attach(MIMEText("<p>html version</p>", "html", "utf-8"))
    send(relay, wire(message))
    payload = delivered(webhook)
    assert payload["body"] == "html version\n\n"
    assert payload["html_body"] == "<p>html version</p>"
    assert payload["sender_name"] == "Carol"
    assert "attachments" not in payload


def test_attachments_are_inline_base64_with_content_id(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    pdf = b"%PDF-1.4 fake pdf bytes \x00\x01\x02"
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    message = EmailMessage()
    message["From"] = "alice@example.org"
    message["Subject"] = "Files"
    message.set_content("see attached")
    message.add_alternative('<p>logo: <img src="cid:logo@example.org"></p>', subtype="html")
    html_part = list(message.iter_parts())[1]
    assert isinstance(html_part, EmailMessage)
    html_part.add_related(png, "image", "png", cid="<logo@example.org>", filename="logo.png")
    message.add_attachment(pdf, maintype="application", subtype="pdf", filename="report.pdf")
    send(relay, wire(message))
    attachments = delivered(webhook)["attachments"]
    by_type = {a["content_type"]: a for a in attachments}
    assert by_type["application/pdf"] == {
        "filename": "report.pdf",
        "content_type": "application/pdf",
        "size_bytes": len(pdf),
        "delivery": "inline",
        "data_base64": base64.b64encode(pdf).decode(),
    }
    image = by_type["image/png"]
    assert image["content_id"] == "logo@example.org"
    assert image["filename"] == "logo.png"
    assert base64.b64decode(image["data_base64"]) == png
    assert image["size_bytes"] == len(png)


def test_header_passthrough_matches_prefixes_case_insensitively(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    raw = (
        b"From: alice@example.org\r\n"
        b"Subject: headers\r\n"
        b"X-Custom-Ticket: 1234\r\n"
        b"x-custom-priority: high\r\n"
        b"X-Tracking-Id: abc\r\n"
        b"X-Other: nope\r\n"
        b"\r\nbody\r\n"
    )
    send(relay, raw)
    assert delivered(webhook)["headers"] == {
        "X-Custom-Ticket": "1234",
        "x-custom-priority": "high",
        "X-Tracking-Id": "abc",
    }


def test_no_headers_field_when_nothing_matches(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(relay, b"From: alice@example.org\r\nSubject: none\r\nX-Other: 1\r\n\r\nbody\r\n")
    assert "headers" not in delivered(webhook)


def test_encoded_subject_is_decoded(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    raw = (
        b"From: =?utf-8?q?J=C3=B6rg_M=C3=BCller?= <jorg@example.de>\r\n"
        b"Subject: =?UTF-8?B?R3LDvMOfZSBhdXMgWsO8cmljaA==?= =?iso-8859-1?q?_und_K=F6ln?=\r\n"
        b"\r\nHallo\r\n"
    )
    send(relay, raw)
    payload = delivered(webhook)
    assert payload["subject"] == "Grüße aus Zürich und Köln"
    assert payload["sender_name"] == "Jörg Müller"


def test_missing_subject_is_empty_string(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(relay, b"From: alice@example.org\r\n\r\nno subject here\r\n")
    payload = delivered(webhook)
    assert payload["subject"] == ""
    assert payload["body"] == "no subject here\n"


def test_recipient_is_the_matched_target(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(relay, b"Subject: to support\r\n\r\nhi\r\n", to="Support@Example.Test")
    assert delivered(webhook)["recipient"] == "Support@Example.Test"
    assert SECOND_TARGET == "support@example.test"


def test_eight_bit_body_is_kept_and_decoded(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    raw = "Subject: 8bit\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nnaïve café ✓\r\n".encode()
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.mail("alice@example.org", ["BODY=8BITMIME"])
        smtp.rcpt(TARGET)
        assert smtp.data(raw) == (250, b"OK: Message accepted for delivery")
    assert delivered(webhook)["body"] == "naïve café ✓\n"


def test_dot_stuffed_lines_are_unstuffed(relay: RelayProcess, webhook: WebhookReceiver) -> None:
    send(relay, b"Subject: dots\r\n\r\n.leading dot\r\n..two dots\r\n")
    assert delivered(webhook)["body"] == ".leading dot\n..two dots\n"
