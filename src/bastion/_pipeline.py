"""The request pipeline, written once: the ordered list of steps, outermost first, and the loop that builds it.

Every HTTP request and WebSocket handshake passes the steps below, top to bottom; a gRPC call passes the
steps that carry a gRPC check (token auth, rate limit, policy, resilience), in the same order. A step that
is switched off is simply not in the list: there is no other way to turn a layer off.

``assemble`` builds the steps' layers in this order; an HTTP request then runs adjacent built-in steps in one
coroutine with one ``send`` wrapper (``bastion._fused``), a WebSocket handshake through the nested layers.

The capability steps are guards (``bastion._guard``): one check and its exemptions, from which
:meth:`Step.guarding` makes both the HTTP/WebSocket layer and the gRPC check. A new capability is one package
(its guard in ``<capability>/_capability.py``) plus one entry in the list below.

    request_id          x-request-id kept if sane, else generated; on every response and log line. The one
                        place response headers are added: the id, the security headers (nosniff, frame
                        denial, referrer policy, HSTS over TLS; [middleware.security_headers]) and what later
                        steps ask for in the scope (rate-limit quota, deprecation)
    observe             request metrics, the server span, the access log line, the public /metrics
                        endpoint ([metrics], [tracing], [middleware.access_log])
    panic_recovery      an exception escaping the outer steps -> logged 500 in the error shape
    cors                preflights answered here, never reach auth                    (on when origins are set)
    error_rendering     errors raised further in -> {"error","code","status"}; a domain exception the
                        service has an exception handler for -> what that handler returns
    path_normalization  merge //, resolve ./.. once: every later step sees one path
    timeout             504 when the handler is too slow
    body_limit          413 over middleware.max_body_bytes; 400 for JSON nested deeper than max_json_depth
    compression         gzip for clients that accept it                              ([middleware.compression])
    deprecation         version metric; headers and log for deprecated versions
    route_resolution    route template, version, path parameters into the scope, once
    token_auth          401; then the operator's Slot.TOKEN_AUTH layers               (a key in [token])
    rate_limit          429; then the operator's Slot.RATE_LIMIT layers               ([rate_limit])
    policy              403; then the operator's Slot.POLICY layers                   (a policy_path in [policy])
    idempotency         a repeated Idempotency-Key replays the stored response; 400/409/422/503
                        (HTTP only; on when [idempotency] routes or a route's idempotency=True name a route)
    resilience          one step per service.use_resilience(...) (bulkhead inside breaker -> 503); then the
                        operator's Slot.RESILIENCE layers
    (dispatch)          /health, /ready, versioned routes, frontend routes, fallback
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from bastion._exception_handlers import ExceptionHandlers
from bastion._fused import Checks, Edge
from bastion._guard import CheckNow, Guard, GuardLayer, grpc_check, guard_layer
from bastion._metrics import Metrics
from bastion._parts import Layer, Slot, SlotUse
from bastion._tracing import Tracer
from bastion.config import Settings
from bastion.middleware._compression import CompressionMiddleware
from bastion.middleware._cors import CorsMiddleware, cors_enabled
from bastion.middleware._errors import ErrorRenderingMiddleware, PanicRecoveryMiddleware
from bastion.middleware._limits import BodyLimitMiddleware, TimeoutMiddleware
from bastion.middleware._observe import ObserveMiddleware
from bastion.middleware._request_id import RequestIdMiddleware
from bastion.routing._deprecation_middleware import DeprecationMiddleware
from bastion.routing._paths import PathNormalizationMiddleware
from bastion.routing._resolve import RouteResolutionMiddleware, RouteTable
from bastion.routing._versioned import VersionedApi
from bastion.types import ASGIApp

Fuses = Literal["plain", "guard"]


@dataclass(frozen=True, slots=True)
class Step:
    """One entry of the pipeline: a name, the ASGI layer and, for the security and resilience steps, the check
    a gRPC call passes at the same position (``slot`` says which operator slot the step belongs to)."""

    name: str
    layer: Layer
    grpc: CheckNow | None = None
    """A plain call that returns the outcome or the coroutine to await: a guard's check
    (``bastion._guard.grpc_check``) or an operator's hook (``skipping_built_in``)."""
    slot: Slot | None = None
    fuses: Fuses | None = None
    """How ``assemble`` may run the step fused with its neighbours (``bastion._fused``): ``"plain"`` (its layer's
    ``enter`` is the whole step for most requests) or ``"guard"`` (a built-in guard); ``None``: its own layer."""

    @classmethod
    def guarding(cls, name: str, guard: Guard, slot: Slot) -> Step:
        """The step of a guard: its HTTP/WebSocket layer and, at the same position, its gRPC check (both with
        the guard's exemptions), so the two protocols cannot drift apart."""
        return cls(name, guard_layer(guard), grpc_check(guard), slot, "guard")


def _slot(
    slot: Slot, built_in: Guard | None, operator: Mapping[Slot, Sequence[SlotUse]], *, named: str | None = None
) -> list[Step]:
    name = slot.value if named is None else f"{slot.value}:{named}"
    steps = [] if built_in is None else [Step.guarding(name, built_in, slot)]
    uses = operator.get(slot, ())
    for number, use in enumerate(uses, start=1):
        steps.append(Step(f"{slot.value}:operator:{number}", use.layer, use.grpc, slot))
    return steps


def _observe(
    settings: Settings, *, metrics: Metrics, tracer: Tracer | None, builtin_paths: frozenset[str]
) -> Step | None:
    """The observe step, when metrics, the access log or tracing is on."""
    middleware = settings.middleware
    if not (metrics.enabled or middleware.access_log.enabled or tracer is not None):
        return None
    public = settings.metrics.public and settings.metrics.port is None
    return Step(
        "observe",
        partial(
            ObserveMiddleware,
            access_log=middleware.access_log,
            metrics=metrics,
            metrics_path=settings.metrics.path if public else None,
            builtin_paths=builtin_paths,
            tracer=tracer,
        ),
    )


def pipeline(
    settings: Settings,
    *,
    routes: RouteTable,
    api: VersionedApi,
    base_path: str,
    metrics: Metrics,
    tracer: Tracer | None = None,
    token_auth: Guard | None,
    rate_limit: Guard | None,
    policy: Guard | None,
    idempotency: Layer | None = None,
    resilience: Sequence[tuple[str, Guard]] = (),
    operator: Mapping[Slot, Sequence[SlotUse]],
    builtin_paths: frozenset[str] = frozenset(),
    exception_handlers: ExceptionHandlers | None = None,
) -> list[Step]:
    """The steps for these settings, outermost first (the order in the module docstring)."""
    middleware, form = settings.middleware, settings.service.deprecation_header
    listed: list[Step | None] = [
        Step("request_id", partial(RequestIdMiddleware, security=middleware.security_headers)),
        _observe(settings, metrics=metrics, tracer=tracer, builtin_paths=builtin_paths),
        Step("panic_recovery", PanicRecoveryMiddleware),
        Step("cors", partial(CorsMiddleware, settings=middleware.cors)) if cors_enabled(middleware.cors) else None,
        Step("error_rendering", partial(ErrorRenderingMiddleware, handlers=exception_handlers)),
        Step("path_normalization", PathNormalizationMiddleware, fuses="plain"),
        Step("timeout", partial(TimeoutMiddleware, timeout_secs=middleware.timeout_secs)),
        Step(
            "body_limit",
            partial(
                BodyLimitMiddleware,
                max_body_bytes=middleware.max_body_bytes,
                max_json_depth=middleware.max_json_depth,
            ),
            fuses="plain",
        ),
        Step("compression", partial(CompressionMiddleware, settings=middleware.compression), fuses="plain")
        if middleware.compression.enabled
        else None,
        Step(
            "deprecation",
            partial(DeprecationMiddleware, api=api, base_path=base_path, metrics=metrics, form=form),
            fuses="plain",
        ),
        Step("route_resolution", partial(RouteResolutionMiddleware, table=routes), fuses="plain"),
        *_slot(Slot.TOKEN_AUTH, token_auth, operator),
        *_slot(Slot.RATE_LIMIT, rate_limit, operator),
        *_slot(Slot.POLICY, policy, operator),
        Step("idempotency", idempotency) if idempotency is not None else None,
        *(step for name, layer in resilience for step in _slot(Slot.RESILIENCE, layer, {}, named=name)),
        *_slot(Slot.RESILIENCE, None, operator),
    ]
    return [step for step in listed if step is not None]


def assemble(steps: Sequence[Step], app: ASGIApp, *, fuse: bool = True) -> ASGIApp:
    """Wrap ``app`` (the dispatcher) in ``steps``: the first step ends up outermost.

    Every step's layer is built once, nested as listed. With ``fuse`` (the default) an HTTP request runs adjacent
    steps in one coroutine (``bastion._fused``): the outer steps up to CORS in one :class:`~bastion._fused.Edge`,
    each run of plain steps and built-in guards in one :class:`~bastion._fused.Checks`; other connections (and
    ``fuse=False``) take the nested layers.
    """
    if not fuse:
        for step in reversed(steps):
            app = step.layer(app)
        return app
    edge = _edge_length(steps)
    top, run = app, list[ASGIApp]()  # run: the open run's layers, innermost first; top: what is below it
    for step in reversed(steps[edge:]):
        if step.fuses is None or (run and step.fuses == "guard" and not isinstance(run[-1], GuardLayer)):
            top, run = _closed(run, top), []  # a run is plain steps, then guards
        if step.fuses is None:
            top = step.layer(top)
        else:
            run.append(step.layer(run[-1] if run else top))
    top = _closed(run, top)
    if not edge:
        return top
    built = {step.name: step.layer for step in steps[:edge]}
    cors = built["cors"](top) if "cors" in built else None
    recovering = built["panic_recovery"](cors or top)
    observe = built["observe"](recovering) if "observe" in built else None
    request_id = built["request_id"](observe or recovering)
    return Edge(request_id, request_id=request_id, observe=observe, cors=cors, app=top)  # type: ignore[arg-type]


def _closed(run: list[ASGIApp], below: ASGIApp) -> ASGIApp:
    """What a run of fusable layers (innermost first) becomes: fused when it has two or more."""
    if len(run) > 1:
        return Checks(run[::-1], below)
    return run[0] if run else below


def _edge_length(steps: Sequence[Step]) -> int:
    """How many outer steps the :class:`~bastion._fused.Edge` takes: request id, observe (if on), panic recovery,
    CORS (if on), in this order; 0 when the list does not start so."""
    names = [step.name for step in steps[:4]]
    expected = ["request_id", *(["observe"] if "observe" in names else []), "panic_recovery"]
    if names[: len(expected)] != expected:
        return 0
    return len(expected) + (len(names) > len(expected) and names[len(expected)] == "cors")


def grpc_steps(steps: Sequence[Step]) -> list[Step]:
    """The steps a gRPC call passes, in pipeline order."""
    return [step for step in steps if step.grpc is not None]
