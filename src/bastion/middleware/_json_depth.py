"""The nesting depth of a JSON body, measured while it arrives: a byte count first, an exact scan only when needed.

Python's ``json`` decoder recurses once per ``[`` or ``{``: a body of a few hundred kilobytes of ``[[[[...`` raises
``RecursionError``, and a few hundred levels already break pydantic's serializer (255) and FastAPI's encoder.
``middleware.max_json_depth`` bounds the depth before any of them sees the body.

Cost: a body with no more ``[`` and ``{`` bytes than the limit cannot nest deeper, so most bodies cost two
``bytes.count`` calls per chunk. Past that, the scan is exact and stays in C loops: escape pairs and strings
removed by two regular expressions, the brackets kept by ``bytes.translate``, the deepest point found by
``itertools.accumulate``. A body in UTF-16 or UTF-32 (``json.loads`` reads them; RFC 8259 8.1 allows only UTF-8
between systems) is measured once it is complete, transcoded to UTF-8.
"""

from __future__ import annotations

import json
import operator
import re
from itertools import accumulate, count

# Brackets and quotes, each one byte: opens 2, closes 0, a quote 1; everything else dropped.
_MARKS = bytes.maketrans(b'[{]}"', b"\x02\x02\x00\x00\x01")
_OTHERS = bytes(byte for byte in range(256) if byte not in b'[]{}"')
_OPEN, _QUOTE, _LEAF = b"\x02", b"\x01", b"\x02\x00"
_STRING = re.compile(b"\x01[^\x01]*\x01")
_PASSES = 8
_UTF8 = frozenset({"utf-8", "utf-8-sig"})
_DETECT_BYTES = 4  # json.detect_encoding reads the first four bytes


class JsonDepthGauge:
    """Feed the chunks of one JSON text in order; :meth:`feed` answers whether its nesting depth (open arrays and
    objects) is still within ``limit``. A text that is not valid JSON gets an answer too, of no meaning: the
    parser refuses it anyway."""

    __slots__ = ("depth", "escaped", "held", "in_string", "limit", "opened", "state")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.opened = 0
        self.held: list[bytes] = []
        self.state = "counting"  # then "utf8" (scanning each chunk) or "transcoding" (waiting for the last one)
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, chunk: bytes, *, last: bool) -> bool:
        """Take the next chunk (``last``: the body ends with it); False once the depth is over the limit."""
        if self.state == "counting":
            self.opened += chunk.count(b"[") + chunk.count(b"{")
            self.held.append(chunk)
            if self.opened <= self.limit:  # fewer openers than the limit: no deeper nesting possible
                if last:
                    self.held = []
                return True
            data = b"".join(self.held)
            if len(data) < _DETECT_BYTES and not last:
                return True
            self.held = []
            if json.detect_encoding(data) in _UTF8:
                self.state = "utf8"
                return self._scan(data)
            self.state = "transcoding"
            self.held = [data]
            chunk = b""
        if self.state == "utf8":
            return self._scan(chunk)
        self.held.append(chunk)
        if not last:
            return True
        data = b"".join(self.held)
        self.held = []
        try:
            text = data.decode(json.detect_encoding(data)).encode()
        except UnicodeError:
            return True  # the decoder refuses it first
        return self._scan(text)

    def _scan(self, data: bytes) -> bool:
        if not data:
            return True
        if self.escaped:
            data = data[1:]  # the byte the previous chunk's last backslash escapes
        if b"\\" in data:
            # Valid JSON has backslashes only inside strings, where pairs read left to right are its escapes:
            # without the escaped backslashes and quotes, every quote opens or closes a string.
            data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
        self.escaped = data.endswith(b"\\")
        marks = data.translate(_MARKS, _OTHERS)
        if self.in_string:
            end = marks.find(_QUOTE)
            if end < 0:
                return True
            marks = marks[end + 1 :]
            self.in_string = False
        if _QUOTE in marks:
            # Two quotes in a row enclose no bracket (an empty string here, or the gap between two strings):
            # dropping them keeps the rest paired. What is left are the strings holding brackets.
            marks = _STRING.sub(b"", marks.replace(_QUOTE + _QUOTE, b""))
            unclosed = marks.find(_QUOTE)
            if unclosed >= 0:
                marks = marks[:unclosed]
                self.in_string = True
        if not self.in_string:
            self.escaped = False  # a backslash outside a string: not JSON
        return self._measure(marks)

    def _measure(self, marks: bytes) -> bool:
        """Move the depth over ``marks`` (2 opens, 0 closes); False when it passes the limit on the way."""
        if not marks:
            return True
        if _OPEN * (self.limit + 1) in marks:  # the usual attack, [[[[..., found by one search
            return False
        start = self.depth
        self.depth += 2 * marks.count(_OPEN) - len(marks)
        room = self.limit - start
        # Dropping every innermost pair (an empty or scalar-only container) lowers the deepest point by at most
        # one: after p rounds the deepest point of what is left is within p of the exact one.
        reduced, rounds = marks, 0
        while rounds < _PASSES:
            shorter = reduced.replace(_LEAF, b"")
            if len(shorter) == len(reduced):
                break
            reduced, rounds = shorter, rounds + 1
        deepest = _deepest(reduced)
        if deepest + rounds <= room:
            return True
        if deepest > room or not rounds:
            return False
        return _deepest(marks) <= room


def _deepest(marks: bytes) -> int:
    """The highest depth ``marks`` reach from 0 (each mark 2 or 0: the depth after k marks is their sum minus k)."""
    return max(0, max(map(operator.sub, accumulate(marks), count(1)), default=0))
