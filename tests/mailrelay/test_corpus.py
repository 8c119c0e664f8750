"""The parser corpus: real-world-shaped messages (Outlook, Gmail, Apple Mail, digests, broken MIME).

Every file must parse and shape into JSON without an exception; several have their key fields pinned.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mailrelay._attachments import inline_attachment
from mailrelay._parsing import ParsedMessage, parse_message
from mailrelay._payload import build_payload

CORPUS = Path(__file__).parent / "corpus"
FILES = sorted(CORPUS.glob("*.eml"))


def parse(name: str) -> ParsedMessage:
    return parse_message((CORPUS / name).read_bytes())


def test_corpus_is_not_empty() -> None:
    assert len(FILES) >= 15


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("line_ending", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_every_file_parses_and_shapes_to_json(path: Path, line_ending: bytes) -> None:
    raw = path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", line_ending)
    message = parse_message(raw)
    payload = build_payload(
        sender="sender@example.org",
        recipient="inbox@example.test",
        message=message,
        header_prefixes=("x-",),
        attachments=[inline_attachment(part) for part in message.parts],
    )
    decoded = json.loads(payload.to_json())
    assert isinstance(decoded["subject"], str)
    assert isinstance(decoded["body"], str)
    assert None not in decoded.values()


def test_outlook_related_inline_image() -> None:
    message = parse("outlook_related_inline_image.eml")
    assert message.subject == "Réunion budgétaire - ordre du jour"
    assert message.sender_name == "Renée Dupont"
    assert message.text_body is not None and message.text_body.startswith("Bonjour à tous,")
    assert message.html_body is not None and 'src="cid:image001.png@01DB2E8A.5B6C7D80"' in message.html_body
    (image,) = message.parts
    assert (image.content_type, image.filename, image.content_id) == (
        "image/png",
        "image001.png",
        "image001.png@01DB2E8A.5B6C7D80",
    )
    assert image.data.startswith(b"\x89PNG")


def test_gmail_alternative_with_emoji() -> None:
    message = parse("gmail_alternative.eml")
    assert message.subject == "Lunch tomorrow? 🍕"
    assert message.sender_name == "Sam Sender"
    assert message.text_body == "Hi!\n\nPizza at 12:30? 🍕\n\nSam\n"
    assert message.parts == ()


def test_gmail_attachment() -> None:
    message = parse("gmail_attachment.eml")
    (pdf,) = message.parts
    assert (pdf.content_type, pdf.filename, pdf.content_id) == (
        "application/pdf",
        "invoice-2024-117.pdf",
        "f_m3abc1230",
    )
    assert pdf.data.startswith(b"%PDF-1.5")


def test_apple_mail_inline_image_with_filename_is_an_attachment() -> None:
    message = parse("apple_mail_inline_attachments.eml")
    assert message.text_body == "Here are the photos.\n\n"
    assert message.html_body is not None and "Here are the photos." in message.html_body
    assert [(p.content_type, p.filename, p.disposition) for p in message.parts] == [
        ("image/png", "IMG_0001.png", "inline")
    ]


def test_mailing_list_digest_entries_are_message_attachments() -> None:
    message = parse("mailing_list_digest.eml")
    assert message.subject == "Python-list Digest, Vol 254, Issue 3"
    assert message.text_body is not None and message.text_body.startswith("Send Python-list")
    assert [p.content_type for p in message.parts] == ["message/rfc822", "message/rfc822"]
    assert b"Subject: Packaging question" in message.parts[1].data


def test_missing_boundary_keeps_the_text() -> None:
    message = parse("malformed_missing_boundary.eml")
    assert message.text_body is not None and "this multipart has no boundary parameter" in message.text_body


def test_unterminated_and_broken_encodings_degrade_gracefully() -> None:
    message = parse("malformed_unterminated.eml")
    assert message.subject.startswith("=?utf-8?B?")  # an undecodable encoded word is kept as sent
    assert message.sender_name is None or isinstance(message.sender_name, str)
    assert message.html_body is not None and message.html_body.startswith("<p>trailing soft break")
    assert [p.content_type for p in message.parts] == ["application/octet-stream"]


def test_nested_multiparts_find_both_bodies_and_all_parts() -> None:
    message = parse("nested_multiparts.eml")
    assert message.text_body == "plain at depth two"
    assert message.html_body is not None and "html at depth four" in message.html_body
    assert [(p.content_type, p.filename, p.content_id) for p in message.parts] == [
        ("image/png", None, "deep@x"),
        ("text/csv", "data.csv", None),
    ]


def test_unknown_charset_is_replaced_not_fatal() -> None:
    message = parse("unknown_charset.eml")
    assert message.subject == "Qapla\ufffd"
    assert message.text_body == "caf\ufffd bytes in an unknown charset\n"


def test_latin1_quoted_printable() -> None:
    message = parse("latin1_quoted_printable.eml")
    assert message.subject == "Café crème"
    assert message.sender_name == "André"
    assert message.text_body is not None
    assert "Un café crème, s'il vous plaît. Très long ligne qui est coupée par un saut" in message.text_body


def test_base64_utf8_body() -> None:
    assert parse("base64_utf8.eml").text_body == "Grüße, 世界! ✓\n"


def test_rfc2047_mixed_charsets_and_folding() -> None:
    message = parse("rfc2047_subjects.eml")
    assert message.subject == "会议通知 / Zgłoszenie — done"
    assert message.sender_name == "李明"


def test_forwarded_message_is_one_attachment() -> None:
    message = parse("forwarded_message.eml")
    (forwarded,) = message.parts
    assert (forwarded.content_type, forwarded.filename) == ("message/rfc822", "original.eml")
    assert b"original body" in forwarded.data


def test_rfc2231_and_rfc2047_filenames() -> None:
    message = parse("rfc2231_filename.eml")
    assert [p.filename for p in message.parts] == ["€ rates.pdf", "élève.txt"]


@pytest.mark.parametrize("name", ["empty.eml", "body_only.eml", "headers_only.eml", "binary_garbage.eml"])
def test_degenerate_inputs(name: str) -> None:
    message = parse(name)
    assert isinstance(message.subject, str)
    assert message.html_body is None
