"""docs/broker.md's example tested as docs/testing.md shows it: no NATS server, the in-memory broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bastion import Service
from bastion.testing import ServiceClient
from examples.orders_broker import billed, service


@pytest.fixture
def bastion_service() -> Service:
    return service


@pytest.fixture
def bastion_environ() -> dict[str, str]:
    return {"SERVICE_TOKEN_ENABLED": "false"}


@pytest.fixture(autouse=True)
def _forget_what_was_billed() -> Iterator[None]:
    """The example records charges in a module-level list (its stand-in for a payment provider)."""
    yield
    billed.clear()


def test_an_order_is_billed(bastion_client: ServiceClient) -> None:
    response = bastion_client.post("/api/v1/orders", json={"id": "o-1", "total_cents": 500})
    assert response.json() == {"sequence": 1}  # ORDERS stored it; the consumer ran before the answer came back
    charged = bastion_client.broker.published("billing.charged")
    assert [message.json() for message in charged] == [{"id": "o-1", "attempt": 1}]


def test_a_declined_order_is_dead_lettered_on_its_third_delivery(bastion_client: ServiceClient) -> None:
    bastion_client.post("/api/v1/orders", json={"id": "o-2", "total_cents": 0})
    assert [message.deliveries for message in bastion_client.broker.pending("billing")] == [1]
    bastion_client.broker.drain()  # the redeliveries, 0.5 s and 1 s later on the broker's clock: no waiting
    [dead] = bastion_client.broker.published("deadletter.>")
    assert dead.subject == "deadletter.billing"
    assert dead.json() == {"id": "o-2", "total_cents": 0}
    assert dead.headers["Bastion-Deliveries"] == "3"
    assert dead.headers["Bastion-Error"] == "PaymentDeclined: cannot charge 0 cents"
    assert bastion_client.broker.clock() == 1.5


def test_a_price_comes_over_request_reply(bastion_client: ServiceClient) -> None:
    assert bastion_client.get("/api/v1/prices/A-1").json() == {"sku": "A-1", "cents": 1999}
