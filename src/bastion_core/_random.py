"""Random bytes for ids without a system call each: Bastion's request ids, MailRelay's delivery ids."""

from __future__ import annotations

import os


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


def random16() -> bytes:
    """16 bytes from the OS's random source (pooled; a forked child starts a pool of its own)."""
    return _random.take16()


def uuid4_hex() -> str:
    """``uuid.uuid4().hex`` from :func:`random16`: 32 hex digits, version 4, RFC 4122 variant."""
    value = int.from_bytes(random16(), "big")
    value = (value & ~(0xF000 << 64) & ~(0xC000 << 48)) | (0x4000 << 64) | (0x8000 << 48)
    return f"{value:032x}"
