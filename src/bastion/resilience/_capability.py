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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bastion._guard import Exemptions, Outcome
from bastion._metrics import NO_METRICS, Metrics
from bastion.config import ResilienceSettings
from bastion.errors import BulkheadFull, CircuitOpen
from bastion.resilience._posture import ResiliencePosture
from bastion.types import SCOPE_API_VERSION, Scope
from bastion_core import (
    Bulkhead,
    BulkheadFullError,
    CircuitBreaker,
    CircuitOpenError,
    ConfigError,
    Ticket,
)

FAILED_STATUSES = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE", "DEADLINE_EXCEEDED", "DATA_LOSS"})
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


class ResilienceGuard:
    """The resilience guard of one ``use_resilience`` call: its breaker and bulkhead, and the requests they guard.

    Over HTTP a 5xx response or an exception (other than a Bastion or HTTP error below 500) counts as a failure; a
    request cancelled by the timeout layer counts too (a hanging service is the case a breaker is for), unless its
    handler was still waiting for the client's body (the 408). A client that disconnects is not counted. The
    bulkhead slot is returned whatever ends the request (``bastion._guard.GuardLayer`` reports the outcome).
    """

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
        self.exemptions = Exemptions(scope_types=frozenset({"http", "grpc"}))
        """HTTP requests and gRPC calls but ``/health``, ``/ready``, gRPC health and reflection (a WebSocket session
        holds no slot: it is long-lived)."""
        self._exact = frozenset(p for p in spec.paths if not p.endswith("/*"))
        self._prefixes = tuple(p[:-1] for p in spec.paths if p.endswith("/*"))

    def applies(self, scope: Scope) -> bool:
        """Whether this layer guards the request or call (its version and paths; see also :attr:`exemptions`)."""
        path: str = scope["path"]
        if self.spec.version is not None and scope.get(SCOPE_API_VERSION) != self.spec.version:
            return False
        return not self.spec.paths or path in self._exact or path.startswith(self._prefixes)

    def posture(self) -> ResiliencePosture:
        """What this layer is made of, for the security posture."""
        return ResiliencePosture(name=self.name, breaker=self.breaker is not None, bulkhead=self.bulkhead is not None)

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

    async def check(self, scope: Scope) -> Outcome | None:
        """Admit the request or call (breaker, then bulkhead) or raise CircuitOpen / BulkheadFull (503,
        UNAVAILABLE); the returned outcome gives the slot back and records how it ended (``bastion._guard.Outcome``:
        a status in FAILED_STATUSES is a failure, ``None`` says nothing about the service)."""
        if not self.applies(scope):
            return None
        ticket = await self.enter()

        async def finish(status: str | None) -> None:
            self.leave(ticket, None if status is None else status not in FAILED_STATUSES)

        return finish


def layers_from(
    specs: Sequence[ResilienceSpec], settings: ResilienceSettings, *, metrics: Metrics = NO_METRICS
) -> list[ResilienceGuard]:
    """One layer per spec; names must be unique (they name the breakers and pools in logs and metrics)."""
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"use_resilience(name=...) names {', '.join(map(repr, duplicates))} more than once")
    layers = [ResilienceGuard(spec, settings, metrics=metrics) for spec in specs]
    metrics.watch_breakers(
        lambda: [(layer.name, layer.breaker.observed_state.value) for layer in layers if layer.breaker is not None]
    )
    return layers
