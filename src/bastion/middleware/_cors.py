"""CORS from configuration: preflights are answered here and never reach token auth."""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware

from bastion.config import CorsSettings
from bastion.types import ASGIApp


def cors_enabled(settings: CorsSettings) -> bool:
    """CORS is off until ``allow_origins`` (or ``allow_origin_regex``) names an origin: a service that does not
    opt in sends no ``Access-Control-*`` headers at all (the pipeline then leaves the step out)."""
    return bool(settings.allow_origins) or settings.allow_origin_regex is not None


def CorsMiddleware(app: ASGIApp, *, settings: CorsSettings) -> ASGIApp:
    """Starlette's pure-ASGI CORS layer configured from ``[middleware.cors]``."""
    return CORSMiddleware(
        app,
        allow_origins=settings.allow_origins,
        allow_origin_regex=settings.allow_origin_regex,
        allow_methods=settings.allow_methods,
        allow_headers=settings.allow_headers,
        allow_credentials=settings.allow_credentials,
        expose_headers=settings.expose_headers,
        max_age=settings.max_age,
    )
