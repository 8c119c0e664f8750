"""What the HTTP/1.1 protocol hands to the WebSocket protocol at the upgrade, whichever uvicorn WebSocket protocol the
listener extends (``_websocket_sansio``, ``_websocket_legacy``)."""

from __future__ import annotations

from typing import Any

from bastion._connections import UNCOUNTED, Slot
from bastion._tls import ClientCertificate
from bastion.types import SCOPE_CLIENT_CERTIFICATE


class HandedOver:
    """A mixin before uvicorn's WebSocket protocol: the connection's :class:`Slot`, released when the connection is
    lost (a WebSocket counts against ``service.max_connections`` and ``service.max_connections_per_ip`` while
    open), and with mutual TLS the connection's verified client certificate, put in the handshake's scope as the
    HTTP/1.1 protocol puts it in each request's (``scope[SCOPE_CLIENT_CERTIFICATE]``): the same credential rules
    and the same ``Service`` principal decide a WebSocket handshake as an HTTP request."""

    slot: Slot = UNCOUNTED
    client_certificate: ClientCertificate | None = None
    mutual_tls: bool = False
    scope: Any

    def connection_lost(self, exc: Exception | None) -> None:
        self.slot.release()
        super().connection_lost(exc)  # type: ignore[misc]

    async def run_asgi(self) -> None:
        if self.mutual_tls:
            self.scope[SCOPE_CLIENT_CERTIFICATE] = self.client_certificate
        await super().run_asgi()  # type: ignore[misc]
