"""docs/broker.md's complete example against a real NATS server: publish over HTTP, the durable consumer,
its dead letters, and the request/reply pair."""

from __future__ import annotations

import json

import nats

from examples.orders_broker import billed, service
from tests.bastion.broker.conftest import broker_settings, client_for, eventually, listen
from tests.conftest import running
from tests.nats_server import NatsServer


async def test_the_broker_example_end_to_end(own_nats_server: NatsServer) -> None:
    nc = await nats.connect(own_nats_server.url)
    app = service.build(broker_settings(own_nats_server.url, SERVICE_BROKER_LAZY_INIT="false"))
    try:
        follow_ups = await listen(nc, "billing.charged")
        async with running(app), client_for(app) as client:
            placed = await client.post("/api/v1/orders", json={"id": "o-1", "total_cents": 500})
            declined = await client.post("/api/v1/orders", json={"id": "o-2", "total_cents": 0})
            priced = await client.get("/api/v1/prices/A-1")
            await eventually(lambda: billed == ["o-1"], what="o-1 billed")
            js = nc.jetstream()

            async def dead_lettered() -> bool:
                return (await js.stream_info("DEAD")).state.messages == 1

            await eventually(dead_lettered, what="o-2 dead-lettered")
        assert (placed.status_code, placed.json()) == (200, {"sequence": 1})
        assert (declined.status_code, declined.json()) == (200, {"sequence": 2})
        assert (priced.status_code, priced.json()) == (200, {"sku": "A-1", "cents": 1999})
        assert [json.loads(msg.data) for msg in follow_ups.messages] == [{"id": "o-1", "attempt": 1}]
        dead = await js.get_msg("DEAD", 1)
        assert (dead.subject, json.loads(dead.data), dict(dead.headers or {})) == (
            "deadletter.billing",
            {"id": "o-2", "total_cents": 0},
            {
                "Bastion-Original-Subject": "orders.placed",
                "Bastion-Deliveries": "3",
                "Bastion-Error": "PaymentDeclined: cannot charge 0 cents",
                "Bastion-Consumer": "billing",
                "Nats-Expected-Stream": "DEAD",  # published with JetStream's ack, to the stream that keeps them
            },
        )
    finally:
        await nc.close()
