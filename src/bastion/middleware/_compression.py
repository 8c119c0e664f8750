"""Response compression: gzip above a size threshold, negotiated by ``Accept-Encoding``."""

from __future__ import annotations

from starlette.middleware.gzip import GZipMiddleware

from bastion.config import CompressionSettings
from bastion.types import ASGIApp, Receive, Scope, Send


class CompressionMiddleware:
    """gzip responses for clients that send ``Accept-Encoding: gzip`` (Starlette's GZip layer does the work).

    Requests that do not accept gzip skip that layer entirely, so they pay nothing for it.
    """

    def __init__(self, app: ASGIApp, *, settings: CompressionSettings) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=settings.minimum_size, compresslevel=settings.level)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.enter(scope, receive) is None:
            await self.gzip(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def enter(self, scope: Scope, receive: Receive) -> Receive | None:
        """The step for an HTTP request, as a plain call (``bastion._fused``): ``receive`` when the client does not
        accept gzip (nothing to do), ``None`` when it does (then this layer runs)."""
        for name, value in scope["headers"]:
            if name == b"accept-encoding":
                return None if b"gzip" in value else receive
        return receive
