"""A request's content type as FastAPI reads it: the compiled handlers decide with it whether to parse JSON."""

from __future__ import annotations

import email.message
import functools

from bastion.types import Scope


def is_json_content_type(value: str) -> bool:
    """FastAPI's test of a ``content-type`` value (``application/json`` or ``application/*+json``), remembered
    for the usual short values (a bounded cache: clients choose the values)."""
    return _json_content_type_cached(value) if len(value) <= 128 else _json_content_type(value)


@functools.lru_cache(maxsize=64)
def _json_content_type_cached(value: str) -> bool:
    return _json_content_type(value)


def _json_content_type(value: str) -> bool:
    message = email.message.Message()
    message["content-type"] = value
    if message.get_content_maintype() == "application":
        subtype = message.get_content_subtype()
        return subtype == "json" or subtype.endswith("+json")
    return False


def content_type_of(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"content-type":
            decoded: str = value.decode("latin-1")
            return decoded
    return None
