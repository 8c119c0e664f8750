"""Route resolution: full templates and path parameters, known before auth and policy run."""

from __future__ import annotations

from fastapi import APIRouter

from bastion.routing._resolve import RouteEntry, RouteTable


def table() -> RouteTable:
    router = APIRouter()
    inner = APIRouter()

    @inner.get("/documents/{user_id}/{doc_id}")
    async def get_document(user_id: str, doc_id: str) -> None: ...

    @inner.put("/documents/{user_id}/{doc_id}")
    async def put_document(user_id: str, doc_id: str) -> None: ...

    @inner.get("/items/{item_id:int}")
    async def item(item_id: int) -> None: ...

    router.include_router(inner, prefix="/api/v1")
    return RouteTable(RouteTable.from_router(router, version=1))


def test_full_template_and_params() -> None:
    resolved = table().resolve("GET", "/api/v1/documents/alice/doc-1")
    assert resolved is not None
    assert resolved.template == "/api/v1/documents/{user_id}/{doc_id}"
    assert resolved.path_params == {"user_id": "alice", "doc_id": "doc-1"}
    assert resolved.version == 1
    assert resolved.method_allowed


def test_second_method_on_same_template_resolves() -> None:
    resolved = table().resolve("PUT", "/api/v1/documents/alice/doc-1")
    assert resolved is not None and resolved.method_allowed


def test_other_method_is_a_partial_match_with_allowed_methods() -> None:
    resolved = table().resolve("DELETE", "/api/v1/documents/alice/doc-1")
    assert resolved is not None
    assert not resolved.method_allowed
    assert resolved.allowed_methods == {"GET", "PUT"}


def test_convertors_apply() -> None:
    resolved = table().resolve("GET", "/api/v1/items/42")
    assert resolved is not None and resolved.path_params == {"item_id": 42}
    assert table().resolve("GET", "/api/v1/items/abc") is None


def test_unknown_path_is_none() -> None:
    assert table().resolve("GET", "/api/v1/documents/alice") is None


def test_built_in_entries_carry_their_handler() -> None:
    async def handler(scope: object, receive: object, send: object) -> None: ...

    entry = RouteEntry(path="/api/v1/openapi.json", methods=frozenset({"GET"}), version=1, handler=handler)  # type: ignore[arg-type]
    resolved = RouteTable([entry]).resolve("GET", "/api/v1/openapi.json")
    assert resolved is not None and resolved.entry.handler is handler
