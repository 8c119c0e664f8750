"""Timeout (504) and body-size limit (413) in the error shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi import Request

from bastion import Service
from tests.conftest import open_settings


def service() -> Service:
    svc = Service()
    v1 = svc.version(1)

    @v1.get("/hang")
    async def hang() -> None:
        await asyncio.sleep(30)

    @v1.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    @v1.post("/json")
    async def json_body(payload: dict[str, str]) -> dict[str, int]:
        return {"keys": len(payload)}

    return svc


async def test_slow_handler_gets_504(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_MIDDLEWARE_TIMEOUT_SECS": "0.1"})
    response = await asyncio.wait_for(asgi_client(service(), settings).get("/api/v1/hang"), timeout=10)
    assert response.status_code == 504
    assert response.json() == {
        "error": "Request timed out after 0.1s",
        "code": "GATEWAY_TIMEOUT",
        "status": 504,
    }


async def test_declared_oversized_body_is_413_before_reading(
    asgi_client: Callable[..., httpx.AsyncClient],
) -> None:
    settings = open_settings(environ={"SERVICE_MIDDLEWARE_MAX_BODY_BYTES": "100"})
    response = await asgi_client(service(), settings).post("/api/v1/echo", content=b"x" * 101)
    assert response.status_code == 413
    assert response.json() == {
        "error": "Request body too large (limit 100 bytes)",
        "code": "PAYLOAD_TOO_LARGE",
        "status": 413,
    }


async def test_streamed_oversized_body_is_413(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_MIDDLEWARE_MAX_BODY_BYTES": "100"})

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"y" * 40

    for path in ("/api/v1/echo", "/api/v1/json"):
        response = await asgi_client(service(), settings).post(path, content=chunks())
        assert response.status_code == 413, path
        assert response.json()["code"] == "PAYLOAD_TOO_LARGE"


async def test_body_at_the_limit_passes(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_MIDDLEWARE_MAX_BODY_BYTES": "100"})
    response = await asgi_client(service(), settings).post("/api/v1/echo", content=b"x" * 100)
    assert response.json() == {"size": 100}


async def test_garbage_content_length_is_400(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    app = service().build(open_settings())
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/echo",
        "raw_path": b"/api/v1/echo",
        "query_string": b"",
        "headers": [(b"content-length", b"-5")],
        "scheme": "http",
        "server": ("t", 80),
        "client": ("127.0.0.1", 1),
        "root_path": "",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 400
