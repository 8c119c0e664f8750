"""Outbound resilience: a bulkhead outermost, then a circuit breaker, then the call (the spec's guidance).

:class:`Guard` wraps any coroutine (``async with guard.call():`` or ``@guard``); an exception from the call counts
as a failure, and so does a call marked failed (an HTTP 5xx). A rejection raises CircuitOpenError or
BulkheadFullError without making the call. Its httpx transport is ``_resilient_transport.ResilientTransport``,
apart so that a user of Guard alone (MailRelay) loads neither httpx nor OpenTelemetry.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ParamSpec, TypeVar

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

    async def ready(self) -> None:
        """A readiness check for the dependency this guard protects: raises CircuitOpenError while its circuit
        is open; always ready without a breaker (``circuit_breaker_enabled = false``), so the same
        ``service.add_readiness_check(name, guard.ready)`` line works whichever parts are on."""
        if self.breaker is not None:
            await self.breaker.ready()

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
