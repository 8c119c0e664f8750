"""The ceiling: a raw ASGI app answering every request with the same small JSON body."""

from __future__ import annotations

from typing import Any

BODY = b'{"hello":"world"}'
START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
}
BODY_MESSAGE = {"type": "http.response.body", "body": BODY}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send(START)
    await send(BODY_MESSAGE)
