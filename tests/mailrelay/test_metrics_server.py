"""The metrics endpoint in-process over real sockets: GET/HEAD /metrics, 405 for other methods there, 404 `Not Found`
elsewhere, and a clear answer (never a silent close or a traceback) for whatever else arrives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from mailrelay._http import BAD_REQUEST, HEAD_TOO_LARGE, REQUEST_HEAD_LIMIT, REQUEST_TIMEOUT
from mailrelay._metrics import RelayMetrics
from mailrelay._metrics_server import MetricsServer
from mailrelay.smtp import _replies as r

NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Cache-Control: no-store\r\nConnection: close\r\n\r\nNot Found"
)
NOT_ALLOWED = (
    b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 18\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Allow: GET, HEAD\r\nCache-Control: no-store\r\nConnection: close\r\n\r\nMethod Not Allowed"
)

Serve = Callable[..., Awaitable[MetricsServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Factory: serve(metrics, read_timeout=...) -> a started MetricsServer on a free loopback port."""
    started: list[MetricsServer] = []

    async def start(metrics: RelayMetrics | None = None, **options: float) -> MetricsServer:
        server = MetricsServer(metrics or RelayMetrics(process_collector=False), **options)
        await server.start("127.0.0.1", 0)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


async def exchange(port: int, raw: bytes, *, half_close: bool = False) -> bytes:
    """Send `raw` (then shut our sending side down, with `half_close`) and read the answer to its end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    if half_close:
        writer.write_eof()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return data


def split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("ascii").split("\r\n")
    return status, dict(line.split(": ", 1) for line in lines), body


@pytest.fixture
def no_errors_logged() -> Iterator[list[structlog.typing.EventDict]]:
    with structlog.testing.capture_logs() as logs:
        yield logs
    assert [entry for entry in logs if entry["log_level"] in ("error", "critical")] == []


async def test_get_metrics_is_the_exposition(serve: Serve) -> None:
    metrics = RelayMetrics(process_collector=False)
    metrics.message_answered(r.MESSAGE_ACCEPTED)
    server = await serve(metrics)
    status, headers, body = split(await exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert (status, headers["Content-Type"]) == ("HTTP/1.1 200 OK", "text/plain; version=0.0.4; charset=utf-8")
    assert (headers["Content-Length"], headers["Cache-Control"], headers["Connection"]) == (
        str(len(body)),
        "no-store",
        "close",
    )
    assert body == metrics.exposition()
    (messages,) = [f for f in text_string_to_metric_families(body.decode()) if f.name == "mailrelay_smtp_messages"]
    assert {s.labels["code"]: s.value for s in messages.samples if s.name.endswith("_total")}["250"] == 1.0


async def test_head_metrics_has_the_headers_of_get_and_no_body(serve: Serve) -> None:
    metrics = RelayMetrics(process_collector=False)
    server = await serve(metrics)
    status, headers, body = split(await exchange(server.port, b"HEAD /metrics HTTP/1.1\r\n\r\n"))
    assert (status, headers["Content-Length"], body) == ("HTTP/1.1 200 OK", str(len(metrics.exposition())), b"")


@pytest.mark.parametrize(
    "target",
    ["/metrics?x=1", "http://127.0.0.1:9100/metrics", "HTTP://relay.example/metrics?name[]=x"],
)
async def test_query_and_absolute_form_still_name_metrics(serve: Serve, target: str) -> None:
    """RFC 9112 3.2.2: a server must accept the absolute form."""
    server = await serve()
    status, _, _ = split(await exchange(server.port, f"GET {target} HTTP/1.1\r\n\r\n".encode()))
    assert status == "HTTP/1.1 200 OK"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"])
async def test_other_methods_on_metrics_are_405_with_allow(serve: Serve, method: str) -> None:
    server = await serve()
    assert await exchange(server.port, f"{method} /metrics HTTP/1.1\r\n\r\n".encode()) == NOT_ALLOWED


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/"),
        ("GET", "/health"),
        ("GET", "/metrics/"),
        ("GET", "/Metrics"),
        ("GET", "/metricsx"),
        ("GET", "/x/metrics"),
        ("GET", "/%6Detrics"),
        ("GET", "*"),
        ("GET", "http://relay.example/"),
        ("POST", "/anything"),
        ("DELETE", "/"),
    ],
)
async def test_any_other_path_is_404_not_found_whatever_the_method(serve: Serve, method: str, target: str) -> None:
    server = await serve()
    assert await exchange(server.port, f"{method} {target} HTTP/1.1\r\n\r\n".encode()) == NOT_FOUND


async def test_head_elsewhere_is_404_without_a_body(serve: Serve) -> None:
    server = await serve()
    assert await exchange(server.port, b"HEAD /nope HTTP/1.1\r\n\r\n") == NOT_FOUND.removesuffix(b"Not Found")


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"hello\r\n\r\n", id="one-word"),
        pytest.param(b"GET /metrics\r\n\r\n", id="no-version"),
        pytest.param(b"GET /metrics SMTP/1.0\r\n\r\n", id="not-http"),
        pytest.param(b"GET  /metrics HTTP/1.1\r\n\r\n", id="two-spaces"),
        pytest.param(b"GET /met rics HTTP/1.1\r\n\r\n", id="space-in-target"),
        pytest.param(b"\r\n\r\n", id="empty-line"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", id="tls-hello"),
        pytest.param(b"GET http://[/metrics HTTP/1.1\r\n\r\n", id="unclosed-ipv6-literal"),
        pytest.param(b"GET http://[::1/metrics HTTP/1.1\r\n\r\n", id="unclosed-ipv6-address"),
    ],
)
async def test_what_is_not_an_http_request_is_400(
    serve: Serve, raw: bytes, no_errors_logged: list[structlog.typing.EventDict]
) -> None:
    server = await serve()
    assert await exchange(server.port, raw) == BAD_REQUEST


async def test_a_request_cut_short_is_400(serve: Serve) -> None:
    server = await serve()
    assert await exchange(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n", half_close=True) == BAD_REQUEST


async def test_a_client_that_leaves_without_a_word_gets_nothing(serve: Serve) -> None:
    server = await serve()
    assert await exchange(server.port, b"", half_close=True) == b""


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"GET /" + b"a" * (REQUEST_HEAD_LIMIT + 1) + b" HTTP/1.1\r\n\r\n", id="request-line"),
        pytest.param(b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * 4000 + b"\r\n", id="headers"),
        pytest.param(b"GET /" + b"a" * 1_000_000, id="megabyte-without-end"),
    ],
)
async def test_a_head_over_the_limit_is_431(
    serve: Serve, raw: bytes, no_errors_logged: list[structlog.typing.EventDict]
) -> None:
    """Answered whole although the client sent far more than was read."""
    server = await serve()
    assert await exchange(server.port, raw) == HEAD_TOO_LARGE


async def test_a_big_body_is_left_unread_but_the_answer_arrives(serve: Serve) -> None:
    server = await serve()
    raw = b"POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1_000_000
    assert await exchange(server.port, raw) == NOT_ALLOWED


async def test_a_small_body_is_read_and_dropped(serve: Serve) -> None:
    server = await serve()
    assert await exchange(server.port, b"PUT /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc") == NOT_ALLOWED


async def test_a_request_that_does_not_arrive_in_time_is_408(serve: Serve) -> None:
    server = await serve(read_timeout=0.05)
    assert await exchange(server.port, b"GET /metr") == REQUEST_TIMEOUT


async def test_a_failing_scrape_is_500_and_logged_not_a_dead_endpoint(serve: Serve) -> None:
    class Broken:
        def collect(self) -> Iterator[object]:
            raise RuntimeError("a bug")

    metrics = RelayMetrics(process_collector=False)
    metrics.registry.register(Broken())  # type: ignore[arg-type]
    server = await serve(metrics)
    with structlog.testing.capture_logs() as logs:
        status, _, body = split(await exchange(server.port, b"GET /metrics HTTP/1.1\r\n\r\n"))
    assert (status, body) == ("HTTP/1.1 500 Internal Server Error", b"Internal Server Error")
    assert [(entry["event"], entry["log_level"]) for entry in logs] == [("metrics_scrape_failed", "error")]
    assert await exchange(server.port, b"GET /nope HTTP/1.1\r\n\r\n") == NOT_FOUND
