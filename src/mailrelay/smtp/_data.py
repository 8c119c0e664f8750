"""The DATA phase reader: message bytes up to CRLF.CRLF, dot-unstuffed, with line and size limits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mailrelay.smtp import _replies as r
from mailrelay.smtp._replies import Reply

TERMINATOR = b".\r\n"
TEXT_LINE_OCTETS = 998  # RFC 5321 4.5.3.1.6: 1000 octets with the CRLF
DOT_STUFFED_LINE_OCTETS = TEXT_LINE_OCTETS + 1  # the transparency dot (4.5.2) is added to, then removed from, a line


async def read_message(
    reader: asyncio.StreamReader, *, max_size: int, on_line: Callable[[], None] = lambda: None
) -> bytes | Reply:
    """Read the message up to CRLF.CRLF, undoing dot-stuffing (RFC 5321 4.5.2).

    Only CRLF "." CRLF ends the data; a bare LF "." LF does not (no SMTP smuggling). A line holds at most
    998 octets before its CRLF, 999 when it starts with the transparency dot (removed here). Longer lines
    (the reader's limit stops those past 999 before they are buffered) and messages over `max_size` are read
    to the end (RFC 5321 4.2.5 wants the reply after the data) but not kept: the returned Reply says which
    limit was hit. `on_line` is called for every line received, so the caller can tell an idle client from
    a slow upload.
    """
    data = bytearray()  # grows in place (a final join of 25 MB of lines held the event loop for ~10-30 ms)
    size = 0
    failure: Reply | None = None
    in_long_line = False
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError as exc:
            await reader.read(exc.consumed)
            in_long_line = True
            failure = failure or r.DATA_LINE_TOO_LONG
            data.clear()
            on_line()
            continue
        on_line()
        if in_long_line:
            in_long_line = False  # the tail of an over-long line, never the terminator
            continue
        if line == TERMINATOR:
            break
        if line.startswith(b"."):
            line = line[1:]
        if len(line) - 2 > TEXT_LINE_OCTETS and failure is None:
            failure = r.DATA_LINE_TOO_LONG
            data.clear()
        size += len(line)
        if failure is None and size > max_size:
            failure = r.MESSAGE_TOO_LARGE
            data.clear()
        if failure is None:
            data += line
    if failure is not None:
        return failure
    return bytes(data)
