"""The service builder: versioned API, readiness checks, frontend routes, fallback, gRPC, pipeline slots.

``Service.build(settings)`` freezes what was registered into :class:`~bastion._parts.ServiceParts` and builds a
:class:`~bastion._app.BastionApp` from it. Registering anything after the first build raises: it would be lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from pydantic import BaseModel
from starlette.routing import BaseRoute

from bastion._callables import as_async, check_shape
from bastion._exception_handlers import ExceptionHandler, ExceptionHandlers, register
from bastion._guard import Guard
from bastion._health import ReadinessCheck
from bastion._parts import GrpcExtractor, GrpcHook, Hook, Layer, Lifespan, ServiceParts, Slot, SlotUse
from bastion._service_broker import BrokerRegistrations, before_build
from bastion.broker._specs import BrokerPlan, ConsumerSpec, ResponderSpec, StreamSpec, SubscriberSpec
from bastion.config import Settings, load_settings
from bastion.config._app import check_settings_model
from bastion.errors import ConfigError
from bastion.policy import Normalizer, ResourceExtractor
from bastion.policy._schema import cedar_attributes
from bastion.resilience._capability import ResilienceSpec
from bastion.routing import ApiVersion, VersionedApi
from bastion.routing._fallback import FallbackHandler, handler_app
from bastion.routing._sunset import Brownout
from bastion.types import ASGIApp

if TYPE_CHECKING:
    from bastion._app import BastionApp

P = ParamSpec("P")
R = TypeVar("R")


class Service(BrokerRegistrations):
    """A Bastion service: versioned API, readiness checks, frontend routes, fallback, and pipeline slots.

    ``bastion run module:service`` builds it with the loaded settings. Business routes are registered only
    through :meth:`version` (or the :class:`VersionedApi` passed in); there is no unversioned route method.

    Every callable it takes may be a ``def`` (run in the thread pool) or an ``async def``; one of the wrong
    shape is refused at registration (ConfigError). ``lifespan``: FastAPI's (:data:`~bastion._parts.Lifespan`).
    ``settings``: the app's pydantic settings model for ``[app]`` (``service.settings``, ``Depends(app_settings)``).
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        version: str | None = None,
        api: VersionedApi | None = None,
        lifespan: Lifespan | None = None,
        settings: type[BaseModel] | None = None,
    ) -> None:
        if lifespan is not None:
            check_shape(lifespan, what="Service(lifespan=...)", arguments=1)
        self.settings_model = check_settings_model(settings)
        self.settings: Any = None  # the instance of settings_model, once built
        self.lifespan = lifespan
        self.name = name
        self.service_version = version
        self.api = api or VersionedApi()
        self._checks: list[ReadinessCheck] = []
        self._frontend: list[BaseRoute] = []
        self._frontend_fallback: ASGIApp | None = None
        self._fallback: ASGIApp | None = None
        self._fallback_is_app = False
        self._built = False
        self._slots: dict[Slot, list[SlotUse]] = {slot: [] for slot in Slot}
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []
        self._revoke_route: tuple[str, str] | None = None
        self._reload_route: tuple[str, str] | None = None
        self._extractors: dict[str, ResourceExtractor] = {}
        self._normalizer: Normalizer | None = None
        self._grpc_services: list[Any] = []
        self._grpc_extractors: dict[str, GrpcExtractor] = {}
        self._resource_attributes: dict[str, Mapping[str, str]] = {}
        self._resilience: list[ResilienceSpec] = []
        self._streams: list[StreamSpec] = []
        self._subscribers: list[SubscriberSpec] = []
        self._consumers: list[ConsumerSpec] = []
        self._responders: list[ResponderSpec] = []
        self._exception_handlers: dict[type[BaseException], Any] = {}
        # FastAPI's {dependency: replacement}, read per request by every route of every app built from this
        # service (also app.dependency_overrides), so it may be set before or after build(): docs/testing.md.
        self.dependency_overrides: dict[Callable[..., Any], Callable[..., Any]] = {}

    @before_build
    def version(self, number: int, **kwargs: Any) -> ApiVersion:
        """Register API major version ``number`` (see :meth:`VersionedApi.version`)."""
        return self.api.version(number, **kwargs)

    def deprecate(
        self,
        number: int,
        *,
        replacement: int,
        sunset: str | None = None,
        message: str | None = None,
        enforce_sunset: bool = False,
        brownout: Brownout | None = None,
        since: str | None = None,
    ) -> None:
        """Mark version ``number`` deprecated (see :meth:`VersionedApi.deprecate`): ``enforce_sunset`` answers
        410 Gone from the sunset on, ``brownout`` for a share of the time before it (docs/pipeline.md)."""
        self.api.deprecate(
            number,
            replacement=replacement,
            sunset=sunset,
            message=message,
            enforce_sunset=enforce_sunset,
            brownout=brownout,
            since=since,
        )

    @before_build
    def add_readiness_check(self, name: str, check: Callable[[], object], *, optional: bool = False) -> None:
        """Add a ``/ready`` dependency check (``def`` or ``async def``, no arguments); a non-optional check that
        raises, times out or returns ``False`` makes ``/ready`` answer 503."""
        if any(existing.name == name for existing in self._checks):
            raise ConfigError(f"readiness check {name!r} is registered twice")
        checked = as_async(check, what=f"add_readiness_check({name!r})", arguments=0)
        self._checks.append(ReadinessCheck(name=name, check=checked, optional=optional))

    @before_build
    def frontend(self, routes: Sequence[BaseRoute], *, fallback: FallbackHandler | None = None) -> None:
        """Unversioned frontend routes (pages, static files), matched after the versioned API."""
        self._frontend = list(routes)
        if fallback is not None:
            check_shape(fallback, what="frontend(fallback=...)", arguments=1)
        self._frontend_fallback = handler_app(fallback) if fallback is not None else None

    @before_build
    def set_fallback(self, handler: FallbackHandler) -> None:
        """Handle unmatched paths with ``handler(request) -> Response`` (``def`` or ``async def``). The last call
        wins."""
        check_shape(handler, what="set_fallback()", arguments=1)
        self._fallback = handler_app(handler)
        self._fallback_is_app = False

    @before_build
    def set_fallback_app(self, app: ASGIApp) -> None:
        """Forward unmatched paths to an ASGI app (a proxy or gateway; WebSocket handshakes too). The last call
        wins."""
        self._fallback = app
        self._fallback_is_app = True

    @before_build
    def mount_revoke_token_route(self, path: str = "/admin/revoke-token", *, admin_role: str = "admin") -> None:
        """Serve ``POST {path}`` ``{"jti", "reason", "exp"?}`` to revoke tokens; callers need ``admin_role``.

        Unversioned and protected like every other path (see bastion.auth._routes.revoke_token_route).
        """
        self._revoke_route = (path, admin_role)

    @before_build
    def mount_policy_reload_route(self, path: str = "/admin/reload-policy", *, admin_role: str = "admin") -> None:
        """Serve ``POST {path}`` to re-read the policy file; callers need ``admin_role`` (see reload_policies)."""
        self._reload_route = (path, admin_role)

    @before_build
    def resource_extractor(
        self, route: str, *, attributes: Mapping[str, type] | None = None
    ) -> Callable[[ResourceExtractor], ResourceExtractor]:
        """Decorator: add resource attributes for ``route`` (a template such as ``/api/v1/documents/{user_id}/{doc_id}``
        or an action such as ``GET /api/v1/...``). The function (``def`` or ``async def``) gets
        ``(scope, path_params)`` and returns a mapping, e.g. ``owner_id`` from a storage lookup. When the
        resource does not exist it raises :class:`~bastion.errors.NotFound` (or returns ``None``): the request
        is answered 404 before the policy is asked (docs/policy.md, "Missing routes and resources").

        ``attributes`` (``{"owner_id": str}``; str, int or bool) declares what it returns, for the policy
        schema: policies are then checked against exactly these. Undeclared, the route's resource accepts any
        attribute a policy reads (docs/policy.md, "The schema")."""
        declared = None if attributes is None else cedar_attributes(f"resource_extractor({route!r})", attributes)

        def register(extractor: ResourceExtractor) -> ResourceExtractor:
            self._extractors[route] = as_async(extractor, what=f"resource_extractor({route!r})", arguments=2)
            if declared is not None:
                self._resource_attributes[route] = declared
            return extractor

        return register

    @before_build
    def add_grpc_service(self, servable: Any) -> None:
        """Serve a grpclib service (an instance of a class generated from a ``.proto`` file) when ``grpc.enabled``."""
        self._grpc_services.append(servable)

    @before_build
    def grpc_resource_extractor(
        self, method: str, *, attributes: Mapping[str, type] | None = None
    ) -> Callable[[GrpcExtractor], GrpcExtractor]:
        """Decorator: resource attributes for gRPC ``method`` (``/pkg.Service/Method``) from its request message.

        The policy check of such a method waits for the first request message (unary and server-streaming
        calls have exactly one) and runs before the handler sees it. ``attributes`` declares what it returns,
        as for :meth:`resource_extractor`."""
        declared = None if attributes is None else cedar_attributes(f"grpc_resource_extractor({method!r})", attributes)

        def register(extractor: GrpcExtractor) -> GrpcExtractor:
            self._grpc_extractors[method] = as_async(
                extractor, what=f"grpc_resource_extractor({method!r})", arguments=1
            )
            if declared is not None:
                self._resource_attributes[method] = declared
            return extractor

        return register

    @before_build
    def set_action_normalizer(self, normalizer: Normalizer) -> None:
        """Replace the default normalizer that turns unmatched paths into policy actions."""
        self._normalizer = normalizer

    @before_build
    def use(self, slot: Slot, layer: Layer | Guard, *, grpc: GrpcHook | None = None) -> None:
        """Plug a guard, or ``layer`` (``app -> app``), into ``slot``; several in one slot run in the order added.

        A :class:`~bastion.Guard` checks HTTP requests, WebSocket handshakes and gRPC calls with one ``check``
        and its :class:`~bastion.Exemptions` (docs/pipeline.md). A plain layer sees HTTP requests and WebSocket
        handshakes; gRPC calls pass through ``grpc`` (``async hook(scope)``, see :data:`GrpcHook`) at the same
        position; when gRPC serves methods, a token-auth, rate-limit or policy layer without one is refused at
        build time, so no call skips it silently.
        """
        self._slots[slot].append(SlotUse.of(layer, grpc))

    @before_build
    def use_resilience(
        self,
        *,
        version: int | None = None,
        paths: Sequence[str] = (),
        name: str | None = None,
        breaker: bool | None = None,
        bulkhead: bool | None = None,
        **overrides: Any,
    ) -> None:
        """Guard requests with a circuit breaker and a bulkhead (inside it) built from ``[middleware.resilience]``.

        Without arguments: every versioned route and every gRPC method. ``version=N``: only that version's
        routes; ``paths=["/api/v2/reports/*", ...]``: only those paths (or gRPC methods, ``/pkg.Service/*``).
        Every call adds an independent layer with its own breaker and slot pool. ``breaker=False`` /
        ``bulkhead=False`` leave a part out (the settings' ``*_enabled = false`` does so for every layer);
        keyword overrides (``threshold``, ``min_requests``, ``wait_secs``, ``half_open_requests``,
        ``max_concurrent``, ``max_wait``) replace the settings' values for this layer. See docs/resilience.md.
        """
        default = f"v{version}" if version is not None else ",".join(paths) or "default"
        self._resilience.append(
            ResilienceSpec(
                name=name or default,
                version=version,
                paths=tuple(paths),
                breaker=breaker,
                bulkhead=bulkhead,
                overrides=MappingProxyType(dict(overrides)),
            )
        )

    @before_build
    def on_startup(self, hook: Callable[[], Any]) -> Callable[[], Any]:
        """Decorator: run ``hook()`` at start-up, in registration order; one that raises stops the start-up."""
        self._startup.append(as_async(hook, what="on_startup", arguments=0))
        return hook

    @before_build
    def on_shutdown(self, hook: Callable[[], Any]) -> Callable[[], Any]:
        """Decorator: run ``hook()`` at shutdown, in reverse registration order."""
        self._shutdown.append(as_async(hook, what="on_shutdown", arguments=0))
        return hook

    @before_build
    def exception_handler(self, exc_class: type[Exception]) -> Callable[[ExceptionHandler], ExceptionHandler]:
        """Decorator, as FastAPI's: ``handler(request, exc)`` answers ``exc_class`` (and subclasses) with a
        BastionError (rendered in the error shape; over gRPC its ``grpc_status``) or a Response, inside the
        pipeline's outer steps. ``@v2.exception_handler`` wins for v2's routes (docs/pipeline.md)."""

        def add(handler: ExceptionHandler) -> ExceptionHandler:
            register(self._exception_handlers, exc_class, handler)
            return handler

        return add

    def build(
        self, settings: Settings | None = None, *, tracer_provider: Any = None, broker: Literal["memory"] | None = None
    ) -> BastionApp:
        """The ASGI application for ``settings`` (embedded defaults when ``None``); ``[app]`` validated into
        ``service.settings``. ``tracer_provider``: an OpenTelemetry SDK ``TracerProvider`` to trace into (an
        in-memory exporter in tests, or one the application set up itself); it turns tracing on whatever
        ``[tracing]`` says. ``broker="memory"``: the in-memory test broker instead of ``broker.url``
        (docs/testing.md). May be called again (with other settings); registering more after it raises ConfigError.
        """
        from bastion._app import BastionApp

        self._built = True
        settings = settings or load_settings(environ={})
        app = BastionApp(self.parts(), settings, tracer_provider=tracer_provider, memory_broker=broker == "memory")
        self.settings = app.app_settings
        return app

    def parts(self) -> ServiceParts:
        """A frozen snapshot of everything registered (what the app is built from)."""
        return ServiceParts(
            name=self.name,
            version=self.service_version,
            api=self.api,
            checks=tuple(self._checks),
            frontend=tuple(self._frontend),
            frontend_fallback=self._frontend_fallback,
            fallback=self._fallback,
            fallback_is_app=self._fallback_is_app,
            slots=MappingProxyType({slot: tuple(uses) for slot, uses in self._slots.items()}),
            startup=tuple(self._startup),
            shutdown=tuple(self._shutdown),
            revoke_route=self._revoke_route,
            reload_route=self._reload_route,
            extractors=MappingProxyType(dict(self._extractors)),
            normalizer=self._normalizer,
            grpc_services=tuple(self._grpc_services),
            grpc_extractors=MappingProxyType(dict(self._grpc_extractors)),
            resource_attributes=MappingProxyType(dict(self._resource_attributes)),
            lifespan=self.lifespan,
            overrides=self,
            settings_model=self.settings_model,
            exception_handlers=ExceptionHandlers(
                service=MappingProxyType(dict(self._exception_handlers)),
                versions=MappingProxyType(
                    {number: MappingProxyType(dict(v.exception_handlers)) for number, v in self.api.versions.items()}
                ),
            ),
            resilience=tuple(self._resilience),
            broker=BrokerPlan(
                streams=tuple(self._streams),
                subscribers=tuple(self._subscribers),
                consumers=tuple(self._consumers),
                responders=tuple(self._responders),
            ),
        )
