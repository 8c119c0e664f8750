"""Action paths for requests that match no route: UUID and numeric segments become ``{id}``."""

from __future__ import annotations

from collections.abc import Callable

from bastion.routing._segments import normalize_segment

Normalizer = Callable[[str], str]


def default_normalizer(path: str) -> str:
    """The default rules, segment by segment on the canonical path (:func:`normalize_segment`).

    - a UUID (8-4-4-4-12 hex digits, any case) -> ``{id}``
    - all ASCII digits -> ``{id}``
    - a version segment (``v1``) is kept, as is every other segment.

    ``/api/v1/orders/42/items/3f2b...`` -> ``/api/v1/orders/{id}/items/{id}``.
    """
    return "/".join(normalize_segment(segment) for segment in path.split("/"))
