"""Outbound resilience: a bulkhead outermost, then a circuit breaker, then the call (the spec's guidance).

:class:`Guard` wraps any coroutine (``async with guard.call():`` or ``@guard``); :class:`ResilientTransport`
wraps an httpx transport, so any ``httpx.AsyncClient`` gets it. Errors count as failures: an exception from
the call, and for HTTP a 5xx response. A rejection raises CircuitOpenError or BulkheadFullError without
making the call.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ParamSpec, TypeVar

import httpx
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bastion_core._breaker import CircuitBreaker
from bastion_core._bulkhead import Bulkhead

P = ParamSpec("P")
R = TypeVar("R")


class Call:
    """One guarded call: mark it failed when its result is an error that raised nothing (a 5xx)."""

    __slots__ = ("failed",)

    def __init__(self) -> None:
        self.failed = False

    def fail(self) -> None:
        self.failed = True


class Guard:
    """Bulkhead (outermost), circuit breaker, then the call; either part may be left out.

    ``is_failure(exc)`` says which exceptions count against the breaker (all, by default); the exception is
    re-raised either way. A caller cancelled mid-call records nothing (its outcome says nothing about the
    dependency).
    """

    def __init__(
        self,
        *,
        breaker: CircuitBreaker | None = None,
        bulkhead: Bulkhead | None = None,
        is_failure: Callable[[BaseException], bool] = lambda exc: True,
    ) -> None:
        self.breaker = breaker
        self.bulkhead = bulkhead
        self.is_failure = is_failure

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[Call]:
        bulkhead, breaker = self.bulkhead, self.breaker
        if bulkhead is not None:
            await bulkhead.acquire()
        try:
            ticket = breaker.admit() if breaker is not None else None
            call = Call()
            try:
                yield call
            except Exception as exc:
                if breaker is not None and ticket is not None:
                    breaker.record(ticket, success=not self.is_failure(exc))
                raise
            except BaseException:
                if breaker is not None and ticket is not None:
                    breaker.record(ticket, success=None)
                raise
            if breaker is not None and ticket is not None:
                breaker.record(ticket, success=not call.failed)
        finally:
            if bulkhead is not None:
                bulkhead.release()

    def __call__(self, func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        """Decorator: every call of ``func`` goes through this guard."""

        @functools.wraps(func)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            async with self.call():
                return await func(*args, **kwargs)

        return guarded


_PROPAGATOR = TraceContextTextMapPropagator()


class ResilientTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends every request through a :class:`Guard`; a 5xx response is a failure.

    ``httpx.AsyncClient(transport=ResilientTransport(guard))`` (the default transport underneath), or wrap a
    transport of your own. The response is returned as is: a 5xx still reaches the caller. When tracing is on
    (a current span exists), the request carries W3C ``traceparent``/``tracestate`` (unless it already has one),
    so the service it calls continues the trace.
    """

    def __init__(self, guard: Guard, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.guard = guard
        self.transport = transport or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if trace.get_current_span().get_span_context().is_valid and "traceparent" not in request.headers:
            _PROPAGATOR.inject(request.headers)
        async with self.guard.call() as call:
            response = await self.transport.handle_async_request(request)
            if response.status_code >= 500:
                call.fail()
            return response

    async def aclose(self) -> None:
        await self.transport.aclose()
