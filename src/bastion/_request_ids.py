"""Request ids, shared by the HTTP pipeline and the gRPC interceptors: what a sane incoming id is, and fresh ones."""

from __future__ import annotations

import re

from bastion_core._random import random16

MAX_LENGTH = 128
# Printable token characters only: no spaces, quotes or control characters that could forge log lines.
_SANE = re.compile(rb"[A-Za-z0-9._:@/+=~-]{1,%d}" % MAX_LENGTH)


def sane_request_id(value: bytes) -> str | None:
    """``value`` when it is a sane token of 1-128 characters, else ``None`` (HTTP headers and gRPC metadata)."""
    return value.decode("ascii") if _SANE.fullmatch(value) else None


def new_request_id() -> str:
    """A fresh id: 32 hex digits (128 bits from the OS's random source)."""
    return random16().hex()
