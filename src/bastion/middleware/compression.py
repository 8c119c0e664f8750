"""Response compression: gzip above a size threshold, negotiated by ``Accept-Encoding``."""

from __future__ import annotations

from starlette.middleware.gzip import GZipMiddleware

from bastion.config import CompressionSettings
from bastion.types import ASGIApp


def CompressionMiddleware(app: ASGIApp, *, settings: CompressionSettings) -> ASGIApp:
    """Starlette's pure-ASGI gzip layer from ``[middleware.compression]``; ``app`` itself when disabled."""
    if not settings.enabled:
        return app
    return GZipMiddleware(app, minimum_size=settings.minimum_size, compresslevel=settings.level)
