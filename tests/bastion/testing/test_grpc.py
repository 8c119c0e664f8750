"""``client.grpc(Stub)``: gRPC methods called in-process through the app's own guard, with no server and no port."""

from __future__ import annotations

from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from bastion import Service
from bastion.testing import AsyncServiceClient, ServiceClient
from examples.documents_api import create_service
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1.documents_grpc import DocumentServiceStub
from examples.documents_api.store import Document, DocumentStore

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "documents_api" / "config.toml"
NO_HOT_RELOAD = {"SERVICE_POLICY_HOT_RELOAD": "false"}


def documents() -> Service:
    store = DocumentStore()
    store.put(Document(id="d1", owner_id="alice", title="Plan", content="Ship it."))
    return create_service(store)


def bearer(client: ServiceClient | AsyncServiceClient, sub: str) -> dict[str, str]:
    return {"authorization": f"Bearer {client.token(sub)}"}


def test_a_round_trip_with_a_token() -> None:
    with ServiceClient(documents(), config=CONFIG, environ=NO_HOT_RELOAD) as client:
        stub = client.grpc(DocumentServiceStub)
        reply = stub.GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="d1"), metadata=bearer(client, "alice"))
        assert (reply.id, reply.title) == ("d1", "Plan")


def test_without_a_token_the_call_is_unauthenticated() -> None:
    with ServiceClient(documents(), config=CONFIG, environ=NO_HOT_RELOAD) as client:
        with pytest.raises(GRPCError) as refused:
            client.grpc(DocumentServiceStub).GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="d1"))
        assert refused.value.status is Status.UNAUTHENTICATED


def test_the_policy_and_the_handler_errors_keep_their_status() -> None:
    with ServiceClient(documents(), config=CONFIG, environ=NO_HOT_RELOAD) as client:
        stub = client.grpc(DocumentServiceStub)
        with pytest.raises(GRPCError) as denied:
            stub.GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="d1"), metadata=bearer(client, "bob"))
        assert denied.value.status is Status.PERMISSION_DENIED
        with pytest.raises(GRPCError) as missing:
            stub.GetDocument(pb.GetDocumentRequest(user_id="alice", doc_id="nope"), metadata=bearer(client, "alice"))
        assert (missing.value.status, missing.value.message) == (Status.NOT_FOUND, "Document not found")


async def test_the_async_client_gives_the_stub_itself() -> None:
    async with AsyncServiceClient(documents(), config=CONFIG, environ=NO_HOT_RELOAD) as client:
        stub = client.grpc(DocumentServiceStub)
        request = pb.WatchDocumentsRequest(max_events=1)
        async with stub.WatchDocuments.open(metadata=bearer(client, "alice")) as stream:
            await stream.send_message(request, end=True)
            replies = [reply.id async for reply in stream]
        assert replies == ["d1"]
        assert stream.initial_metadata is not None and "x-request-id" in stream.initial_metadata


def test_a_service_without_grpc_is_named() -> None:
    service = Service("http-only")
    service.version(1)
    with ServiceClient(service) as client, pytest.raises(RuntimeError, match="the service serves no gRPC"):
        client.grpc(DocumentServiceStub)
