"""Reply stripping: the corpus of real client formats, the project's parser corpus, and adversarial bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mailrelay._parsing import parse_message
from mailrelay._payload import build_payload
from mailrelay._stripping import MAX_CANDIDATES, strip_reply

CORPUS = Path(__file__).parent / "corpus"
REPLIES = sorted((CORPUS / "replies").glob("*.eml"))
PARSER_CORPUS_EXPECTED = json.loads((CORPUS / "stripped.json").read_text(encoding="utf-8"))


def stripped_of(raw: bytes) -> dict[str, str]:
    message = parse_message(raw)
    body = build_payload(sender="a@example.org", recipient="inbox@example.test", message=message).body
    reply = strip_reply(message.text_body if message.text_body is not None else body)
    return {"stripped_text": reply.text, **({"stripped_signature": reply.signature} if reply.signature else {})}


def test_reply_corpus_has_thirty_client_formats() -> None:
    assert len(REPLIES) >= 30


@pytest.mark.parametrize("path", REPLIES, ids=lambda p: p.stem)
def test_reply_corpus_yields_the_expected_reply(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    assert stripped_of(path.read_bytes()) == expected


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.eml")), ids=lambda p: p.stem)
def test_parser_corpus_yields_the_expected_reply(path: Path) -> None:
    assert stripped_of(path.read_bytes()) == PARSER_CORPUS_EXPECTED[path.name]


def test_parser_corpus_expectations_cover_every_file() -> None:
    assert sorted(PARSER_CORPUS_EXPECTED) == sorted(p.name for p in CORPUS.glob("*.eml"))


def test_body_without_history_is_kept_whole() -> None:
    assert strip_reply("  Hello,\r\n\r\nsee you.\r\n").text == "Hello,\n\nsee you."


def test_signature_after_the_last_delimiter() -> None:
    reply = strip_reply("Text\n-- \nnot a signature\n-- \nAnna")
    assert (reply.text, reply.signature) == ("Text\n-- \nnot a signature", "Anna")


def test_deeply_nested_quotes_leave_only_the_reply() -> None:
    body = "Answer.\n" + "\n".join(">" * depth + " old" for depth in range(1, 2001))
    assert strip_reply(body).text == "Answer."


def test_megabytes_without_a_line_break_are_the_reply() -> None:
    body = "On " + "x" * 3_000_000
    assert strip_reply(body).text == body


def test_a_header_past_the_candidate_cap_is_not_looked_for() -> None:
    """Past MAX_CANDIDATES lines that look like header parts the rest is the reply: the work stays linear."""
    lines = ["- item"] * (MAX_CANDIDATES + 1)
    body = "\n".join([*lines, "On Mon, 1 Jan 2026, Bob <bob@example.org> wrote:", "> old"])
    assert strip_reply(body).text == "\n".join([*lines, "On Mon, 1 Jan 2026, Bob <bob@example.org> wrote:"])


def test_a_header_before_the_candidate_cap_is_found() -> None:
    lines = ["- item"] * (MAX_CANDIDATES - 1)
    body = "\n".join([*lines, "On Mon, 1 Jan 2026, Bob <bob@example.org> wrote:", "> old"])
    assert strip_reply(body).text == "\n".join(lines)


def test_signature_of_an_html_only_reply() -> None:
    """html2text writes the `-- ` delimiter as `\\--`: still a signature."""
    raw = b"Subject: x\r\nContent-Type: text/html\r\n\r\n<p>Yes.</p><p>-- <br>Anna</p><blockquote>old</blockquote>"
    assert stripped_of(raw) == {"stripped_text": "Yes.", "stripped_signature": "Anna"}
