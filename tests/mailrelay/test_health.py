"""The health responder: pure response shaping and the asyncio server."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from mailrelay.health import HealthServer, response_for


def test_health_is_200_empty() -> None:
    response = response_for("GET", "/health")
    assert response.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 0\r\n" in response
    assert response.endswith(b"\r\n\r\n")


def test_query_string_is_ignored() -> None:
    assert response_for("POST", "/health?probe=1").startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("target", ["/", "/healthz", "/health/", "/x/health"])
def test_other_paths_are_404_not_found(target: str) -> None:
    response = response_for("GET", target)
    assert response.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert response.endswith(b"\r\n\r\nNot Found")


@pytest.mark.parametrize("target", ["http://127.0.0.1:8080/health", "HTTP://relay.example/health?probe=1"])
def test_absolute_form_target_for_health_is_200(target: str) -> None:
    """RFC 9112 3.2.2: a server must accept the absolute form, as proxies and some probes send it."""
    assert response_for("GET", target).startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize("target", ["http://relay.example/", "http://relay.example/healthz", "http://relay.example"])
def test_absolute_form_target_elsewhere_is_404(target: str) -> None:
    assert response_for("GET", target).endswith(b"\r\n\r\nNot Found")


def test_head_has_no_body() -> None:
    assert response_for("HEAD", "/nope").endswith(b"\r\n\r\n")


async def request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return data


async def test_server_answers_and_rejects_garbage() -> None:
    server = HealthServer()
    await server.start("127.0.0.1", 0)
    try:
        ok = await request(server.port, b"PUT /health HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert ok.startswith(b"HTTP/1.1 200 OK")
        missing = await request(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert missing.endswith(b"Not Found")
        garbage = await request(server.port, b"hello\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 ")
    finally:
        await server.stop()
