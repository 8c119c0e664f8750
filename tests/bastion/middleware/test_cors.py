"""CORS from configuration: off by default, preflights answered before any security slot."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from starlette.middleware.cors import CORSMiddleware as StarletteCORS

from bastion import Service, Slot
from bastion.config import CorsSettings
from bastion.errors import TokenError
from bastion.middleware._cors import CorsMiddleware
from bastion.types import ASGIApp, Message, Receive, Scope, Send
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


def _recorder(sent: list[Message]) -> Send:
    async def send(message: Message) -> None:
        sent.append(message)

    return send


VARY_CASES = [
    [(b"content-type", b"application/json")],
    [(b"vary", b"Accept-Encoding"), (b"content-length", b"2")],
    [(b"content-length", b"2"), (b"vary", b"Accept"), (b"x-a", b"1"), (b"vary", b"Cookie"), (b"vary", b"X")],
    [(b"Vary", b"Accept")],  # not lowercased: Starlette does not see it either
    [],
]


@pytest.mark.parametrize("headers", VARY_CASES)
async def test_a_request_without_origin_gets_starlettes_vary_bytes(headers: list[tuple[bytes, bytes]]) -> None:
    """The fast path for requests without ``Origin`` sends what Starlette's CORSMiddleware sends, byte for byte."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": list(headers)})
        await send({"type": "http.response.body", "body": b"{}"})

    answers = []
    settings = CorsSettings(allow_origins=[ORIGIN])
    for layer in (CorsMiddleware(app, settings=settings), StarletteCORS(app, allow_origins=[ORIGIN])):
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"host", b"t")], "query_string": b""}
        await layer(scope, receive, _recorder(sent))
        answers.append(sent)
    assert answers[0] == answers[1]
    assert b"Origin" in dict(answers[0][0]["headers"])[b"vary"]
