"""A service written with FastAPI habits, for process-level tests: sync hooks and checks, an extractor that finds
no resource, a domain exception with its handler, over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Request

from bastion import BastionError, Service
from examples.documents_api.grpc_service import GET_DOCUMENT, DocumentService
from examples.documents_api.store import seeded_store

OWNERS = {"doc-1": "alice", "locked": "alice"}
POLICY = (
    'permit(principal, action, resource) when { context.path == "/api/v1/greeting" || '
    "(resource has owner_id && resource.owner_id == principal.sub) };\n"
)


class DocumentLocked(Exception):
    """The domain's own exception: knows nothing of HTTP."""


class Locked(BastionError):
    """What the service answers for DocumentLocked."""

    status, code, message, grpc_status = 423, "DOCUMENT_LOCKED", "Document is locked", "FAILED_PRECONDITION"


class LockingDocuments(DocumentService):
    async def GetDocument(self, stream: Any) -> None:
        request = await stream.recv_message()
        raise DocumentLocked(request.doc_id)


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[dict[str, str]]:
    yield {"greeting": "hello from lifespan"}


service = Service("habits", version="0.0.1", lifespan=lifespan)
v1 = service.version(1)
service.add_grpc_service(LockingDocuments(seeded_store()))
started: list[str] = []


@service.on_startup
def start() -> None:
    started.append("started")


service.add_readiness_check("started", lambda: bool(started))


@v1.get("/greeting")
async def greeting(request: Request) -> dict[str, str]:
    return {"greeting": request.state.greeting}


@v1.get("/docs/{doc_id}")
async def get_doc(doc_id: str) -> dict[str, str]:
    raise DocumentLocked(doc_id)


@service.resource_extractor("/api/v1/docs/{doc_id}", attributes={"owner_id": str})
def owner(scope: Any, params: dict[str, Any]) -> dict[str, str] | None:
    found = OWNERS.get(params["doc_id"])
    return None if found is None else {"owner_id": found}


@service.grpc_resource_extractor(GET_DOCUMENT, attributes={"owner_id": str})
def grpc_owner(request: Any) -> dict[str, str] | None:
    found = OWNERS.get(request.doc_id)
    return None if found is None else {"owner_id": found}


@service.exception_handler(DocumentLocked)
def locked(request: Any, exc: DocumentLocked) -> Locked:
    return Locked(f"Document {exc} is locked ({request.url.path})")


__all__ = ["service"]
