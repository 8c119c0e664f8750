"""The built application: the one place that knows the order of the HTTP pipeline.

Outermost first (DESIGN.md section 1; ``docs/pipeline.md`` explains each layer)::

    request id -> panic recovery -> security headers -> CORS -> access log -> error rendering
    -> path normalization -> timeout -> body limit -> compression -> deprecation -> route resolution
    -> [token auth] -> [rate limit] -> [policy] -> [resilience] -> dispatch

The bracketed layers are slots (:class:`~bastion.service.Slot`): the built-in capabilities fill them from
the settings, and the operator adds layers with ``service.use(slot, layer)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime
from typing import Any

import structlog
from fastapi import APIRouter
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from opentelemetry.metrics import MeterProvider
from starlette.datastructures import State
from starlette.routing import BaseRoute

from bastion.auth.routes import revoke_token_route
from bastion.cache_store import CacheStore
from bastion.config import Settings
from bastion.errors import ConfigError
from bastion.health import HEALTH_PATH, READY_PATH, Health, ReadinessCheck
from bastion.middleware import (
    AccessLogMiddleware,
    BodyLimitMiddleware,
    CompressionMiddleware,
    CorsMiddleware,
    ErrorRenderingMiddleware,
    PanicRecoveryMiddleware,
    RequestIdMiddleware,
    SecurityHeadersMiddleware,
    TimeoutMiddleware,
)
from bastion.policy.engine import LoadedPolicies
from bastion.policy.middleware import PolicyMiddleware
from bastion.policy.routes import reload_policy_route
from bastion.routing.deprecation import DeprecationMiddleware
from bastion.routing.fallback import Dispatcher
from bastion.routing.paths import PathNormalizationMiddleware
from bastion.routing.resolve import RouteEntry, RouteResolutionMiddleware, RouteTable
from bastion.routing.versioned import ApiVersion
from bastion.security import Posture, Security
from bastion.service import SECURITY_SLOTS, GrpcHook, Layer, Service, Slot
from bastion.telemetry import get_meter, version_counter
from bastion.types import H2_PROTOCOL_FACTORY, ASGIApp, Receive, Scope, Send

DEFAULT_SERVICE_NAME = "bastion-service"
DEFAULT_SERVICE_VERSION = "0.1.0"

log = structlog.get_logger("bastion.app")

# Innermost first: the order in which slot layers wrap the dispatcher.
_SLOTS_INNERMOST_FIRST = (Slot.RESILIENCE, Slot.POLICY, Slot.RATE_LIMIT, Slot.TOKEN_AUTH)


class BastionApp:
    """The built ASGI application: the middleware stack over the dispatcher, plus lifespan hooks."""

    def __init__(self, service: Service, settings: Settings, *, meter_provider: MeterProvider | None = None) -> None:
        service.api.validate()
        self.service = service
        self.settings = settings
        self.state = State()
        self.name = settings.service.name or service.name or DEFAULT_SERVICE_NAME
        self.version = settings.service.version or service.service_version or DEFAULT_SERVICE_VERSION
        self.base_path = service.api.base_path if service.api.base_path is not None else settings.service.base_path
        counter = version_counter(get_meter(meter_provider)) if settings.metrics.enabled else None
        # Token auth, policy, rate limiting: built and checked the way `bastion check-config` checks them.
        self.security = Security.from_settings(
            settings, realm=self.name, normalizer=service._normalizer, extractors=service._extractors
        )
        self.cache_store: CacheStore = self.security.cache_store
        self.revocations = self.security.revocations
        self.auditor = self.security.auditor
        self.policy = self.security.policy
        self.token_auth = self.security.token_auth
        self.rate_limiting = self.security.rate_limiting
        self._check_grpc_layers()
        self._watcher: asyncio.Task[None] | None = None
        self.grpc: Any = None  # bastion.grpc.GrpcServer once started

        self.router = APIRouter()
        entries: list[RouteEntry] = []
        for number, version in sorted(service.api.versions.items()):
            prefix = service.api.prefix(number, self.base_path)
            self.router.include_router(version, prefix=prefix)
            openapi = RouteEntry(
                path=f"{prefix}/openapi.json",
                methods=frozenset({"GET", "HEAD"}),
                version=number,
                name=f"openapi_v{number}",
                handler=self._openapi_handler(number),
            )
            entries.extend(RouteTable.from_router(version_router(version, prefix), version=number, extra=[openapi]))
        self.routes = RouteTable(entries)
        checks = list(service._checks)
        if settings.cache_store.url is not None:
            checks.append(ReadinessCheck(name="cache_store", check=self.cache_store.ping))
        self.health = Health(
            service=self.name,
            version=self.version,
            checks=checks,
            timeout=settings.service.ready_timeout_secs,
        )
        operator_routes: list[BaseRoute] = []
        if service._revoke_route is not None:
            path, admin_role = service._revoke_route
            operator_routes.append(revoke_token_route(self.revocations, path=path, admin_role=admin_role))
        if service._reload_route is not None:
            path, admin_role = service._reload_route
            operator_routes.append(reload_policy_route(self.reload_policies, path=path, admin_role=admin_role))
        dispatcher = Dispatcher(
            builtins={HEALTH_PATH: self.health.health, READY_PATH: self.health.ready},
            table=self.routes,
            versioned=AsyncExitStackMiddleware(self.router),  # FastAPI routes expect its exit stack in scope
            frontend=[*operator_routes, *service._frontend],
            fallback=service._fallback or service._frontend_fallback,
            fallback_takes_websockets=service._fallback is not None and service._fallback_is_app,
        )
        self.stack = self._assemble(dispatcher, counter)

    def _check_grpc_layers(self) -> None:
        """Refuse operator security layers that would leave gRPC methods unguarded (docs/grpc.md)."""
        if not self.settings.grpc.enabled or not self.service._grpc_services:
            return
        for slot in SECURITY_SLOTS:
            if any(use.grpc is None for use in self.service._slots[slot]):
                raise ConfigError(
                    f"service.use(Slot.{slot.name}, layer) guards HTTP only and gRPC is enabled: pass "
                    f"service.use(Slot.{slot.name}, layer, grpc=hook) with an async hook(scope) that checks every "
                    "gRPC call the same way, or set grpc.enabled = false"
                )

    def _grpc_hooks(self, slot: Slot) -> list[GrpcHook]:
        return [use.grpc for use in self.service._slots[slot] if use.grpc is not None]

    def posture(self) -> Posture:
        """What protects this app: the ``security_posture`` log line at start-up."""
        return self.security.posture(
            custom_layers={slot.value: len(self.service._slots[slot]) for slot in Slot},
            grpc_services=len(self.service._grpc_services),
        )

    def _assemble(self, dispatcher: ASGIApp, counter: Any) -> ASGIApp:
        settings, middleware = self.settings, self.settings.middleware
        app: ASGIApp = dispatcher
        built_in: dict[Slot, list[Layer]] = {slot: [] for slot in Slot}
        if self.token_auth is not None:
            built_in[Slot.TOKEN_AUTH].append(self.token_auth.layer)
        if self.rate_limiting is not None:
            built_in[Slot.RATE_LIMIT].append(self.rate_limiting.layer)
        if self.policy is not None:
            policy = self.policy
            built_in[Slot.POLICY].append(lambda app: PolicyMiddleware(app, authorizer=policy))
        for slot in _SLOTS_INNERMOST_FIRST:
            for layer in reversed([*built_in[slot], *(use.layer for use in self.service._slots[slot])]):
                app = layer(app)
        app = RouteResolutionMiddleware(app, table=self.routes)
        app = DeprecationMiddleware(app, api=self.service.api, base_path=self.base_path, counter=counter)
        app = CompressionMiddleware(app, settings=middleware.compression)
        app = BodyLimitMiddleware(app, max_body_bytes=middleware.max_body_bytes)
        app = TimeoutMiddleware(app, timeout_secs=middleware.timeout_secs)
        app = PathNormalizationMiddleware(app)
        app = ErrorRenderingMiddleware(app)
        if middleware.access_log.enabled:
            app = AccessLogMiddleware(app, settings=middleware.access_log)
        app = CorsMiddleware(app, settings=middleware.cors)
        if middleware.security_headers.enabled:
            app = SecurityHeadersMiddleware(app, settings=middleware.security_headers)
        app = PanicRecoveryMiddleware(app)
        app = RequestIdMiddleware(app)
        del settings
        return app

    def reload_policies(self) -> LoadedPolicies:
        """Re-read ``policy.policy_path`` and swap the set in atomically; a bad file keeps the old set and raises
        PolicyLoadError (naming the file, statement and line). The decision cache is cleared on success."""
        if self.policy is None:
            raise ConfigError("policy authorization is off (no policy.policy_path): there are no policies to reload")
        return self.policy.reload()

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
        await self.cache_store.close()

    async def revoke(self, jti: str, reason: str, expires_at: float | datetime) -> None:
        """Revoke the token ``jti`` until ``expires_at`` (its ``exp``): ``jwt:revoked:{jti}`` in the cache store."""
        await self.revocations.revoke(jti, reason, expires_at)

    def _openapi_handler(self, number: int) -> ASGIApp:
        async def openapi(scope: Scope, receive: Receive, send: Send) -> None:
            document = self.service.api.openapi(number, base_path=self.base_path, title=self.name, version=self.version)
            body = json.dumps(document, separators=(",", ":")).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

        return openapi

    async def start_grpc(self, state: dict[str, Any]) -> None:
        """Create the gRPC server in the running loop: on ``grpc.port`` or behind the main port's sniffer."""
        # Imported here: grpclib registers the grpc.health/reflection protos in protobuf's default pool, which
        # would clash with grpcio's own health package in services that never enable gRPC.
        from bastion.grpc.interceptors import GrpcGuard
        from bastion.grpc.server import GrpcServer

        settings = self.settings
        guard = GrpcGuard(
            token_auth=self.token_auth,
            policy=self.policy,
            auditor=self.auditor,
            max_message_size=settings.grpc.max_message_size,
            extractors=self.service._grpc_extractors,
            rate_limit=self.rate_limiting.check if self.rate_limiting is not None else None,
            token_hooks=self._grpc_hooks(Slot.TOKEN_AUTH),
            rate_limit_hooks=self._grpc_hooks(Slot.RATE_LIMIT),
            policy_hooks=self._grpc_hooks(Slot.POLICY),
        )

        async def ready() -> bool:
            healthy, _ = await self.health.readiness()
            return healthy

        self.grpc = GrpcServer(self.service._grpc_services, guard=guard, ready=ready)
        if settings.grpc.use_separate_port:
            await self.grpc.start(settings.service.host, settings.grpc.port)
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
                    for hook in self.service._startup:
                        await hook()
                    if self.settings.grpc.enabled:
                        await self.start_grpc(scope.setdefault("state", {}))
                    if self.policy is not None and self.settings.policy.hot_reload:
                        self._watcher = asyncio.create_task(self.policy.watch(), name="policy-hot-reload")
                except Exception as exc:
                    log.error("startup_failed", exc_info=exc)
                    await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                    return
                self.posture().log()
                log.info("service_started", service=self.name, version=self.version)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for hook in [*reversed(self.service._shutdown), self.aclose]:
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
