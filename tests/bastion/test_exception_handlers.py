"""``@service.exception_handler`` and ``@v2.exception_handler``: domain exceptions answered in the error shape,
through the pipeline's outer steps."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import Request
from starlette.responses import JSONResponse

from bastion import BastionError, ConfigError, Service
from bastion.testing import AsyncServiceClient

ORIGIN = "https://app.example"


class DocumentLocked(Exception):
    def __init__(self, doc_id: str) -> None:
        super().__init__(doc_id)
        self.doc_id = doc_id


class ArchiveLocked(DocumentLocked):
    """A subclass: handled by its parent's handler."""


class Locked(BastionError):
    status, code, message, grpc_status = 423, "DOCUMENT_LOCKED", "Document is locked", "FAILED_PRECONDITION"


def locking_service() -> Service:
    """v1 and v2 both raise DocumentLocked (v2 also ArchiveLocked); the service's handler answers 423."""
    service = Service("locks")
    v1, v2 = service.version(1), service.version(2)

    @v1.get("/docs/{doc_id}")
    @v2.get("/docs/{doc_id}")
    async def get_doc(doc_id: str) -> None:
        raise DocumentLocked(doc_id)

    @v1.get("/archive/{doc_id}")
    async def get_archived(doc_id: str) -> None:
        raise ArchiveLocked(doc_id)

    @v1.get("/boom")
    async def boom() -> None:
        raise KeyError("secret")

    @service.exception_handler(DocumentLocked)
    def locked(request: Request, exc: DocumentLocked) -> Locked:
        return Locked(f"Document {exc.doc_id} is locked ({request.url.path})")

    return service


async def test_domain_exception_renders_the_handlers_error_with_pipeline_headers() -> None:
    environ = {"SERVICE_MIDDLEWARE_CORS_ALLOW_ORIGINS": ORIGIN}
    async with AsyncServiceClient(locking_service(), environ=environ) as client:
        response = await client.as_user("alice").get(
            "/api/v1/docs/d1", headers={"x-request-id": "req-1", "origin": ORIGIN}
        )
    assert (response.status_code, response.json()) == (
        423,
        {"error": "Document d1 is locked (/api/v1/docs/d1)", "code": "DOCUMENT_LOCKED", "status": 423},
    )
    assert [
        response.headers.get(name) for name in ("x-request-id", "x-content-type-options", "access-control-allow-origin")
    ] == [
        "req-1",
        "nosniff",
        ORIGIN,
    ]


async def test_subclass_of_a_handled_exception_uses_its_parents_handler() -> None:
    async with AsyncServiceClient(locking_service()) as client:
        response = await client.as_user("alice").get("/api/v1/archive/a1")
    assert (response.status_code, response.json()["code"]) == (423, "DOCUMENT_LOCKED")


async def test_version_handler_wins_for_its_routes_and_may_return_a_response() -> None:
    service = locking_service()

    @service.api.versions[2].exception_handler(DocumentLocked)
    async def locked_v2(request: Request, exc: DocumentLocked) -> JSONResponse:
        return JSONResponse({"locked": exc.doc_id}, status_code=409)

    async with AsyncServiceClient(service) as client:
        alice = client.as_user("alice")
        v1, v2 = await alice.get("/api/v1/docs/d1"), await alice.get("/api/v2/docs/d2")
    assert [(v1.status_code, v1.json()["code"]), (v2.status_code, v2.json())] == [
        (423, "DOCUMENT_LOCKED"),
        (409, {"locked": "d2"}),
    ]
    assert v2.headers["x-request-id"]


async def test_unhandled_exception_is_still_a_500() -> None:
    async with AsyncServiceClient(locking_service()) as client:
        response = await client.as_user("alice").get("/api/v1/boom")
    assert (response.status_code, response.json()["code"]) == (500, "INTERNAL_ERROR")


async def test_handler_returning_something_else_is_a_500() -> None:
    service = locking_service()

    @service.exception_handler(KeyError)
    def wrong(request: Request, exc: KeyError) -> Any:
        return {"not": "an error"}

    async with AsyncServiceClient(service) as client:
        response = await client.as_user("alice").get("/api/v1/boom")
    assert (response.status_code, response.json()["code"]) == (500, "INTERNAL_ERROR")


@pytest.mark.parametrize(
    ("exc_class", "handler", "message"),
    [
        pytest.param(
            "DocumentLocked",
            lambda request, exc: None,
            "exception_handler('DocumentLocked'): expected an Exception subclass",
            id="not-a-class",
        ),
        pytest.param(
            DocumentLocked,
            lambda exc: None,
            "exception_handler(DocumentLocked): <lambda>(exc) cannot be called with 2 positional arguments",
            id="one-argument",
        ),
    ],
)
def test_wrong_shaped_handler_is_refused_at_registration(exc_class: Any, handler: Any, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Service("x").exception_handler(exc_class)(handler)
    assert str(raised.value) == message


async def test_catch_all_handler_never_rewrites_the_pipelines_rejections() -> None:
    """A handler for Exception answers the domain's exceptions, not a 401 (nor a 403, 404, 422 ...)."""
    service = locking_service()

    @service.exception_handler(Exception)
    def everything(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"caught": type(exc).__name__}, status_code=200)

    async with AsyncServiceClient(service) as client:
        anonymous = await client.get("/api/v1/boom")
        boom = await client.as_user("alice").get("/api/v1/boom")
    assert [(anonymous.status_code, anonymous.json()["code"]), (boom.status_code, boom.json())] == [
        (401, "UNAUTHORIZED"),
        (200, {"caught": "KeyError"}),
    ]
