"""The `nats-kill` scenario's service: publishes over HTTP with JetStream's ack, consumes with a durable consumer.

``POST /api/v1/events`` with ``{"id": N}`` publishes it on ``reliability.events`` with ``ack=True``: 200 with the
stream's sequence once the stream stored it, 503 (``BROKER_UNAVAILABLE``) when the broker is not connected or the
ack did not come. The durable consumer appends ``<id> <unix time>`` to the file named by ``RELIABILITY_HANDLED_FILE``
before it returns (so before the ack): a line per delivery, so a redelivered message shows twice.

Run: ``SERVICE_BROKER_URL=nats://... RELIABILITY_HANDLED_FILE=... bastion run reliability.broker_app:service``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

from fastapi import Depends
from pydantic import BaseModel

from bastion import Service
from bastion.broker import Broker, current_broker

STREAM = "RELIABILITY"
SUBJECT = "reliability.events"
DURABLE = "reliability"
HANDLED_FILE_ENV = "RELIABILITY_HANDLED_FILE"


class Event(BaseModel):
    id: int


service = Service("reliability-broker")
v1 = service.version(1)
service.stream(STREAM, subjects=[SUBJECT])


@service.consume(SUBJECT, durable=DURABLE, stream=STREAM, concurrency=16, ack_wait=5)
async def handle(event: Event) -> None:
    _record(event.id)


def _record(number: int) -> None:
    """One short line appended to a local file: quick enough to do on the event loop."""
    with Path(os.environ[HANDLED_FILE_ENV]).open("a") as handled:
        handled.write(f"{number} {time.time():.6f}\n")


@v1.post("/events")
async def publish(event: Event, broker: Annotated[Broker, Depends(current_broker)]) -> dict[str, int | None]:
    return {"sequence": await broker.publish(SUBJECT, event, ack=True)}
