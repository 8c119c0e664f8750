"""One trace across an HTTP request, the broker message it publishes and the consumer that handles it (real NATS,
spans collected by an in-memory exporter)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from nats.aio.client import Client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode
from pydantic import BaseModel

from bastion import Service
from bastion.broker import Broker, BrokerMessage, current_broker
from tests.bastion.broker.conftest import broker_settings, client_for, eventually, listen, worker
from tests.conftest import running
from tests.nats_server import NatsServer

EAGER = {"SERVICE_BROKER_LAZY_INIT": "false"}
UPSTREAM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
UPSTREAM_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01"


class Order(BaseModel):
    id: str


def by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in spans if span.kind is kind]


def same_span(a: SpanContext | None, b: SpanContext | None) -> bool:
    assert a is not None and b is not None
    return (a.trace_id, a.span_id) == (b.trace_id, b.span_id)


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


async def test_one_trace_from_the_request_through_the_message_to_its_consumer(
    nats_server: NatsServer, uid: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    service = Service("shop")
    service.stream(uid, subjects=[f"{uid}.orders"])
    handled: list[str] = []

    @service.version(1).post("/orders", status_code=202)
    async def place(order: Order, broker: Annotated[Broker, Depends(current_broker)]) -> dict[str, str]:
        await broker.publish(f"{uid}.orders", order, ack=True)
        return {"id": order.id}

    @service.consume(f"{uid}.orders", durable=f"{uid}-billing", stream=uid)
    async def bill(order: Order) -> None:
        handled.append(order.id)

    app = service.build(broker_settings(nats_server.url, **EAGER), tracer_provider=provider)
    async with running(app), client_for(app) as client:
        response = await client.post("/api/v1/orders", json={"id": "o-1"}, headers={"traceparent": TRACEPARENT})
        assert response.status_code == 202
        await eventually(lambda: handled == ["o-1"], what="the consumer handled the order")
        await eventually(lambda: len(by_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)) == 1, what="span")

    spans = exporter.get_finished_spans()
    (server,) = by_kind(spans, SpanKind.SERVER)
    (producer,) = by_kind(spans, SpanKind.PRODUCER)
    (consumer,) = by_kind(spans, SpanKind.CONSUMER)
    assert {hex_trace(server), hex_trace(producer), hex_trace(consumer)} == {UPSTREAM_TRACE}
    assert server.parent is not None and format(server.parent.span_id, "016x") == UPSTREAM_SPAN
    assert same_span(producer.parent, server.context)
    assert same_span(consumer.parent, producer.context)  # across NATS: the parent arrived in the headers
    assert server.name == "POST /api/v1/orders"
    assert producer.name == f"publish {uid}.orders"
    assert consumer.name == f"process {uid}.orders"
    assert consumer.attributes is not None
    assert consumer.attributes["messaging.system"] == "nats"
    assert consumer.attributes["messaging.consumer.group.name"] == f"{uid}-billing"
    assert consumer.attributes["bastion.broker.outcome"] == "ack"


async def test_the_published_message_carries_traceparent(
    nats_server: NatsServer, nc: Client, uid: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    service = Service("shop")

    @service.version(1).post("/orders", status_code=202)
    async def place(order: Order, broker: Annotated[Broker, Depends(current_broker)]) -> None:
        await broker.publish(f"{uid}.orders", order)

    inbox = await listen(nc, f"{uid}.orders")
    app = service.build(broker_settings(nats_server.url, **EAGER), tracer_provider=provider)
    async with running(app), client_for(app) as client:
        assert (await client.post("/api/v1/orders", json={"id": "o-1"})).status_code == 202
        await eventually(lambda: len(inbox.messages) == 1, what="the message arrived")
    (producer,) = by_kind(exporter.get_finished_spans(), SpanKind.PRODUCER)
    assert producer.context is not None
    context = producer.context
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    assert context.trace_flags.sampled
    assert inbox.headers == [{"traceparent": expected}]


async def test_a_failing_consumer_marks_its_span(
    nats_server: NatsServer, nc: Client, uid: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    service = worker()
    service.stream(uid, subjects=[f"{uid}.orders"])

    @service.consume(f"{uid}.orders", durable=f"{uid}-billing", stream=uid, max_deliveries=1)
    async def bill(message: BrokerMessage) -> None:
        raise ValueError("no such customer")

    app = service.build(broker_settings(nats_server.url, **EAGER), tracer_provider=provider)
    async with running(app):
        await nc.jetstream().publish(f"{uid}.orders", b"{}", headers={"traceparent": TRACEPARENT})
        await eventually(lambda: len(by_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)) == 1, what="span")
    (consumer,) = by_kind(exporter.get_finished_spans(), SpanKind.CONSUMER)
    assert hex_trace(consumer) == UPSTREAM_TRACE
    assert consumer.status.status_code is StatusCode.ERROR
    assert consumer.attributes is not None
    assert consumer.attributes["bastion.broker.outcome"] == "dead_letter"
    assert [event.name for event in consumer.events] == ["exception"]


async def test_without_tracing_messages_carry_no_trace_headers(nats_server: NatsServer, nc: Client, uid: str) -> None:
    service = Service("shop")

    @service.version(1).post("/orders", status_code=202)
    async def place(order: Order, broker: Annotated[Broker, Depends(current_broker)]) -> None:
        await broker.publish(f"{uid}.orders", order, headers={"x-tenant": "acme"})

    inbox = await listen(nc, f"{uid}.orders")
    app = service.build(broker_settings(nats_server.url, **EAGER))
    assert app.tracer is None
    async with running(app), client_for(app) as client:
        response = await client.post("/api/v1/orders", json={"id": "o-1"}, headers={"traceparent": TRACEPARENT})
        assert response.status_code == 202
        await eventually(lambda: len(inbox.messages) == 1, what="the message arrived")
    assert inbox.headers == [{"x-tenant": "acme"}]
