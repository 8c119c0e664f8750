"""The one place that writes a complete response: health, the OpenAPI documents and every error use it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bastion.types import Headers, Send

JSON_CONTENT_TYPE = (b"content-type", b"application/json")


def json_body(payload: Any) -> bytes:
    """Compact JSON bytes (the same separators everywhere, non-ASCII kept as UTF-8)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


async def send_response(
    send: Send, status: int, headers: Headers, body: bytes, *, head: bool = False, websocket: bool = False
) -> None:
    """Send a whole response: start and one body message. ``head`` sends no body bytes (HEAD requests);
    ``websocket`` answers a WebSocket handshake instead of accepting it (ASGI ``websocket.http.response``)."""
    kind = "websocket.http.response" if websocket else "http.response"
    await send({"type": f"{kind}.start", "status": status, "headers": headers})
    await send({"type": f"{kind}.body", "body": b"" if head else body})


async def send_json(
    send: Send, status: int, payload: Any, *, headers: Sequence[tuple[bytes, bytes]] = (), head: bool = False
) -> None:
    """Send ``payload`` as an ``application/json`` response with its content length."""
    body = json_body(payload)
    all_headers = [JSON_CONTENT_TYPE, (b"content-length", str(len(body)).encode()), *headers]
    await send_response(send, status, all_headers, body, head=head)
