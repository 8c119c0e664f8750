"""Request/reply on a real NATS server: replies, the timeout, no responders, a failing responder, over HTTP."""

from __future__ import annotations

import asyncio
from typing import Annotated

import pytest
from fastapi import Depends
from nats.aio.client import Client
from pydantic import BaseModel

from bastion import Service
from bastion.broker import Broker, BrokerMessage, current_broker
from bastion.errors import BrokerRequestFailed, BrokerTimeout, NoResponders, NotFound
from tests.bastion.broker.conftest import broker_settings, client_for, worker
from tests.conftest import open_settings, running
from tests.nats_server import NatsServer

EAGER = {"SERVICE_BROKER_LAZY_INIT": "false"}


class PriceQuery(BaseModel):
    sku: str


class Price(BaseModel):
    sku: str
    cents: int


def pricing(uid: str) -> object:
    service = worker("pricing")

    @service.respond(f"{uid}.price")
    async def price(query: PriceQuery) -> Price:
        if query.sku == "missing":
            raise NotFound("no such sku")
        if query.sku == "broken":
            raise RuntimeError("database gone")
        if query.sku == "slow":
            await asyncio.sleep(1.0)
        return Price(sku=query.sku, cents=1999)

    @service.respond(f"{uid}.echo")
    async def echo(raw: bytes, message: BrokerMessage) -> bytes:
        return raw + b"|" + message.headers.get("X-Trace", "").encode()

    return service


@pytest.fixture
async def broker(nats_server: NatsServer, uid: str) -> object:
    async with running(pricing(uid).build(broker_settings(nats_server.url, **EAGER))) as app:  # type: ignore[attr-defined]
        assert app.broker is not None
        yield app.broker


async def test_a_request_gets_the_reply(broker: Broker, uid: str) -> None:
    reply = await broker.request(f"{uid}.price", PriceQuery(sku="A-1"))
    assert Price.model_validate_json(reply.data) == Price(sku="A-1", cents=1999)


async def test_bytes_and_headers_pass_through(broker: Broker, uid: str) -> None:
    reply = await broker.request(f"{uid}.echo", b"\x00raw", headers={"X-Trace": "t-1"})
    assert reply.data == b"\x00raw|t-1"


async def test_plain_nats_clients_can_request_too(broker: Broker, nc: Client, uid: str) -> None:
    reply = await nc.request(f"{uid}.price", b'{"sku": "B"}', timeout=5)
    assert reply.data == b'{"sku":"B","cents":1999}'


async def test_no_reply_in_time_is_broker_timeout(broker: Broker, uid: str) -> None:
    with pytest.raises(BrokerTimeout) as failed:
        await broker.request(f"{uid}.price", PriceQuery(sku="slow"), timeout=0.2)
    assert (failed.value.status, failed.value.code) == (504, "BROKER_TIMEOUT")


async def test_nobody_listening_is_no_responders(broker: Broker, uid: str) -> None:
    with pytest.raises(NoResponders) as failed:
        await broker.request(f"{uid}.nobody", {"q": 1}, timeout=5)
    assert (failed.value.status, failed.value.code) == (503, "NO_RESPONDERS")


@pytest.mark.parametrize(
    ("sku", "error"),
    [
        ("missing", '{"error":"no such sku","code":"NOT_FOUND"}'),
        ("broken", '{"error":"database gone","code":"RESPONDER_ERROR"}'),
        ("{not json", None),
    ],
)
async def test_a_failing_responder_is_broker_request_failed(
    broker: Broker, nc: Client, uid: str, sku: str, error: str | None
) -> None:
    payload = b'{"sku": "' + sku.encode() + b'"}' if error else b"{not json"
    with pytest.raises(BrokerRequestFailed) as failed:
        await broker.request(f"{uid}.price", payload)
    assert (failed.value.status, failed.value.code) == (502, "BROKER_REQUEST_FAILED")
    if error is not None:
        assert failed.value.responder_error == error
    else:
        assert failed.value.responder_error.startswith('{"error":"1 validation error for PriceQuery')


async def test_over_http_the_errors_render_without_naming_subjects(
    broker: Broker, nats_server: NatsServer, uid: str
) -> None:
    service = worker("front")
    v2 = service.version(2)

    @v2.get("/quote/{sku}")
    async def quote(sku: str, via: Annotated[Broker, Depends(current_broker)]) -> dict[str, object]:
        subject = f"{uid}.nobody" if sku == "nobody" else f"{uid}.price"
        reply = await via.request(subject, {"sku": sku}, timeout=0.3)
        return dict(reply.json())

    app = service.build(broker_settings(nats_server.url, **EAGER))
    async with running(app), client_for(app) as client:
        answered = await client.get("/api/v2/quote/A-1")
        nobody = await client.get("/api/v2/quote/nobody")
        slow = await client.get("/api/v2/quote/slow")
        failed = await client.get("/api/v2/quote/broken")
    assert (answered.status_code, answered.json()) == (200, {"sku": "A-1", "cents": 1999})
    assert (nobody.status_code, nobody.json()) == (
        503,
        {"error": "No responder for the request", "code": "NO_RESPONDERS", "status": 503},
    )
    assert (slow.status_code, slow.json()) == (
        504,
        {"error": "No reply from the broker in time", "code": "BROKER_TIMEOUT", "status": 504},
    )
    assert (failed.status_code, failed.json()) == (
        502,
        {"error": "The responder failed", "code": "BROKER_REQUEST_FAILED", "status": 502},
    )


async def test_without_a_broker_current_broker_is_503(uid: str) -> None:
    service = Service("front")
    v1 = service.version(1)

    @v1.post("/events")
    async def publish(via: Annotated[Broker, Depends(current_broker)]) -> None:
        await via.publish(f"{uid}.x", b"")

    app = service.build(open_settings())
    async with client_for(app) as client:
        response = await client.post("/api/v1/events")
    assert (response.status_code, response.json()) == (
        503,
        {"error": "no broker is configured", "code": "BROKER_UNAVAILABLE", "status": 503},
    )
