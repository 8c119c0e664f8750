"""Payload v2's shortcuts give what the general code gives: the simple address and date shapes read without the
stdlib parsers, reply stripping without the header search when no line can start one, and orjson's bytes
against json.dumps'. Each compares both over generated inputs and the corpora (bench/README.md, issue 31)."""

from __future__ import annotations

import datetime
import email.utils
import itertools
import json
from pathlib import Path

import pytest

from mailrelay import _headers, _stripping
from mailrelay._attachments import Attachment, DeliveryMode
from mailrelay._headers import MAX_ID_CHARS, MAX_SCANNED_CHARS, address_dicts, addresses, message_id, rfc3339_date
from mailrelay._parsing import parse_message, simple_address_pairs
from mailrelay._payload import WebhookPayload, build_payload, encode_json
from mailrelay._payload_v2 import MailAuth, Transaction, payload_v2
from mailrelay._raw import RawMessage
from mailrelay._stripping import strip_reply

CORPUS = Path(__file__).parent / "corpus"
FILES = [*sorted(CORPUS.glob("*.eml")), *sorted((CORPUS / "replies").glob("*.eml"))]
LOCALS = ["a", "john.doe", "x+tag", "o'hara", "#!$%&*/=?^_`{|}~-", ".a", "a.", "a..b", "a b", '"q"', "ü"]
DOMAINS = ["example.org", "x", "ex-ample.co.uk", "[192.0.2.1]", "a.b.", "a..b"]
NAMES = ["", "John", "John  Smith", "John\tSmith", '"Doe, John"', "=?utf-8?q?J=C3=BCrgen?=", "J. Smith", "(c)", "Jo@n"]
FORMS = ["{a}", "<{a}>", "{n} <{a}>", "{n}<{a}>", "  <{a}>  ", "{n} < {a} >", "{a} ({n})", ""]


def _stdlib_date(value: str) -> str | None:
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)).isoformat()


def test_simple_address_lists_parse_as_the_stdlib() -> None:
    entries = [
        form.format(a=f"{local}@{domain}", n=name)
        for form in FORMS
        for local in LOCALS
        for domain in DOMAINS
        for name in NAMES
    ]
    lists = [*entries, *(", ".join(pair) for pair in itertools.islice(itertools.combinations(entries[::7], 2), 20_000))]
    shortcut = 0
    for value in lists:
        pairs = simple_address_pairs(value)
        if pairs is not None:
            shortcut += 1
            assert pairs == email.utils.getaddresses([value]), value
    assert shortcut > 1_000  # the comparison covered the shortcut, not only the fallback


def test_one_address_reads_as_the_address_list() -> None:
    entries = [
        form.format(a=f"{local}@{domain}", n=name)
        for form in [*FORMS, "\t{n}\t<{a}>\t", "{n} <{a}>\r\n", "{a},"]
        for local in LOCALS
        for domain in DOMAINS
        for name in [*NAMES, "N" * 300, "=?utf-8?q?a=2C_b?="]
    ]
    entries += ["x" * 317 + "@b", "x" * 318 + "@b", "<" + "x" * 316 + "@b>", "x" * 319 + "@b", "a@b\r\n c@d"]
    assert sum("," not in entry for entry in entries) > 1_000  # the one-address shortcut is tried
    for entry in entries:
        assert address_dicts(entry) == [address.to_dict() for address in addresses(entry)], entry


def test_simple_dates_read_as_the_stdlib() -> None:
    days = ["", "Tue, ", "Xyz, "]
    fields = itertools.product(
        days, ["1", "07", "29", "31", "32"], ["Jan", "Feb", "Apr", "nov"], ["2026", "0099", "10000"],
        ["00:00:00", "23:59:59", "09:30", "24:00:00", "12:60:00", "12:00:61"],
        ["+0000", "-0000", "+0100", "-0530", "+0160", "+2359", "+2400", "+9999", "GMT", "+01"],
    )  # fmt: skip
    for day, date, month, year, time, zone in fields:
        value = f"{day}{date} {month} {year} {time} {zone}"
        assert rfc3339_date(value) == _stdlib_date(value), value


def _bodies() -> list[str]:
    bodies = ["", "\n\n", "plain-text reply\nwith no marker", " - a dash list\n", "\u00a0-\u2003rule", "a\x0b-b\n\x1c-"]
    for path in FILES:
        message = parse_message(path.read_bytes())
        bodies.append(message.text_body or "")
        bodies.append(build_payload(sender="a@example.org", recipient="b@example.test", message=message).body)
    parts = [
        "a - b",
        "Thanks!",
        "- item",
        "  -- ",
        "> quoted",
        "On Mon, Anna wrote:",
        "x: y",
        "Sent from my iPhone",
        "\u3000-",
        "",
    ]
    bodies += ["\n".join(combo) for combo in itertools.permutations(parts, 4)]
    return bodies


def test_reply_stripping_without_the_header_search_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = _bodies()
    assert sum(not _stripping._may_have_header(body) for body in bodies) > 100  # the shortcut is taken
    fast = [strip_reply(body) for body in bodies]
    monkeypatch.setattr(_stripping, "_may_have_header", lambda text: True)
    assert [strip_reply(body) for body in bodies] == fast


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_orjson_writes_json_dumps_bytes(path: Path) -> None:
    message = parse_message(path.read_bytes())
    v1 = build_payload(sender="a@example.org", recipient="b+tag@example.test", message=message)
    transaction = Transaction(recipients=("b+tag@example.test",), client_ip="192.0.2.7", helo="mx", size_bytes=9)
    for payload in (v1.to_dict(), payload_v2(v1, message=message, transaction=transaction)):
        assert encode_json(payload) == json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def test_orjson_escapes_as_json_dumps() -> None:
    every = "".join(chr(c) for c in range(0x3400) if not 0xD800 <= c < 0xE000) + "\u2028\u2029\ufeff\U0001f600"
    payload = {"text": every, "list": [{"k": every, "n": 12}], "empty": ""}
    assert encode_json(payload) == json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def test_blank_runs_in_an_address_header_are_no_address() -> None:
    # one pass over the blanks: the shortcut's pattern never lets two runs of blanks compete for them
    assert addresses(" " * MAX_SCANNED_CHARS + "x") == []
    assert addresses("a" + "\t" * MAX_SCANNED_CHARS) == []


def test_dates_of_leap_years_and_wide_zones_read_as_the_stdlib() -> None:
    fields = itertools.product(
        ["28", "29", "30", "31"], ["Feb", "Apr", "Dec"], ["1900", "2000", "2024", "2026", "2100", "9999"],
        ["23:59:59", "00:00", "23:59:60"],
        ["+0000", "-0000", "+2300", "-2359", "+2360", "-0099", "+0160", "+2400", "-0059"],
    )  # fmt: skip
    for date, month, year, time, zone in fields:
        value = f"Mon, {date} {month} {year} {time} {zone}"
        assert rfc3339_date(value) == _stdlib_date(value), value


def test_replies_without_quotes_read_as_the_general_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # the last lines split off for the footer check: footers among and past them, blank lines after them
    lines = ["Thanks, see you", "Sent from my iPhone", "Von meinem Handy gesendet", "", "  ", "\t", " " * 301 + "x"]
    bodies = ["\n".join(combo) for combo in itertools.product(lines, repeat=4)]
    bodies += ["Hi\nSent from my iPad" + "\n" * blanks + "end" * last for blanks in range(14) for last in (0, 1)]
    bodies += ["a\n" * before + "Sent via phone\n" + "b\n" * after for before in (0, 9) for after in range(6)]
    bodies += ["reply\n\\--\nsig\n", "reply\r\nSent from my iPhone\r\n", "\u017fent from my iPhone", "İnviato da Mail"]
    assert sum(_stripping._plain_reply(body) is not None for body in bodies) > 1_000  # the shortcut is taken
    fast = [strip_reply(body) for body in bodies]
    monkeypatch.setattr(_stripping, "_may_have_header", lambda text: True)
    assert [strip_reply(body) for body in bodies] == fast


def test_replies_without_a_marked_line_read_as_the_general_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # no line starting with "-" or a footer's first letter (after any blanks, Unicode ones and their case
    # variants too), no ":", ">" or backslash: the whole text is the reply, without _plain_reply's footer search
    lines = ["all of it", "  Sent from my iPhone", "\u00a0- x", "\u017fent from my iPad", "\u0130nviato da", "a", ""]
    lines += ["\u2003W", "\x0bo", " " * 301 + "Sent via x", "\tEnd", "x-y", "ok.", "  \t"]
    bodies = [*_bodies(), *("\n".join(combo) for combo in itertools.product(lines, repeat=3))]
    bodies += [body.replace("\n", "\r\n") for body in bodies[-200:]] + ["a\rSent from my iPhone", "a\r\r\nb\r"]
    texts = [body.replace("\r", "\n") for body in bodies]
    taken = [text for text in texts if not set(":>\\") & set(text) and _stripping._unmarked(text)]
    assert len(taken) > 150  # the shortcut is taken
    fast = [strip_reply(body) for body in bodies]
    monkeypatch.setattr(_stripping, "_unmarked", lambda text: False)
    assert [strip_reply(body) for body in bodies] == fast  # through _plain_reply
    monkeypatch.setattr(_stripping, "_may_have_header", lambda text: True)
    assert [strip_reply(body) for body in bodies] == fast  # through the general code


def _general_message_id(value: str) -> str | None:
    # message_id's search without its `<id>` shortcut: the first acceptable bracketed id, else a bare one
    for match in _headers._ID.finditer(value):
        identifier = _headers._identifier(match.group(1))
        if identifier is not None:
            return identifier
    return _headers._bare_id(value)


def test_a_bracketed_id_alone_reads_as_the_general_search() -> None:
    pieces = ["<", ">", "a", "@", " ", "\t", "\x7f", "\x1c", "\u00a0", "é", "\u2028"]
    inner = ["".join(combo) for length in range(4) for combo in itertools.product(pieces, repeat=length)]
    values = [*inner, *(f"<{text}>" for text in inner)]
    values += ["<" + "i" * length + "@x>" for length in (MAX_ID_CHARS - 3, MAX_ID_CHARS - 2, MAX_ID_CHARS - 1)]
    values += ["<bench-17@bench.test>", "<a@b><c@d>", "<>", "<a b@c>", "<a@b>\n", "<a\u3000@b>"]
    assert sum(value[:1] == "<" and value[-1:] == ">" for value in values) > 1_000  # the shortcut is looked at
    for value in values:
        assert message_id(value) == _general_message_id(value), repr(value)


@pytest.mark.parametrize("path", FILES[:12], ids=lambda p: p.stem)
def test_threading_headers_are_the_first_of_each_header(path: Path) -> None:
    raw = b"message-ID: <first@x>\r\nDATE: Mon, 1 Jan 2024 00:00:00 +0000\r\nMessage-Id: <second@x>\r\n"
    for message in (parse_message(path.read_bytes()), parse_message(raw + path.read_bytes())):
        first: dict[str, str] = {}
        for name, value in message.headers:
            first.setdefault(name.lower(), value)
        names = ("message-id", "in-reply-to", "references", "date")
        assert dict(message.threading_headers) == {name: first[name] for name in names if name in first}


def test_v1_fields_keep_their_values_and_order_in_v2() -> None:
    # payload_v2 reads v1's attributes itself unless to_dict has work to do (headers, attachments, raw)
    message = parse_message(b"To: Ann <ann@example.org>\r\nSubject: s\r\n\r\nHello\r\n")
    attachment = Attachment(content_type="text/csv", size_bytes=3, delivery=DeliveryMode.INLINE, data=b"a,b")
    options = itertools.product(
        [None, "Al"], [None, "<p>x</p>"], [None, {"X-A": "1"}], [None, (attachment,)], [None, "pass"],
        [None, "a@example.org"], [None, RawMessage(data=b"raw"), RawMessage(url="s3://b/k", presigned_url="https://p")],
        [None, MailAuth(spf="pass"), MailAuth(spf="fail", dkim="pass")],
    )  # fmt: skip
    for name, html, headers, attachments, dmarc, authenticated, raw, auth in options:
        v1 = WebhookPayload(
            sender="a@example.org", recipient="b+t@example.test", subject="s", body="Hello\n", sender_name=name,
            html_body=html, headers=headers, attachments=attachments, dmarc_result=dmarc,
            authenticated_from=authenticated, raw=raw,
        )  # fmt: skip
        transaction = Transaction(recipients=("b+t@example.test",), client_ip="192.0.2.7", helo=None, size_bytes=9)
        v2 = payload_v2(v1, message=message, transaction=transaction, auth=auth)
        expected = v1.to_dict()
        assert {key: v2[key] for key in v2 if key in expected} == expected
        assert [key for key in v2 if key in expected] == list(expected)
        assert v2.get("spf") == (auth.spf if auth else None)
        last = list(raw.fields()) if raw is not None else []  # MAIL_RELAY_RAW's fields close both versions
        assert list(v2)[-len(last) - 1 :] == ["size_bytes", *last]
