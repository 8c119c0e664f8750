"""The reference example through the ASGI app: records, validation, paging, owner from the caller's sub."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import httpx

from bastion import Service, Slot
from bastion.types import SCOPE_CLAIMS, ASGIApp, Receive, Scope, Send
from examples.documents_api.api import register
from examples.documents_api.store import seeded_store


def example() -> Service:
    service = Service("documents-api", version="1.0.0")
    register(service, seeded_store())
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
