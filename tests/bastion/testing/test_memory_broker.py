"""The in-memory broker of the test clients: the service's broker work with no NATS server, and one scenario run
on both the in-memory broker and a real JetStream to check they agree."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Annotated, Literal

import nats
import pytest
from fastapi import Depends
from pydantic import BaseModel

from bastion import Service
from bastion.broker import Broker, BrokerMessage, current_broker
from bastion.errors import BrokerRequestFailed, BrokerTimeout, ConfigError, NoResponders
from bastion.testing import AsyncServiceClient, ServiceClient
from tests.bastion.broker.conftest import eventually, listen
from tests.conftest import TOKEN_OFF
from tests.nats_server import NatsServer


class Order(BaseModel):
    id: str
    total: int


class Declined(Exception):
    pass


def shop(prefix: str = "shop", *, fail_first: int = 0, max_deliveries: int = 5) -> tuple[Service, list[int]]:
    """A service whose ``POST /orders`` publishes ``<prefix>.orders.placed`` (acked by a stream); its consumer
    fails the first ``fail_first`` deliveries, then publishes ``<prefix>.billing.charged``. Returns the
    service and the deliveries the consumer saw."""
    service = Service("shop")
    v1 = service.version(1)
    service.stream(f"{prefix}-orders", subjects=[f"{prefix}.orders.>"])
    deliveries: list[int] = []

    @service.consume(
        f"{prefix}.orders.placed",
        durable=f"{prefix}-billing",
        max_deliveries=max_deliveries,
        retry_delay=0.05,
    )
    async def bill(order: Order, message: BrokerMessage, broker: Broker) -> None:
        deliveries.append(message.deliveries)
        if message.deliveries <= fail_first:
            raise Declined(f"card declined for {order.id}")
        await broker.publish(f"{prefix}.billing.charged", {"id": order.id, "attempt": message.deliveries})

    @v1.post("/orders")
    async def place(order: Order, broker: Annotated[Broker, Depends(current_broker)]) -> dict[str, int | None]:
        return {"sequence": await broker.publish(f"{prefix}.orders.placed", order, ack=True)}

    return service, deliveries


def test_a_route_publishes_and_the_consumer_handles_it_with_no_server() -> None:
    """The app declares a consumer and no broker.url: the client runs it in memory, no server anywhere."""
    service, deliveries = shop()
    with ServiceClient(service, environ=TOKEN_OFF) as client:
        response = client.post("/api/v1/orders", json={"id": "o-1", "total": 5})
        charged = client.broker.published("shop.billing.charged")
    assert response.json() == {"sequence": 1}
    assert deliveries == [1]
    assert [(m.subject, m.json()) for m in charged] == [("shop.billing.charged", {"id": "o-1", "attempt": 1})]


def test_published_filters_by_wildcard_subjects() -> None:
    service, _ = shop()
    with ServiceClient(service, environ=TOKEN_OFF) as client:
        client.post("/api/v1/orders", json={"id": "o-1", "total": 5})
        assert [m.subject for m in client.broker.published("shop.*.placed")] == ["shop.orders.placed"]
        assert [m.subject for m in client.broker.published("shop.>")] == ["shop.orders.placed", "shop.billing.charged"]
        assert client.broker.published("shop.*") == []
        assert client.broker.published("billing.>") == []


async def test_subscribers_hear_the_subjects_their_wildcards_match() -> None:
    service = Service("listener")
    service.version(1)
    heard: list[tuple[str, str]] = []

    @service.subscribe("orders.*.created")
    async def one_token(message: BrokerMessage) -> None:
        heard.append(("*", message.subject))

    @service.subscribe("orders.>")
    async def the_rest(message: BrokerMessage) -> None:
        heard.append((">", message.subject))

    async with AsyncServiceClient(service, environ=TOKEN_OFF) as client:
        for subject in ("orders.eu.created", "orders.eu.fr.created", "orders", "invoices.eu.created"):
            await client.broker.publish(subject, {}, headers={"X-Tenant": "acme"})
        headers = [m.headers for m in client.broker.published("orders.>")]
    assert heard == [("*", "orders.eu.created"), (">", "orders.eu.created"), (">", "orders.eu.fr.created")]
    assert headers == [{"X-Tenant": "acme"}, {"X-Tenant": "acme"}]


def test_a_failed_delivery_comes_again_after_its_retry_delay_on_the_brokers_clock() -> None:
    service, deliveries = shop(fail_first=1)
    with ServiceClient(service, environ=TOKEN_OFF) as client:
        client.post("/api/v1/orders", json={"id": "o-1", "total": 5})
        assert deliveries == [1]
        assert [m.deliveries for m in client.broker.pending("shop-billing")] == [1]
        client.broker.advance(0.04)  # retry_delay is 0.05 s: not due yet
        assert deliveries == [1]
        client.broker.advance(0.01)
        assert deliveries == [1, 2]
        assert client.broker.pending() == []
        assert [m.json() for m in client.broker.published("shop.billing.charged")] == [{"id": "o-1", "attempt": 2}]


async def test_a_poison_message_is_dead_lettered_after_max_deliveries() -> None:
    service, deliveries = shop(fail_first=99, max_deliveries=3)
    async with AsyncServiceClient(service, environ=TOKEN_OFF) as client:
        await client.post("/api/v1/orders", json={"id": "o-1", "total": 5})
        await client.broker.drain()
        dead = client.broker.published("deadletter.>")
        assert client.broker.clock() == pytest.approx(0.05 + 0.1)  # the two retry delays, doubled once
        assert client.broker.pending() == []
        assert client.broker.dead_lettered == 1
    assert deliveries == [1, 2, 3]
    assert [(m.subject, m.json(), dict(m.headers)) for m in dead] == [
        (
            "deadletter.shop-billing",
            {"id": "o-1", "total": 5},
            {
                "Bastion-Original-Subject": "shop.orders.placed",
                "Bastion-Deliveries": "3",
                "Bastion-Error": "Declined: card declined for o-1",
                "Bastion-Consumer": "shop-billing",
            },
        )
    ]


def responders() -> Service:
    service = Service("prices")
    service.version(1)
    never = asyncio.Event()

    @service.respond("prices.get")
    async def price(sku: str) -> dict[str, int | str]:
        if sku == "unknown":
            raise LookupError("no such sku")
        return {"sku": sku, "cents": 1999}

    @service.respond("prices.slow")
    async def slow(sku: str) -> None:
        await never.wait()

    return service


async def test_a_request_gets_the_responders_reply() -> None:
    async with AsyncServiceClient(responders(), environ=TOKEN_OFF) as client:
        reply = await client.broker.request("prices.get", "sku-1")
    assert reply.json() == {"sku": "sku-1", "cents": 1999}


async def test_a_request_fails_as_on_nats() -> None:
    """No responder, a responder that raises, one that does not answer in time: the NATS Broker's errors."""
    async with AsyncServiceClient(responders(), environ=TOKEN_OFF) as client:
        with pytest.raises(NoResponders):
            await client.broker.request("stock.get", "sku-1")
        with pytest.raises(BrokerRequestFailed) as failed:
            await client.broker.request("prices.get", "unknown")
        with pytest.raises(BrokerTimeout):
            await client.broker.request("prices.slow", "sku-1", timeout=0.01)
    assert failed.value.responder_error == '{"error":"no such sku","code":"RESPONDER_ERROR"}'


def test_a_consumer_on_a_subject_no_stream_stores_fails_the_start_as_on_nats() -> None:
    service = Service("shop")
    service.version(1)

    @service.consume("orders.placed", durable="billing")
    async def bill(order: Order) -> None:
        pass

    with (
        pytest.raises(RuntimeError, match=r"no stream stores subject 'orders\.placed'"),
        ServiceClient(service, environ=TOKEN_OFF),
    ):
        pass


def test_client_broker_names_the_way_to_an_in_memory_broker() -> None:
    service = Service("plain")
    service.version(1)
    with ServiceClient(service, environ=TOKEN_OFF) as client, pytest.raises(RuntimeError, match="broker='memory'"):
        client.broker.published()
    with ServiceClient(service, environ=TOKEN_OFF, broker="memory") as client:
        assert client.broker.published() == []


def test_broker_nats_without_a_url_is_the_start_up_error_run_gives() -> None:
    service, _ = shop()
    with pytest.raises(ConfigError, match=r"no broker is configured: set broker\.url"):
        ServiceClient(service, environ=TOKEN_OFF, broker="nats")


@pytest.mark.parametrize("broker", ["memory", "nats"])
async def test_the_same_scenario_on_memory_and_on_jetstream(
    broker: Literal["memory", "nats"], nats_server: NatsServer
) -> None:
    """An order placed over HTTP fails once, is billed on its redelivery, and the follow-up event says so."""
    prefix = "t" + uuid.uuid4().hex[:10]
    service, deliveries = shop(prefix, fail_first=1)
    environ = {**TOKEN_OFF, "SERVICE_BROKER_URL": nats_server.url, "SERVICE_BROKER_LAZY_INIT": "false"}
    nc = await nats.connect(nats_server.url)
    try:
        charged = await listen(nc, f"{prefix}.billing.charged")
        async with AsyncServiceClient(service, environ=environ, broker=broker) as client:
            response = await client.post("/api/v1/orders", json={"id": "o-1", "total": 5})
            if broker == "memory":
                await client.broker.drain()
                events = [m.json() for m in client.broker.published(f"{prefix}.billing.charged")]
            else:
                await eventually(lambda: len(charged.messages) == 1, what="the follow-up event")
                events = [json.loads(m.data) for m in charged.messages]
    finally:
        await nc.close()
    assert response.json() == {"sequence": 1}
    assert deliveries == [1, 2]
    assert events == [{"id": "o-1", "attempt": 2}]
