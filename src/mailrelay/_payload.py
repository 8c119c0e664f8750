"""The webhook payload (spec: "Webhook payload"): shaping from a parsed message and JSON encoding.

Pure: no I/O. Optional fields are None in Python and omitted from the JSON, never null.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import html2text
import orjson

from mailrelay._attachments import Attachment
from mailrelay._dmarc import DmarcResult, DmarcVerdict
from mailrelay._errors import HtmlTextTooLong
from mailrelay._parsing import ParsedMessage, scrub
from mailrelay._raw import RawMessage

HTML_TEXT_WIDTH = 80  # spec: HTML-to-text conversion at 80-character width
HTML_TEXT_BUDGET_FACTOR = 4  # text may be this many times the HTML's length (markup only shrinks)...
HTML_TEXT_BUDGET_BASE = 64 * 1024  # ...plus this, for short HTML with deep but legitimate nesting


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookPayload:
    sender: str
    recipient: str
    subject: str
    body: str
    sender_name: str | None = None
    html_body: str | None = None
    headers: dict[str, str] | None = None
    attachments: tuple[Attachment, ...] | None = None
    dmarc_result: str | None = None
    authenticated_from: str | None = None
    raw: RawMessage | None = None
    """MAIL_RELAY_RAW: the original message, inline or in S3 (`raw_base64`, `raw_url`, `raw_presigned_url`)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, in the spec's field order, without the None fields."""
        out: dict[str, Any] = {"sender": self.sender}
        if self.sender_name is not None:
            out["sender_name"] = self.sender_name
        out["recipient"] = self.recipient
        out["subject"] = self.subject
        out["body"] = self.body
        if self.html_body is not None:
            out["html_body"] = self.html_body
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.attachments:
            out["attachments"] = [attachment_dict(a) for a in self.attachments]
        if self.dmarc_result is not None:
            out["dmarc_result"] = self.dmarc_result
        if self.authenticated_from is not None:
            out["authenticated_from"] = self.authenticated_from
        if self.raw is not None:
            out.update(self.raw.fields())
        return out

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON: these exact bytes are sent and signed."""
        return encode_json(self.to_dict())


def encode_json(payload: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, the bytes of ``json.dumps(payload, ensure_ascii=False, separators=(",", ":"))`` for
    the payloads' values (str, int, lists and dicts of them), written by orjson in a tenth of the time
    (tests/mailrelay/test_payload.py compares both on every corpus payload)."""
    return orjson.dumps(payload)


def attachment_dict(attachment: Attachment) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if attachment.filename is not None:
        out["filename"] = attachment.filename
    out["content_type"] = attachment.content_type
    out["size_bytes"] = attachment.size_bytes
    if attachment.content_id is not None:
        out["content_id"] = attachment.content_id
    out["delivery"] = attachment.delivery.value
    for key in ("data_base64", "url", "presigned_url"):
        value = getattr(attachment, key)
        if value is not None:
            out[key] = value
    return out


def html_to_text(html: str) -> str:
    """HTML -> plain text with html2text, wrapped at HTML_TEXT_WIDTH columns.

    Raises HtmlTextTooLong once the text outgrows HTML_TEXT_BUDGET_FACTOR x the HTML (+ a constant):
    html2text indents every line by its list/quote depth, so deeply nested or unclosed <ul>/<ol>/
    <blockquote> make the text grow with the square of the input (40 KB of "<ul><li>a " gave 16 MB of
    text; one 1 MB message would exhaust the memory of the whole relay).
    """
    converter = html2text.HTML2Text()
    converter.body_width = HTML_TEXT_WIDTH
    # html2text's default folds entities to ASCII (&eacute; -> "e", &uuml; -> "u") while literal "é"
    # stays: the same word would read differently depending on how the sender's editor escaped it
    converter.unicode_snob = True
    budget = HTML_TEXT_BUDGET_FACTOR * len(html) + HTML_TEXT_BUDGET_BASE
    produced = 0
    write = converter.out

    def counted(s: str) -> None:  # named like html2text's OutCallback parameter
        nonlocal produced
        produced += len(s)
        if produced > budget:
            raise HtmlTextTooLong(f"html2text produced over {budget} characters from {len(html)} of HTML")
        write(s)

    converter.out = counted
    return converter.handle(html)


def select_headers(headers: Iterable[tuple[str, str]], prefixes: Sequence[str]) -> dict[str, str] | None:
    """Top-level headers whose names start with one of `prefixes` (case-insensitive).

    Keys keep the first occurrence's spelling; repeated headers are joined with ", " (RFC 9110 5.3).
    Returns None when no prefix is configured or nothing matches.
    """
    if not prefixes:
        return None
    lowered = tuple(p.lower() for p in prefixes)
    selected: dict[str, str] = {}
    spelling: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if not key.startswith(lowered):
            continue
        if key in spelling:
            selected[spelling[key]] += ", " + value
        else:
            spelling[key] = name
            selected[name] = value
    return selected or None


def build_payload(
    *,
    sender: str,
    recipient: str,
    message: ParsedMessage,
    header_prefixes: Sequence[str] = (),
    attachments: Sequence[Attachment] = (),
    dmarc: DmarcVerdict | None = None,
    raw: RawMessage | None = None,
) -> WebhookPayload:
    """Shape one payload. `body` is the HTML converted to text when there is HTML, else the plain
    text, else ""; `authenticated_from` is carried only with a DMARC pass; `raw` (MAIL_RELAY_RAW) last."""
    if message.html_body is not None:
        try:
            body = html_to_text(message.html_body)
        except Exception:  # html2text on hostile markup (HtmlTextTooLong, ...): fall back to the plain part
            body = message.text_body or ""
    else:
        body = message.text_body or ""
    return WebhookPayload(
        sender=scrub(sender),
        sender_name=message.sender_name,
        recipient=scrub(recipient),
        subject=message.subject,
        body=body,
        html_body=message.html_body,
        headers=select_headers(message.headers, header_prefixes),
        attachments=tuple(attachments) or None,
        dmarc_result=dmarc.result.value if dmarc else None,
        authenticated_from=(dmarc.authenticated_from if dmarc and dmarc.result is DmarcResult.PASS else None),
        raw=raw,
    )
