"""Security headers on every response: nosniff, frame denial, referrer policy, HSTS over TLS, optional CSP."""

from __future__ import annotations

from bastion.config import SecurityHeadersSettings
from bastion.types import RESPONSE_START, ASGIApp, Headers, Message, Receive, Scope, Send


def security_headers(settings: SecurityHeadersSettings) -> tuple[Headers, Headers]:
    """The headers for plain-HTTP responses and the extra ones (HSTS) for TLS responses."""
    headers: Headers = [
        (b"x-content-type-options", settings.content_type_options.encode("latin-1")),
        (b"x-frame-options", settings.frame_options.encode("latin-1")),
        (b"referrer-policy", settings.referrer_policy.encode("latin-1")),
    ]
    if settings.content_security_policy:
        headers.append((b"content-security-policy", settings.content_security_policy.encode("latin-1")))
    tls: Headers = []
    if settings.hsts_max_age:
        value = f"max-age={settings.hsts_max_age}" + ("; includeSubDomains" if settings.hsts_include_subdomains else "")
        tls.append((b"strict-transport-security", value.encode("latin-1")))
    return headers, tls


class SecurityHeadersMiddleware:
    """Add the configured security headers to every HTTP response (and refused WebSocket handshake), unless the
    handler set its own.

    HSTS only on requests that arrived over TLS (RFC 6797 7.2: never over plain HTTP).
    """

    def __init__(self, app: ASGIApp, *, settings: SecurityHeadersSettings) -> None:
        self.app = app
        self.plain, tls = security_headers(settings)
        self.secure = self.plain + tls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = RESPONSE_START.get(scope["type"])
        if start is None:
            await self.app(scope, receive, send)
            return
        extra = self.secure if scope.get("scheme") in ("https", "wss") else self.plain

        async def send_with_headers(message: Message) -> None:
            if message["type"] == start:
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in extra if h[0] not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
