"""Test helpers both programs' tests (and their users' tests) share: a clock moved by hand, a free port."""

from __future__ import annotations

import socket

__all__ = ["FakeClock", "free_port"]


class FakeClock:
    """A clock tests move by hand (``clock.advance(1.5)`` or ``clock.now = ...``) instead of sleeping.

    Callable like ``time.time`` / ``time.monotonic`` (a :data:`bastion_core.Clock`): pass it as the ``clock``
    of limiters, caches, breakers and retry loops.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
