"""Security headers on every response: nosniff, frame denial, referrer policy, HSTS over TLS, optional CSP (added by
the request-id step, the one place response headers are added: ``_request_id.RequestIdMiddleware``)."""

from __future__ import annotations

from bastion.config import SecurityHeadersSettings
from bastion.types import Headers


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
