"""What a :class:`~bastion.Service` hands to the app it builds: one frozen snapshot of everything registered.

The builder (``_service``) and the built app (``_app``) both depend on this module and not on each other.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel
from starlette.routing import BaseRoute

from bastion._exception_handlers import ExceptionHandlers
from bastion._guard import CheckNow, Guard, Outcome, grpc_check, guard_layer, skipping_built_in
from bastion._health import ReadinessCheck
from bastion.broker._specs import BrokerPlan
from bastion.policy import Normalizer, ResourceExtractor
from bastion.resilience._capability import ResilienceSpec
from bastion.routing import VersionedApi
from bastion.types import ASGIApp, Scope

Layer = Callable[[ASGIApp], ASGIApp]
"""``app -> app``: an ASGI middleware factory (``functools.partial(SomeMiddleware, option=...)``)."""
Hook = Callable[[], Awaitable[None]]
Lifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]
"""``lifespan(app)``: an async context manager entered after the start-up hooks and left before the shutdown
hooks (FastAPI's and Starlette's ``lifespan=``); a mapping it yields is the lifespan state (``request.state``)."""
GrpcFinish = Outcome
"""Called when a gRPC call is over with its status name (``"OK"``, ``"INTERNAL"``, ...), or ``None`` when its
outcome says nothing about the service: its handler never ran (a later step refused the call), or the client
cancelled it, let its deadline pass or sent a broken request message (:data:`bastion._guard.Outcome`)."""
GrpcHook = Callable[[Scope], Awaitable[GrpcFinish | None]]
"""``async hook(scope)`` run for every gRPC call at a layer's position; it rejects by raising a BastionError and
may return a function to be called with the call's outcome (:data:`GrpcFinish`).

The scope has ``type`` ``"grpc"``, ``method`` ``"POST"``, ``path`` ``/pkg.Service/Method``, ``headers`` (the
call's metadata, lower-case names, latin-1 bytes), ``client`` and the request id; a token hook may write
``scope[SCOPE_CLAIMS]`` for the rate limiter and the policy after it.
"""
GrpcExtractor = Callable[[Any], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
"""``message -> resource attributes`` for a gRPC method (``def`` or ``async def``)."""
DependencyOverrides = dict[Callable[..., Any], Callable[..., Any]]
"""FastAPI's ``dependency_overrides``: ``{original dependency: replacement}``, read on every request."""


class OverridesProvider(Protocol):
    """What FastAPI's routers read overrides from (their ``dependency_overrides_provider``): the service."""

    dependency_overrides: DependencyOverrides


@dataclass(slots=True)
class NoOverrides:
    """The provider of an app built from parts no service made (its mapping starts empty all the same)."""

    dependency_overrides: DependencyOverrides = field(default_factory=dict)


class Slot(enum.Enum):
    """Where an operator's layer plugs into the pipeline; the order is the pipeline's (``bastion._pipeline``)."""

    TOKEN_AUTH = "token_auth"
    RATE_LIMIT = "rate_limit"
    POLICY = "policy"
    RESILIENCE = "resilience"


SECURITY_SLOTS = frozenset({Slot.TOKEN_AUTH, Slot.RATE_LIMIT, Slot.POLICY})
"""Slots whose operator layers must also guard gRPC calls (a ``grpc`` hook) when gRPC serves methods."""


@dataclass(frozen=True, slots=True)
class SlotUse:
    """One operator layer in a slot: the HTTP/WebSocket layer and, optionally, its gRPC hook."""

    layer: Layer
    grpc: CheckNow | None = None

    @classmethod
    def of(cls, layer: Layer | Guard, grpc: GrpcHook | None = None) -> SlotUse:
        """A guard's layer and gRPC check (its exemptions applied to both), or a plain layer and hook (the hook
        is not run for gRPC health and reflection, as no built-in check is)."""
        if isinstance(layer, Guard):
            if grpc is not None:
                raise TypeError("service.use(slot, guard): a guard checks gRPC calls itself; pass no grpc= hook")
            return cls(guard_layer(layer), grpc_check(layer))
        return cls(layer, None if grpc is None else skipping_built_in(grpc))


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceParts:
    """Everything a service registered, as the app is built from it."""

    name: str | None
    version: str | None
    api: VersionedApi
    checks: tuple[ReadinessCheck, ...]
    frontend: tuple[BaseRoute, ...]
    frontend_fallback: ASGIApp | None
    fallback: ASGIApp | None
    fallback_is_app: bool
    slots: Mapping[Slot, tuple[SlotUse, ...]]
    startup: tuple[Hook, ...]
    shutdown: tuple[Hook, ...]
    revoke_route: tuple[str, str] | None
    reload_route: tuple[str, str] | None
    extractors: Mapping[str, ResourceExtractor]
    normalizer: Normalizer | None
    grpc_services: tuple[Any, ...]
    grpc_extractors: Mapping[str, GrpcExtractor]
    resilience: tuple[ResilienceSpec, ...] = ()
    broker: BrokerPlan = field(default_factory=BrokerPlan)
    resource_attributes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Attributes (name -> Cedar type) an extractor declared, by its route, action or gRPC method: the policy
    schema's resource attributes (``bastion.policy._schema``)."""
    lifespan: Lifespan | None = None
    exception_handlers: ExceptionHandlers = field(default_factory=ExceptionHandlers)
    overrides: OverridesProvider = field(default_factory=NoOverrides)
    """Where the routes read ``dependency_overrides`` per request: the service itself, so a mapping set or
    replaced after the build still counts."""
    settings_model: type[BaseModel] | None = None
    """The app's own settings model (``Service(settings=...)``): validates ``[app]`` and ``SERVICE_APP_*``."""
