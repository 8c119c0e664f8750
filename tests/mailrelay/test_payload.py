"""Payload shaping and JSON: field rules, omission of optional fields, header selection."""

from __future__ import annotations

import json

import pytest

from mailrelay._attachments import Attachment, DeliveryMode, inline_attachment
from mailrelay._dmarc import DmarcResult, DmarcVerdict
from mailrelay._errors import HtmlTextTooLong
from mailrelay._parsing import MimePart, ParsedMessage, parse_message
from mailrelay._payload import build_payload, html_to_text, select_headers


def message(**fields: object) -> ParsedMessage:
    base: dict[str, object] = {
        "subject": "",
        "sender_name": None,
        "from_address": None,
        "text_body": None,
        "html_body": None,
        "headers": (),
        "parts": (),
    }
    base.update(fields)
    return ParsedMessage(**base)  # type: ignore[arg-type]


def test_minimal_payload_has_only_required_fields() -> None:
    payload = build_payload(sender="a@x.org", recipient="inbox@x.org", message=message())
    assert json.loads(payload.to_json()) == {"sender": "a@x.org", "recipient": "inbox@x.org", "subject": "", "body": ""}


def test_html_wins_for_body_at_80_columns() -> None:
    words = " ".join(["word"] * 40)
    payload = build_payload(
        sender="a@x.org", recipient="r@x.org", message=message(text_body="plain", html_body=f"<p>{words}</p>")
    )
    assert payload.html_body == f"<p>{words}</p>"
    assert payload.body == html_to_text(f"<p>{words}</p>")
    assert max(len(line) for line in payload.body.splitlines()) <= 80
    assert payload.body.count("\n") > 1


def test_html_entities_keep_their_characters() -> None:
    html = "<p>Gr&uuml;&szlig;e aus K&ouml;ln, caf&#233; &euro; &ldquo;q&rdquo; &amp; caf\u00e9</p>"
    assert html_to_text(html) == "Grüße aus Köln, café € \u201cq\u201d & café\n\n"


class TestHostileHtml:
    """html2text indents each line by its nesting depth: unclosed lists make text grow quadratically."""

    def test_quadratic_output_is_cut_off(self) -> None:
        with pytest.raises(HtmlTextTooLong):
            html_to_text("<ul><li>a " * 4_000)  # 40 KB of HTML; unchecked it became 16 MB of text

    def test_the_payload_falls_back_to_the_plain_part(self) -> None:
        html = "<ol>" + "<li><ol>" * 4_000 + "x"
        payload = build_payload(
            sender="a@x.org", recipient="r@x.org", message=message(text_body="plain\n", html_body=html)
        )
        assert (payload.body, payload.html_body) == ("plain\n", html)

    def test_legitimate_nesting_is_still_converted(self) -> None:
        html = "<ul>" + "<li>item<ul>" * 12 + "<li>leaf</li>" + "</ul></li>" * 12 + "</ul>"
        text = html_to_text(html)
        assert text.rstrip().endswith("* leaf")
        assert text.count("* item") == 12


def test_plain_text_is_the_body_without_html() -> None:
    payload = build_payload(sender="a@x.org", recipient="r@x.org", message=message(text_body="raw text\n"))
    assert payload.body == "raw text\n"
    assert "html_body" not in payload.to_dict()


def test_json_field_order_and_no_nulls() -> None:
    parsed = message(subject="S", sender_name="Al", text_body="t", html_body="<b>h</b>")
    attachment = inline_attachment(MimePart(content_type="image/png", data=b"\x00\x01", content_id="c@x"))
    payload = build_payload(sender="a@x.org", recipient="r@x.org", message=parsed, attachments=[attachment])
    data = payload.to_dict()
    assert list(data) == ["sender", "sender_name", "recipient", "subject", "body", "html_body", "attachments"]
    assert data["attachments"] == [
        {"content_type": "image/png", "size_bytes": 2, "content_id": "c@x", "delivery": "inline", "data_base64": "AAE="}
    ]


def test_s3_attachment_shape() -> None:
    entry = Attachment(
        content_type="application/pdf",
        size_bytes=10,
        delivery=DeliveryMode.S3,
        filename="a.pdf",
        url="s3://bucket/key",
    )
    payload = build_payload(sender="a@x.org", recipient="r@x.org", message=message(), attachments=[entry])
    assert payload.to_dict()["attachments"] == [
        {
            "filename": "a.pdf",
            "content_type": "application/pdf",
            "size_bytes": 10,
            "delivery": "s3",
            "url": "s3://bucket/key",
        }
    ]


def test_dmarc_fields_only_with_a_verdict_and_from_only_on_pass() -> None:
    passing = DmarcVerdict(result=DmarcResult.PASS, authenticated_from="a@x.org")
    failing = DmarcVerdict(result=DmarcResult.FAIL, authenticated_from="a@x.org")
    assert (
        build_payload(sender="a", recipient="r", message=message(), dmarc=passing).to_dict()["authenticated_from"]
        == "a@x.org"
    )
    failed = build_payload(sender="a", recipient="r", message=message(), dmarc=failing).to_dict()
    assert failed["dmarc_result"] == "fail"
    assert "authenticated_from" not in failed
    assert "dmarc_result" not in build_payload(sender="a", recipient="r", message=message()).to_dict()


class TestSelectHeaders:
    def test_none_without_prefixes(self) -> None:
        assert select_headers([("X-A", "1")], ()) is None

    def test_none_when_nothing_matches(self) -> None:
        assert select_headers([("Subject", "s")], ("x-",)) is None

    def test_case_insensitive_prefix_and_original_spelling(self) -> None:
        selected = select_headers([("X-Custom-A", "1"), ("x-custom-b", "2"), ("Subject", "s")], ("X-CUSTOM-",))
        assert selected == {"X-Custom-A": "1", "x-custom-b": "2"}

    def test_repeated_headers_are_joined(self) -> None:
        assert select_headers([("X-A", "1"), ("x-a", "2")], ("x-",)) == {"X-A": "1, 2"}


def test_payload_json_is_utf8_not_ascii_escaped() -> None:
    parsed = parse_message("Subject: Grüße\r\n\r\nüber\r\n".encode())
    body = build_payload(sender="a@x.org", recipient="r@x.org", message=parsed).to_json()
    assert "Grüße".encode() in body
