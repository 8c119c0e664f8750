"""CORS from configuration: preflights are answered here and never reach token auth."""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware

from bastion.config import CorsSettings
from bastion.types import ASGIApp


def CorsMiddleware(app: ASGIApp, *, settings: CorsSettings) -> ASGIApp:
    """Starlette's pure-ASGI CORS layer configured from ``[middleware.cors]``; ``app`` itself when CORS is off.

    CORS is off until ``allow_origins`` (or ``allow_origin_regex``) names an origin: a service that
    does not opt in sends no ``Access-Control-*`` headers at all.
    """
    if not settings.allow_origins and settings.allow_origin_regex is None:
        return app
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
