"""CORS from configuration: off by default, preflights answered before any security slot."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from bastion import Service, Slot
from bastion.errors import TokenError
from bastion.types import ASGIApp, Receive, Scope, Send
from tests.conftest import open_settings

ORIGIN = "https://app.example"


def locked_service() -> Service:
    svc = Service()
    svc.version(1).get("/x")(lambda: {"ok": True})

    def deny_all(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            raise TokenError()

        return middleware

    svc.use(Slot.TOKEN_AUTH, deny_all)
    return svc


def cors_settings() -> object:
    return open_settings(environ={"SERVICE_MIDDLEWARE_CORS_ALLOW_ORIGINS": ORIGIN})


async def test_no_cors_headers_by_default(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(locked_service()).get("/health", headers={"origin": ORIGIN})
    assert "access-control-allow-origin" not in response.headers


async def test_preflight_is_answered_without_reaching_auth(
    asgi_client: Callable[..., httpx.AsyncClient],
) -> None:
    response = await asgi_client(locked_service(), cors_settings()).options(
        "/api/v1/x",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "GET",
            "access-control-request-headers": "authorization",
        },
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in response.headers["access-control-allow-headers"].lower()
    assert response.headers["x-request-id"]


async def test_disallowed_origin_preflight_is_refused(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(locked_service(), cors_settings()).options(
        "/api/v1/x", headers={"origin": "https://evil.example", "access-control-request-method": "GET"}
    )
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers


async def test_rejections_carry_cors_headers(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(locked_service(), cors_settings()).get("/api/v1/x", headers={"origin": ORIGIN})
    assert response.status_code == 401
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in response.headers["access-control-expose-headers"].lower()
