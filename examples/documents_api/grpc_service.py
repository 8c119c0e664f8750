"""``documents.v1.DocumentService`` over gRPC, backed by the same in-memory store as the HTTP API."""

from __future__ import annotations

import asyncio
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from bastion import NotFound
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1.documents_grpc import DocumentServiceBase
from examples.documents_api.store import Document, DocumentStore

PAGE_SIZE_DEFAULT = 20
PAGE_SIZE_MAX = 100
WATCH_INTERVAL_MAX_MS = 10_000

GET_DOCUMENT = "/documents.v1.DocumentService/GetDocument"


def to_message(doc: Document) -> pb.Document:
    return pb.Document(id=doc.id, owner_id=doc.owner_id, title=doc.title, content=doc.content)


def owner_of_request(request: Any) -> dict[str, object]:
    """Policy resource attributes for GetDocument: the owner named by the request, as in HTTP."""
    return {"owner_id": request.user_id, "user_id": request.user_id, "doc_id": request.doc_id}


class DocumentService(DocumentServiceBase):
    def __init__(self, store: DocumentStore) -> None:
        self.store = store

    async def ListDocuments(self, stream: Any) -> None:
        request = await stream.recv_message()
        if not 0 <= request.limit <= PAGE_SIZE_MAX:
            raise GRPCError(Status.INVALID_ARGUMENT, f"limit must be 0-{PAGE_SIZE_MAX}")
        items, next_cursor = self.store.page(after=request.cursor or None, limit=request.limit or PAGE_SIZE_DEFAULT)
        await stream.send_message(
            pb.ListDocumentsResponse(items=[to_message(doc) for doc in items], next_cursor=next_cursor or "")
        )

    async def GetDocument(self, stream: Any) -> None:
        request = await stream.recv_message()
        doc = self.store.get(request.user_id, request.doc_id)
        if doc is None:
            raise NotFound("Document not found")  # a Bastion error: the guard sends its gRPC status, NOT_FOUND
        await stream.send_message(to_message(doc))

    async def WatchDocuments(self, stream: Any) -> None:
        request = await stream.recv_message()
        if request.max_events < 0 or not 0 <= request.interval_ms <= WATCH_INTERVAL_MAX_MS:
            raise GRPCError(Status.INVALID_ARGUMENT, f"max_events >= 0 and interval_ms 0-{WATCH_INTERVAL_MAX_MS}")
        docs = self.store.all()
        if request.max_events:
            docs = docs[: request.max_events]
        for doc in docs:
            await stream.send_message(to_message(doc))
            if request.interval_ms:
                await asyncio.sleep(request.interval_ms / 1000)
