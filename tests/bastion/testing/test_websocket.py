"""``client.websocket_connect``: WebSocket routes through the whole pipeline, in-process, as Starlette's TestClient."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from bastion import Service
from bastion.testing import AsyncServiceClient, ServiceClient, WebSocketDenialResponse

POLICY = """
permit (principal, action == Action::"GET /api/v1/echo", resource) when { principal.roles.contains("chat") };
"""


def echo_service() -> Service:
    """``/echo`` answers each text with its upper case and each JSON with the same JSON, until the client closes."""
    service = Service("chat-api")
    v1 = service.version(1)

    @v1.websocket("/echo")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text", "").startswith("{"):
                await websocket.send_json({"echo": json.loads(message["text"])})
            else:
                await websocket.send_text(message["text"].upper())

    @v1.websocket("/bye")
    async def bye(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close(code=4000, reason="bye")

    return service


def test_a_round_trip_with_a_token() -> None:
    with ServiceClient(echo_service()) as client, client.as_user("alice").websocket_connect("/api/v1/echo") as ws:
        ws.send_text("hello")
        assert ws.receive_text() == "HELLO"
        ws.send_json({"n": 1})
        assert ws.receive_json() == {"echo": {"n": 1}}


def test_without_a_token_the_handshake_gets_401() -> None:
    with ServiceClient(echo_service()) as client:
        with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect("/api/v1/echo"):
            pytest.fail("the handshake was accepted")
        assert denied.value.status_code == 401
        assert denied.value.json()["code"] == "UNAUTHORIZED"


def test_the_policy_decides_the_upgrade(tmp_path: Path) -> None:
    policy = tmp_path / "policy.cedar"
    policy.write_text(POLICY)
    with ServiceClient(echo_service(), environ={"SERVICE_POLICY_POLICY_PATH": str(policy)}) as client:
        with pytest.raises(WebSocketDenialResponse) as denied, client.as_user("bob").websocket_connect("/api/v1/echo"):
            pytest.fail("the handshake was accepted")
        assert denied.value.status_code == 403
        with client.as_user("carol", roles=["chat"]).websocket_connect("/api/v1/echo") as ws:
            ws.send_text("ok")
            assert ws.receive_text() == "OK"


def test_a_close_from_the_app_is_a_disconnect_with_its_code() -> None:
    with ServiceClient(echo_service()) as client, client.as_user("alice").websocket_connect("/api/v1/bye") as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert (closed.value.code, closed.value.reason) == (4000, "bye")


def test_outside_with_the_client_refuses_to_connect() -> None:
    client = ServiceClient(echo_service())
    with pytest.raises(RuntimeError, match="the service is not running"):
        client.websocket_connect("/api/v1/echo")


async def test_the_async_client_round_trip() -> None:
    async with AsyncServiceClient(echo_service()) as client:
        async with client.as_user("alice").websocket_connect("/api/v1/echo") as ws:
            await ws.send_text("async")
            assert await ws.receive_text() == "ASYNC"
        with pytest.raises(WebSocketDenialResponse) as denied:
            async with client.websocket_connect("/api/v1/echo"):
                pytest.fail("the handshake was accepted")
        assert denied.value.status_code == 401
