"""A service with a WebSocket route and an HTTP route, for the handshake tests (tests/e2e/test_secure_by_default.py)."""

from __future__ import annotations

from fastapi import WebSocket

from bastion import Service

service = Service("ws-service", version="1.0.0")
v2 = service.version(2)


@v2.get("/notes")
async def list_notes() -> list[str]:
    return ["first"]


@v2.websocket("/notes/live")
async def live_notes(websocket: WebSocket) -> None:
    await websocket.accept()
    text = await websocket.receive_text()
    await websocket.send_text(f"echo: {text}")
    await websocket.close()
