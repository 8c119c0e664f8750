"""The broker example of docs/broker.md: a stream, a durable consumer with dead letters, a request/reply pair.

``SERVICE_BROKER_URL=nats://127.0.0.1:4222 SERVICE_TOKEN_ENABLED=false bastion run examples.orders_broker:service``
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from pydantic import BaseModel

from bastion import Service
from bastion.broker import Broker, BrokerMessage, current_broker


class OrderPlaced(BaseModel):
    id: str
    total_cents: int


class PriceQuery(BaseModel):
    sku: str


class Price(BaseModel):
    sku: str
    cents: int


class PaymentDeclined(Exception):
    pass


billed: list[str] = []
"""What the consumer charged (this example's stand-in for a payment provider)."""


async def charge(order: OrderPlaced) -> None:
    if order.total_cents <= 0:
        raise PaymentDeclined(f"cannot charge {order.total_cents} cents")
    billed.append(order.id)


service = Service("orders")
v1 = service.version(1)

# A stream keeps every message on orders.> (a day at most); a second one keeps the dead letters (a week).
service.stream("ORDERS", subjects=["orders.>"], max_age=86_400, retention="limits")
service.stream("DEAD", subjects=["deadletter.>"], max_age=7 * 86_400)


# A durable consumer: return -> ack; raise -> nak, redelivered after 0.5 s, then 1 s; the 3rd failure
# publishes the message to deadletter.billing (headers: original subject, deliveries, error), then acks it.
@service.consume("orders.placed", durable="billing", stream="ORDERS", max_deliveries=3, retry_delay=0.5)
async def bill(order: OrderPlaced, message: BrokerMessage, broker: Broker) -> None:
    await charge(order)
    await broker.publish("billing.charged", {"id": order.id, "attempt": message.deliveries})  # a follow-up event


# A responder: its return value is the reply; instances of the service share the requests.
@service.respond("prices.get")
async def price(query: PriceQuery) -> Price:
    return Price(sku=query.sku, cents=1999)


# HTTP handlers reach the broker through a dependency.
@v1.post("/orders")
async def place(order: OrderPlaced, broker: Annotated[Broker, Depends(current_broker)]) -> dict[str, int | None]:
    sequence = await broker.publish("orders.placed", order, ack=True)  # stored by ORDERS before we answer
    return {"sequence": sequence}


@v1.get("/prices/{sku}")
async def get_price(sku: str, broker: Annotated[Broker, Depends(current_broker)]) -> Price:
    reply = await broker.request("prices.get", PriceQuery(sku=sku), timeout=2.0)
    return Price.model_validate_json(reply.data)
