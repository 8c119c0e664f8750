"""Security headers: on every response, HSTS only over TLS, handler-set values kept."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from starlette.responses import JSONResponse

from bastion import Service
from tests.conftest import open_settings


def service() -> Service:
    svc = Service()
    v1 = svc.version(1)
    v1.get("/x")(lambda: {"ok": True})

    @v1.get("/framed")
    async def framed() -> JSONResponse:
        return JSONResponse({}, headers={"x-frame-options": "SAMEORIGIN"})

    return svc


async def test_headers_on_plain_http(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service()).get("/api/v1/x")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert "strict-transport-security" not in response.headers


async def test_hsts_over_tls(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    client = asgi_client(service())
    response = await client.get("https://testserver/api/v1/x")
    assert response.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains"


async def test_on_unmatched_404_and_errors(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    client = asgi_client(service())
    for path in ("/nowhere", "/api/v1/x?"):
        assert (await client.get(path)).headers["x-content-type-options"] == "nosniff"
    assert (await client.delete("/api/v1/x")).headers["x-frame-options"] == "DENY"


async def test_handler_value_is_kept(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service()).get("/api/v1/framed")
    assert response.headers.get_list("x-frame-options") == ["SAMEORIGIN"]


async def test_csp_when_configured(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(
        environ={"SERVICE_MIDDLEWARE_SECURITY_HEADERS_CONTENT_SECURITY_POLICY": "default-src 'none'"}
    )
    response = await asgi_client(service(), settings).get("/api/v1/x")
    assert response.headers["content-security-policy"] == "default-src 'none'"


async def test_can_be_disabled(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_MIDDLEWARE_SECURITY_HEADERS_ENABLED": "false"})
    assert "x-frame-options" not in (await asgi_client(service(), settings).get("/api/v1/x")).headers
