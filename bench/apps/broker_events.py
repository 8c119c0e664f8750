"""The broker rows' message and their two consumers' shared settings (bench/brokerload.py)."""

from __future__ import annotations

from pydantic import BaseModel

STREAM = "BENCH"
SUBJECT = "bench.events"
DURABLE = "bench"
BATCH = 64
"""Messages fetched (and handled concurrently) at once, by both consumers."""


class Event(BaseModel):
    id: int
    kind: str
    owner: str
    title: str


def payload(number: int) -> bytes:
    event = Event(id=number, kind="document.created", owner="alice", title=f"Document {number}")
    return event.model_dump_json().encode()
