"""Fixtures for the rate-limit tests: a clock moved by hand and request scopes."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from bastion.types import SCOPE_CLAIMS, Scope


class FakeClock:
    """A clock tests move by hand (``clock.advance(1.5)``) instead of sleeping; callable like ``time.time``."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_scope(
    path: str = "/api/v1/items",
    *,
    method: str = "GET",
    sub: str | None = None,
    client_id: str | None = None,
    peer: str | None = "10.0.0.1",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Scope:
    """An HTTP scope as the rate limiter sees it (claims set only when ``sub`` or ``client_id`` is given)."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers or [],
        "client": (peer, 50000) if peer is not None else None,
    }
    if sub is not None or client_id is not None:
        scope[SCOPE_CLAIMS] = SimpleNamespace(sub=sub, client_id=client_id)
    return scope


@pytest.fixture
def scope() -> Callable[..., Scope]:
    return make_scope
