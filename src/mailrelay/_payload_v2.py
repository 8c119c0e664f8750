"""Payload v2 (`MAIL_RELAY_PAYLOAD_VERSION=2`): every v1 field plus threading, all recipients, the addresses, the
reply without quotes or signature, SPF/DKIM verdicts and the SMTP transaction's facts.

Pure: no I/O. Optional fields are omitted, never null, as in v1. The field list and its caps are in
docs/mailrelay.md; `mailrelay/schemas/payload-v2.schema.json` describes the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mailrelay._headers import (
    THREADING_HEADERS,
    addresses,
    first_headers,
    message_id,
    message_ids,
    plus_tag,
    rfc3339_date,
)
from mailrelay._parsing import ParsedMessage, scrub
from mailrelay._payload import WebhookPayload, encode_json
from mailrelay._stripping import strip_reply

PAYLOAD_VERSION = 2
PAYLOAD_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True, kw_only=True)
class Transaction:
    """What the SMTP session knows of one message: every accepted recipient in RCPT order, the client's address
    and HELO/EHLO name, and the size of the message data in bytes."""

    recipients: tuple[str, ...]
    client_ip: str
    helo: str | None
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MailAuth:
    """The SPF and DKIM verdicts reported beside `dmarc_result` (None: not evaluated)."""

    spf: str | None = None
    dkim: str | None = None


RAW_FIELDS = ("raw_base64", "raw_url", "raw_presigned_url")
"""The original message's fields (``mailrelay._raw``), when ``MAIL_RELAY_RAW`` is on."""


def payload_v2(
    v1: WebhookPayload, *, message: ParsedMessage, transaction: Transaction, auth: MailAuth | None = None
) -> dict[str, Any]:
    """The v2 JSON object: `v1`'s fields (values unchanged) with the v2 fields among them, None fields left out."""
    base = v1.to_dict()
    threading = first_headers(message.headers, THREADING_HEADERS)
    stripped = strip_reply(message.text_body if message.text_body is not None else v1.body)
    references = message_ids(threading.get("references", ""))
    out: dict[str, Any] = {"payload_version": PAYLOAD_VERSION}
    _put(out, "message_id", message_id(threading.get("message-id")))
    _put(out, "in_reply_to", message_id(threading.get("in-reply-to")))
    _put(out, "references", references or None)
    _put(out, "date", rfc3339_date(threading.get("date")))
    out["sender"] = base["sender"]
    _put(out, "sender_name", base.get("sender_name"))
    out["recipient"] = base["recipient"]
    out["recipients"] = [scrub(r) for r in transaction.recipients] or [base["recipient"]]
    _put(out, "recipient_tag", plus_tag(base["recipient"]))
    address_headers = dict(message.address_headers)  # one value per key already
    for key in ("to", "cc", "reply_to"):
        _put(out, key, [a.to_dict() for a in addresses(address_headers.get(key))] or None)
    out["subject"] = base["subject"]
    out["body"] = base["body"]
    _put(out, "text_body", message.text_body)
    _put(out, "html_body", base.get("html_body"))
    out["stripped_text"] = stripped.text
    _put(out, "stripped_signature", stripped.signature)
    for key in ("headers", "attachments", "dmarc_result", "authenticated_from"):
        _put(out, key, base.get(key))
    if auth is not None:
        _put(out, "spf", auth.spf)
        _put(out, "dkim", auth.dkim)
    out["client_ip"] = scrub(transaction.client_ip)
    _put(out, "helo", scrub(transaction.helo) if transaction.helo else None)
    out["size_bytes"] = transaction.size_bytes
    for key in RAW_FIELDS:  # MAIL_RELAY_RAW, last as in v1
        _put(out, key, base.get(key))
    return out


def encode(payload: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as v1's `WebhookPayload.to_json`."""
    return encode_json(payload)


def _put(out: dict[str, Any], key: str, value: object) -> None:
    if value is not None:
        out[key] = value
