"""A FastAPI user's test file, run against Bastion: overrides, a WebSocket, a consumer (docs/testing.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.websockets import WebSocketDisconnect

from bastion.testing import ServiceClient, WebSocketDenialResponse
from examples.notes_app.app import Note, Store, get_store, service

CONFIG = Path(__file__).parents[2] / "examples" / "notes_app" / "service.toml"


class FakeStore(Store):
    def __init__(self) -> None:
        super().__init__()
        self.notes = {7: Note(id=7, owner="bob", text="from the fake")}


@pytest.fixture
def client() -> Iterator[ServiceClient]:
    with ServiceClient(service, config=CONFIG) as client:  # runs the start-up, as `with TestClient(app)` does
        yield client
    client.app.dependency_overrides.clear()


def test_read_a_note_from_an_overridden_store(client: ServiceClient) -> None:
    client.app.dependency_overrides[get_store] = FakeStore
    response = client.as_user("alice", roles=["reader"]).get("/api/v1/notes/7")
    assert response.status_code == 200
    assert response.json() == {"id": 7, "owner": "bob", "text": "from the fake"}


def test_a_missing_note_is_404(client: ServiceClient) -> None:
    client.app.dependency_overrides[get_store] = Store
    response = client.as_user("alice", roles=["reader"]).get("/api/v1/notes/1")
    assert response.status_code == 404
    # HTTPException renders in the service's error shape (the spec's), not FastAPI's {"detail": ...}
    assert response.json() == {"error": "Note not found", "code": "NOT_FOUND", "status": 404}


def test_without_a_token_is_401(client: ServiceClient) -> None:
    assert client.get("/api/v1/notes/7").status_code == 401


def test_websocket_echo(client: ServiceClient) -> None:
    with client.as_user("alice", roles=["reader"]).websocket_connect("/api/v1/notes/echo") as websocket:
        websocket.send_text("hello")
        assert websocket.receive_json() == {"echo": "hello"}


def test_websocket_without_the_role_is_refused(client: ServiceClient) -> None:
    bob = client.as_user("bob", roles=[])
    with pytest.raises(WebSocketDenialResponse) as refused, bob.websocket_connect("/api/v1/notes/echo"):
        pass
    assert refused.value.status_code == 403
    assert isinstance(refused.value, WebSocketDisconnect)


def test_a_created_note_is_indexed_by_the_consumer(client: ServiceClient) -> None:
    client.app.dependency_overrides[get_store] = Store  # a fresh, empty store for this test
    response = client.as_user("alice", roles=["writer"]).post("/api/v1/notes", json={"text": "buy more milk"})
    assert response.status_code == 201
    assert response.json() == {"id": 1, "owner": "alice", "text": "buy more milk"}
    [created] = client.broker.published("notes.created")
    assert created.json() == {"id": 1, "owner": "alice", "text": "buy more milk"}
    [indexed] = client.broker.published("notes.indexed")
    assert indexed.json() == {"id": 1, "words": 3}
