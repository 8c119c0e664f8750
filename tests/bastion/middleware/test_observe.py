"""Access log: one line per request, sensitive headers and query values masked."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from structlog.testing import capture_logs

from bastion import Service
from bastion.middleware._observe import mask_headers, mask_query
from tests.conftest import open_settings


def service() -> Service:
    svc = Service()
    svc.version(1).get("/x")(lambda: {"ok": True})
    return svc


def test_mask_headers() -> None:
    masked = mask_headers(
        [(b"Authorization", b"Bearer abc.def.ghi"), (b"cookie", b"s=1"), (b"accept", b"*/*")],
        frozenset({"authorization", "cookie"}),
    )
    assert masked == {"authorization": "***", "cookie": "***", "accept": "*/*"}


def test_mask_query() -> None:
    assert mask_query(b"access_token=abc&page=2&API_KEY=k") == "access_token=%2A%2A%2A&page=2&API_KEY=%2A%2A%2A"


async def test_one_line_per_request(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    with capture_logs() as logs:
        await asgi_client(service()).get("/api/v1/x?page=2")
    lines = [entry for entry in logs if entry["event"] == "http_request"]
    assert len(lines) == 1
    assert lines[0]["method"] == "GET" and lines[0]["path"] == "/api/v1/x" and lines[0]["status"] == 200
    assert lines[0]["query"] == "page=2"
    assert "headers" not in lines[0]


async def test_headers_masked_when_included(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    settings = open_settings(environ={"SERVICE_MIDDLEWARE_ACCESS_LOG_INCLUDE_HEADERS": "true"})
    with capture_logs() as logs:
        await asgi_client(service(), settings).get(
            "/api/v1/x?access_token=secret-token",
            headers={"authorization": "Bearer secret-token", "x-api-key": "k"},
        )
    line = next(entry for entry in logs if entry["event"] == "http_request")
    assert line["headers"]["authorization"] == "***"
    assert line["headers"]["x-api-key"] == "***"
    assert "secret-token" not in repr(line)


async def test_logs_status_of_rendered_errors(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    with capture_logs() as logs:
        await asgi_client(service()).delete("/api/v1/x")
    assert next(entry for entry in logs if entry["event"] == "http_request")["status"] == 405
