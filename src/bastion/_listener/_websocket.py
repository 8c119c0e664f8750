"""The listener's WebSocket protocol: uvicorn's, holding its connection slot and quiet about what clients get wrong.

uvicorn 0.35 and later serve WebSockets on websockets' sans-I/O implementation, earlier releases on its legacy one;
the listener subclasses whichever the installed uvicorn has, with the same behaviours (slot, refusals, 1007).
"""

from __future__ import annotations

from bastion._compat import uvicorn as uvicorn_compat

if uvicorn_compat.SANSIO_WEBSOCKETS:
    from bastion._listener._websocket_sansio import SansIOWebSocketProtocol as WebSocketProtocol
else:  # uvicorn 0.30 to 0.34
    from bastion._listener._websocket_legacy import LegacyWebSocketProtocol as WebSocketProtocol  # type: ignore[assignment]

__all__ = ["WebSocketProtocol"]
