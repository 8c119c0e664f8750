"""A broker killed and restarted under load: every message a stream acknowledged before (or after) the outage
is consumed; a publish during the outage fails loudly instead of vanishing."""

from __future__ import annotations

import asyncio
import contextlib

import nats
from nats.aio.client import Client

from bastion.errors import BrokerUnavailable
from tests.bastion.broker.conftest import broker_settings, eventually, worker
from tests.conftest import running
from tests.nats_server import NatsServer

MESSAGES = 300


async def test_acked_messages_survive_a_kill_and_restart(own_nats_server: NatsServer, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.jobs"], retention="workqueue")
    consumed: list[int] = []
    after_outage = asyncio.Event()

    @service.consume(f"{uid}.jobs", durable=f"{uid}-worker", stream=uid, concurrency=8, ack_wait=5)
    async def work(number: int) -> None:
        if number >= 50:
            await after_outage.wait()  # the outage lands mid-stream, with handlers in flight
        consumed.append(number)

    settings = broker_settings(
        own_nats_server.url,
        SERVICE_BROKER_LAZY_INIT="false",
        SERVICE_BROKER_RETRY_DELAY_SECS="0",
        SERVICE_BROKER_MAX_RECONNECTS="-1",
    )
    async with running(service.build(settings)) as app:
        assert app.broker is not None
        acked: list[int] = []
        for number in range(MESSAGES):
            await app.broker.publish(f"{uid}.jobs", number, ack=True)
            acked.append(number)
        await eventually(lambda: len(consumed) == 50, what="consumption under way")

        own_nats_server.kill()
        await eventually(lambda: app.broker is not None and not app.broker.connected, what="the outage seen")
        refused = 0
        with contextlib.suppress(BrokerUnavailable):
            await app.broker.publish(f"{uid}.jobs", -1, ack=True)
            refused = -1  # must not be reached
        assert refused == 0

        own_nats_server.start()
        after_outage.set()
        await eventually(lambda: app.broker is not None and app.broker.connected, what="reconnected")
        for number in range(MESSAGES, MESSAGES + 20):  # and the stream keeps working after it
            await app.broker.publish(f"{uid}.jobs", number, ack=True)
            acked.append(number)
        await eventually(lambda: set(consumed) >= set(acked), what="every acknowledged message consumed", within=60)

    assert set(consumed) == set(acked)  # none lost (a message in flight at the kill may come twice); -1 never stored
    client: Client = await nats.connect(own_nats_server.url)
    try:
        info = await client.jetstream().stream_info(uid)
        assert info.state.messages == 0  # workqueue: all acknowledged
    finally:
        await client.close()
