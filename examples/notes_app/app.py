"""A small notes service written the FastAPI way: a store behind a dependency, a WebSocket route, a consumer.

docs/testing.md ("Coming from FastAPI") shows it with its test file, tests/examples/test_notes_app.py, which
runs with no server: the store is overridden, the WebSocket and the broker run in-process.

    bastion dev-keys --dir examples/notes_app/keys
    SERVICE_BROKER_URL=nats://127.0.0.1:4222 bastion run examples.notes_app.app:service \\
        --config examples/notes_app/service.toml
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, WebSocket
from pydantic import BaseModel

from bastion import Claims, Service, current_claims
from bastion.broker import Broker, current_broker


class NewNote(BaseModel):
    text: str


class Note(BaseModel):
    id: int
    owner: str | None  # the token's sub
    text: str


class Store:
    """Where notes live (a database in a real service; a dict here)."""

    def __init__(self) -> None:
        self.notes: dict[int, Note] = {}

    def add(self, owner: str | None, text: str) -> Note:
        note = Note(id=len(self.notes) + 1, owner=owner, text=text)
        self.notes[note.id] = note
        return note

    def get(self, note_id: int) -> Note | None:
        return self.notes.get(note_id)


STORE = Store()


def get_store() -> Store:
    return STORE


service = Service("notes", version="1.0.0")
service.stream("NOTES", subjects=["notes.>"])
service.stream("DEAD", subjects=["deadletter.>"])  # keeps the dead letters of the consumer below
v1 = service.version(1)


@v1.post("/notes", status_code=201)
async def create_note(
    new: NewNote,
    store: Annotated[Store, Depends(get_store)],
    claims: Annotated[Claims, Depends(current_claims)],
    broker: Annotated[Broker, Depends(current_broker)],
) -> Note:
    note = store.add(claims.sub, new.text)
    await broker.publish("notes.created", note)
    return note


@v1.get("/notes/{note_id}")
async def read_note(note_id: int, store: Annotated[Store, Depends(get_store)]) -> Note:
    note = store.get(note_id)
    if note is None:
        raise HTTPException(status_code=404, detail="Note not found")
    return note


@v1.websocket("/notes/echo")
async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    while True:
        text = await websocket.receive_text()
        await websocket.send_json({"echo": text})


# A durable consumer: every created note is indexed once (return -> ack; raise -> nak and redelivery).
@service.consume("notes.created", durable="indexer", stream="NOTES")
async def index(note: Note, broker: Broker) -> None:
    await broker.publish("notes.indexed", {"id": note.id, "words": len(note.text.split())})
