"""Routes that fail or stall on demand, in two versions with independent resilience layers, plus a gRPC method
that fails or stalls on demand (tests/e2e/test_resilience.py, tests/e2e/test_resilience_client_faults.py); routes
that read a JSON body and a raw body."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import HTTPException, Request
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from pydantic import BaseModel

from bastion import Service
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1.documents_grpc import DocumentServiceBase

FAIL_ON_DEMAND = 77  # ListDocuments with limit 77 fails with INTERNAL (a server-side failure)
STALL_ON_DEMAND = 88  # ListDocuments with limit 88 answers after 30 s (for clients that give up first)


class Note(BaseModel):
    title: str
    tags: list[str] = []


class FlakyDocuments(DocumentServiceBase):  # type: ignore[misc]
    async def ListDocuments(self, stream: Any) -> None:
        request = await stream.recv_message()
        if request.limit == FAIL_ON_DEMAND:
            raise GRPCError(Status.INTERNAL, "failing on demand")
        if request.limit == STALL_ON_DEMAND:
            await asyncio.sleep(30)
        if request.limit > 100:
            raise GRPCError(Status.INVALID_ARGUMENT, "limit must be 0-100")  # the caller's error
        await stream.send_message(pb.ListDocumentsResponse())

    async def GetDocument(self, stream: Any) -> None:
        raise GRPCError(Status.UNIMPLEMENTED)

    async def WatchDocuments(self, stream: Any) -> None:
        raise GRPCError(Status.UNIMPLEMENTED)


service = Service("resilience-service", version="1.0.0")
for number in (1, 2):
    version = service.version(number)

    @version.get("/flaky")
    async def flaky(status: int = 200) -> dict[str, int]:
        if status >= 400:
            raise HTTPException(status_code=status)
        return {"status": status}

    @version.get("/slow")
    async def slow(secs: float = 0.5) -> dict[str, float]:
        await asyncio.sleep(secs)
        return {"slept": secs}

    @version.post("/notes")
    async def add_note(note: Note) -> Note:
        return note

    @version.post("/uploads")
    async def upload(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}


service.add_grpc_service(FlakyDocuments())
service.use_resilience(version=1)
service.use_resilience(version=2)
service.use_resilience(paths=["/documents.v1.DocumentService/*"], name="documents-grpc")
