"""Payload v2: every field from a full message, omission of absent ones, and both versions against their schemas."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from mailrelay._attachments import inline_attachment
from mailrelay._dmarc import DmarcResult, DmarcVerdict
from mailrelay._parsing import parse_message
from mailrelay._payload import build_payload
from mailrelay._payload_v2 import MailAuth, Transaction, encode, payload_v2
from mailrelay.testing import payload_schema

CORPUS = Path(__file__).parent / "corpus"
FILES = [*sorted(CORPUS.glob("*.eml")), *sorted((CORPUS / "replies").glob("*.eml"))]
TRANSACTION = Transaction(
    recipients=("inbox+t42@example.test", "other@example.test"),
    client_ip="192.0.2.7",
    helo="mx.example.org",
    size_bytes=9,
)
V1, V2 = (jsonschema.Draft202012Validator(payload_schema(version)) for version in (1, 2))
RAW = (
    b"From: Anna <anna@example.org>\r\nTo: Inbox <inbox@example.test>, bad@@x\r\nCc: c@example.org\r\n"
    b"Reply-To: =?utf-8?q?R=C3=A9ponse?= <reply@example.org>\r\nSubject: Re: hi\r\n"
    b"Date: Tue, 24 Nov 2026 09:41:07 +0100\r\nMessage-ID: <m2@example.org>\r\nIn-Reply-To: <m1@example.org>\r\n"
    b"References: <m0@example.org> <m1@example.org>\r\n\r\nYes.\r\n\r\n-- \r\nAnna\r\n\r\n"
    b"On Mon, 23 Nov 2026, Inbox <inbox@example.test> wrote:\r\n> Question?\r\n"
)


def v2(raw: bytes, *, dmarc: DmarcVerdict | None = None) -> dict[str, object]:
    message = parse_message(raw)
    v1 = build_payload(sender="anna@example.org", recipient="inbox+t42@example.test", message=message, dmarc=dmarc)
    auth = MailAuth(spf=dmarc.spf, dkim=dmarc.dkim) if dmarc else None
    payload: dict[str, object] = json.loads(encode(payload_v2(v1, message=message, transaction=TRANSACTION, auth=auth)))
    return payload


def test_every_field_of_a_full_message() -> None:
    verdict = DmarcVerdict(result=DmarcResult.PASS, authenticated_from="anna@example.org", spf="pass", dkim="none")
    assert v2(RAW, dmarc=verdict) == {
        "payload_version": 2,
        "message_id": "m2@example.org",
        "in_reply_to": "m1@example.org",
        "references": ["m0@example.org", "m1@example.org"],
        "date": "2026-11-24T09:41:07+01:00",
        "sender": "anna@example.org",
        "sender_name": "Anna",
        "recipient": "inbox+t42@example.test",
        "recipients": ["inbox+t42@example.test", "other@example.test"],
        "recipient_tag": "t42",
        "to": [{"address": "inbox@example.test", "name": "Inbox"}],
        "cc": [{"address": "c@example.org"}],
        "reply_to": [{"address": "reply@example.org", "name": "Réponse"}],
        "subject": "Re: hi",
        "body": "Yes.\n\n-- \nAnna\n\nOn Mon, 23 Nov 2026, Inbox <inbox@example.test> wrote:\n> Question?\n",
        "text_body": "Yes.\n\n-- \nAnna\n\nOn Mon, 23 Nov 2026, Inbox <inbox@example.test> wrote:\n> Question?\n",
        "stripped_text": "Yes.",
        "stripped_signature": "Anna",
        "dmarc_result": "pass",
        "authenticated_from": "anna@example.org",
        "spf": "pass",
        "dkim": "none",
        "client_ip": "192.0.2.7",
        "helo": "mx.example.org",
        "size_bytes": 9,
    }


def test_absent_fields_are_omitted() -> None:
    payload = v2(b"Subject: x\r\n\r\n")
    assert set(payload) == {
        *("payload_version", "sender", "recipient", "recipients", "recipient_tag", "subject", "body", "text_body"),
        *("stripped_text", "client_ip", "helo", "size_bytes"),
    }


def test_v1_fields_keep_their_values() -> None:
    message = parse_message(RAW)
    v1 = build_payload(sender="anna@example.org", recipient="inbox@example.test", message=message)
    shaped = payload_v2(v1, message=message, transaction=TRANSACTION)
    assert {key: shaped[key] for key in v1.to_dict()} == v1.to_dict()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_both_versions_match_their_schemas(path: Path) -> None:
    message = parse_message(path.read_bytes())
    v1 = build_payload(
        sender="sender@example.org",
        recipient="inbox@example.test",
        message=message,
        header_prefixes=("x-",),
        attachments=[inline_attachment(part) for part in message.parts],
    )
    V1.validate(json.loads(v1.to_json()))
    V2.validate(json.loads(encode(payload_v2(v1, message=message, transaction=TRANSACTION))))


def test_unknown_schema_version_is_refused() -> None:
    with pytest.raises(ValueError, match="not 1 or 2"):
        payload_schema(3)


@pytest.mark.parametrize("version", [1, 2])
def test_docs_example_payload_matches_the_schema(version: int) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "mailrelay.md").read_text(encoding="utf-8")
    section = docs.split(f"### Example payload (v{version})", 1)[1]
    example = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    (V1, V2)[version - 1].validate(example)
    assert example.get("payload_version", 1) == version
