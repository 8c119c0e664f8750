"""CORS from configuration: preflights are answered here and never reach token auth."""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware

from bastion.config import CorsSettings
from bastion.types import ASGIApp, Message, Receive, Scope, Send


def cors_enabled(settings: CorsSettings) -> bool:
    """CORS is off until ``allow_origins`` (or ``allow_origin_regex``) names an origin: a service that does not
    opt in sends no ``Access-Control-*`` headers at all (the pipeline then leaves the step out)."""
    return bool(settings.allow_origins) or settings.allow_origin_regex is not None


class _CORS(CORSMiddleware):
    """Starlette's CORS layer, with a cheaper path for the common request that carries no ``Origin``.

    Starlette answers such a request by adding ``Origin`` to the response's ``Vary`` (one merged header) through
    its ``Headers``/``MutableHeaders`` objects; this does the same on the raw header list, with the same bytes in
    the same place (tests/bastion/middleware/test_cors.py compares both). Requests with an ``Origin``
    (preflights, cross-origin calls) take Starlette's own code.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, _ in scope["headers"]:
            if name == b"origin":
                await super().__call__(scope, receive, send)
                return

        async def send_with_vary(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = vary_origin(list(message.get("headers", ())))
            await send(message)

        await self.app(scope, receive, send_with_vary)


def vary_origin(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``MutableHeaders(headers)["Vary"] = ", ".join([*getlist("Vary"), "Origin"])`` on the raw list: the merged
    value replaces the first ``vary`` header, later ones are dropped, or it is appended."""
    first = -1
    values: list[bytes] = []
    for index, (name, value) in enumerate(headers):
        if name == b"vary":
            values.append(value)
            if first < 0:
                first = index
    values.append(b"Origin")
    merged = (b"vary", b", ".join(values))
    if first < 0:
        headers.append(merged)
        return headers
    if len(values) > 2:
        headers = [item for index, item in enumerate(headers) if index == first or item[0] != b"vary"]
    headers[first] = merged
    return headers


def CorsMiddleware(app: ASGIApp, *, settings: CorsSettings) -> ASGIApp:
    """Starlette's pure-ASGI CORS layer configured from ``[middleware.cors]``."""
    return _CORS(
        app,
        allow_origins=settings.allow_origins,
        allow_origin_regex=settings.allow_origin_regex,
        allow_methods=settings.allow_methods,
        allow_headers=settings.allow_headers,
        allow_credentials=settings.allow_credentials,
        expose_headers=settings.expose_headers,
        max_age=settings.max_age,
    )
