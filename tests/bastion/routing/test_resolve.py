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


def ordered_table() -> RouteTable:
    """Static and parameterised routes interleaved: the first route in registration order must win."""
    entries = [
        RouteEntry(path="/items/special", methods=frozenset({"GET"}), version=1, name="special-get"),
        RouteEntry(path="/items/{item_id}", methods=frozenset({"POST", "GET"}), version=1, name="any-item"),
        RouteEntry(path="/items/special", methods=frozenset({"POST", "DELETE"}), version=1, name="special-post"),
        RouteEntry(path="/things/{id}", methods=frozenset({"GET"}), version=1, name="any-thing"),
        RouteEntry(path="/things/fixed", methods=frozenset({"GET", "PUT"}), version=1, name="fixed-thing"),
        RouteEntry(path="/plain", methods=frozenset({"GET"}), version=1, name="plain"),
        RouteEntry(path="/plain", methods=frozenset({"PUT"}), version=1, name="plain-put"),
    ]
    return RouteTable(entries)


def scan(table: RouteTable, method: str, path: str) -> tuple[str | None, bool, frozenset[str]] | None:
    """The ordered scan alone (no static index): the reference answer."""
    reference = RouteTable(table.entries)
    reference.static = {}
    resolved = reference.resolve(method, path)
    return None if resolved is None else (resolved.entry.name, resolved.method_allowed, resolved.allowed_methods)


def test_the_static_index_answers_exactly_as_the_ordered_scan() -> None:
    table = ordered_table()
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        for path in ("/items/special", "/items/7", "/things/fixed", "/things/9", "/plain", "/nothing"):
            resolved = table.resolve(method, path)
            got = None if resolved is None else (resolved.entry.name, resolved.method_allowed, resolved.allowed_methods)
            assert got == scan(table, method, path), (method, path)
    post = table.resolve("POST", "/items/special")
    assert post is not None and post.entry.name == "any-item"  # registered before the second static route
    assert set(table.static) == {"/items/special", "/plain"}  # /things/fixed comes after a pattern matching it
