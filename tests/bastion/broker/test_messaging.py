"""Publish/subscribe on a real NATS server: wildcards, typed payloads, queue groups, handlers' parameters."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from nats.aio.client import Client
from pydantic import BaseModel
from structlog.testing import capture_logs

from bastion import Service
from bastion.broker import Broker, BrokerMessage
from bastion.errors import ConfigError
from tests.bastion.broker.conftest import broker_settings, eventually, worker
from tests.conftest import running
from tests.nats_server import NatsServer


class Order(BaseModel):
    id: str
    total: int


async def test_star_matches_one_token_and_gt_the_rest(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    one: list[str] = []
    rest: list[str] = []

    @service.subscribe(f"{uid}.orders.*.created")
    async def on_one(message: BrokerMessage) -> None:
        one.append(message.subject)

    @service.subscribe(f"{uid}.orders.>")
    async def on_rest(message: BrokerMessage) -> None:
        rest.append(message.subject)

    async with running(service.build(broker_settings(nats_server.url))) as app:
        assert app.broker is not None
        await eventually(lambda: app.broker is not None and app.broker.connected, what="connected")
        for subject in ("orders.eu.created", "orders.eu.de.created", "orders.created", "orders.eu.deleted"):
            await nc.publish(f"{uid}.{subject}", b"{}")
        await nc.publish(f"{uid}.end", b"")  # not ours: neither pattern takes it
        await nc.flush()
        await eventually(lambda: len(rest) == 4, what="four messages under orders.>")
    assert one == [f"{uid}.orders.eu.created"]
    assert rest == [
        f"{uid}.orders.eu.created",
        f"{uid}.orders.eu.de.created",
        f"{uid}.orders.created",
        f"{uid}.orders.eu.deleted",
    ]


async def test_payloads_decode_to_the_annotation(nats_server: NatsServer, uid: str) -> None:
    service = worker()
    received: list[object] = []

    @service.subscribe(f"{uid}.model")
    async def on_model(order: Order) -> None:
        received.append(order)

    @service.subscribe(f"{uid}.bytes")
    async def on_bytes(raw: bytes) -> None:
        received.append(raw)

    @service.subscribe(f"{uid}.dict")
    async def on_dict(body: dict[str, int]) -> None:
        received.append(body)

    async with running(service.build(broker_settings(nats_server.url, SERVICE_BROKER_LAZY_INIT="false"))) as app:
        assert app.broker is not None
        await app.broker.publish(f"{uid}.model", Order(id="o-1", total=12))
        await app.broker.publish(f"{uid}.bytes", b"\x00\xffraw")
        await app.broker.publish(f"{uid}.dict", {"a": 1})
        await eventually(lambda: len(received) == 3, what="three messages")
    assert received == [Order(id="o-1", total=12), b"\x00\xffraw", {"a": 1}]


async def test_a_subscriber_that_raises_keeps_receiving(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    seen: list[bytes] = []

    @service.subscribe(f"{uid}.fragile")
    async def fragile(raw: bytes) -> None:
        seen.append(raw)
        if raw == b"bad":
            raise RuntimeError("cannot handle")

    with capture_logs() as logs:
        async with running(service.build(broker_settings(nats_server.url, SERVICE_BROKER_LAZY_INIT="false"))):
            await nc.publish(f"{uid}.fragile", b"bad")
            await nc.publish(f"{uid}.fragile", b"good")
            await eventually(lambda: len(seen) == 2, what="both messages")
    assert seen == [b"bad", b"good"]
    failures = [entry for entry in logs if entry["event"] == "broker_subscriber_failed"]
    assert [entry["subscriber"] for entry in failures] == [f"{uid}.fragile"]


async def test_a_queue_group_shares_messages_between_instances(nats_server: NatsServer, nc: Client, uid: str) -> None:
    handled: list[tuple[str, bytes]] = []

    def instance(name: str) -> Service:
        service = worker("workers")

        @service.subscribe(f"{uid}.jobs", queue="workers")
        async def on_job(raw: bytes) -> None:
            handled.append((name, raw))

        return service

    settings = broker_settings(nats_server.url, SERVICE_BROKER_LAZY_INIT="false")
    async with running(instance("a").build(settings)), running(instance("b").build(settings)):
        for number in range(20):
            await nc.publish(f"{uid}.jobs", str(number).encode())
        await nc.flush()
        await eventually(lambda: len(handled) == 20, what="twenty jobs")
    assert sorted(int(raw) for _, raw in handled) == list(range(20))  # each exactly once, by either instance


async def test_handlers_can_take_the_broker_to_publish_follow_ups(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    service = worker()
    follow_ups: list[bytes] = []

    @service.subscribe(f"{uid}.placed")
    async def on_placed(order: Order, broker: Broker) -> None:
        await broker.publish(f"{uid}.invoice", {"order": order.id})

    @service.subscribe(f"{uid}.invoice")
    async def on_invoice(raw: bytes) -> None:
        follow_ups.append(raw)

    async with running(service.build(broker_settings(nats_server.url, SERVICE_BROKER_LAZY_INIT="false"))):
        await nc.publish(f"{uid}.placed", b'{"id": "o-9", "total": 3}')
        await eventually(lambda: len(follow_ups) == 1, what="the follow-up")
    assert follow_ups == [b'{"order":"o-9"}']


async def test_a_sync_handler_runs_in_a_worker_thread(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = worker()
    seen: list[tuple[str, bool]] = []

    @service.subscribe(f"{uid}.placed")
    def on_placed(order: Order) -> None:
        seen.append((order.id, threading.current_thread() is threading.main_thread()))

    async with running(service.build(broker_settings(nats_server.url, SERVICE_BROKER_LAZY_INIT="false"))):
        await nc.publish(f"{uid}.placed", b'{"id": "o-7", "total": 3}')
        await eventually(lambda: len(seen) == 1, what="the sync handler's call")
    assert seen == [("o-7", False)]


class TestDeclarationErrors:
    def test_a_generator_handler_is_refused(self) -> None:
        service = worker()
        with pytest.raises(
            ConfigError, match=r"^broker handler: gen is a generator; expected a def or async def function$"
        ):

            @service.subscribe("a.b")
            def gen(raw: bytes) -> Iterator[None]:
                yield

    def test_two_payload_parameters_are_refused(self) -> None:
        service = worker()
        with pytest.raises(ConfigError, match=r"one payload parameter .* got 'second' too$"):

            @service.subscribe("a.b")
            async def two(first: bytes, second: bytes) -> None: ...

    @pytest.mark.parametrize(
        ("subject", "why"),
        [
            ("", "empty"),
            ("a..b", "empty token"),
            ("a.>.b", "'>' only as the last token"),
            ("a.b c", "whitespace"),
            ("a.b*", "'*' alone in its token"),
        ],
    )
    def test_malformed_subjects_are_refused(self, subject: str, why: str) -> None:
        service = worker()
        with pytest.raises(ConfigError, match=r"^broker subject "):

            @service.subscribe(subject)
            async def handler(raw: bytes) -> None: ...

    def test_broker_work_without_a_broker_refuses_to_build(self) -> None:
        service = worker()

        @service.subscribe("a.b")
        async def handler(raw: bytes) -> None: ...

        with pytest.raises(
            ConfigError,
            match=r"^the service declares broker streams or handlers .* no broker is configured: set broker.url "
            r"\(or SERVICE_BROKER_URL\)$",
        ):
            service.build(broker_settings("nats://127.0.0.1:4222", SERVICE_BROKER_ENABLED="false"))
