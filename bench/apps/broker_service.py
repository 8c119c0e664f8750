"""The framework's consumer: a durable consumer declared on a Bastion service, run by ``bastion run``.

It validates each message into the pydantic model and acks it, as the plain nats-py consumer does.
"""

from __future__ import annotations

from bastion import Service
from bench.apps.broker_events import BATCH, DURABLE, STREAM, SUBJECT, Event

service = Service("bench-broker")
service.version(1)


@service.consume(SUBJECT, durable=DURABLE, stream=STREAM, concurrency=BATCH)
async def handle(event: Event) -> None:
    del event
