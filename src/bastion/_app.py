"""The built application: the pipeline (``bastion._pipeline``) over the dispatcher, plus lifespan hooks.

Built by ``Service.build(settings)`` from the service's :class:`~bastion._parts.ServiceParts`, part by part
(``bastion._assembly``: one function per part, kept in one frozen record); the order of the layers is not written
here but in the pipeline's one list.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

import structlog
from starlette.datastructures import State

from bastion import _assembly as assembly
from bastion import _extras as extras
from bastion import _tls as tls
from bastion._assembly import INLINE_DEPENDENCIES as INLINE_DEPENDENCIES
from bastion._cache_store import RedisCacheStore
from bastion._connections import ConnectionSlots
from bastion._metrics import Metrics
from bastion._parts import DependencyOverrides, ServiceParts, Slot
from bastion._pipeline import grpc_steps
from bastion._security import Posture, Security
from bastion._tracing import Tracing
from bastion.config import Settings
from bastion.config._app import app_settings_from
from bastion.errors import ConfigError
from bastion.policy._engine import LoadedPolicies
from bastion.policy._normalize import default_normalizer
from bastion.policy._schema import PolicySchema, service_schema
from bastion.policy._validation import check_policies
from bastion.resilience._capability import layers_from
from bastion.types import H2_PROTOCOL_FACTORY, Receive, Scope, Send

log = structlog.get_logger("bastion.app")


class BastionApp:
    """The built ASGI application: the pipeline's steps over the dispatcher, plus lifespan hooks."""

    def __init__(
        self, parts: ServiceParts, settings: Settings, *, tracer_provider: Any = None, memory_broker: bool = False
    ) -> None:
        parts.api.validate()
        self.parts, self.settings, self.state = parts, settings, State()
        self.app_settings: Any = app_settings_from(parts.settings_model, settings.app)
        """The app's own settings (``Service(settings=...)``), or ``None``: what ``Depends(app_settings)`` gives."""
        names = assembly.identity(parts, settings)
        settings = self.settings = assembly.with_route_limits(parts, settings, base_path=names.base_path)
        self.name, self.version, self.base_path = names.name, names.version, names.base_path
        self.metrics = Metrics(enabled=settings.metrics.enabled, version_callers=settings.metrics.version_callers)
        self.tracing = Tracing.from_settings(
            settings.tracing, service=names.name, version=names.version, provider=tracer_provider
        )
        self.tracer = self.tracing.tracer if self.tracing is not None else None
        self.metrics.traced = self.tracer is not None  # the steps' outcomes also go on the request's span
        self._watcher: asyncio.Task[None] | None = None
        self._tls_watcher: asyncio.Task[None] | None = None
        self.metrics.watch_tls(partial(tls.report, settings))
        self._lifespan_context: contextlib.AbstractAsyncContextManager[Any] | None = None
        self.grpc: Any = None  # bastion.grpc._server.GrpcServer once started
        self._memory_broker = memory_broker
        self.on_startup_failure: Callable[[ConfigError], None] | None = None
        """Who reports a failed start-up (``bastion run``: its one ``error:`` line): it gets a ConfigError of one
        line (the cause chained), and the server is told only that start-up failed. Unset, the server gets the
        message (and an exception other than ConfigError is logged with its traceback)."""
        self.built = self._assemble(names)
        self.stack = self.built.stack

    def _assemble(self, names: assembly.Identity) -> assembly.AppParts:
        """Each part from its own function (``bastion._assembly``), in the order they depend on each other."""
        parts, settings, metrics = self.parts, self.settings, self.metrics
        # Token auth, policy, rate limiting: built and checked the way `bastion check-config` checks them.
        self.security = security = Security.from_settings(
            settings,
            realm=names.name,
            normalizer=parts.normalizer,
            extractors=parts.extractors,
            metrics=metrics,
            limiter_follows_token_auth=not parts.slots.get(Slot.TOKEN_AUTH),
        )
        self.cache_store, self.revocations, self.auditor = security.cache_store, security.revocations, security.auditor
        if isinstance(security.cache_store, RedisCacheStore):
            metrics.watch_cache_store(security.cache_store.available)
        self.policy, self.token_auth, self.rate_limiting = security.policy, security.token_auth, security.rate_limiting
        self.resilience = resilience = layers_from(parts.resilience, settings.middleware.resilience, metrics=metrics)
        assembly.check_grpc_layers(parts, settings)
        gates = partial(assembly.gates, settings=settings, parts=parts, security=security, resilience=resilience)
        routes = assembly.routes(parts, settings, names=names, gates=gates)
        self.router, self.routes, self.docs = routes.router, routes.table, routes.docs
        callbacks = assembly.Callbacks(
            revoke=self.revoke,
            reload_everywhere=self.reload_everywhere,
            reload_announced=self._reload_announced,
            revoke_announced=self._revoke_announced,
        )
        messaging = assembly.messaging(
            settings, parts.broker, names=names, auditor=security.auditor, metrics=metrics, tracer=self.tracer,
            callbacks=callbacks, memory=self._memory_broker,
        )  # fmt: skip
        self.broker, self.cluster, self.audit_sink = messaging.broker, messaging.cluster, messaging.audit_sink
        self.health = assembly.readiness(parts, settings, names=names, security=security, broker=messaging.broker)
        self.dispatcher = assembly.dispatcher(
            parts, settings, routes=routes, health=self.health, metrics=metrics, callbacks=callbacks
        )
        if self.policy is not None:
            # An authenticated request that reaches nothing is the empty 404, not a policy question.
            self.policy.exemptions = dataclasses.replace(
                self.policy.exemptions, unmatched=self.dispatcher.reaches_nothing
            )
            # Needs the route table: the policies are checked against what this app serves (and so is a reload).
            self.policy.use_schema(partial(check_policies, self.policy_schema()))
        self.steps = list(
            assembly.steps(
                parts, settings, names=names, security=security, resilience=resilience, routes=routes,
                builtin_paths=frozenset(self.dispatcher.builtins), metrics=metrics, tracer=self.tracer,
            )
        )  # fmt: skip
        return assembly.AppParts(
            identity=names, security=security, resilience=tuple(resilience), routes=routes, messaging=messaging,
            health=self.health, dispatcher=self.dispatcher, steps=tuple(self.steps),
            stack=assembly.stack(self.steps, self.dispatcher),
        )  # fmt: skip

    @property
    def dependency_overrides(self) -> DependencyOverrides:
        """FastAPI's ``app.dependency_overrides``: the service's mapping (``service.dependency_overrides``), read
        on every request, so setting or replacing it after the build takes effect at the next request."""
        return self.parts.overrides.dependency_overrides

    @dependency_overrides.setter
    def dependency_overrides(self, overrides: DependencyOverrides) -> None:
        self.parts.overrides.dependency_overrides = overrides

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
        schema = service_schema(
            routes=self.routes,
            dispatcher=self.dispatcher,
            normalizer=self.parts.normalizer or default_normalizer,
            extractors=[*self.parts.extractors, *self.parts.grpc_extractors],
            declared=self.parts.resource_attributes,
            grpc_services=self.parts.grpc_services,
        )
        return dataclasses.replace(schema, service_principals=self.settings.tls.mtls)

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
        for task in (self._watcher, self._tls_watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watcher = self._tls_watcher = None
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

    async def start_grpc(self, state: dict[str, Any]) -> None:
        """Create the gRPC server in the running loop: on ``grpc.port`` or behind the main port's sniffer."""
        # Imported here: grpclib registers the grpc.health/reflection protos in protobuf's default pool, which
        # would clash with grpcio's own health package in services that never enable gRPC. And they are the grpc
        # extra's packages (bastion._extras).
        extras.GRPC.require()
        from bastion.grpc._interceptors import GrpcGuard
        from bastion.grpc._limits import Http2Limits
        from bastion.grpc._server import GrpcServer

        settings = self.settings
        guard = GrpcGuard(
            steps=grpc_steps(self.steps),
            max_message_size=settings.grpc.max_message_size,
            message_timeout_secs=settings.middleware.timeout_secs,
            extractors=self.parts.grpc_extractors,
            exception_handlers=self.parts.exception_handlers,
            metrics=self.metrics,
            tracer=self.tracer,
            identity_from=settings.tls.identity_from if settings.tls.mtls else None,
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
                tls=tls.server_tls(settings, alpn=("h2",)),
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
                failure = await self._start(scope)
                if failure is not None:
                    if self.on_startup_failure is not None:
                        self.on_startup_failure(failure)
                        await send({"type": "lifespan.startup.failed", "message": ""})
                        return
                    cause = failure.__cause__
                    if not isinstance(cause, ConfigError):
                        log.error("startup_failed", exc_info=cause)
                    await send({"type": "lifespan.startup.failed", "message": _server_message(failure)})
                    return
                self.posture().log()
                log.info("service_started", service=self.name, version=self.version)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for hook in [self._exit_lifespan, *reversed(self.parts.shutdown), self.aclose]:
                    try:
                        await hook()
                    except Exception as exc:
                        log.error("shutdown_hook_failed", exc_info=exc)
                log.info("service_stopped", service=self.name)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self, scope: Scope) -> ConfigError | None:
        """The start-up steps in order; the first that fails stops it: a ConfigError of one line naming the step
        (a ConfigError raised by the step is its own line already), the exception chained."""
        step = "start-up"
        try:
            for hook in self.parts.startup:
                step = f"start-up hook {getattr(hook, '__name__', hook)!s}"
                await hook()
            step = "Service(lifespan=...)"
            await self._enter_lifespan(scope)
            step = "the broker's start"
            if self.broker is not None:
                await self.broker.start()
            step = "the audit sink's start"
            if self.audit_sink is not None:
                self.audit_sink.start()
            step = "the gRPC server's start"
            if self.settings.grpc.enabled:
                await self.start_grpc(scope.setdefault("state", {}))
            if self.policy is not None and self.settings.policy.hot_reload:
                self._watcher = asyncio.create_task(self.policy.watch(), name="policy-hot-reload")
            if self.settings.service.tls_cert_path is not None:
                self._tls_watcher = asyncio.create_task(tls.watch(self.settings), name="tls-reload")
        except ConfigError as exc:
            failure = ConfigError(str(exc))
            failure.__cause__ = exc
            return failure
        except Exception as exc:
            failure = ConfigError(f"{step} failed: {type(exc).__name__}: {exc}")
            failure.__cause__ = exc
            return failure
        return None

    async def _enter_lifespan(self, scope: Scope) -> None:
        """Enter the service's ``lifespan(app)`` context; the mapping it yields joins the lifespan state."""
        if self.parts.lifespan is None:
            return
        context = self.parts.lifespan(self)
        if not isinstance(context, contextlib.AbstractAsyncContextManager):
            if inspect.iscoroutine(context):
                context.close()  # an `async def` missing its @asynccontextmanager: never to be awaited
            raise ConfigError(
                f"Service(lifespan=...): lifespan(app) returned {type(context).__name__}; expected an async context "
                "manager (decorate it with @contextlib.asynccontextmanager)"
            )
        state = await context.__aenter__()
        self._lifespan_context = context
        if state is not None:
            scope.setdefault("state", {}).update(state)
            for name, value in state.items():
                setattr(self.state, name, value)

    async def _exit_lifespan(self) -> None:
        context, self._lifespan_context = self._lifespan_context, None
        if context is not None:
            await context.__aexit__(None, None, None)


def _server_message(failure: ConfigError) -> str:
    """The ``lifespan.startup.failed`` message: a ConfigError raised by a step keeps its class name in front."""
    return f"ConfigError: {failure}" if isinstance(failure.__cause__, ConfigError) else str(failure)
