"""How a :class:`~bastion.BastionApp` is put together: one small function per part, each returning that part.

``BastionApp.__init__`` calls them in order (identity, security, routes and docs, messaging, readiness,
dispatcher, pipeline) and keeps what they return in one frozen :class:`AppParts`. What the parts do at run time
(lifespan, reload, revoke, gRPC) stays in ``bastion._app``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

import structlog
from fastapi import APIRouter
from starlette.routing import BaseRoute

from bastion import _extras as extras
from bastion._api_docs import ApiDocs
from bastion._app_settings import app_settings
from bastion._audit import Auditor
from bastion._cache_store import MemoryCacheStore
from bastion._claims import current_claims, optional_claims
from bastion._compat import fastapi as fastapi_compat
from bastion._health import HEALTH_PATH, READY_PATH, Health, ReadinessCheck
from bastion._metrics import Metrics, serve_metrics
from bastion._parts import SECURITY_SLOTS, Layer, OverridesProvider, ServiceParts, Slot
from bastion._pipeline import Step, assemble, pipeline
from bastion._security import Security
from bastion._tracing import Tracer
from bastion.auth._formats import token_format
from bastion.auth._routes import revoke_token_route
from bastion.broker._dependencies import current_broker, optional_broker
from bastion.broker._specs import BrokerPlan, StreamSpec
from bastion.config import AuditSettings, BrokerSettings, Settings
from bastion.errors import ConfigError
from bastion.idempotency import IdempotencyMiddleware, IdempotentRoutes
from bastion.policy._engine import LoadedPolicies
from bastion.policy._matrix import OperationRoles
from bastion.policy._routes import reload_policy_route
from bastion.ratelimit._rules import merge_route_options
from bastion.resilience._capability import ResilienceGuard
from bastion.routing._fallback import Dispatcher
from bastion.routing._openapi import Gates
from bastion.routing._resolve import RouteEntry, RouteTable
from bastion.routing._versioned import ApiVersion
from bastion.types import SCOPE_API_VERSION, ASGIApp

if TYPE_CHECKING:  # the broker's modules import nats-py (the broker extra): loaded when a broker is configured
    from bastion.broker._audit_sink import BrokerAuditSink
    from bastion.broker._broker import Broker
    from bastion.broker._cluster import ClusterSync
    from bastion.broker._memory import MemoryBroker

DEFAULT_SERVICE_NAME = "bastion-service"
DEFAULT_SERVICE_VERSION = "0.1.0"
INLINE_DEPENDENCIES = frozenset({current_claims, optional_claims, current_broker, optional_broker, app_settings})
"""Bastion's dependency providers that only read the scope: compiled handlers call them inline."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """The service's name, version and base path: the settings', else what the service declared."""

    name: str
    version: str
    base_path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Routes:
    """The versioned routes: FastAPI's router, the route table every step reads, and the API docs."""

    router: APIRouter
    table: RouteTable
    docs: ApiDocs


@dataclass(frozen=True, slots=True, kw_only=True)
class Messaging:
    """The broker (``None`` without ``broker.url``), its cluster announcements and audit sink."""

    broker: Broker | MemoryBroker | None = None
    cluster: ClusterSync | None = None
    audit_sink: BrokerAuditSink | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AppParts:
    """Everything one built app is made of, in the order it is built."""

    identity: Identity
    security: Security
    resilience: tuple[ResilienceGuard, ...]
    routes: Routes
    messaging: Messaging
    health: Health
    dispatcher: Dispatcher
    steps: tuple[Step, ...]
    stack: ASGIApp


@dataclass(frozen=True, slots=True, kw_only=True)
class Callbacks:
    """What the built parts call back into the running app for (operator routes, cluster announcements)."""

    revoke: Callable[[str, str, float | datetime], Awaitable[None]]
    reload_everywhere: Callable[[], Awaitable[LoadedPolicies]]
    reload_announced: Callable[[str], Awaitable[None]]
    revoke_announced: Callable[[str, str, float], Awaitable[None]]


def identity(parts: ServiceParts, settings: Settings) -> Identity:
    base_path = parts.api.base_path if parts.api.base_path is not None else settings.service.base_path
    return Identity(
        name=settings.service.name or parts.name or DEFAULT_SERVICE_NAME,
        version=settings.service.version or parts.version or DEFAULT_SERVICE_VERSION,
        base_path=base_path,
    )


def with_route_limits(parts: ServiceParts, settings: Settings, *, base_path: str) -> Settings:
    """``settings`` with the routes' own limits (``rate_limit=`` on a route) in ``rate_limit.routes``; an entry of
    the configuration for the same route wins (logged once here: ``rate_limit_route_option_replaced``)."""
    options = {}
    for number, version in parts.api.versions.items():
        prefix = parts.api.prefix(number, base_path)
        for route, rule in version.rate_limits:
            # In a route template '{id}' is any segment, as the router reads it (in a rule key: numeric or UUID).
            template = route.path.replace("{id}", "{id:str}")
            options.update({f"{method} {prefix}{template}": rule for method in sorted(route.methods or ())})
    if not options:
        return settings
    routes, replaced = merge_route_options(settings.rate_limit.routes, options)
    for option, key in replaced:
        structlog.get_logger("bastion.ratelimit").info("rate_limit_route_option_replaced", route=option, key=key)
    return settings.model_copy(update={"rate_limit": settings.rate_limit.model_copy(update={"routes": routes})})


def idempotency_layer(
    parts: ServiceParts, settings: Settings, *, base_path: str, security: Security, metrics: Metrics
) -> Layer | None:
    """The idempotency step for ``[idempotency] routes`` and the routes registered with ``idempotency=True``, on
    the app's cache store; ``None`` when no route takes a key. ConfigError for a bad pattern."""
    patterns = list(settings.idempotency.routes)
    for number, version in parts.api.versions.items():
        prefix = parts.api.prefix(number, base_path)
        for route in version.idempotent:
            template = route.path.replace("{id}", "{id:str}")
            patterns += [f"{method} {prefix}{template}" for method in sorted(route.methods or ())]
    if not patterns:
        return None
    idempotency = settings.idempotency
    if idempotency.in_flight_secs < settings.middleware.timeout_secs:
        raise ConfigError(
            f"idempotency.in_flight_secs = {idempotency.in_flight_secs} is shorter than middleware.timeout_secs = "
            f"{settings.middleware.timeout_secs:g}: a retry could run while the first request still does"
        )
    store = security.cache_store
    if isinstance(store, MemoryCacheStore):  # the records get a store of their own, with a byte cap
        store = MemoryCacheStore(max_bytes=idempotency.memory_max_bytes)
    return partial(
        IdempotencyMiddleware, settings=idempotency, routes=IdempotentRoutes(patterns), store=store, metrics=metrics
    )


def check_grpc_layers(parts: ServiceParts, settings: Settings) -> None:
    """Refuse operator security layers that would leave gRPC methods unguarded (docs/grpc.md)."""
    if not settings.grpc.enabled or not parts.grpc_services:
        return
    for slot in Slot:
        if slot in SECURITY_SLOTS and any(use.grpc is None for use in parts.slots.get(slot, ())):
            raise ConfigError(
                f"service.use(Slot.{slot.name}, layer) guards HTTP only and gRPC is enabled: pass "
                f"service.use(Slot.{slot.name}, layer, grpc=hook) with an async hook(scope) that checks every "
                "gRPC call the same way, or set grpc.enabled = false"
            )


def gates(
    number: int, *, settings: Settings, parts: ServiceParts, security: Security, resilience: Sequence[ResilienceGuard]
) -> Gates:
    """What the pipeline does in front of version ``number``'s operations: the answers its document lists."""
    token_auth, slots, policy = security.token_auth, parts.slots, security.policy
    guards = [layer for layer in resilience if layer.spec.version in (None, number)]
    roles = None if policy is None else OperationRoles(lambda: policy.policies, parts.resource_attributes)
    return Gates(
        needs_token=token_auth.rules.requires_token if token_auth is not None else None,
        bearer_format=token_format(settings.token.format).bearer_format,
        policy=security.policy is not None or bool(slots.get(Slot.POLICY)),
        rate_limited=security.rate_limiting is not None or bool(slots.get(Slot.RATE_LIMIT)),
        # The layer's own rule for a request, asked about the template.
        guarded=lambda template: any(layer.applies({"path": template, SCOPE_API_VERSION: number}) for layer in guards),
        max_body_bytes=settings.middleware.max_body_bytes,
        timeout_secs=settings.middleware.timeout_secs,
        permitted_roles=roles,
        policy_digest=roles.digest if roles is not None else "",
    )


def routes(parts: ServiceParts, settings: Settings, *, names: Identity, gates: Callable[[int], Gates]) -> Routes:
    """Each version's routes under its prefix, in one route table with the docs' own entries."""
    # The service provides the overrides, as a FastAPI app does for its routers: read per request (see _parts).
    router = APIRouter(dependency_overrides_provider=parts.overrides)
    docs = ApiDocs(
        parts.api,
        base_path=names.base_path,
        title=names.name,
        version=names.version,
        public=settings.service.api_docs_public,
        gates=gates,
    )
    entries: list[RouteEntry] = []
    for number, version in sorted(parts.api.versions.items()):
        prefix = parts.api.prefix(number, names.base_path)
        router.include_router(version, prefix=prefix)
        table = RouteTable.from_router(
            version_router(version, prefix, overrides=parts.overrides),
            version=number,
            compile_with=INLINE_DEPENDENCIES if settings.service.compiled_handlers else None,
        )
        entries.extend([*docs.entries(number, table), *table])
    return Routes(router=router, table=RouteTable(entries), docs=docs)


def version_router(version: ApiVersion, prefix: str, *, overrides: OverridesProvider | None = None) -> APIRouter:
    """A router holding only ``version`` under ``prefix``, for reading its routes' full templates (and their
    handlers, which read ``dependency_overrides`` from ``overrides``)."""
    router = APIRouter(dependency_overrides_provider=overrides)
    router.include_router(version, prefix=prefix)
    return router


def messaging(
    settings: Settings,
    declared: BrokerPlan,
    *,
    names: Identity,
    auditor: Auditor,
    metrics: Metrics,
    tracer: Tracer | None,
    callbacks: Callbacks,
    memory: bool = False,
) -> Messaging:
    """The broker with the declared streams, or nothing (refusing a service that declares broker work then).

    ``memory``: the in-memory broker of the test clients, whatever ``[broker]`` says (``broker.url`` unused)."""
    if memory:
        return memory_messaging(settings, declared, names=names, auditor=auditor, metrics=metrics, callbacks=callbacks)
    if settings.broker is None or not settings.broker.active:
        if not declared.empty:
            raise ConfigError(
                "the service declares broker streams or handlers (service.stream / subscribe / consume / respond) "
                "but no broker is configured: set broker.url (or SERVICE_BROKER_URL)"
            )
        return Messaging()
    extras.BROKER.require()
    from bastion.broker._broker import Broker
    from bastion.broker._cluster import ClusterSync

    cluster = ClusterSync(
        service=names.name, on_reload=callbacks.reload_announced, on_revoke=callbacks.revoke_announced
    )
    plan = dataclasses.replace(
        declared,
        streams=streams(settings.broker, declared),
        subscribers=(*declared.subscribers, cluster.subscriber()),
    )
    broker = Broker(settings.broker, plan, service=names.name, metrics=metrics, tracer=tracer)
    cluster.broker = broker
    return Messaging(broker=broker, cluster=cluster, audit_sink=audit_sink(broker, settings.audit, names, auditor))


def memory_messaging(
    settings: Settings,
    declared: BrokerPlan,
    *,
    names: Identity,
    auditor: Auditor,
    metrics: Metrics,
    callbacks: Callbacks,
) -> Messaging:
    """The service's broker work on the in-memory broker (``bastion.broker._memory``): needs no nats-py."""
    from bastion.broker._cluster import ClusterSync
    from bastion.broker._memory import MemoryBroker

    broker_settings = settings.broker or BrokerSettings()
    cluster = ClusterSync(
        service=names.name, on_reload=callbacks.reload_announced, on_revoke=callbacks.revoke_announced
    )
    plan = dataclasses.replace(
        declared,
        streams=streams(broker_settings, declared),
        subscribers=(*declared.subscribers, cluster.subscriber()),
    )
    broker = MemoryBroker(broker_settings, plan, service=names.name, metrics=metrics)
    cluster.broker = broker
    return Messaging(broker=broker, cluster=cluster, audit_sink=audit_sink(broker, settings.audit, names, auditor))


def streams(settings: BrokerSettings, declared: BrokerPlan) -> tuple[StreamSpec, ...]:
    """The declared streams; a ``[broker.streams.NAME]`` table replaces the declaration of the same name."""
    configured = {
        name: StreamSpec(
            name=name,
            subjects=tuple(stream.subjects),
            max_messages=stream.max_messages,
            max_age=stream.max_age,
            retention=stream.retention,
            num_replicas=stream.num_replicas,
        )
        for name, stream in settings.streams.items()
    }
    return (*(spec for spec in declared.streams if spec.name not in configured), *configured.values())


def audit_sink(
    broker: Broker | MemoryBroker, audit: AuditSettings, names: Identity, auditor: Auditor
) -> BrokerAuditSink | None:
    """With audit on, the sink that publishes audit events on the broker (added to the auditor's sinks)."""
    if not auditor.enabled:
        return None
    from bastion.broker._audit_sink import BrokerAuditSink

    sink = BrokerAuditSink(broker, prefix=audit.broker_subject_prefix, service=names.name, buffer=audit.broker_buffer)
    auditor.sinks.append(sink)
    return sink


def readiness(
    parts: ServiceParts,
    settings: Settings,
    *,
    names: Identity,
    security: Security,
    broker: Broker | MemoryBroker | None,
) -> Health:
    """``/health`` and ``/ready``: the service's checks, the cache store's and the broker's when they are used."""
    checks = list(parts.checks)
    if settings.cache_store.url is not None:
        checks.append(ReadinessCheck(name="cache_store", check=security.cache_store.ping))
    if broker is not None:
        optional = settings.broker is not None and settings.broker.optional
        checks.append(ReadinessCheck(name="broker", check=broker.ready, optional=optional))
    return Health(service=names.name, version=names.version, checks=checks, timeout=settings.service.ready_timeout_secs)


def dispatcher(
    parts: ServiceParts, settings: Settings, *, routes: Routes, health: Health, metrics: Metrics, callbacks: Callbacks
) -> Dispatcher:
    """What answers a request once the pipeline let it through: built-in endpoints, routes, frontend, fallback."""
    operator_routes: list[BaseRoute] = []
    if parts.revoke_route is not None:
        path, admin_role = parts.revoke_route
        operator_routes.append(revoke_token_route(callbacks.revoke, path=path, admin_role=admin_role))
    if parts.reload_route is not None:
        path, admin_role = parts.reload_route
        operator_routes.append(reload_policy_route(callbacks.reload_everywhere, path=path, admin_role=admin_role))
    builtins: dict[str, ASGIApp] = {HEALTH_PATH: health.health, READY_PATH: health.ready}
    where = settings.metrics
    if where.enabled and not where.public and where.port is None:
        builtins[where.path] = partial(serve_metrics, metrics)  # behind token auth and policy
    return Dispatcher(
        builtins=builtins,
        table=routes.table,
        versioned=fastapi_compat.exit_stack(routes.router),  # FastAPI routes expect its exit stack in scope
        frontend=[*operator_routes, *parts.frontend],
        fallback=parts.fallback or parts.frontend_fallback,
        fallback_takes_websockets=parts.fallback is not None and parts.fallback_is_app,
    )


def steps(
    parts: ServiceParts,
    settings: Settings,
    *,
    names: Identity,
    security: Security,
    resilience: Sequence[ResilienceGuard],
    routes: Routes,
    builtin_paths: frozenset[str],
    metrics: Metrics,
    tracer: Tracer | None,
) -> tuple[Step, ...]:
    """The pipeline's steps for this app (``bastion._pipeline``: the one list of their order)."""
    return tuple(
        pipeline(
            settings,
            routes=routes.table,
            api=parts.api,
            base_path=names.base_path,
            metrics=metrics,
            tracer=tracer,
            builtin_paths=builtin_paths,
            token_auth=security.credentials or security.token_auth,
            rate_limit=security.rate_limiting,
            policy=security.policy,
            idempotency=idempotency_layer(
                parts, settings, base_path=names.base_path, security=security, metrics=metrics
            ),
            resilience=[(layer.name, layer) for layer in resilience],
            operator=parts.slots,
            exception_handlers=parts.exception_handlers,
        )
    )


def stack(built: Sequence[Step], dispatcher: Dispatcher) -> ASGIApp:
    """The steps over the dispatcher: the ASGI app every request enters."""
    return assemble(built, dispatcher)
