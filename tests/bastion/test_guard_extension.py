"""A capability written against the public extension API only: one guard, one ``service.use``, three protocols.

``TenantGuard`` below imports nothing but ``bastion``: it requires an ``x-tenant`` header (HTTP, WebSocket) or
metadata entry (gRPC) and exempts ``/public``. Plugged in with ``service.use(Slot.POLICY, TenantGuard())``, it
guards HTTP requests, WebSocket handshakes and gRPC calls alike, and Bastion's own endpoints (``/health``, gRPC
health) pass it, as they pass every guard.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1 import health_grpc, health_pb2
from starlette.websockets import WebSocket

from bastion import BastionError, Exemptions, Guard, Service, Slot, load_settings
from bastion.testing import AsyncServiceClient
from bastion.types import Message, Scope
from bastion_core.testing import free_port
from examples.documents_api.grpc_service import DocumentService
from examples.documents_api.proto.documents.v1 import documents_grpc
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.store import seeded_store


class TenantMissing(BastionError):
    status, code, message, grpc_status = 403, "TENANT_REQUIRED", "An x-tenant header is required", "PERMISSION_DENIED"


class TenantGuard:
    """The whole capability: its exemptions as data and one check for every connection."""

    exemptions = Exemptions(public_paths=("/public",))

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def check(self, scope: Scope) -> None:
        tenant = next((value for name, value in scope["headers"] if name == b"x-tenant"), None)
        if tenant is None:
            raise TenantMissing()
        self.seen.append((scope["type"], tenant.decode()))


def tenant_service(guard: TenantGuard) -> Service:
    service = Service("tenants")
    v1 = service.version(1)
    v1.get("/things")(lambda: {"ok": True})

    @v1.websocket("/feed")
    async def feed(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    service.add_grpc_service(DocumentService(seeded_store()))
    service.use(Slot.POLICY, guard)
    return service


@pytest.fixture
def guard() -> TenantGuard:
    return TenantGuard()


@pytest.fixture
def grpc_port() -> int:
    return free_port()


@pytest.fixture
async def client(guard: TenantGuard, grpc_port: int) -> AsyncIterator[AsyncServiceClient]:
    settings = load_settings(
        environ={
            "SERVICE_TOKEN_ENABLED": "false",
            "SERVICE_GRPC_ENABLED": "true",
            "SERVICE_GRPC_USE_SEPARATE_PORT": "true",
            "SERVICE_GRPC_PORT": str(grpc_port),
        }
    )
    async with AsyncServiceClient(tenant_service(guard), settings=settings) as started:
        yield started


def test_the_test_capability_is_a_guard() -> None:
    assert isinstance(TenantGuard(), Guard)


async def test_http_requests_are_guarded(client: AsyncServiceClient, guard: TenantGuard) -> None:
    refused = await client.get("/api/v1/things")
    assert refused.status_code == 403
    assert refused.json() == {"error": "An x-tenant header is required", "code": "TENANT_REQUIRED", "status": 403}
    allowed = await client.get("/api/v1/things", headers={"x-tenant": "acme"})
    assert allowed.status_code == 200
    assert (await client.get("/health")).status_code == 200  # Bastion's own endpoints pass every guard
    assert (await client.get("/public/anything")).status_code == 404  # exempt: the dispatcher answers
    assert guard.seen == [("http", "acme")]


async def handshake(client: AsyncServiceClient, headers: list[tuple[bytes, bytes]]) -> list[Message]:
    """A WebSocket handshake straight through the app; what it sent back."""
    sent: list[Message] = []
    incoming = [{"type": "websocket.connect"}]

    async def receive() -> Message:
        return incoming.pop() if incoming else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": "/api/v1/feed",
        "raw_path": b"/api/v1/feed",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
        "subprotocols": [],
        "state": {},
        "extensions": {"websocket.http.response": {}},
    }
    await client.app(scope, receive, send)
    return sent


async def test_websocket_handshakes_are_guarded(client: AsyncServiceClient, guard: TenantGuard) -> None:
    refused = await handshake(client, [])
    assert refused[0]["type"] == "websocket.http.response.start"
    assert refused[0]["status"] == 403
    accepted = await handshake(client, [(b"x-tenant", b"acme")])
    assert accepted[0]["type"] == "websocket.accept"
    assert guard.seen == [("websocket", "acme")]


async def test_grpc_calls_are_guarded(client: AsyncServiceClient, guard: TenantGuard, grpc_port: int) -> None:
    channel = Channel("127.0.0.1", grpc_port)
    try:
        documents = documents_grpc.DocumentServiceStub(channel)
        with pytest.raises(GRPCError) as refused:
            await documents.ListDocuments(pb.ListDocumentsRequest(), timeout=10)
        assert refused.value.status is Status.PERMISSION_DENIED
        assert refused.value.message == "An x-tenant header is required"
        reply = await documents.ListDocuments(pb.ListDocumentsRequest(), metadata={"x-tenant": "acme"}, timeout=10)
        assert reply.items
        health = await health_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # gRPC health passes every guard
    finally:
        channel.close()
    assert guard.seen == [("grpc", "acme")]
