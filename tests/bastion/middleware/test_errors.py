"""Error rendering and panic recovery once the response has started: one record per request says so, kept by the
outermost layer that asks and read by the layers inside it."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from typing import Any

from structlog.testing import capture_logs

from bastion.errors import NotFound
from bastion.middleware._errors import ErrorRenderingMiddleware, PanicRecoveryMiddleware
from bastion.middleware._limits import TimeoutMiddleware
from bastion.types import ASGIApp, Message, Receive, Scope, Send

START = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}


def http_scope() -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": "/x", "headers": []}


def websocket_scope(*, denial: bool = True) -> dict[str, Any]:
    extensions = {"websocket.http.response": {}} if denial else {}
    return {"type": "websocket", "path": "/ws", "headers": [], "extensions": extensions}


async def call(app: ASGIApp, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""} if scope["type"] == "http" else {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def starts(sent: list[Message]) -> list[Message]:
    return [m for m in sent if m["type"] in ("http.response.start", "websocket.http.response.start")]


async def started_then_fails(scope: Scope, receive: Receive, send: Send) -> None:
    await send(dict(START))
    raise RuntimeError("after the headers")


async def fails_at_once(scope: Scope, receive: Receive, send: Send) -> None:
    raise NotFound()


class TestHttp:
    async def test_an_error_after_the_response_started_is_logged_not_rendered(self) -> None:
        app = PanicRecoveryMiddleware(ErrorRenderingMiddleware(started_then_fails))
        with capture_logs() as logs:
            sent = await call(app, http_scope())
        assert [m["status"] for m in starts(sent)] == [200]
        assert "error_after_response_started" in [entry["event"] for entry in logs]

    async def test_an_error_before_the_response_is_rendered(self) -> None:
        sent = await call(PanicRecoveryMiddleware(ErrorRenderingMiddleware(fails_at_once)), http_scope())
        assert [m["status"] for m in starts(sent)] == [404]
        assert json.loads(sent[-1]["body"])["code"] == "NOT_FOUND"

    async def test_error_rendering_alone_keeps_its_own_record(self) -> None:
        with capture_logs() as logs:
            sent = await call(ErrorRenderingMiddleware(started_then_fails), http_scope())
        assert [m["status"] for m in starts(sent)] == [200]
        assert "error_after_response_started" in [entry["event"] for entry in logs]

    async def test_panic_recovery_sees_the_response_error_rendering_sent(self) -> None:
        """A layer between them fails after error rendering answered: panic recovery must not answer again."""

        def failing_after(app: ASGIApp) -> ASGIApp:
            async def layer(scope: Scope, receive: Receive, send: Send) -> None:
                await app(scope, receive, send)
                raise RuntimeError("an outer layer's bug")

            return layer

        app = PanicRecoveryMiddleware(failing_after(ErrorRenderingMiddleware(fails_at_once)))
        with capture_logs() as logs:
            sent = await call(app, http_scope())
        assert [m["status"] for m in starts(sent)] == [404]
        assert "panic_recovered" in [entry["event"] for entry in logs]

    async def test_a_timeout_after_the_response_started_cuts_it_off(self) -> None:
        async def slow_body(scope: Scope, receive: Receive, send: Send) -> None:
            await send(dict(START))
            await asyncio.sleep(30)

        app = PanicRecoveryMiddleware(ErrorRenderingMiddleware(TimeoutMiddleware(slow_body, timeout_secs=0.05)))
        with capture_logs() as logs:
            sent = await asyncio.wait_for(call(app, http_scope()), timeout=10)
        assert [m["status"] for m in starts(sent)] == [200]
        assert "error_after_response_started" in [entry["event"] for entry in logs]

    async def test_a_timeout_before_the_response_is_a_504(self) -> None:
        async def hangs(scope: Scope, receive: Receive, send: Send) -> None:
            await asyncio.sleep(30)

        app = PanicRecoveryMiddleware(ErrorRenderingMiddleware(TimeoutMiddleware(hangs, timeout_secs=0.05)))
        sent = await asyncio.wait_for(call(app, http_scope()), timeout=10)
        assert [m["status"] for m in starts(sent)] == [504]


class TestWebSocket:
    async def test_an_error_after_accept_closes_with_1011(self) -> None:
        async def accepts_then_fails(scope: Scope, receive: Receive, send: Send) -> None:
            await send({"type": "websocket.accept"})
            raise RuntimeError("inside the session")

        sent = await call(PanicRecoveryMiddleware(ErrorRenderingMiddleware(accepts_then_fails)), websocket_scope())
        assert [m["type"] for m in sent] == ["websocket.accept", "websocket.close"]
        assert sent[-1]["code"] == 1011

    async def test_an_error_before_accept_is_an_http_response(self) -> None:
        sent = await call(PanicRecoveryMiddleware(ErrorRenderingMiddleware(fails_at_once)), websocket_scope())
        assert [m["status"] for m in starts(sent)] == [404]
        assert all(m["type"] != "websocket.accept" for m in sent)

    async def test_an_error_after_the_handler_closed_sends_nothing_more(self) -> None:
        async def closes_then_fails(scope: Scope, receive: Receive, send: Send) -> None:
            await send({"type": "websocket.close", "code": 1000})
            raise RuntimeError("after the close")

        sent = await call(PanicRecoveryMiddleware(ErrorRenderingMiddleware(closes_then_fails)), websocket_scope())
        assert [m["type"] for m in sent] == ["websocket.close"]


class _Scope(dict[str, Any]):
    """A scope a weak reference can point at."""


async def test_a_finished_request_leaves_no_cycle_through_its_scope() -> None:
    """The record in the scope does not hold the ``send`` wrapper: an outer ``send`` that reads the scope (as the
    request-id step's does) would otherwise keep every finished scope alive until the cycle collector runs."""
    scope = _Scope(http_scope())
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    def outer_send_for(scope: Scope) -> Send:
        async def send(message: Message) -> None:
            sent.append({**message, "path": scope["path"]})

        return send

    async def answers(scope: Scope, receive: Receive, send: Send) -> None:
        await send(dict(START))
        await send({"type": "http.response.body", "body": b"hello"})

    app = PanicRecoveryMiddleware(ErrorRenderingMiddleware(TimeoutMiddleware(answers, timeout_secs=30)))
    gc.disable()
    try:
        await app(scope, receive, outer_send_for(scope))
        gone = weakref.ref(scope)
        del scope
        assert gone() is None
    finally:
        gc.enable()
    assert [m["status"] for m in starts(sent)] == [200]
