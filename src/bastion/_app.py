"""The built application: the pipeline (``bastion._pipeline``) over the dispatcher, plus lifespan hooks.

Built by ``Service.build(settings)`` from the service's :class:`~bastion._parts.ServiceParts`; the order of the
layers is not written here but in the pipeline's one list.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import datetime
from functools import partial
from typing import Any

import structlog
from fastapi import APIRouter
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from starlette.datastructures import State
from starlette.routing import BaseRoute

from bastion._api_docs import ApiDocs
from bastion._claims import current_claims, optional_claims
from bastion._connections import ConnectionSlots
from bastion._health import HEALTH_PATH, READY_PATH, Health, ReadinessCheck
from bastion._metrics import Metrics, serve_metrics
from bastion._parts import SECURITY_SLOTS, ServiceParts, Slot
from bastion._pipeline import Step, assemble, grpc_steps, pipeline
from bastion._security import Posture, Security
from bastion._tracing import Tracing
from bastion.auth._routes import revoke_token_route
from bastion.broker._audit_sink import BrokerAuditSink
from bastion.broker._broker import Broker
from bastion.broker._cluster import ClusterSync
from bastion.broker._dependencies import current_broker, optional_broker
from bastion.broker._specs import BrokerPlan, StreamSpec
from bastion.config import BrokerSettings, Settings
from bastion.errors import ConfigError
from bastion.policy._engine import LoadedPolicies
from bastion.policy._normalize import default_normalizer
from bastion.policy._routes import reload_policy_route
from bastion.policy._schema import PolicySchema, service_schema
from bastion.policy._validation import check_policies
from bastion.resilience._layer import layers_from
from bastion.routing._fallback import Dispatcher
from bastion.routing._openapi import Gates
from bastion.routing._resolve import RouteEntry, RouteTable
from bastion.routing._versioned import ApiVersion
from bastion.types import H2_PROTOCOL_FACTORY, SCOPE_API_VERSION, ASGIApp, Receive, Scope, Send

DEFAULT_SERVICE_NAME = "bastion-service"
INLINE_DEPENDENCIES = frozenset({current_claims, optional_claims, current_broker, optional_broker})
"""Bastion's dependency providers that only read the scope: compiled handlers call them inline."""
DEFAULT_SERVICE_VERSION = "0.1.0"

log = structlog.get_logger("bastion.app")


class BastionApp:
    """The built ASGI application: the pipeline's steps over the dispatcher, plus lifespan hooks."""

    def __init__(self, parts: ServiceParts, settings: Settings, *, tracer_provider: Any = None) -> None:
        parts.api.validate()
        self.parts = parts
        self.settings = settings
        self.state = State()
        self.name = settings.service.name or parts.name or DEFAULT_SERVICE_NAME
        self.version = settings.service.version or parts.version or DEFAULT_SERVICE_VERSION
        self.base_path = parts.api.base_path if parts.api.base_path is not None else settings.service.base_path
        self.metrics = Metrics(enabled=settings.metrics.enabled)
        self.tracing = Tracing.from_settings(
            settings.tracing, service=self.name, version=self.version, provider=tracer_provider
        )
        self.tracer = self.tracing.tracer if self.tracing is not None else None
        self.metrics.traced = self.tracer is not None  # the steps' outcomes also go on the request's span
        # Token auth, policy, rate limiting: built and checked the way `bastion check-config` checks them.
        self.security = Security.from_settings(
            settings, realm=self.name, normalizer=parts.normalizer, extractors=parts.extractors, metrics=self.metrics
        )
        self.cache_store = self.security.cache_store
        self.revocations = self.security.revocations
        self.auditor = self.security.auditor
        self.policy = self.security.policy
        self.token_auth = self.security.token_auth
        self.rate_limiting = self.security.rate_limiting
        if (
            self.token_auth is not None
            and self.token_auth.revocations is not None
            and self.rate_limiting is not None
            and self.rate_limiting.checks_revocation
            and not parts.slots.get(Slot.TOKEN_AUTH)
        ):
            # Token auth is followed directly by the distributed limiter: the revocation check rides in the
            # limiter's round trip (one script instead of two commands per request).
            self.token_auth.defer_revocation = True
        self.resilience = layers_from(parts.resilience, settings.middleware.resilience, metrics=self.metrics)
        self._check_grpc_layers()
        self._watcher: asyncio.Task[None] | None = None
        self.grpc: Any = None  # bastion.grpc._server.GrpcServer once started

        self.router = APIRouter()
        self.docs = ApiDocs(
            parts.api,
            base_path=self.base_path,
            title=self.name,
            version=self.version,
            public=settings.service.api_docs_public,
            gates=self._gates,
        )
        entries: list[RouteEntry] = []
        for number, version in sorted(parts.api.versions.items()):
            prefix = parts.api.prefix(number, self.base_path)
            self.router.include_router(version, prefix=prefix)
            routes = RouteTable.from_router(
                version_router(version, prefix),
                version=number,
                compile_with=INLINE_DEPENDENCIES if settings.service.compiled_handlers else None,
            )
            entries.extend([*self.docs.entries(number, routes), *routes])
        self.routes = RouteTable(entries)
        checks = list(parts.checks)
        if settings.cache_store.url is not None:
            checks.append(ReadinessCheck(name="cache_store", check=self.cache_store.ping))
        self.broker: Broker | None = None
        self.cluster: ClusterSync | None = None
        self.audit_sink: BrokerAuditSink | None = None
        if settings.broker is not None and settings.broker.active:
            self._build_broker(settings.broker, parts.broker)
            assert self.broker is not None
            checks.append(ReadinessCheck(name="broker", check=self.broker.ready, optional=settings.broker.optional))
        elif not parts.broker.empty:
            raise ConfigError(
                "the service declares broker streams or handlers (service.stream / subscribe / consume / respond) "
                "but no broker is configured: set broker.url (or SERVICE_BROKER_URL)"
            )
        self.health = Health(
            service=self.name,
            version=self.version,
            checks=checks,
            timeout=settings.service.ready_timeout_secs,
        )
        operator_routes: list[BaseRoute] = []
        if parts.revoke_route is not None:
            path, admin_role = parts.revoke_route
            operator_routes.append(revoke_token_route(self.revoke, path=path, admin_role=admin_role))
        if parts.reload_route is not None:
            path, admin_role = parts.reload_route
            operator_routes.append(reload_policy_route(self.reload_everywhere, path=path, admin_role=admin_role))
        builtins: dict[str, ASGIApp] = {HEALTH_PATH: self.health.health, READY_PATH: self.health.ready}
        metrics_settings = settings.metrics
        if metrics_settings.enabled and not metrics_settings.public and metrics_settings.port is None:
            builtins[metrics_settings.path] = self._metrics_endpoint  # behind token auth and policy
        dispatcher = Dispatcher(
            builtins=builtins,
            table=self.routes,
            versioned=AsyncExitStackMiddleware(self.router),  # FastAPI routes expect its exit stack in scope
            frontend=[*operator_routes, *parts.frontend],
            fallback=parts.fallback or parts.frontend_fallback,
            fallback_takes_websockets=parts.fallback is not None and parts.fallback_is_app,
        )
        self.dispatcher = dispatcher
        if self.policy is not None:
            # Needs the route table: the policies are checked against what this app serves (and so is a reload).
            self.policy.use_schema(partial(check_policies, self.policy_schema()))
        self.steps: list[Step] = pipeline(
            settings,
            routes=self.routes,
            api=parts.api,
            base_path=self.base_path,
            metrics=self.metrics,
            tracer=self.tracer,
            builtin_paths=frozenset(builtins),
            token_auth=self.token_auth,
            rate_limit=self.rate_limiting,
            policy=self.policy,
            resilience=[(layer.name, layer) for layer in self.resilience],
            operator=parts.slots,
        )
        self.stack = assemble(self.steps, dispatcher)

    def _build_broker(self, settings: BrokerSettings, declared: BrokerPlan) -> None:
        """The broker with the declared streams (``[broker.streams.NAME]`` replaces a declaration of the same
        name), the cluster announcements and, when audit is on, the audit sink."""
        configured = {
            name: StreamSpec(
                name=name,
                subjects=tuple(stream.subjects),
                max_messages=stream.max_messages,
                max_age=stream.max_age,
                retention=stream.retention,
            )
            for name, stream in settings.streams.items()
        }
        streams = [spec for spec in declared.streams if spec.name not in configured] + list(configured.values())
        self.cluster = ClusterSync(
            service=self.name, on_reload=self._reload_announced, on_revoke=self._revoke_announced
        )
        plan = dataclasses.replace(
            declared, streams=tuple(streams), subscribers=(*declared.subscribers, self.cluster.subscriber())
        )
        self.broker = Broker(settings, plan, service=self.name, metrics=self.metrics, tracer=self.tracer)
        self.cluster.broker = self.broker
        if self.auditor.enabled:
            audit = self.settings.audit
            self.audit_sink = BrokerAuditSink(
                self.broker, prefix=audit.broker_subject_prefix, service=self.name, buffer=audit.broker_buffer
            )
            self.auditor.sinks.append(self.audit_sink)

    def _check_grpc_layers(self) -> None:
        """Refuse operator security layers that would leave gRPC methods unguarded (docs/grpc.md)."""
        if not self.settings.grpc.enabled or not self.parts.grpc_services:
            return
        for slot in Slot:
            if slot in SECURITY_SLOTS and any(use.grpc is None for use in self.parts.slots.get(slot, ())):
                raise ConfigError(
                    f"service.use(Slot.{slot.name}, layer) guards HTTP only and gRPC is enabled: pass "
                    f"service.use(Slot.{slot.name}, layer, grpc=hook) with an async hook(scope) that checks every "
                    "gRPC call the same way, or set grpc.enabled = false"
                )

    def posture(self) -> Posture:
        """What protects this app: the ``security_posture`` log line at start-up."""
        return self.security.posture(
            custom_layers={slot.value: len(self.parts.slots.get(slot, ())) for slot in Slot},
            grpc_services=len(self.parts.grpc_services),
            resilience=self.resilience,
        )

    def policy_schema(self) -> PolicySchema:
        """The Cedar schema of what this app decides (routes, operator and frontend routes, gRPC methods),
        against which its policies are validated; ``bastion policy schema`` prints it."""
        return service_schema(
            routes=self.routes,
            dispatcher=self.dispatcher,
            normalizer=self.parts.normalizer or default_normalizer,
            extractors=[*self.parts.extractors, *self.parts.grpc_extractors],
            declared=self.parts.resource_attributes,
            grpc_services=self.parts.grpc_services,
        )

    def reload_policies(self) -> LoadedPolicies:
        """Re-read ``policy.policy_path`` and swap the set in atomically; a bad file keeps the old set and raises
        PolicyLoadError (naming the file, statement and line). The decision cache is cleared on success."""
        if self.policy is None:
            raise ConfigError("policy authorization is off (no policy.policy_path): there are no policies to reload")
        return self.policy.reload()

    async def reload_everywhere(self) -> LoadedPolicies:
        """:meth:`reload_policies`, then tell the other instances (with a broker) to reload theirs."""
        loaded = self.reload_policies()
        if self.cluster is not None:
            await self.cluster.announce_reload(loaded.digest)
        return loaded

    async def _reload_announced(self, digest: str) -> None:
        if self.policy is not None and self.policy.policies.digest != digest:
            try:
                self.policy.reload()
            except ConfigError as exc:
                log.error("policy_reload_announced_failed", error=str(exc))

    async def aclose(self) -> None:
        """Release what the app holds open (cache-store connections); run at lifespan shutdown."""
        if self.grpc is not None:
            await self.grpc.drain(self.settings.service.graceful_shutdown_secs)
            self.grpc = None
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self.audit_sink is not None:
            await self.audit_sink.stop()
        if self.broker is not None:
            await self.broker.stop()
        await self.cache_store.close()
        self.metrics.close()
        if self.tracing is not None:
            self.tracing.shutdown()

    async def revoke(self, jti: str, reason: str, expires_at: float | datetime) -> None:
        """Revoke the token ``jti`` until ``expires_at`` (its ``exp``): ``jwt:revoked:{jti}`` in the cache store,
        dropped from the verified-token cache, and announced to the other instances (with a broker)."""
        until = expires_at.timestamp() if isinstance(expires_at, datetime) else float(expires_at)
        await self.revocations.revoke(jti, reason, until)
        if self.token_auth is not None:
            self.token_auth.tokens.forget(jti)
        if self.cluster is not None:
            await self.cluster.announce_revocation(jti, reason, until)

    async def _revoke_announced(self, jti: str, reason: str, expires_at: float) -> None:
        if self.settings.cache_store.url is None:
            # The in-process store is this instance's own: record the revocation here too.
            await self.revocations.revoke(jti, reason, expires_at)
        if self.token_auth is not None:
            self.token_auth.tokens.forget(jti)

    async def _metrics_endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve_metrics(self.metrics, scope, receive, send)

    def _gates(self, number: int) -> Gates:
        """What the pipeline does in front of version ``number``'s operations: the answers its document lists."""
        token, slots = self.settings.token, self.parts.slots
        guards = [layer for layer in self.resilience if layer.spec.version in (None, number)]
        return Gates(
            needs_token=self.token_auth.rules.requires_token if self.token_auth is not None else None,
            bearer_format="PASETO" if token.format == "paseto" else "JWT",
            policy=self.policy is not None or bool(slots.get(Slot.POLICY)),
            rate_limited=self.rate_limiting is not None or bool(slots.get(Slot.RATE_LIMIT)),
            # The layer's own rule for a request, asked about the template.
            guarded=lambda template: any(
                layer.applies({"path": template, SCOPE_API_VERSION: number}) for layer in guards
            ),
            max_body_bytes=self.settings.middleware.max_body_bytes,
            timeout_secs=self.settings.middleware.timeout_secs,
        )

    async def start_grpc(self, state: dict[str, Any]) -> None:
        """Create the gRPC server in the running loop: on ``grpc.port`` or behind the main port's sniffer."""
        # Imported here: grpclib registers the grpc.health/reflection protos in protobuf's default pool, which
        # would clash with grpcio's own health package in services that never enable gRPC.
        from bastion.grpc._interceptors import GrpcGuard
        from bastion.grpc._limits import Http2Limits
        from bastion.grpc._server import GrpcServer

        settings = self.settings
        guard = GrpcGuard(
            steps=grpc_steps(self.steps),
            max_message_size=settings.grpc.max_message_size,
            message_timeout_secs=settings.middleware.timeout_secs,
            extractors=self.parts.grpc_extractors,
            metrics=self.metrics,
            tracer=self.tracer,
        )

        async def ready() -> bool:
            healthy, _ = await self.health.readiness()
            return healthy

        limits = Http2Limits.of(settings.grpc, max_header_bytes=settings.service.max_header_bytes)
        self.grpc = GrpcServer(self.parts.grpc_services, guard=guard, ready=ready, limits=limits)
        if settings.grpc.use_separate_port:
            await self.grpc.start(
                settings.service.host,
                settings.grpc.port,
                preface_timeout_secs=settings.service.header_read_timeout_secs,
                slots=ConnectionSlots(settings.service.max_connections, settings.service.max_connections_per_ip),
            )
        else:
            state[H2_PROTOCOL_FACTORY] = self.grpc.protocol_factory

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        scope["app"] = self
        scope["router"] = self.router
        await self.stack(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    for hook in self.parts.startup:
                        await hook()
                    if self.broker is not None:
                        await self.broker.start()
                    if self.audit_sink is not None:
                        self.audit_sink.start()
                    if self.settings.grpc.enabled:
                        await self.start_grpc(scope.setdefault("state", {}))
                    if self.policy is not None and self.settings.policy.hot_reload:
                        self._watcher = asyncio.create_task(self.policy.watch(), name="policy-hot-reload")
                except ConfigError as exc:
                    # One line that says how to fix it, logged by the server with the failure (no traceback).
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                except Exception as exc:
                    log.error("startup_failed", exc_info=exc)
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                self.posture().log()
                log.info("service_started", service=self.name, version=self.version)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for hook in [*reversed(self.parts.shutdown), self.aclose]:
                    try:
                        await hook()
                    except Exception as exc:
                        log.error("shutdown_hook_failed", exc_info=exc)
                log.info("service_stopped", service=self.name)
                await send({"type": "lifespan.shutdown.complete"})
                return


def version_router(version: ApiVersion, prefix: str) -> APIRouter:
    """A router holding only ``version`` under ``prefix``, for reading its routes' full templates."""
    router = APIRouter()
    router.include_router(version, prefix=prefix)
    return router
