"""Broker metrics on a real NATS server (JetStream on): messages published, acknowledged or not; messages handled
by durable consumers, by outcome; requests, by outcome. Scraped from the app's own ``/metrics``."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from bastion import BastionApp
from bastion.broker import BrokerMessage
from bastion.errors import BrokerRequestFailed, BrokerTimeout, BrokerUnavailable, NoResponders
from tests.bastion.broker.conftest import broker_settings, client_for, eventually, worker
from tests.conftest import metric_samples, metric_series, running
from tests.nats_server import NatsServer

EAGER = {"SERVICE_BROKER_LAZY_INIT": "false"}
Series = dict[tuple[str, ...], float]


async def scrape(app: BastionApp) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with client_for(app) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    return metric_samples(response.text)


async def published(app: BastionApp) -> Series:
    return metric_series(await scrape(app), "bastion_broker_published_total", "acknowledged")


async def consumed(app: BastionApp) -> Series:
    return metric_series(await scrape(app), "bastion_broker_consumed_total", "consumer", "outcome")


def requests(app: BastionApp) -> Series:
    """Read from the app's registry directly: it still answers once the app has stopped."""
    return metric_series(metric_samples(app.metrics.exposition().decode()), "bastion_broker_requests_total", "outcome")


async def test_published_counts_acknowledged_and_fire_and_forget_messages(nats_server: NatsServer, uid: str) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.stored.>"])
    async with running(service.build(broker_settings(nats_server.url, **EAGER))) as app:
        broker = app.broker
        assert broker is not None
        assert await published(app) == {}
        assert await broker.publish(f"{uid}.plain", {"n": 1}) is None
        assert await broker.publish(f"{uid}.stored.a", b"raw") is None  # stored by the stream, still not acked
        assert await broker.publish(f"{uid}.stored.b", {"n": 3}, ack=True) == 2
        with pytest.raises(BrokerUnavailable):
            await broker.publish(f"{uid}.nowhere", {"n": 4}, ack=True)  # no stream takes it: not published
        assert await published(app) == {("false",): 2, ("true",): 1}


async def test_consumed_counts_ack_nak_and_dead_letter_per_consumer(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.*"])
    ok, retry, poison = f"{uid}-ok", f"{uid}-retry", f"{uid}-poison"

    @service.consume(f"{uid}.ok", durable=ok, stream=uid)
    async def handle_ok(message: BrokerMessage) -> None:
        pass

    @service.consume(f"{uid}.retry", durable=retry, stream=uid, retry_delay=0.01)
    async def handle_retry(message: BrokerMessage) -> None:
        if message.deliveries == 1:
            raise ConnectionError("downstream not there yet")

    @service.consume(f"{uid}.poison", durable=poison, stream=uid, max_deliveries=2, retry_delay=0.01)
    async def handle_poison(message: BrokerMessage) -> None:
        raise ValueError("never valid")

    expected = {(ok, "ack"): 1, (retry, "nak"): 1, (retry, "ack"): 1, (poison, "nak"): 1, (poison, "dead_letter"): 1}
    async with running(service.build(broker_settings(nats_server.url, **EAGER))) as app:
        js = nc.jetstream()
        for subject in ("ok", "retry", "poison"):
            await js.publish(f"{uid}.{subject}", b"{}")

        async def all_handled() -> bool:
            return sum((await consumed(app)).values()) >= len(expected)

        await eventually(all_handled, what="five outcomes recorded")
        assert app.broker is not None and app.broker.dead_lettered == 1
        assert await consumed(app) == expected


async def test_requests_count_ok_timeout_no_responders_failed_and_unavailable(
    nats_server: NatsServer, uid: str
) -> None:
    service = worker("pricing")
    release = asyncio.Event()

    @service.respond(f"{uid}.price")
    async def price(message: BrokerMessage) -> dict[str, int]:
        return {"cents": 1999}

    @service.respond(f"{uid}.hold")
    async def hold(message: BrokerMessage) -> dict[str, int]:
        await release.wait()  # answers only after the caller gave up
        return {"cents": 0}

    @service.respond(f"{uid}.broken")
    async def broken(message: BrokerMessage) -> None:
        raise RuntimeError("database gone")

    async with running(service.build(broker_settings(nats_server.url, **EAGER))) as app:
        broker = app.broker
        assert broker is not None
        assert (await broker.request(f"{uid}.price", {})).json() == {"cents": 1999}
        with pytest.raises(BrokerTimeout):
            await broker.request(f"{uid}.hold", {}, timeout=0.2)
        release.set()
        with pytest.raises(NoResponders):
            await broker.request(f"{uid}.nobody", {}, timeout=5)
        with pytest.raises(BrokerRequestFailed):
            await broker.request(f"{uid}.broken", {}, timeout=5)
        assert requests(app) == {("ok",): 1, ("timeout",): 1, ("no_responders",): 1, ("failed",): 1}
    with pytest.raises(BrokerUnavailable):
        await broker.request(f"{uid}.price", {})  # stopped: no connection
    assert requests(app) == {("ok",): 1, ("timeout",): 1, ("no_responders",): 1, ("failed",): 1, ("unavailable",): 1}


async def pending(app: BastionApp) -> Series:
    return metric_series(await scrape(app), "bastion_broker_consumer_pending", "consumer")


async def test_a_consumers_lag_is_what_its_stream_still_holds_for_it(
    nats_server: NatsServer, nc: Client, uid: str
) -> None:
    """``bastion_broker_consumer_pending``: JetStream's count after each delivery (one message at a time here)."""
    service = worker()
    service.stream(uid, subjects=[f"{uid}.*"])
    durable = f"{uid}-lag"
    gates = [asyncio.Event() for _ in range(3)]
    seen: list[int] = []

    @service.consume(f"{uid}.work", durable=durable, stream=uid)
    async def handle(message: BrokerMessage) -> None:
        seen.append(message.json()["n"])
        await gates[len(seen) - 1].wait()

    async with running(service.build(broker_settings(nats_server.url, **EAGER))) as app:
        js = nc.jetstream()
        await js.publish(f"{uid}.work", b'{"n": 1}')
        await eventually(lambda: len(seen) == 1, what="the first message delivered")
        for n in (2, 3):
            await js.publish(f"{uid}.work", b'{"n": %d}' % n)
        gates[0].set()
        await eventually(lambda: len(seen) == 2, what="the second message delivered")
        assert await pending(app) == {(durable,): 1}  # the third waits
        gates[1].set()
        gates[2].set()
        await eventually(lambda: len(seen) == 3, what="the third message delivered")
        assert await pending(app) == {(durable,): 0}
