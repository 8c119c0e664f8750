"""uvicorn's WebSocket protocol on websockets' legacy implementation (uvicorn 0.30 to 0.34), with the behaviours of
the websockets-sansio one Bastion serves on uvicorn 0.35 and later."""

from __future__ import annotations

from typing import Any

import structlog
from uvicorn.protocols.websockets.websockets_impl import WebSocketProtocol as UvicornWebSocketProtocol
from websockets.datastructures import Headers

from bastion._compat import uvicorn as uvicorn_compat
from bastion._listener._handover import HandedOver

log = structlog.get_logger("bastion.server")

INVALID_DATA = 1007
"""RFC 6455 7.4.1: data inconsistent with the message type (a text message that is not UTF-8)."""


class LegacyWebSocketProtocol(HandedOver, UvicornWebSocketProtocol):
    """uvicorn's WebSocket protocol before 0.35 (websockets' legacy implementation), with three changes that make it
    behave as :class:`~bastion._listener._websocket_sansio.SansIOWebSocketProtocol` does on later uvicorn releases:

    - It holds the connection's :class:`Slot` and, with mutual TLS, its client certificate
      (:class:`~bastion._listener._handover.HandedOver`).
    - A refused handshake (``websocket.http.response``: 401, 403, 404, ...) is answered with the app's body:
      uvicorn answers when the response starts and sends an empty body (``uvicorn_compat.refusal_complete``).
    - A text message that is not UTF-8 is closed with 1007 (websockets does) and logged at info,
      ``websocket_invalid_utf8``.
    """

    async def process_request(self, path: str, request_headers: Headers) -> Any:
        response = await super().process_request(path, request_headers)
        if response is None:  # accepted
            return None
        return await uvicorn_compat.refusal_complete(self)

    def fail_connection(self, code: int = 1006, reason: str = "") -> None:
        if code == INVALID_DATA:
            log.info("websocket_invalid_utf8", client=self.client[0] if self.client else None)
        super().fail_connection(code, reason)
