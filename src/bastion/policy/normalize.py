"""Action paths for requests that match no route: UUID and numeric segments become ``{id}``."""

from __future__ import annotations

import re
from collections.abc import Callable

Normalizer = Callable[[str], str]

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_NUMERIC = re.compile(r"[0-9]+")
_VERSION = re.compile(r"v[0-9]+")


def default_normalizer(path: str) -> str:
    """The default rules, segment by segment on the canonical path.

    - a UUID (8-4-4-4-12 hex digits, any case) -> ``{id}``
    - all digits -> ``{id}``
    - a version segment (``v`` + digits, e.g. ``v1``) is kept, as is every other segment.

    ``/api/v1/orders/42/items/3f2b...`` -> ``/api/v1/orders/{id}/items/{id}``.
    """
    segments = path.split("/")
    for index, segment in enumerate(segments):
        if _VERSION.fullmatch(segment):
            continue
        if _NUMERIC.fullmatch(segment) or _UUID.fullmatch(segment):
            segments[index] = "{id}"
    return "/".join(segments)
