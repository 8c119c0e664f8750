"""Payload v2 (`MAIL_RELAY_PAYLOAD_VERSION=2`): every v1 field plus threading, all recipients, the addresses, the
reply without quotes or signature, SPF/DKIM verdicts and the SMTP transaction's facts.

Pure: no I/O. Optional fields are omitted, never null, as in v1. The field list and its caps are in
docs/mailrelay.md; `mailrelay/schemas/payload-v2.schema.json` describes the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from mailrelay._headers import (
    address_dicts,
    message_id,
    message_ids,
    plus_tag,
    rfc3339_date,
)
from mailrelay._parsing import ParsedMessage, scrub
from mailrelay._payload import WebhookPayload, encode_json
from mailrelay._stripping import reply_parts

PAYLOAD_VERSION = 2
PAYLOAD_VERSIONS = (1, 2)


class Transaction(NamedTuple):
    """What the SMTP session knows of one message: every accepted recipient in RCPT order, the client's address
    and HELO/EHLO name, and the size of the message data in bytes. A named tuple, not a frozen dataclass: one is
    built per message, and a frozen dataclass sets each field through ``object.__setattr__``."""

    recipients: tuple[str, ...]
    client_ip: str
    helo: str | None
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MailAuth:
    """The SPF and DKIM verdicts reported beside `dmarc_result` (None: not evaluated)."""

    spf: str | None = None
    dkim: str | None = None


V1_TAIL_FIELDS = ("headers", "attachments", "dmarc_result", "authenticated_from")
"""v1's fields after the bodies, in v2 after the stripped reply."""
_ID_FIELDS = (("message_id", "message-id"), ("in_reply_to", "in-reply-to"))  # field, header
RAW_FIELDS = ("raw_base64", "raw_url", "raw_presigned_url")
"""The original message's fields (``mailrelay._raw``), when ``MAIL_RELAY_RAW`` is on."""


def payload_v2(
    v1: WebhookPayload, *, message: ParsedMessage, transaction: Transaction, auth: MailAuth | None = None
) -> dict[str, Any]:
    """The v2 JSON object: `v1`'s fields (values unchanged) with the v2 fields among them, None fields left out.

    Each field is set where it goes in the order (the JSON's order), read from `v1`'s attributes as its `to_dict`
    reads them; a field whose header is missing costs a dictionary look-up."""
    if auth is None:
        return payload_v2_dict(v1, message, transaction)
    return payload_v2_dict(v1, message, transaction, spf=auth.spf, dkim=auth.dkim)


def payload_v2_dict(
    v1: WebhookPayload,
    message: ParsedMessage,
    transaction: Transaction,
    *,
    spf: str | None = None,
    dkim: str | None = None,
) -> dict[str, Any]:
    """`payload_v2` with the SPF and DKIM verdicts as arguments (the relay builds no `MailAuth` per message)."""
    out: dict[str, Any] = {"payload_version": PAYLOAD_VERSION}
    if message.threading_headers:
        _threading(out, dict(message.threading_headers))
    recipient = v1.recipient
    out["sender"] = v1.sender
    if v1.sender_name is not None:
        out["sender_name"] = v1.sender_name
    out["recipient"] = recipient
    out["recipients"] = list(map(scrub, transaction.recipients)) or [recipient]
    tag = plus_tag(recipient) if "+" in recipient else None
    if tag is not None:
        out["recipient_tag"] = tag
    for key, raw in message.address_headers:  # to, cc, reply_to in this order, one value each
        found = address_dicts(raw)
        if found:
            out[key] = found
    out["subject"] = v1.subject
    out["body"] = v1.body
    text_body = message.text_body
    if text_body is not None:
        out["text_body"] = text_body
    if v1.html_body is not None:
        out["html_body"] = v1.html_body
    out["stripped_text"], signature = reply_parts(text_body if text_body is not None else v1.body)
    if signature is not None:
        out["stripped_signature"] = signature
    if v1.headers or v1.attachments or v1.raw is not None:  # to_dict's fields after the bodies, as it writes them
        tail = v1.to_dict()
        out.update((key, tail[key]) for key in V1_TAIL_FIELDS if key in tail)
    else:
        if v1.dmarc_result is not None:
            out["dmarc_result"] = v1.dmarc_result
        if v1.authenticated_from is not None:
            out["authenticated_from"] = v1.authenticated_from
        tail = None
    if spf is not None:
        out["spf"] = spf
    if dkim is not None:
        out["dkim"] = dkim
    out["client_ip"] = scrub(transaction.client_ip)
    if transaction.helo:
        out["helo"] = scrub(transaction.helo)
    out["size_bytes"] = transaction.size_bytes
    if tail is not None:  # MAIL_RELAY_RAW, last as in v1
        out.update((key, tail[key]) for key in RAW_FIELDS if key in tail)
    return out


def _threading(out: dict[str, Any], threading: dict[str, str]) -> None:
    """`message_id`, `in_reply_to`, `references` and `date` from the message's first such headers (a missing
    header costs a look-up)."""
    for key, name in _ID_FIELDS:
        value = threading.get(name)
        identifier = message_id(value) if value is not None else None
        if identifier is not None:
            out[key] = identifier
    references = threading.get("references")
    if references is not None:
        _put(out, "references", message_ids(references) or None)
    date = threading.get("date")
    if date is not None:
        _put(out, "date", rfc3339_date(date))


def encode(payload: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as v1's `WebhookPayload.to_json`."""
    return encode_json(payload)


def _put(out: dict[str, Any], key: str, value: object) -> None:
    if value is not None:
        out[key] = value
