"""Helpers for the rate-limit tests: a clock moved by hand, request scopes, and a small service."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from bastion import NotFound, Service, Slot
from bastion.testing import FakeClock
from bastion.types import SCOPE_CLAIMS, ASGIApp, Receive, Scope, Send


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


def as_user(sub: str | None = "alice", client_id: str | None = None) -> Callable[[ASGIApp], ASGIApp]:
    """A token-auth stand-in: claims from the ``x-test-sub`` header (else ``sub``); none when it is ``-``."""

    def layer(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            who = dict(scope["headers"]).get(b"x-test-sub", (sub or "-").encode()).decode()
            if who != "-" or client_id:
                scope[SCOPE_CLAIMS] = SimpleNamespace(sub=None if who == "-" else who, client_id=client_id)
            await app(scope, receive, send)

        return middleware

    return layer


def service(*, sub: str | None = "alice", calls: list[str] | None = None) -> Service:
    """A small versioned service behind the ``as_user`` stand-in; handlers append their name to ``calls``."""
    svc = Service("limited")
    v1 = svc.version(1)
    seen = calls if calls is not None else []

    @v1.get("/items")
    async def items() -> dict[str, str]:
        seen.append("items")
        return {"ok": "yes"}

    @v1.post("/uploads")
    async def upload() -> dict[str, str]:
        seen.append("upload")
        return {"ok": "uploaded"}

    @v1.get("/missing")
    async def missing() -> None:
        raise NotFound("Nothing here")

    svc.use(Slot.TOKEN_AUTH, as_user(sub))
    return svc
