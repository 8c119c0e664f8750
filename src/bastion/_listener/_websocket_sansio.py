"""uvicorn's websockets-sansio WebSocket protocol (uvicorn 0.35 and later), holding its connection slot and quiet about
what clients get wrong."""

from __future__ import annotations

from typing import Any

import structlog
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from bastion._compat import uvicorn as uvicorn_compat
from bastion._listener._handover import HandedOver

log = structlog.get_logger("bastion.server")


class SansIOWebSocketProtocol(HandedOver, WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (websockets' sans-I/O implementation), with three changes:

    - It holds the connection's :class:`Slot` and, with mutual TLS, its client certificate (both handed over from
      the HTTP/1.1 protocol at the upgrade: :class:`~bastion._listener._handover.HandedOver`).
    - A refused handshake (``websocket.http.response``: 401, 403, 404, ...) counts as done. uvicorn 0.54 sends
      the refusal but leaves ``handshake_complete`` unset, then logs "ASGI callable returned without completing
      handshake." at error level for every refused handshake. Before uvicorn 0.53 the refusal is sent as 0.53
      sends it, with the app's headers (``bastion._compat.uvicorn.send_refusal``).
    - A text message that is not UTF-8 is closed with 1007 (as uvicorn does) and logged at info,
      ``websocket_invalid_utf8``; uvicorn logs it at error level with a traceback, for a client's mistake.
    """

    async def send(self, message: Any) -> None:
        if not uvicorn_compat.send_refusal(self, message):  # uvicorn before 0.53: the refusal sent as 0.53 does
            await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            self.handshake_complete = True

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                # Decoded here and again by uvicorn: checking first is what lets the refusal be ours.
                uvicorn_compat.websocket_message(self).decode()
            except UnicodeDecodeError:
                log.info("websocket_invalid_utf8", client=self.client[0] if self.client else None)
                uvicorn_compat.forget_websocket_message(self)
                self.conn.send_close(1007)  # RFC 6455 7.4.1: data inconsistent with the message type
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()
