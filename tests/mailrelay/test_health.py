"""The health responder: pure response shaping and the asyncio server."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
import structlog

from mailrelay._errors import QueueUnavailable
from mailrelay._health import HealthServer, response_for
from mailrelay._http import BAD_REQUEST, HEAD_TOO_LARGE, REQUEST_HEAD_LIMIT
from mailrelay._queue import QueueDepth

OK = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Cache-Control: no-store\r\nConnection: close\r\n\r\n"
)
NOT_FOUND_HEAD = (
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Cache-Control: no-store\r\nConnection: close\r\n\r\n"
)
NOT_FOUND = NOT_FOUND_HEAD + b"Not Found"


def test_health_is_200_empty() -> None:
    assert response_for("GET", "/health") == OK


def test_query_string_is_ignored() -> None:
    assert response_for("POST", "/health?probe=1") == OK


@pytest.mark.parametrize("target", ["/", "/healthz", "/health/", "/x/health"])
def test_other_paths_are_404_not_found(target: str) -> None:
    assert response_for("GET", target) == NOT_FOUND


@pytest.mark.parametrize("target", ["http://127.0.0.1:8080/health", "HTTP://relay.example/health?probe=1"])
def test_absolute_form_target_for_health_is_200(target: str) -> None:
    """RFC 9112 3.2.2: a server must accept the absolute form, as proxies and some probes send it."""
    assert response_for("GET", target) == OK


@pytest.mark.parametrize("target", ["http://relay.example/", "http://relay.example/healthz", "http://relay.example"])
def test_absolute_form_target_elsewhere_is_404(target: str) -> None:
    assert response_for("GET", target) == NOT_FOUND


def test_head_has_no_body() -> None:
    assert response_for("HEAD", "/nope") == NOT_FOUND_HEAD


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
        assert ok == OK
        missing = await request(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert missing == NOT_FOUND
        garbage = await request(server.port, b"hello\r\n\r\n")
        assert garbage == BAD_REQUEST
    finally:
        await server.stop()


@pytest.mark.parametrize("target", ["http://[/health", "http://[::1/health?x"])
def test_absolute_form_that_does_not_parse_is_400(target: str) -> None:
    assert response_for("GET", target) == BAD_REQUEST


@pytest.mark.parametrize(
    ("raw", "answer"),
    [
        pytest.param(b"GET http://[/health HTTP/1.1\r\n\r\n", BAD_REQUEST, id="unparsable-target"),
        pytest.param(b"GET /" + b"h" * REQUEST_HEAD_LIMIT + b" HTTP/1.1\r\n\r\n", HEAD_TOO_LARGE, id="huge-line"),
        pytest.param(b"GET /health HTTP/1.1\r\n" + b"X-A: b\r\n" * 4000 + b"\r\n", HEAD_TOO_LARGE, id="huge-head"),
        pytest.param(b"POST /nope HTTP/1.1\r\nContent-Length: 500000\r\n\r\n" + b"x" * 500_000, NOT_FOUND, id="body"),
    ],
)
async def test_server_answers_bad_input_without_a_traceback(raw: bytes, answer: bytes) -> None:
    server = HealthServer()
    await server.start("127.0.0.1", 0)
    try:
        with structlog.testing.capture_logs() as logs:
            assert await request(server.port, raw) == answer
        assert logs == []
    finally:
        await server.stop()


class StubQueue:
    """The queue as /ready sees it (connected with these depths, or unavailable)."""

    def __init__(self, *, dead_letters: int = 0, down: bool = False) -> None:
        self.dead_letters = dead_letters
        self.down = down

    @property
    def connected(self) -> bool:
        return not self.down

    async def depth(self) -> QueueDepth:
        if self.down:
            raise QueueUnavailable("not connected to NATS")
        return QueueDepth(messages=2, dead_letters=self.dead_letters)


async def ready(server: HealthServer, method: str = "GET") -> tuple[str, dict[str, object] | bytes]:
    await server.start("127.0.0.1", 0)
    try:
        raw = await request(server.port, f"{method} /ready HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    finally:
        await server.stop()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head
    status = head.split(b"\r\n")[0].decode()
    return status, json.loads(body) if body else body


async def test_ready_in_direct_mode_has_no_dependencies() -> None:
    assert await ready(HealthServer()) == (
        "HTTP/1.1 200 OK",
        {"ready": True, "service": "mailrelay", "dependencies": {}},
    )


async def test_ready_in_queue_mode_counts_the_dead_letters() -> None:
    assert await ready(HealthServer(StubQueue(dead_letters=3))) == (
        "HTTP/1.1 200 OK",
        {
            "ready": True,
            "service": "mailrelay",
            "dependencies": {"queue": {"healthy": True, "messages": 2, "dead_letters": 3}},
        },
    )


async def test_ready_without_nats_is_503_with_the_reason() -> None:
    assert await ready(HealthServer(StubQueue(down=True))) == (
        "HTTP/1.1 503 Service Unavailable",
        {
            "ready": False,
            "service": "mailrelay",
            "dependencies": {"queue": {"healthy": False, "message": "not connected to NATS"}},
        },
    )


async def test_ready_answers_head_without_a_body_and_other_methods_404() -> None:
    assert await ready(HealthServer(), "HEAD") == ("HTTP/1.1 200 OK", b"")
    server = HealthServer()
    await server.start("127.0.0.1", 0)
    try:
        assert await request(server.port, b"POST /ready HTTP/1.1\r\nHost: x\r\n\r\n") == NOT_FOUND
    finally:
        await server.stop()
