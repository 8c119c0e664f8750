"""Inbound resilience: one layer per ``service.use_resilience(...)``, a bulkhead inside a circuit breaker.

A layer guards the requests (and gRPC calls) in its scope: every versioned route, one version, or a group of
paths. Each layer owns its breaker and its bulkhead pool. Outcomes (spec, failure classification; the table in
docs/resilience.md): the breaker counts the service's own faults only. A 5xx response, an exception from the
handler, a handler stopped by the timeout are failures; any response below 500 is a success (a 4xx never is a
failure); what the client ended (it left, it was too slow sending its body) is not counted. For gRPC the
server-side statuses INTERNAL, UNKNOWN, UNAVAILABLE, DEADLINE_EXCEEDED and DATA_LOSS raised by the handler are
failures, the caller's (INVALID_ARGUMENT, NOT_FOUND, ...) successes, and a call the client broke (a missing,
truncated or undecodable message), cancelled or let its deadline pass is not counted. Rejections: 503
``SERVICE_UNAVAILABLE`` with ``Retry-After`` (seconds until Half-Open for an open circuit, 1 for a full
bulkhead); over gRPC ``UNAVAILABLE`` with ``retry-after`` in the trailers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect

from bastion._health import ALWAYS_PUBLIC
from bastion._metrics import NO_METRICS, Metrics
from bastion.config import ResilienceSettings
from bastion.errors import BulkheadFull, CircuitOpen
from bastion.middleware._errors import as_bastion_error
from bastion.middleware._limits import stalled_on_body
from bastion.types import SCOPE_API_VERSION, ASGIApp, Message, Receive, Scope, Send
from bastion_core import (
    Bulkhead,
    BulkheadFullError,
    CircuitBreaker,
    CircuitOpenError,
    ConfigError,
    Ticket,
)

GrpcFinish = Callable[[str | None], Awaitable[None]]
"""Called once a guarded gRPC call is over: its status name (``"OK"``, ``"INTERNAL"``, ...), or ``None`` when the
outcome says nothing about the service (a later step refused the call; the client cancelled it, let its deadline
pass or sent a broken request message)."""

FAILED_GRPC_STATUSES = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE", "DEADLINE_EXCEEDED", "DATA_LOSS"})
OVERRIDES = frozenset({"threshold", "min_requests", "wait_secs", "half_open_requests", "max_concurrent", "max_wait"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ResilienceSpec:
    """What one ``service.use_resilience(...)`` asked for; the values come from the settings at build time."""

    name: str
    version: int | None = None
    paths: tuple[str, ...] = ()
    breaker: bool | None = None
    bulkhead: bool | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.overrides) - OVERRIDES)
        if unknown:
            raise ConfigError(
                f"use_resilience({', '.join(unknown)}=...): unknown; the values a layer takes are "
                f"{', '.join(sorted(OVERRIDES))}"
            )
        for pattern in self.paths:
            body = pattern[:-1] if pattern.endswith("/*") else pattern
            if not pattern.startswith("/") or "*" in body:
                raise ConfigError(f"use_resilience(paths=...): {pattern!r} must be a path, optionally ending in '/*'")


def _enabled(requested: bool | None, configured: bool | None) -> bool:
    return requested if requested is not None else configured is not False


class ResilienceLayer:
    """The breaker and bulkhead of one ``use_resilience`` call, and the requests they guard."""

    def __init__(self, spec: ResilienceSpec, settings: ResilienceSettings, *, metrics: Metrics = NO_METRICS) -> None:
        self.metrics = metrics
        values = {
            "threshold": settings.circuit_breaker_threshold,
            "min_requests": settings.circuit_breaker_min_requests,
            "wait_secs": settings.circuit_breaker_wait_secs,
            "half_open_requests": settings.circuit_breaker_half_open_requests,
            "max_concurrent": settings.bulkhead_max_concurrent,
            "max_wait": settings.bulkhead_max_wait,
            **spec.overrides,
        }
        self.spec = spec
        self.name = spec.name
        self.breaker = (
            CircuitBreaker(
                spec.name,
                threshold=values["threshold"],
                min_requests=values["min_requests"],
                wait_secs=values["wait_secs"],
                half_open_requests=values["half_open_requests"],
            )
            if _enabled(spec.breaker, settings.circuit_breaker_enabled)
            else None
        )
        self.bulkhead = (
            Bulkhead(spec.name, max_concurrent=values["max_concurrent"], max_wait=values["max_wait"])
            if _enabled(spec.bulkhead, settings.bulkhead_enabled)
            else None
        )
        if self.breaker is None and self.bulkhead is None:
            raise ConfigError(
                f"resilience layer {spec.name!r} has neither a circuit breaker nor a bulkhead: "
                "middleware.resilience.circuit_breaker_enabled and bulkhead_enabled are both false"
            )
        self._exact = frozenset(p for p in spec.paths if not p.endswith("/*"))
        self._prefixes = tuple(p[:-1] for p in spec.paths if p.endswith("/*"))

    def applies(self, scope: Scope) -> bool:
        """Whether this layer guards the request or call (``/health`` and ``/ready`` never)."""
        path: str = scope["path"]
        if path in ALWAYS_PUBLIC:
            return False
        if self.spec.version is not None and scope.get(SCOPE_API_VERSION) != self.spec.version:
            return False
        return not self.spec.paths or path in self._exact or path.startswith(self._prefixes)

    async def enter(self) -> Ticket | None:
        """Admit one call (breaker, then bulkhead) or raise CircuitOpen / BulkheadFull (503)."""
        ticket: Ticket | None = None
        if self.breaker is not None:
            try:
                ticket = self.breaker.admit()
            except CircuitOpenError as exc:
                self.metrics.resilience_rejected(self.name, "circuit_open")
                raise CircuitOpen(retry_after=max(1, math.ceil(exc.retry_after))) from None
        if self.bulkhead is not None:
            try:
                await self.bulkhead.acquire()
            except BaseException as exc:
                self.leave(ticket, None, holds_slot=False)
                if isinstance(exc, BulkheadFullError):
                    self.metrics.resilience_rejected(self.name, "bulkhead_full")
                    raise BulkheadFull(retry_after=exc.retry_after) from None
                raise
        return ticket

    def leave(self, ticket: Ticket | None, success: bool | None, *, holds_slot: bool = True) -> None:
        """Give the slot back and record the outcome (``None``: the call says nothing about the service)."""
        if holds_slot and self.bulkhead is not None:
            self.bulkhead.release()
        if ticket is not None and self.breaker is not None:
            self.breaker.record(ticket, success=success)

    def layer(self, app: ASGIApp) -> ASGIApp:
        return ResilienceMiddleware(app, guard=self)

    async def check_call(self, scope: Scope) -> GrpcFinish | None:
        """The gRPC form: admit the call; the returned function records its outcome when it is over."""
        if not self.applies(scope):
            return None
        ticket = await self.enter()

        async def finish(status: str | None) -> None:
            self.leave(ticket, None if status is None else status not in FAILED_GRPC_STATUSES)

        return finish


class ResilienceMiddleware:
    """The HTTP face of a :class:`ResilienceLayer` (inside policy, outside the handler).

    A 5xx response or an exception (other than a Bastion or HTTP error below 500) counts as a failure; a
    request cancelled by the timeout layer counts too (a hanging service is the case a breaker is for), unless
    its handler was still waiting for the client's body (the 408). A client that disconnects is not counted.
    The bulkhead slot is returned whatever ends the request.
    """

    def __init__(self, app: ASGIApp, *, guard: ResilienceLayer) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.guard.applies(scope):
            await self.app(scope, receive, send)
            return
        ticket = await self.guard.enter()
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except ClientDisconnect:
            self.guard.leave(ticket, None)  # the client left before the answer: nothing learnt
            raise
        except Exception as exc:
            error = as_bastion_error(exc)
            self.guard.leave(ticket, error is not None and error.status < 500)
            raise
        except asyncio.CancelledError:
            # The timeout layer's deadline: a handler that hangs is what a breaker is for; a client too slow
            # sending its body (the 408) says nothing about the service.
            self.guard.leave(ticket, None if stalled_on_body(scope) else False)
            raise
        except BaseException:
            self.guard.leave(ticket, None)
            raise
        self.guard.leave(ticket, status < 500)


def layers_from(
    specs: Sequence[ResilienceSpec], settings: ResilienceSettings, *, metrics: Metrics = NO_METRICS
) -> list[ResilienceLayer]:
    """One layer per spec; names must be unique (they name the breakers and pools in logs and metrics)."""
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"use_resilience(name=...) names {', '.join(map(repr, duplicates))} more than once")
    layers = [ResilienceLayer(spec, settings, metrics=metrics) for spec in specs]
    metrics.watch_breakers(
        lambda: [(layer.name, layer.breaker.observed_state.value) for layer in layers if layer.breaker is not None]
    )
    return layers
