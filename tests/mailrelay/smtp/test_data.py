"""The DATA reader over an in-memory StreamReader: terminator, dot-unstuffing, limits."""

from __future__ import annotations

import asyncio

from mailrelay.smtp import _replies as r
from mailrelay.smtp._data import read_message
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
