"""An httpx transport under a :class:`Guard`: any ``httpx.AsyncClient`` gets the bulkhead and the breaker, and a 5xx
response counts as a failure. Loaded on first use of ``bastion_core.ResilientTransport`` (httpx and OpenTelemetry
come with it)."""

from __future__ import annotations

import httpx
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bastion_core._guard import Guard
from bastion_core._tls import ReloadingClientContext

_PROPAGATOR = TraceContextTextMapPropagator()


class ResilientTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends every request through a :class:`Guard`; a 5xx response is a failure.

    ``httpx.AsyncClient(transport=ResilientTransport(guard))`` (the default transport underneath), or wrap a
    transport of your own. The response is returned as is: a 5xx still reaches the caller. When tracing is on
    (a current span exists), the request carries W3C ``traceparent``/``tracestate`` (unless it already has one),
    so the service it calls continues the trace.

    ``client_tls``: present a client certificate (mutual TLS) from files that rotate (the default transport is
    built on its context; run ``client_tls.watch()`` as a task, or call ``client_tls.reload()`` on SIGHUP, and new
    connections present the new pair). Not with ``transport``, which brings its own TLS.
    """

    def __init__(
        self,
        guard: Guard,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        client_tls: ReloadingClientContext | None = None,
    ) -> None:
        if transport is not None and client_tls is not None:
            raise ValueError("ResilientTransport: pass client_tls or a transport of your own, not both")
        self.guard = guard
        self.client_tls = client_tls
        self.transport = transport or httpx.AsyncHTTPTransport(
            verify=client_tls.context if client_tls is not None else True
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if trace.get_current_span().get_span_context().is_valid and "traceparent" not in request.headers:
            _PROPAGATOR.inject(request.headers)
        async with self.guard.call() as call:
            response = await self.transport.handle_async_request(request)
            if response.status_code >= 500:
                call.fail()
            return response

    async def aclose(self) -> None:
        await self.transport.aclose()
