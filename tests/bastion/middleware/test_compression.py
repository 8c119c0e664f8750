"""gzip above the size threshold when the client accepts it."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from bastion import Service
from tests.conftest import open_settings


def service() -> Service:
    svc = Service()
    v1 = svc.version(1)
    v1.get("/big")(lambda: {"data": "z" * 5000})
    v1.get("/small")(lambda: {"data": "z"})
    return svc


async def test_large_response_is_gzipped(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service()).get("/api/v1/big", headers={"accept-encoding": "gzip"})
    assert response.headers["content-encoding"] == "gzip"
    assert response.json() == {"data": "z" * 5000}
    assert response.headers["x-request-id"]


async def test_small_response_is_not(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(service()).get("/api/v1/small", headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in response.headers


async def test_disabled(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_MIDDLEWARE_COMPRESSION_ENABLED": "false"})
    response = await asgi_client(service(), settings).get("/api/v1/big", headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in response.headers
