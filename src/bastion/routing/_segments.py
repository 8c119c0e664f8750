"""Dynamic path segments: numeric ids and UUIDs become ``{id}`` (policy actions and rate-limit rules alike)."""

from __future__ import annotations

import re

ID_SEGMENT = "{id}"
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def normalize_segment(segment: str) -> str:
    """``{id}`` for an all-ASCII-digits or UUID (8-4-4-4-12 hex, any case) segment, else the segment unchanged.

    A version segment such as ``v1`` is not all digits, so it is kept (spec, limits / rate limiting 4).
    """
    if (segment.isdigit() and segment.isascii()) or (len(segment) == 36 and _UUID.fullmatch(segment)):
        return ID_SEGMENT
    return segment
