"""Durable consumers on a real JetStream: ack, nak with redelivery, dead letters after N deliveries, scale-out."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client
from pydantic import BaseModel

from bastion.broker import BrokerMessage
from tests.bastion.broker.conftest import broker_settings, client_for, eventually, listen, worker
from tests.conftest import running
from tests.nats_server import NatsServer

EAGER = {"SERVICE_BROKER_LAZY_INIT": "false"}


class Order(BaseModel):
    id: str
    total: int


async def pending(nc: Client, stream: str, durable: str) -> tuple[int, int]:
    """(messages not yet delivered, messages delivered and not acknowledged) for the durable consumer."""
    info = await nc.jetstream().consumer_info(stream, durable)
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


async def settled(nc: Client, stream: str, durable: str) -> bool:
    return await pending(nc, stream, durable) == (0, 0)


async def test_a_handler_that_returns_acks(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.orders"])
    seen: list[tuple[Order, int, str]] = []

    @service.consume(f"{uid}.orders", durable=f"{uid}-billing", stream=uid)
    async def bill(order: Order, message: BrokerMessage) -> None:
        seen.append((order, message.deliveries, message.message_id))

    async with running(service.build(broker_settings(nats_server.url, **EAGER))):
        await nc.jetstream().publish(f"{uid}.orders", b'{"id": "o-1", "total": 5}')
        await eventually(lambda: settled(nc, uid, f"{uid}-billing"), what="the message acked")
    assert seen == [(Order(id="o-1", total=5), 1, f"{uid}:1")]


async def test_a_handler_that_raises_naks_and_the_message_comes_again(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.orders"])
    deliveries: list[int] = []

    @service.consume(f"{uid}.orders", durable=f"{uid}-billing", stream=uid, retry_delay=0.05)
    async def bill(order: Order, message: BrokerMessage) -> None:
        deliveries.append(message.deliveries)
        if message.deliveries == 1:
            raise ConnectionError("payment provider down")

    async with running(service.build(broker_settings(nats_server.url, **EAGER))):
        await nc.jetstream().publish(f"{uid}.orders", b'{"id": "o-1", "total": 5}')
        await eventually(lambda: deliveries == [1, 2], what="the redelivery")
        await eventually(lambda: settled(nc, uid, f"{uid}-billing"), what="the redelivery acked")
    assert deliveries == [1, 2]


async def test_a_poison_message_is_dead_lettered_after_max_deliveries_then_acked(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.orders"])
    deliveries: list[int] = []
    dead = await listen(nc, f"deadletter.{uid}-billing")

    @service.consume(f"{uid}.orders", durable=f"{uid}-billing", stream=uid, max_deliveries=3, retry_delay=0.01)
    async def bill(order: Order, message: BrokerMessage) -> None:
        deliveries.append(message.deliveries)
        raise ValueError("total does not add up")

    async with running(service.build(broker_settings(nats_server.url, **EAGER))) as app:
        await nc.jetstream().publish(f"{uid}.orders", b'{"id": "o-1", "total": 5}')
        await eventually(lambda: len(dead.messages) == 1, what="the dead letter")
        await eventually(lambda: settled(nc, uid, f"{uid}-billing"), what="the poison message acked")
        assert app.broker is not None and app.broker.dead_lettered == 1
    assert deliveries == [1, 2, 3]
    assert dead.messages[0].data == b'{"id": "o-1", "total": 5}'
    assert dead.headers == [
        {
            "Bastion-Original-Subject": f"{uid}.orders",
            "Bastion-Deliveries": "3",
            "Bastion-Error": "ValueError: total does not add up",
            "Bastion-Consumer": f"{uid}-billing",
        }
    ]


async def test_a_payload_that_does_not_validate_is_dead_lettered_never_looped(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.orders"])
    handled: list[Order] = []
    dead = await listen(nc, f"{uid}.rejected")

    @service.consume(
        f"{uid}.orders",
        durable=f"{uid}-billing",
        stream=uid,
        max_deliveries=2,
        retry_delay=0.01,
        dead_letter_subject=f"{uid}.rejected",
    )
    async def bill(order: Order) -> None:
        handled.append(order)

    async with running(service.build(broker_settings(nats_server.url, **EAGER))):
        js = nc.jetstream()
        await js.publish(f"{uid}.orders", b'{"id": "o-1"}')  # no total
        await js.publish(f"{uid}.orders", b"\xff not json")
        await js.publish(f"{uid}.orders", b'{"id": "o-3", "total": 1}')
        await eventually(lambda: len(dead.messages) == 2, what="two dead letters")
        await eventually(lambda: settled(nc, uid, f"{uid}-billing"), what="all acked")
    assert handled == [Order(id="o-3", total=1)]
    assert [msg.data for msg in dead.messages] == [b'{"id": "o-1"}', b"\xff not json"]
    assert [headers["Bastion-Deliveries"] for headers in dead.headers] == ["2", "2"]
    errors = [headers["Bastion-Error"] for headers in dead.headers]
    assert all(error.startswith("ValidationError: 1 validation error for Order") for error in errors)


async def test_dead_letters_are_stored_when_a_stream_captures_their_subject(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.orders"])
    service.stream(f"{uid}-dead", subjects=[f"deadletter.{uid}-billing"])

    @service.consume(f"{uid}.orders", durable=f"{uid}-billing", stream=uid, max_deliveries=1)
    async def bill(raw: bytes) -> None:
        raise RuntimeError("never")

    async with running(service.build(broker_settings(nats_server.url, **EAGER))):
        await nc.jetstream().publish(f"{uid}.orders", b"poison")
        await eventually(lambda: settled(nc, uid, f"{uid}-billing"), what="the poison message acked")
    stored = await nc.jetstream().get_msg(f"{uid}-dead", 1)
    assert (stored.subject, stored.data, (stored.headers or {}).get("Bastion-Error")) == (
        f"deadletter.{uid}-billing",
        b"poison",
        "RuntimeError: never",
    )


async def test_instances_share_a_durable_consumer(nats_server: NatsServer, nc: Client, uid: str) -> None:
    handled: list[tuple[str, int]] = []

    def instance(name: str) -> object:
        service = worker("billing")
        service.stream(uid, subjects=[f"{uid}.orders"])

        @service.consume(f"{uid}.orders", durable=f"{uid}-billing", stream=uid, concurrency=4)
        async def bill(order: Order) -> None:
            handled.append((name, order.total))

        return service.build(broker_settings(nats_server.url, **EAGER))

    js = nc.jetstream()
    async with running(instance("a")), running(instance("b")):  # type: ignore[arg-type]
        for number in range(40):
            await js.publish(f"{uid}.orders", Order(id=str(number), total=number).model_dump_json().encode())
        await eventually(lambda: settled(nc, uid, f"{uid}-billing"), what="forty acked")
    assert sorted(total for _, total in handled) == list(range(40))


async def test_shutdown_lets_a_handler_in_flight_finish_and_ack(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.jobs"])
    started = asyncio.Event()
    finished: list[bytes] = []

    @service.consume(f"{uid}.jobs", durable=f"{uid}-slow", stream=uid)
    async def slow(raw: bytes) -> None:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(raw)

    async with running(service.build(broker_settings(nats_server.url, **EAGER))):
        await nc.jetstream().publish(f"{uid}.jobs", b"long job")
        await asyncio.wait_for(started.wait(), 15)
    assert finished == [b"long job"]
    assert await pending(nc, uid, f"{uid}-slow") == (0, 0)


async def test_a_consumer_without_a_stream_refuses_to_start(nats_server: NatsServer, uid: str) -> None:
    service = worker()

    @service.consume(f"{uid}.nowhere", durable=f"{uid}-lost")
    async def lost(raw: bytes) -> None: ...

    with pytest.raises(AssertionError) as failed:
        async with running(service.build(broker_settings(nats_server.url, **EAGER))):
            pass
    assert str(failed.value) == (
        f"ConfigError: broker consumer '{uid}-lost': no stream stores subject '{uid}.nowhere'; declare one with "
        "service.stream(...) or a [broker.streams.NAME] table"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_deliveries": 0}, "max_deliveries must be at least 1, got 0"),
        ({"concurrency": 0}, "concurrency must be at least 1, got 0"),
        ({"retry_delay": -1.0}, "retry_delay must be >= 0 and ack_wait > 0"),
        ({"dead_letter_subject": "dead.>"}, "'dead.>' is not a subject without wildcards"),
    ],
)
def test_bad_consumer_options_are_refused(options: dict[str, object], message: str) -> None:
    from bastion.errors import ConfigError

    service = worker()
    with pytest.raises(ConfigError) as failed:

        @service.consume("a.b", durable="d", **options)  # type: ignore[arg-type]
        async def handler(raw: bytes) -> None: ...

    assert message in str(failed.value)


async def test_a_slow_consumer_takes_its_time_loses_nothing_and_keeps_http_answering(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.jobs"])
    handled: list[int] = []

    @service.consume(f"{uid}.jobs", durable=f"{uid}-slow", stream=uid)
    async def slow(number: int) -> None:
        await asyncio.sleep(0.02)
        handled.append(number)

    app = service.build(broker_settings(nats_server.url, **EAGER))
    async with running(app), client_for(app) as client:
        js = nc.jetstream()
        for number in range(40):
            await js.publish(f"{uid}.jobs", str(number).encode())
        health = [(await client.get("/health")).status_code for _ in range(5)]  # while the backlog is worked off
        await eventually(lambda: settled(nc, uid, f"{uid}-slow"), what="the backlog worked off")
    assert health == [200] * 5
    assert handled == list(range(40))  # concurrency 1: in order, each once
