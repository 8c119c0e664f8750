"""The DATA reader over an in-memory StreamReader: terminator, dot-unstuffing, limits."""

from __future__ import annotations

import asyncio

import pytest

from mailrelay.smtp import _replies as r
from mailrelay.smtp._data import DOT_STUFFED_LINE_OCTETS, read_message
from mailrelay.smtp._replies import Reply


async def read(data: bytes, *, max_size: int = 1000, limit: int = 100) -> bytes | Reply:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    return await read_message(reader, max_size=max_size)


async def test_terminator_and_dot_unstuffing() -> None:
    assert await read(b"a\r\n..b\r\n.c\r\n.\r\nNEXT\r\n") == b"a\r\n.b\r\nc\r\n"


async def test_bare_lf_dot_does_not_end_the_message() -> None:
    assert await read(b"a\n.\nb\r\n.\r\n") == b"a\n.\nb\r\n"


async def test_empty_message() -> None:
    assert await read(b".\r\n") == b""


async def test_eight_bit_bytes_are_kept() -> None:
    assert await read(b"\xff\xfe\xc3\xa9\r\n.\r\n") == b"\xff\xfe\xc3\xa9\r\n"


async def test_too_large_is_read_to_the_end_then_refused() -> None:
    reader = asyncio.StreamReader(limit=100)
    reader.feed_data(b"x" * 50 + b"\r\n" + b"y" * 50 + b"\r\n.\r\nQUIT\r\n")
    assert await read_message(reader, max_size=60) == r.MESSAGE_TOO_LARGE
    assert await reader.readline() == b"QUIT\r\n"  # the stream is positioned after the data


async def test_over_long_line_is_refused_and_its_tail_is_not_a_terminator() -> None:
    reader = asyncio.StreamReader(limit=100)
    reader.feed_data(b"z" * 300 + b".\r\nmore\r\n.\r\nQUIT\r\n")
    assert await read_message(reader, max_size=10_000) == r.DATA_LINE_TOO_LONG
    assert await reader.readline() == b"QUIT\r\n"


async def test_on_line_is_called_per_line() -> None:
    reader = asyncio.StreamReader(limit=100)
    reader.feed_data(b"a\r\nb\r\n.\r\n")
    calls: list[int] = []
    await read_message(reader, max_size=100, on_line=lambda: calls.append(1))
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("line", "accepted"),
    [
        pytest.param(b"x" * 998, True, id="998-octets"),
        pytest.param(b"x" * 999, False, id="999-octets"),
        pytest.param(b"." + b"x" * 998, True, id="dot-and-998"),
        pytest.param(b"." + b"x" * 999, False, id="dot-and-999"),
        pytest.param(b"x" * 1001, False, id="1001-octets-past-the-readers-limit"),
    ],
)
async def test_a_line_holds_998_octets_plus_the_transparency_dot(line: bytes, accepted: bool) -> None:
    """RFC 5321 4.5.3.1.6: 1000 octets with the CRLF; a dot-stuffed line has one more, removed on receipt."""
    reader = asyncio.StreamReader(limit=DOT_STUFFED_LINE_OCTETS)
    reader.feed_data(b"a\r\n" + line + b"\r\nb\r\n.\r\nQUIT\r\n")
    result = await read_message(reader, max_size=10_000)
    assert result == (b"a\r\n" + line.removeprefix(b".") + b"\r\nb\r\n" if accepted else r.DATA_LINE_TOO_LONG)
    assert await reader.readline() == b"QUIT\r\n"
