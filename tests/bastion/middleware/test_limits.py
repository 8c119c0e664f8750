"""Timeout (504), body-size limit (413) and JSON nesting-depth limit (400) in the error shape."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import HTTPException, Request
from pydantic import BaseModel

from bastion import Service
from bastion.errors import GatewayTimeout, RequestTimeout
from bastion.middleware._limits import TimeoutMiddleware
from bastion.types import Message, Receive, Scope, Send
from tests.conftest import open_settings


class Holder(BaseModel):
    value: Any = None


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

    @v1.post("/any")
    async def any_body(payload: list[Any]) -> list[Any]:
        return payload

    @v1.post("/model")
    async def model_body(payload: Holder) -> Holder:
        return payload

    @v1.post("/parsed-by-the-handler")
    async def parsed_by_the_handler(request: Request) -> Any:
        return await request.json()

    @v1.get("/number")
    async def number(text: str) -> int:
        try:
            return int(text)
        except ValueError as exc:
            raise HTTPException(400, "text is not a number") from exc

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


async def test_a_body_too_slow_to_arrive_is_408_and_closes() -> None:
    """The deadline passes while the handler waits for the client's body: the client's fault, not a 504."""

    async def read_body(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass

    async def slow_client() -> Message:
        await asyncio.sleep(30)
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware = TimeoutMiddleware(read_body, timeout_secs=0.05)
    with pytest.raises(RequestTimeout) as info:
        await middleware({"type": "http", "method": "POST", "path": "/"}, slow_client, _discard)
    assert (info.value.status, info.value.code, info.value.detail) == (
        408,
        "REQUEST_TIMEOUT",
        "Request body not received within 0.05s",
    )
    assert info.value.headers == []  # the listener closes the connection (the body never finished)


async def test_a_cancelled_receive_then_a_slow_handler_is_504() -> None:
    """Starlette's ``is_disconnected()`` cancels a receive at once: the handler was not waiting for a body."""

    async def peek_then_hang(scope: Scope, receive: Receive, send: Send) -> None:
        waiting = asyncio.ensure_future(receive())
        await asyncio.sleep(0)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(30)

    async def never() -> Message:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    with pytest.raises(GatewayTimeout):
        await TimeoutMiddleware(peek_then_hang, timeout_secs=0.05)({"type": "http"}, never, _discard)


async def test_waiting_for_the_disconnect_after_the_whole_body_is_504() -> None:
    async def read_all_then_wait(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # the whole body
        await receive()  # then waits for http.disconnect

    calls: list[int] = []

    async def body_then_nothing() -> Message:
        calls.append(1)
        if len(calls) == 1:
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    with pytest.raises(GatewayTimeout):
        await TimeoutMiddleware(read_all_then_wait, timeout_secs=0.05)({"type": "http"}, body_then_nothing, _discard)


async def test_a_slow_handler_after_the_body_arrived_is_still_504() -> None:
    async def read_then_hang(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await asyncio.sleep(30)

    async def whole_body() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    with pytest.raises(GatewayTimeout):
        await TimeoutMiddleware(read_then_hang, timeout_secs=0.05)({"type": "http"}, whole_body, _discard)


async def _discard(message: Message) -> None:
    pass


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


async def _call(middleware: TimeoutMiddleware, sent: list[Message]) -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await middleware({"type": "http", "method": "GET", "path": "/"}, receive, send)


async def test_the_deadline_is_a_504_and_leaves_the_task_uncancelled() -> None:
    async def hang(scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(30)

    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(GatewayTimeout):
        await _call(TimeoutMiddleware(hang, timeout_secs=0.05), [])  # in this task: its cancel count is checked
    assert task.cancelling() == 0


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    """The server cancelling the request (client gone, shutdown) is not turned into a 504."""
    started = asyncio.Event()

    async def hang(scope: Scope, receive: Receive, send: Send) -> None:
        started.set()
        await asyncio.sleep(30)

    request = asyncio.create_task(_call(TimeoutMiddleware(hang, timeout_secs=5), []))
    await started.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request


async def test_a_response_already_started_is_cut_off_with_timeout_error() -> None:
    async def slow_stream(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(30)

    sent: list[Message] = []
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(_call(TimeoutMiddleware(slow_stream, timeout_secs=0.05), sent), timeout=10)
    assert [message["type"] for message in sent] == ["http.response.start"]


async def test_a_handler_that_swallows_the_deadline_still_leaves_the_task_uncancelled() -> None:
    async def stubborn(scope: Scope, receive: Receive, send: Send) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})

    sent: list[Message] = []
    task = asyncio.current_task()
    assert task is not None
    await _call(TimeoutMiddleware(stubborn, timeout_secs=0.05), sent)
    assert sent[-1]["body"] == b"late"
    assert task.cancelling() == 0


DEPTH_ROUTES = ["/api/v1/any", "/api/v1/model", "/api/v1/parsed-by-the-handler"]


def nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize("compiled", ["true", "false"], ids=["compiled-handlers", "fastapi-handlers"])
@pytest.mark.parametrize("path", DEPTH_ROUTES)
async def test_json_nested_past_the_limit_is_400_on_every_parse_path(
    asgi_client: Callable[..., httpx.AsyncClient], path: str, compiled: str
) -> None:
    """FastAPI's handler, the compiled handlers and a handler's own ``request.json()``: the same 400."""
    settings = open_settings(environ={"SERVICE_SERVICE_COMPILED_HANDLERS": compiled})
    body = nested(100_000) if path != "/api/v1/model" else b'{"value":' + nested(100_000) + b"}"
    response = await asgi_client(service(), settings).post(
        path, content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": "Request body nests JSON deeper than 64 levels",
        "code": "JSON_TOO_DEEP",
        "status": 400,
    }


@pytest.mark.parametrize("compiled", ["true", "false"], ids=["compiled-handlers", "fastapi-handlers"])
async def test_json_at_the_configured_depth_passes_and_one_level_more_does_not(
    asgi_client: Callable[..., httpx.AsyncClient], compiled: str
) -> None:
    settings = open_settings(
        environ={"SERVICE_MIDDLEWARE_MAX_JSON_DEPTH": "8", "SERVICE_SERVICE_COMPILED_HANDLERS": compiled}
    )
    client = asgi_client(service(), settings)
    for content_type in ("application/json", "application/problem+json; charset=utf-8", "Application/JSON"):
        headers = {"content-type": content_type}
        at_limit = await client.post("/api/v1/any", content=nested(8), headers=headers)
        assert at_limit.status_code == 200, content_type
        assert at_limit.content == nested(8)
        over = await client.post("/api/v1/any", content=nested(9), headers=headers)
        assert over.status_code == 400, content_type
        assert over.json()["error"] == "Request body nests JSON deeper than 8 levels"


async def test_a_deep_json_body_streamed_in_chunks_is_refused(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"[" * 2
        for _ in range(40):
            yield b"]" * 2

    response = await asgi_client(service()).post(
        "/api/v1/any", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == "JSON_TOO_DEEP"


async def test_a_body_not_declared_json_is_not_measured(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    """Binary uploads full of ``[`` bytes are not JSON: only the route's own checks apply."""
    client = asgi_client(service())
    for headers in ({"content-type": "application/octet-stream"}, {}):
        response = await client.post("/api/v1/echo", content=nested(10_000), headers=headers)
        assert response.json() == {"size": 20_000}


@pytest.mark.parametrize("compiled", ["true", "false"], ids=["compiled-handlers", "fastapi-handlers"])
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[\xff\xfe\xfd]", id="not-utf8"),
        pytest.param(b"[1,", id="not-json"),
        pytest.param(b"1" * 5000, id="integer-of-5000-digits"),
    ],
)
async def test_a_body_that_does_not_decode_is_400_malformed_body(
    asgi_client: Callable[..., httpx.AsyncClient], body: bytes, compiled: str
) -> None:
    settings = open_settings(environ={"SERVICE_SERVICE_COMPILED_HANDLERS": compiled})
    response = await asgi_client(service(), settings).post(
        "/api/v1/model", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == "MALFORMED_BODY"


async def test_a_handlers_own_400_keeps_its_message(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    """Only FastAPI's body-parsing 400 is read for its cause; a handler's 400 from a ValueError is its own."""
    response = await asgi_client(service()).get("/api/v1/number", params={"text": "x"})
    assert response.json() == {"error": "text is not a number", "code": "BAD_REQUEST", "status": 400}
