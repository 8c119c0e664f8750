"""Focused parsing rules: header decoding, charsets, body selection."""

from __future__ import annotations

import email.header

import pytest

from mailrelay._parsing import HEADER_DECODE_PIECE, decode_bytes, decode_header_value, parse_message, scrub


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("plain subject", "plain subject"),
        ("=?utf-8?q?caf=C3=A9?=", "café"),
        ("=?ISO-8859-1?B?Q2Fm6Q==?=", "Café"),
        ("Re: =?utf-8?q?a?= =?utf-8?q?b?= tail", "Re: ab tail"),
        ("folded\r\n continuation", "folded continuation"),
        ("=?x-nope?q?caf=E9?=", "caf\ufffd"),
        ("=?utf-8?B?!!!?=", "=?utf-8?B?!!!?="),
    ],
)
def test_decode_header_value(raw: str, expected: str) -> None:
    assert decode_header_value(raw) == expected


@pytest.mark.parametrize(
    ("data", "charset", "expected"),
    [
        (b"caf\xc3\xa9", "utf-8", "café"),
        (b"caf\xe9", "latin-1", "café"),
        (b"caf\xe9", "iso-8859-1", "café"),
        (b"caf\xc3\xa9", "us-ascii", "café"),  # mislabelled UTF-8 is common
        (b"caf\xe9", "us-ascii", "caf\ufffd"),
        (b"caf\xe9", "x-unknown", "caf\ufffd"),
        (b"caf\xe9", "base64_codec", "caf\ufffd"),  # not a text encoding
        (b"caf\xe9", None, "caf\ufffd"),
    ],
)
def test_decode_bytes(data: bytes, charset: str | None, expected: str) -> None:
    assert decode_bytes(data, charset) == expected


def test_scrub_turns_smuggled_bytes_into_text() -> None:
    assert scrub("caf\udcc3\udca9") == "café"
    assert scrub("lone \ud800 surrogate") == "lone ? surrogate"


def test_sender_name_absent_for_bare_address() -> None:
    assert parse_message(b"From: alice@example.org\r\n\r\nx").sender_name is None
    assert parse_message(b"From: <alice@example.org>\r\n\r\nx").sender_name is None


def test_sender_name_from_quoted_display_name() -> None:
    message = parse_message(b'From: "Doe, Jane" <jane@example.org>\r\n\r\nx')
    assert message.sender_name == "Doe, Jane"
    assert message.from_address == "jane@example.org"


def test_attachment_disposition_text_file_is_not_the_body() -> None:
    raw = (
        b"Content-Type: multipart/mixed; boundary=b\r\n\r\n"
        b"--b\r\nContent-Type: text/plain\r\nContent-Disposition: attachment; filename=notes.txt\r\n\r\nnotes\r\n"
        b"--b\r\nContent-Type: text/plain\r\n\r\nthe body\r\n--b--\r\n"
    )
    message = parse_message(raw)
    assert message.text_body == "the body"
    assert [(p.filename, p.data) for p in message.parts] == [("notes.txt", b"notes")]


def test_headers_are_decoded_in_order() -> None:
    message = parse_message(b"X-A: 1\r\nX-B: =?utf-8?q?=C3=BC?=\r\nX-A: 2\r\n\r\n")
    assert message.headers == (("X-A", "1"), ("X-B", "ü"), ("X-A", "2"))


def test_eight_bit_header_bytes_are_decoded_as_utf8() -> None:
    message = parse_message("Subject: Grüße\r\n\r\nx".encode())
    assert message.subject == "Grüße"


class TestLongHeaderValues:
    """The stdlib decoder is quadratic in encoded words: long values are decoded piece by piece."""

    def test_many_encoded_words_decode_across_pieces(self) -> None:
        raw = "\r\n ".join(["=?utf-8?q?caf=C3=A9?=", "=?iso-8859-1?q?K=F6ln?="] * 2_000)
        assert len(raw) > 10 * HEADER_DECODE_PIECE
        assert decode_header_value(raw) == "caféKöln" * 2_000

    def test_plain_and_mixed_words_keep_their_spaces_at_a_cut(self) -> None:
        words = ["plain", "=?utf-8?q?caf=C3=A9?=", "text"] * 2_000
        expected = " ".join(["plain", "café", "text"] * 2_000)
        assert decode_header_value(" ".join(words)) == expected

    def test_the_stdlib_decoder_only_sees_bounded_pieces(self, monkeypatch: pytest.MonkeyPatch) -> None:
        seen: list[int] = []
        real = email.header.decode_header

        def measuring(value: str) -> list[tuple[bytes | str, str | None]]:
            seen.append(len(value))
            return real(value)

        monkeypatch.setattr(email.header, "decode_header", measuring)
        raw = "\r\n ".join(["=?utf-8?q?caf=C3=A9?="] * 50_000)  # ~1 MB, seconds in one piece
        assert decode_header_value(raw) == "café" * 50_000
        assert len(seen) > 1
        assert max(seen) <= HEADER_DECODE_PIECE + len("=?utf-8?q?caf=C3=A9?=")
