"""The documents and admin-users API of the spec, in two versions: v1 (deprecated) and v2 (paged list)."""

from __future__ import annotations

from typing import Annotated

import structlog
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from bastion import BastionError, NotFound, Service
from bastion.broker import Broker, optional_broker
from bastion.errors import BrokerUnavailable
from bastion.types import SCOPE_CLAIMS
from examples.documents_api.store import USERS, Document, DocumentStore, IdTaken, StoreFull

PAGE_SIZE_DEFAULT = 20
PAGE_SIZE_MAX = 100
DOCUMENT_CREATED = "documents.created"

log = structlog.get_logger("documents")


class DocumentExists(BastionError):
    """A create naming the ``id`` of a document that exists: it is replaced with ``PUT``, by its owner or an admin."""

    status, code, message, grpc_status = 409, "DOCUMENT_EXISTS", "A document with this id exists", "ALREADY_EXISTS"


class DocumentStoreFull(BastionError):
    """The example's in-memory store is at its bound (examples/documents_api/store.py). A 4xx, not a 5xx: the
    service is not failing, and a 5xx would count against the resilience layer's breaker."""

    status, code, message, grpc_status = (
        409,
        "DOCUMENT_STORE_FULL",
        "The document store is full: delete documents first",
        "RESOURCE_EXHAUSTED",
    )


STORE_FULL = {"description": "The example's in-memory store is full (DOCUMENT_STORE_FULL)."}
CONFLICTS = {"description": "The id is taken (DOCUMENT_EXISTS) or the store is full (DOCUMENT_STORE_FULL)."}


class DocumentRecord(BaseModel):
    """A document as the API returns it."""

    id: str
    owner_id: str
    title: str
    content: str


class DocumentIn(BaseModel):
    """A document as clients send it; ``id`` and ``owner_id`` are optional on create."""

    model_config = ConfigDict(extra="ignore")

    id: Annotated[str | None, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")] = None
    owner_id: Annotated[str | None, Field(min_length=1, max_length=128)] = None
    title: Annotated[str, Field(min_length=1, max_length=200)]
    content: Annotated[str, Field(max_length=100_000)]


class DocumentCreated(BaseModel):
    """The event published on ``documents.created`` (docs/broker.md) when a broker is configured."""

    id: str
    owner_id: str
    title: str


class UserRecord(BaseModel):
    id: str
    username: str
    roles: list[str]


class DocumentPage(BaseModel):
    """v2's paged list."""

    items: list[DocumentRecord]
    next_cursor: str | None


def caller_sub(request: Request) -> str | None:
    """The authenticated caller's ``sub`` when token auth put claims in the scope, else ``None``."""
    claims = request.scope.get(SCOPE_CLAIMS)
    return getattr(claims, "sub", None)


def document_routes(store: DocumentStore) -> APIRouter:
    """The routes both versions share (everything but the list)."""
    router = APIRouter()

    @router.post("/documents", response_model=DocumentRecord, responses={409: CONFLICTS})
    async def create_document(
        body: DocumentIn, request: Request, broker: Annotated[Broker | None, Depends(optional_broker)]
    ) -> dict[str, str]:
        owner = caller_sub(request) or body.owner_id or "anonymous"
        doc_id = body.id or store.new_id()
        try:
            doc = store.add(Document(id=doc_id, owner_id=owner, title=body.title, content=body.content))
        except IdTaken:
            raise DocumentExists() from None
        except StoreFull:
            raise DocumentStoreFull() from None
        if broker is not None:
            event = DocumentCreated(id=doc.id, owner_id=doc.owner_id, title=doc.title)
            try:
                await broker.publish(DOCUMENT_CREATED, event)
            except BrokerUnavailable:
                # The document is stored; the event is best effort here (an outbox would make it durable).
                log.warning("document_event_not_published", subject=DOCUMENT_CREATED, document_id=doc.id)
        return doc.as_dict()

    @router.get("/documents/{user_id}/{doc_id}", response_model=DocumentRecord)
    async def get_document(user_id: str, doc_id: str) -> dict[str, str]:
        doc = store.get(user_id, doc_id)
        if doc is None:
            raise NotFound("Document not found")
        return doc.as_dict()

    @router.put("/documents/{user_id}/{doc_id}", response_model=DocumentRecord, responses={409: STORE_FULL})
    async def replace_document(user_id: str, doc_id: str, body: DocumentIn) -> dict[str, str]:
        if store.get(user_id, doc_id) is None:
            raise NotFound("Document not found")
        try:
            doc = store.put(Document(id=doc_id, owner_id=user_id, title=body.title, content=body.content))
        except StoreFull:
            raise DocumentStoreFull() from None
        return doc.as_dict()

    @router.delete("/documents/{user_id}/{doc_id}", response_model=DocumentRecord)
    async def delete_document(user_id: str, doc_id: str) -> dict[str, str]:
        doc = store.delete(user_id, doc_id)
        if doc is None:
            raise NotFound("Document not found")
        return doc.as_dict()

    @router.get("/admin/users", response_model=list[UserRecord])
    async def list_users() -> list[dict[str, object]]:
        return [user.as_dict() for user in USERS]

    return router


def owner_from_path(scope: object, params: dict[str, object]) -> dict[str, object]:
    """Resource attributes for the document routes: ``owner_id`` is the ``user_id`` path segment."""
    return {"owner_id": params["user_id"]}


def register(service: Service, store: DocumentStore) -> None:
    """Add v1 (deprecated in favour of v2) and v2 to ``service``."""
    v1 = service.version(1)
    v2 = service.version(2)

    @v1.get("/documents", response_model=list[DocumentRecord])
    async def list_documents_v1() -> list[dict[str, str]]:
        return [doc.as_dict() for doc in store.all()]

    @v2.get("/documents", response_model=DocumentPage)
    async def list_documents_v2(
        limit: Annotated[int, Query(ge=1, le=PAGE_SIZE_MAX)] = PAGE_SIZE_DEFAULT,
        cursor: Annotated[str | None, Query(max_length=128)] = None,
    ) -> dict[str, object]:
        items, next_cursor = store.page(after=cursor, limit=limit)
        return {"items": [doc.as_dict() for doc in items], "next_cursor": next_cursor}

    shared = document_routes(store)
    v1.include_router(shared)
    v2.include_router(shared)
    for version in (1, 2):
        # The policies compare the caller's sub with the document owner, which the path names.
        service.resource_extractor(f"/api/v{version}/documents/{{user_id}}/{{doc_id}}", attributes={"owner_id": str})(
            owner_from_path
        )
    service.deprecate(1, replacement=2, sunset="2027-06-30T00:00:00Z", message="v2 pages the document list.")
