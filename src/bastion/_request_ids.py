"""Request ids, shared by the HTTP pipeline and the gRPC interceptors: what a sane incoming id is, and fresh ones."""

from __future__ import annotations

import os
import re

MAX_LENGTH = 128
# Printable token characters only: no spaces, quotes or control characters that could forge log lines.
_SANE = re.compile(rb"[A-Za-z0-9._:@/+=~-]{1,%d}" % MAX_LENGTH)


def sane_request_id(value: bytes) -> str | None:
    """``value`` when it is a sane token of 1-128 characters, else ``None`` (HTTP headers and gRPC metadata)."""
    return value.decode("ascii") if _SANE.fullmatch(value) else None


class _RandomPool:
    """Random bytes from the OS, fetched 4 KiB at a time: one ``getrandom`` system call per 256 ids instead of
    one per request (a system call is the dearest thing on this path). Emptied in a forked child, so that
    workers never hand out the same ids."""

    __slots__ = ("at", "pool")
    SIZE = 4096

    def __init__(self) -> None:
        self.pool = b""
        self.at = 0

    def reset(self) -> None:
        self.pool = b""
        self.at = 0

    def take16(self) -> bytes:
        at = self.at
        if at + 16 > len(self.pool):
            self.pool = os.urandom(self.SIZE)
            at = 0
        self.at = at + 16
        return self.pool[at : at + 16]


_random = _RandomPool()
os.register_at_fork(after_in_child=_random.reset)


def new_request_id() -> str:
    """A fresh id: 32 hex digits (128 bits from the OS's random source)."""
    return _random.take16().hex()
