"""The reference example through the ASGI app: records, validation, paging, owner from the caller's sub."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import httpx

from bastion import Service, Slot
from bastion.types import SCOPE_CLAIMS, ASGIApp, Receive, Scope, Send
from examples.documents_api.api import register
from examples.documents_api.store import DocumentStore, seeded_store


def example(store: DocumentStore | None = None) -> Service:
    service = Service("documents-api", version="1.0.0")
    register(service, store if store is not None else seeded_store())
    return service


async def test_v1_and_v2_serve_the_same_documents(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    client = asgi_client(example())
    v1 = (await client.get("/api/v1/documents")).json()
    v2 = (await client.get("/api/v2/documents")).json()
    assert v1 == v2["items"]
    assert v2["next_cursor"] is None


async def test_admin_users_records(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    users = (await asgi_client(example()).get("/api/v2/admin/users")).json()
    assert {"id": "admin", "username": "Administrator", "roles": ["admin"]} in users
    assert all(set(user) == {"id", "username", "roles"} for user in users)


async def test_post_validates_the_record(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    client = asgi_client(example())
    for body in (
        {"title": "x"},
        {"title": "", "content": "c"},
        {"title": "t", "content": "c", "id": "../etc"},
        [1],
    ):
        response = await client.post("/api/v2/documents", json=body)
        assert response.status_code == 422, body
        assert response.json()["code"] == "VALIDATION_ERROR"


async def test_post_without_auth_keeps_the_given_owner(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    created = (
        await asgi_client(example()).post("/api/v2/documents", json={"title": "t", "content": "c", "owner_id": "carol"})
    ).json()
    assert created["owner_id"] == "carol"
    assert created["id"].startswith("doc-")


async def test_post_sets_owner_to_the_callers_sub(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    def fake_auth(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            scope[SCOPE_CLAIMS] = SimpleNamespace(sub="alice")
            await app(scope, receive, send)

        return middleware

    service = example()
    service.use(Slot.TOKEN_AUTH, fake_auth)
    created = (
        await asgi_client(service).post("/api/v2/documents", json={"title": "t", "content": "c", "owner_id": "mallory"})
    ).json()
    assert created["owner_id"] == "alice"


async def test_pages_walk_every_document_once(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    client = asgi_client(example())
    for n in range(5):
        await client.post("/api/v2/documents", json={"title": f"t{n}", "content": "c"})
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/api/v2/documents", params=params)).json()
        seen.extend(doc["id"] for doc in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 8


async def test_other_owners_path_is_404(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    response = await asgi_client(example()).get("/api/v2/documents/bob/doc-1")
    assert response.status_code == 404
    assert response.json() == {"error": "Document not found", "code": "NOT_FOUND", "status": 404}


async def test_a_create_never_replaces_a_document(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    """POST naming an existing id (alice's doc-1) is 409 and leaves the document as it was: a create by one caller
    must not overwrite another owner's document (PUT replaces, and the policy checks its owner)."""
    client = asgi_client(example())
    response = await client.post("/api/v2/documents", json={"id": "doc-1", "title": "mine now", "content": "x"})
    assert response.status_code == 409
    assert response.json() == {"error": "A document with this id exists", "code": "DOCUMENT_EXISTS", "status": 409}
    kept = (await client.get("/api/v2/documents/alice/doc-1")).json()
    assert (kept["owner_id"], kept["title"]) == ("alice", "Quarterly plan")


async def test_the_store_is_bounded_by_count(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    """At max_documents a create is 409 DOCUMENT_STORE_FULL (a 4xx: nothing for the breaker); a delete makes room."""
    client = asgi_client(example(seeded_with(DocumentStore(max_documents=4))))
    assert (await client.post("/api/v2/documents", json={"title": "4th", "content": "c"})).status_code == 200
    full = await client.post("/api/v2/documents", json={"title": "5th", "content": "c"})
    assert full.status_code == 409
    assert full.json() == {
        "error": "The document store is full: delete documents first",
        "code": "DOCUMENT_STORE_FULL",
        "status": 409,
    }
    assert len((await client.get("/api/v1/documents")).json()) == 4
    assert (await client.delete("/api/v2/documents/bob/doc-3")).status_code == 200
    assert (await client.post("/api/v2/documents", json={"title": "5th", "content": "c"})).status_code == 200


async def test_the_store_is_bounded_by_characters(asgi_client: Callable[..., httpx.AsyncClient]) -> None:
    """Titles and contents together stay within max_chars: a create or a replacement past it is 409, a smaller
    replacement is taken."""
    store = seeded_with(DocumentStore(max_chars=200))
    used = sum(len(doc.title) + len(doc.content) for doc in store.all())
    client = asgi_client(example(store))
    room = 200 - used
    too_big = {"title": "t", "content": "c" * room}
    assert (await client.post("/api/v2/documents", json=too_big)).json()["code"] == "DOCUMENT_STORE_FULL"
    grown = await client.put("/api/v2/documents/bob/doc-3", json={"title": "Notes", "content": "n" * (room + 30)})
    assert grown.status_code == 409
    assert grown.json()["code"] == "DOCUMENT_STORE_FULL"
    fits = {"title": "t", "content": "c" * (room - 1)}
    assert (await client.post("/api/v2/documents", json=fits)).status_code == 200
    shrunk = await client.put("/api/v2/documents/bob/doc-3", json={"title": "N", "content": ""})
    assert shrunk.status_code == 200
    assert (await client.post("/api/v2/documents", json={"title": "t", "content": "c" * 10})).status_code == 200


def seeded_with(store: DocumentStore) -> DocumentStore:
    """``store`` holding seeded_store()'s three documents (alice's doc-1 and doc-2, bob's doc-3)."""
    for doc in seeded_store().all():
        store.put(doc)
    return store
