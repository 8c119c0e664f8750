"""The parser's fast path (`_parsing._message`) builds the Message FeedParser builds, and falls back to it otherwise.

Every corpus file (LF and CRLF), the bench's message and hand-made edge cases of the header section go through
both: the fields, the payload and what parse_message makes of them must be the same.
"""

from __future__ import annotations

import email.header
import itertools
import re
from email import policy
from email.message import Message
from email.parser import BytesParser
from pathlib import Path

import pytest

from mailrelay import _parsing
from mailrelay._parsing import decode_header_value, parse_message

CORPUS = Path(__file__).parent / "corpus"
PLAIN = (
    b"From: Load Client <load@bench.test>\r\n"
    b"To: <inbox@example.test>\r\n"
    b"Subject: benchmark message\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"\r\n" + b"A line of an ordinary plain-text message body.\r\n" * 3
)
EDGE_CASES = {
    "plain": PLAIN,
    "folded": b"Subject: one\r\n two\r\n\tthree\r\nFrom: a@b.test\r\n\r\nbody\r\n",
    "eight-bit header and body": "Subject: caf\u00e9\r\nFrom: \u00e9 <a@b.test>\r\n\r\nd\u00e9j\u00e0\r\n".encode(),
    "empty value": b"Subject:\r\nX-Empty:   \r\n\r\nbody",
    "no body": b"Subject: s\r\n\r\n",
    "headers only": b"Subject: s\r\nFrom: a@b.test\r\n",
    "body only": b"\r\njust a body\r\n",
    "mbox From line": b"From sender@b.test Sat Nov 21 00:00:00 2026\r\nSubject: s\r\n\r\nbody\r\n",
    "leading continuation": b" stray\r\nSubject: s\r\n\r\nbody\r\n",
    "space before colon": b"Subject : s\r\nFrom: a@b.test\r\n\r\nbody\r\n",
    "empty name": b": value\r\nSubject: s\r\n\r\nbody\r\n",
    "bare LF in headers": b"Subject: s\nFrom: a@b.test\r\n\r\nbody\r\n",
    "bare CR in a value": b"Subject: s\rX: y\r\nFrom: a@b.test\r\n\r\nbody\r\n",
    "LF only": b"Subject: s\nFrom: a@b.test\n\nbody\n",
    "multipart": (
        b'Content-Type: multipart/alternative; boundary="b"\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\n'
        b"text\r\n--b\r\nContent-Type: text/html\r\n\r\n<p>html</p>\r\n--b--\r\n"
    ),
    "message/rfc822": b"Content-Type: message/rfc822\r\n\r\nSubject: inner\r\n\r\ninner body\r\n",
    "base64 text": b"Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\nY2Fmw6k=\r\n",
    "attachment": (
        b'Content-Type: application/pdf; name="a.pdf"\r\nContent-Disposition: attachment; filename="a.pdf"\r\n'
        b"\r\n%PDF-1.4\r\n"
    ),
    "encoded words": (
        b"Subject: =?utf-8?q?caf=C3=A9?= =?utf-8?B?w6k=?=\r\nFrom: =?utf-8?q?Z=C3=BC?= <z@b.test>\r\n\r\nb"
    ),
}


def _stdlib(raw: bytes) -> Message:
    return BytesParser(policy=policy.compat32).parsebytes(raw)


def _shape(message: Message) -> object:
    payload = message.get_payload()
    children = [_shape(child) for child in payload] if isinstance(payload, list) else payload
    return (list(message.raw_items()), message.get_content_type(), message.is_multipart(), children)


def _cases() -> dict[str, bytes]:
    cases = dict(EDGE_CASES)
    for path in sorted(CORPUS.glob("*.eml")):
        data = path.read_bytes().replace(b"\r\n", b"\n")
        cases[f"{path.stem} (LF)"] = data
        cases[f"{path.stem} (CRLF)"] = data.replace(b"\n", b"\r\n")
    return cases


CASES = _cases()


@pytest.mark.parametrize("raw", CASES.values(), ids=CASES.keys())
def test_fast_path_builds_feedparsers_message(raw: bytes) -> None:
    assert _shape(_parsing._message(raw)) == _shape(_stdlib(raw))


@pytest.mark.parametrize("raw", CASES.values(), ids=CASES.keys())
def test_parse_message_is_the_same_either_way(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = parse_message(raw)
    monkeypatch.setattr(_parsing, "_message", _stdlib)  # our own module: the stdlib path alone
    assert fast == parse_message(raw)


def test_plain_single_part_mail_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: BytesParser, raw: bytes) -> Message:
        raise AssertionError("FeedParser was used")

    class NoFeedParser(BytesParser):
        parsebytes = refuse  # type: ignore[assignment]

    monkeypatch.setattr(_parsing, "BytesParser", NoFeedParser)
    assert parse_message(PLAIN).text_body == "A line of an ordinary plain-text message body.\n" * 3


@pytest.mark.parametrize(
    "raw",
    ["plain", "  spaced  ", "folded\r\n value", "caf\udcc3\udca9 smuggled", "x" * 10_000, "a =? b", "=?utf-8?q?a?="],
)
def test_header_values_without_encoded_words_decode_as_the_stdlib_does(raw: str) -> None:
    unfolded = raw.replace("\r\n ", " ")
    chunks = email.header.decode_header(unfolded)
    expected = "".join(c if isinstance(c, str) else c.decode(cs or "ascii") for c, cs in chunks)
    assert decode_header_value(raw) == _parsing.scrub(expected)


def _without_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own module's shortcuts off: the stdlib's address, parameter and file-name parsing alone."""
    monkeypatch.setattr(_parsing, "simple_address_pairs", lambda text: None)
    monkeypatch.setattr(_parsing, "_ONE_CHARSET", re.compile(r"(?!)"))
    monkeypatch.setattr(_parsing, "_names_a_file", lambda part: True)


@pytest.mark.parametrize("raw", CASES.values(), ids=CASES.keys())
def test_parse_message_is_the_same_without_the_shortcuts(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = parse_message(raw)
    _without_shortcuts(monkeypatch)
    assert fast == parse_message(raw)


def _content_types() -> list[str]:
    types = ["text/plain", "TEXT/HTML", "application/x-y", "text"]
    separators = ["; ", ";", " ; ", ";\t", ";\r\n "]
    keys = ["charset", "Charset", "CHARSET", "charset*", " charset ", "char set", "xcharset"]
    equals = ["=", " = ", "\t=\t"]
    values = [
        "utf-8",
        '"utf-8"',
        '"UTF-8"',
        "ISO-8859-1",
        '"utf-8',
        'utf-8"',
        '""',
        "",
        "utf 8",
        '"a;b"',
        "us-ascii",
        "x{}~'^",
        "utf-8''x",
        "caf\u00e9",
        '"utf\\-8"',
    ]
    trailers = ["", " ", "\t", "; format=flowed", ";", ' ; name="x"']
    return [
        f"{kind}{separator}{key}{equal}{value}{trailer}"
        for kind, separator, key, equal, value, trailer in itertools.product(
            types, separators, keys, equals, values, trailers
        )
    ]


def test_charsets_read_as_the_stdlib() -> None:
    shortcut = 0
    for value in _content_types():
        part = Message(policy=policy.compat32)
        part["Content-Type"] = value
        expected = _parsing._header_param_safe(part, "get_content_charset")
        assert _parsing._charset(part) == expected, value
        shortcut += _parsing._ONE_CHARSET.fullmatch(value) is not None
    assert shortcut > 500  # the comparison covered the shortcut, not only the fallback


def test_file_names_read_as_the_stdlib(monkeypatch: pytest.MonkeyPatch) -> None:
    params = [
        "",
        '; name="a.txt"',
        "; NAME=b",
        "; Name*0=c; Name*1=d",
        "; name*=utf-8''%C3%A9.txt",
        "; x=name",
        "; nam e=x",
        "; filenam=x",
        '; charset="utf-8"',
        "; format=flowed",
        ";",
        "; =name",
    ]
    dispositions = [
        None,
        "inline",
        "attachment",
        'attachment; filename="r.pdf"',
        "attachment; FileName=s",
        "attachment; filename*0*=utf-8''t; filename*1=u",
        "inline; size=3",
        "attachment; x=filename",
    ]
    parts = []
    for kind, param, disposition in itertools.product(["text/plain", "application/pdf"], params, dispositions):
        part = Message(policy=policy.compat32)
        part["Content-Type"] = kind + param
        if disposition is not None:
            part["Content-Disposition"] = disposition
        parts.append(part)
    fast = [_parsing._filename(part) for part in parts]
    monkeypatch.setattr(_parsing, "_names_a_file", lambda part: True)
    assert fast == [_parsing._filename(part) for part in parts]
    assert fast.count(None) > 50 and len(set(fast)) > 5  # both the shortcut's None and names were compared
