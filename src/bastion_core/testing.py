"""Test helpers both programs' tests (and their users' tests) share: a clock moved by hand, a free port, a small
certificate authority (``DevCA``: mutual TLS and rotation tests, ``bastion dev-ca``)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bastion_core._dev_ca import DevCA, Issued

__all__ = ["DevCA", "FakeClock", "Issued", "free_port"]


def __getattr__(name: str) -> object:
    """DevCA and Issued on first use: they bring ``cryptography``."""
    if name in ("DevCA", "Issued"):
        from bastion_core import _dev_ca

        return getattr(_dev_ca, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
