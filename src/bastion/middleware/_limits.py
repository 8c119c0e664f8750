"""Request limits: a deadline for the whole response (504; 408 while the body is still arriving), a cap on the
body size (413) and on the nesting depth of a JSON body (400)."""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException

from bastion._task_deadline import DeadlineQueue, TaskDeadline
from bastion.errors import BadRequest, GatewayTimeout, JsonTooDeep, PayloadTooLarge, RequestTimeout
from bastion.middleware._errors import response_started
from bastion.middleware._json_depth import JsonDepthGauge
from bastion.types import ASGIApp, Message, Receive, Scope, Send
from bastion_core import running_loop


class TimeoutMiddleware:
    """Cancel a handler that has not started its response within ``timeout_secs``; raise GatewayTimeout (504),
    or RequestTimeout (408; the listener then closes the connection) when the handler was waiting for a body
    that had not all arrived: the time went to a client too slow to send it, not to the service.

    A response already streaming when the deadline passes is cut off (the server closes the connection).
    What ``asyncio.timeout`` does, with one timer on the loop for every request's deadline (a
    :class:`~bastion._task_deadline.DeadlineQueue`) and no loop lookup per request (on Python 3.11 each lookup is a
    ``getpid()`` system call, and ``asyncio.timeout`` makes three).
    """

    def __init__(self, app: ASGIApp, *, timeout_secs: float) -> None:
        self.app = app
        self.timeout_secs = timeout_secs
        self._deadlines: DeadlineQueue | None = None
        """The requests' deadlines, one loop timer for all (``bastion._task_deadline``); one queue per loop."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response, inward = response_started(scope, send)
        loop = running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        deadline = TaskDeadline(task)
        body = _BodyWait(receive, deadline)
        scope[_BODY_WAIT] = body
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = DeadlineQueue(loop, self.timeout_secs)
        deadlines.add(deadline)
        try:
            await self.app(scope, body, inward)
        except asyncio.CancelledError:
            # Ours (not a cancellation from outside, which keeps its CancelledError): the deadline passed.
            if not deadline.expired:
                raise
            deadline.expired = False
            if task.uncancel() > deadline.cancelling:
                raise
            if response.started:
                raise TimeoutError from None
            if stalled_on_body(scope):
                # The listener closes the connection after this answer: the body never finished arriving.
                raise RequestTimeout(f"Request body not received within {self.timeout_secs:g}s") from None
            raise GatewayTimeout(f"Request timed out after {self.timeout_secs:g}s") from None
        finally:
            deadlines.finish(deadline)
            if deadline.expired:  # the handler swallowed our cancellation: take it back all the same
                task.uncancel()


_BODY_WAIT = "bastion.body_wait"  # the request's _BodyWait, for stalled_on_body


def stalled_on_body(scope: Scope) -> bool:
    """Whether the request's handler is waiting (or was when the timeout cancelled it) for a body the client has
    not finished sending: then the time went to the client, not the service (408, and no breaker counts it)."""
    body: _BodyWait | None = scope.get(_BODY_WAIT)
    return body is not None and body.waiting and not body.complete


class _BodyWait:
    """The request's ``receive``, remembering whether the handler is waiting on it right now (``waiting``: set
    while the deadline's cancellation passes through, so the deadline can read it) and whether the whole body
    has arrived (``complete``)."""

    __slots__ = ("complete", "deadline", "receive", "waiting")

    def __init__(self, receive: Receive, deadline: TaskDeadline) -> None:
        self.receive = receive
        self.deadline = deadline
        self.waiting = False
        self.complete = False

    async def __call__(self) -> Message:
        self.waiting = True
        try:
            message = await self.receive()
        except BaseException:
            # Another cancellation (Starlette's is_disconnected() cancels a receive at once) is not a wait.
            if not self.deadline.expired:
                self.waiting = False
            raise
        self.waiting = False
        if message["type"] == "http.request" and not message.get("more_body", False):
            self.complete = True
        return message


def _body_too_large(limit: int) -> HTTPException:
    # An HTTPException, not PayloadTooLarge: FastAPI turns other exceptions raised while it reads the
    # body into a generic 400, but re-raises HTTPException, which the error renderer maps to 413.
    return HTTPException(413, f"Request body too large (limit {limit} bytes)")


class BodyLimitMiddleware:
    """Reject bodies over ``max_body_bytes``: at once when Content-Length says so, else while streaming (413).

    A body declared JSON (``application/json``, ``application/*+json``: what FastAPI parses) is measured as it
    streams: nesting deeper than ``max_json_depth`` raises JsonTooDeep (400) from ``receive``, before any parser
    (FastAPI's, the compiled handlers', a handler's own ``request.json()``) recurses into it.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_json_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, self.enter(scope, receive), send)

    def enter(self, scope: Scope, receive: Receive) -> Receive:
        """The step for an HTTP request, as a plain call (``bastion._fused``): check the declared length, return
        the ``receive`` that measures the body."""
        limit = self.max_body_bytes
        gauge: JsonDepthGauge | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    raise BadRequest("Invalid Content-Length header")
                if int(value) > limit:
                    raise PayloadTooLarge(f"Request body too large (limit {limit} bytes)")
            elif name == b"content-type" and gauge is None and is_json_media_type(value):
                gauge = JsonDepthGauge(self.max_json_depth)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                received += len(body)
                if received > limit:
                    raise _body_too_large(limit)
                if gauge is not None and not gauge.feed(body, last=not message.get("more_body", False)):
                    raise JsonTooDeep(f"Request body nests JSON deeper than {gauge.limit} levels")
            return message

        return limited_receive


def is_json_media_type(value: bytes) -> bool:
    """Whether a ``content-type`` value names JSON as FastAPI reads it: ``application/json`` or
    ``application/<anything>+json``, parameters and case aside."""
    media = value.partition(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
