"""Request metrics and the access log (one structured line per request, sensitive headers and query values
masked), and the public metrics endpoint."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlencode

import structlog

from bastion import _tracing as tracing
from bastion._metrics import Metrics, method_label, serve_metrics
from bastion.config import AccessLogSettings
from bastion.types import SCOPE_CLAIMS, SCOPE_REQUEST_ID, SCOPE_ROUTE, ASGIApp, Message, Receive, Scope, Send
from bastion_core import log_event

MASK = "***"
SENSITIVE_QUERY_KEYS = frozenset({"access_token", "token", "api_key", "apikey", "password", "secret", "code"})

log = structlog.get_logger("bastion.access")
# (the access log's line is written by bastion_core.log_event: structlog's line, at half the cost)


def mask_headers(headers: Iterable[tuple[bytes, bytes]], sensitive: frozenset[str]) -> dict[str, str]:
    """Request headers as a dict for logging, with the values of ``sensitive`` names replaced by ``***``."""
    masked: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        value = MASK if name in sensitive else raw_value.decode("latin-1")
        masked[name] = f"{masked[name]}, {value}" if name in masked else value
    return masked


def mask_query(query: bytes) -> str:
    """The query string with the values of credential-like parameters replaced by ``***``."""
    if not query:
        return ""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urlencode([(k, MASK if k.lower() in SENSITIVE_QUERY_KEYS else v) for k, v in pairs])


class _Traced(NamedTuple):
    span: tracing.Span
    token: object
    log_tokens: Mapping[str, Any]


class _Begun(NamedTuple):
    start: float
    method: str
    active: Any
    traced: _Traced | None


class ObserveMiddleware:
    """Request metrics and the access log, from one timer and one look at the response; and the metrics endpoint
    when it is public.

    Metrics (``metrics``): ``http.server.active_requests`` while the request runs, then
    ``http.server.request.duration`` by method, route template (``""`` when no route matched) and status.
    Access log (``access_log``): ``http_request`` once the response is sent: method, route template (``None``
    when no route matched), path, status, duration, client address and the caller's ``sub`` (``None`` without a
    token); the request id comes with every line of the request. A WebSocket session is logged when it ends,
    with ``websocket: true`` and the handshake's status (101 when accepted). Headers are logged only with
    ``include_headers = true``, and then masked; bodies never are.

    Tracing (``tracer``): a server span per request, a child of the caller's valid ``traceparent``; named
    ``METHOD route`` once the route is known, with the status and the steps' outcomes as attributes;
    ``trace_id``/``span_id`` bound for every log line of the request.

    ``metrics_path``: ``GET``/``HEAD`` on it is answered here with the Prometheus text, before token auth,
    rate limiting and policy (``metrics.public = true``); neither counted nor logged. ``builtin_paths``
    (``/health``, ``/ready``) are their own route label.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        access_log: AccessLogSettings | None,
        metrics: Metrics | None,
        metrics_path: str | None = None,
        builtin_paths: frozenset[str] = frozenset(),
        tracer: tracing.Tracer | None = None,
    ) -> None:
        self.app = app
        self.tracer = tracer
        self.builtin_paths = builtin_paths
        self.log = access_log is not None and access_log.enabled
        self.include_headers = access_log is not None and access_log.include_headers
        self.sensitive = frozenset(h.lower() for h in access_log.sensitive_headers) if access_log else frozenset()
        self.metrics = metrics if metrics is not None and metrics.enabled else None
        self.metrics_path = metrics_path if self.metrics is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        if self.serves_metrics(scope):
            await serve_metrics(self.metrics, scope, receive, send)  # type: ignore[arg-type]
            return
        begun = self.begin(scope)
        status = 0

        async def send_and_record(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start" or kind == "websocket.http.response.start":
                status = message["status"]
            elif kind == "websocket.accept":
                status = 101
            elif kind == "websocket.close" and not status:
                status = 403  # refused before accept: the server answers the handshake with 403
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.finish(scope, begun, status)

    def serves_metrics(self, scope: Scope) -> bool:
        """Whether this request is for the public metrics endpoint (answered here)."""
        return self.metrics is not None and scope["path"] == self.metrics_path and scope["type"] == "http"

    def begin(self, scope: Scope) -> _Begun:
        """Start observing a request: its timer, the active-requests gauge, its span."""
        start = time.perf_counter()
        method = scope.get("method", "GET")
        active = self.metrics.request_started(method) if self.metrics is not None else None
        traced = self._start_span(scope, method) if self.tracer is not None else None
        return _Begun(start, method, active, traced)

    def finish(self, scope: Scope, begun: _Begun, status: int) -> None:
        """Record the request once it is over: metrics, the access-log line, the span."""
        seconds = time.perf_counter() - begun.start
        method = begun.method
        route = scope.get(SCOPE_ROUTE)
        path = scope["path"]
        template = route.template if route is not None else (path if path in self.builtin_paths else None)
        if begun.active is not None:
            begun.active.dec()
            self.metrics.request_finished(method, template or "", status or 500, seconds)  # type: ignore[union-attr]
        if self.log:
            self._log(scope, scope["type"], method, template, status, seconds)
        if begun.traced is not None:
            self._end_span(begun.traced, scope, template, status)

    def _start_span(self, scope: Scope, method: str) -> _Traced:
        assert self.tracer is not None
        parent = tracing.extract(
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name == b"traceparent" or name == b"tracestate"
        )
        label = method_label(method)
        span = tracing.start(
            self.tracer,
            "HTTP" if label == "_OTHER" else label,
            parent=parent,
            kind=tracing.SERVER,
            attributes={
                "http.request.method": label,
                "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"),
                "network.protocol.version": scope.get("http_version", "1.1"),
                "bastion.request_id": scope.get(SCOPE_REQUEST_ID, ""),
            },
        )
        return _Traced(span, tracing.activate(span), structlog.contextvars.bind_contextvars(**tracing.ids(span)))

    @staticmethod
    def _end_span(traced: _Traced, scope: Scope, template: str | None, status: int) -> None:
        span = traced.span
        structlog.contextvars.reset_contextvars(**traced.log_tokens)
        tracing.deactivate(traced.token)
        if span.is_recording():
            if template is not None:
                span.set_attribute("http.route", template)
                span.update_name(f"{span.name} {template}")  # type: ignore[attr-defined]
            span.set_attribute("http.response.status_code", status or 500)
            claims = scope.get(SCOPE_CLAIMS)
            if claims is not None:
                span.set_attribute("bastion.token.outcome", "valid")
                if getattr(claims, "sub", None):
                    span.set_attribute("user.id", str(claims.sub))
            if not status or status >= 500:
                span.set_status(tracing.ERROR)
        span.end()

    def _log(self, scope: Scope, kind: str, method: str, template: str | None, status: int, seconds: float) -> None:
        client = scope.get("client")
        fields: dict[str, object] = {
            "method": method,
            "route": template,
            "path": scope["path"],
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            "client": client[0] if client else None,
            "sub": getattr(scope.get(SCOPE_CLAIMS), "sub", None),
        }
        if scope.get("query_string"):
            fields["query"] = mask_query(scope["query_string"])
        if self.include_headers:
            fields["headers"] = mask_headers(scope["headers"], self.sensitive)
        if kind == "websocket":
            fields["websocket"] = True
        log_event(log, "bastion.access", "http_request", fields)
