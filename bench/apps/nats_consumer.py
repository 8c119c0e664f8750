"""The peer: the same durable pull consumer written with plain nats-py (fetch a batch, validate, ack each).

``python bench/apps/nats_consumer.py nats://127.0.0.1:4222``; runs until killed.
"""

from __future__ import annotations

import asyncio
import sys

import nats
import uvloop
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig

from bench.apps.broker_events import BATCH, DURABLE, STREAM, SUBJECT, Event


async def handle(msg: nats.aio.msg.Msg) -> None:
    Event.model_validate_json(msg.data)
    await msg.ack()


async def main(url: str) -> None:
    nc = await nats.connect(url)
    subscription = await nc.jetstream().pull_subscribe(
        SUBJECT, durable=DURABLE, stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
    )
    while True:
        try:
            messages = await subscription.fetch(batch=BATCH, timeout=1)
        except (TimeoutError, NatsTimeoutError):
            continue
        await asyncio.gather(*(handle(msg) for msg in messages))


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1]))
