"""Tracing (``[tracing]``; docs/observability.md): W3C trace context in and out, spans through OpenTelemetry.

Off by default, and then free: no tracer, no span, no header is looked at (the pipeline's steps test
``tracer is None`` once per request). On, each HTTP request and gRPC call gets a server span, a child of the
caller's ``traceparent`` when it sends a valid one (a malformed one is ignored: the span starts a new trace);
the auth, rate-limit and policy outcomes are set on it as attributes; ``trace_id`` and ``span_id`` join
``request_id`` in every log line of the request. What the request publishes to the broker and what it calls
through the outbound transport carries ``traceparent``/``tracestate``, so consumers and downstream services
continue the same trace.

The OpenTelemetry SDK does the spans, sampling and OTLP export; only the glue is here. Not the ASGI and gRPC
instrumentation packages: their span name is the raw path on an app like ours (the route template is known
only once our dispatcher ran), the ASGI one adds a span per ``send``/``receive``, and neither reads our
outcomes; the glue is a few lines in the steps that already time each request.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bastion import _extras as extras
from bastion.config import TracingSettings

TRACE_HEADERS = ("traceparent", "tracestate")
PROPAGATOR = TraceContextTextMapPropagator()
"""W3C Trace Context only (traceparent, tracestate): no baggage, no vendor formats."""
SERVER = SpanKind.SERVER
CONSUMER = SpanKind.CONSUMER
PRODUCER = SpanKind.PRODUCER
CLIENT = SpanKind.CLIENT
ERROR = Status(StatusCode.ERROR)

__all__ = ["CLIENT", "CONSUMER", "ERROR", "PRODUCER", "SERVER", "Context", "Span", "Tracer", "Tracing"]


class Tracing:
    """The tracer of one app, and the provider behind it when the app made it (then flushed at shutdown)."""

    def __init__(self, provider: Any, *, owned: bool) -> None:
        self.provider = provider
        self.owned = owned
        self.tracer: Tracer = provider.get_tracer("bastion")

    @classmethod
    def from_settings(
        cls, settings: TracingSettings, *, service: str, version: str, provider: Any = None
    ) -> Tracing | None:
        """``provider`` given (an SDK ``TracerProvider``, e.g. with an in-memory exporter): traces go there,
        whatever ``[tracing]`` says. Else ``[tracing]`` on: a provider exporting OTLP over HTTP to
        ``tracing.endpoint``, sampling ``tracing.sampling_ratio`` of new traces (a caller's sampled flag is
        followed), and made the global one when none is set, so the service's own spans join the trace."""
        if provider is not None:
            return cls(provider, owned=False)
        if not settings.active:
            return None
        extras.TRACING.require()  # the SDK and the exporter: the tracing extra
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        own = TracerProvider(
            resource=Resource.create({"service.name": service, "service.version": version}),
            sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)),
        )
        own.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint, timeout=settings.export_timeout_secs))
        )
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(own)
        return cls(own, owned=True)

    def shutdown(self) -> None:
        """Export what is buffered (the app's own provider only; a given one is its owner's)."""
        if self.owned:
            self.provider.shutdown()


def extract(headers: Iterable[tuple[str, str]]) -> Context:
    """The caller's trace context from ``(lowercase name, value)`` pairs; an empty context when there is none or
    it is malformed (the W3C rules: a bad ``traceparent`` is ignored, never an error)."""
    carrier = {name: value for name, value in headers if name == "traceparent" or name == "tracestate"}
    return PROPAGATOR.extract(carrier) if carrier else Context()


def inject(headers: MutableMapping[str, str]) -> None:
    """Add ``traceparent`` (and ``tracestate``) for the current span, when there is one (tracing on)."""
    if trace.get_current_span().get_span_context().is_valid:
        PROPAGATOR.inject(headers)


def start(tracer: Tracer, name: str, *, parent: Context, kind: SpanKind, attributes: dict[str, Any]) -> Span:
    return tracer.start_span(name, context=parent, kind=kind, attributes=attributes)


def activate(span: Span) -> object:
    """Make ``span`` the current one (until ``deactivate(token)``)."""
    return otel_context.attach(trace.set_span_in_context(span))


def deactivate(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


def ids(span: Span) -> dict[str, str]:
    """``trace_id`` and ``span_id`` in the W3C hex form, for log lines."""
    context = span.get_span_context()
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


def note(key: str, value: str | bool | int) -> None:
    """Set an attribute on the current span when it records (an outcome of auth, the limiter or the policy)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(key, value)


def fail(exc: BaseException) -> None:
    """Record ``exc`` on the current span (when it records) and mark the span failed."""
    span = trace.get_current_span()
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(ERROR)
