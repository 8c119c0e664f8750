"""The broker inside HTTP handlers: ``broker: Broker = Depends(current_broker)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection

from bastion.broker._handlers import BrokerHandle
from bastion.errors import BrokerUnavailable

if TYPE_CHECKING:  # nats-py (the broker extra) comes with the Broker: an app without a broker does not need it
    from bastion.broker._broker import Broker


def optional_broker(connection: HTTPConnection) -> Broker | None:
    """The app's broker, or ``None`` when none is configured (``[broker]`` without a url)."""
    app: Any = connection.scope.get("app")
    broker = getattr(app, "broker", None)
    return broker if isinstance(broker, BrokerHandle) else None  # type: ignore[return-value]


def current_broker(connection: HTTPConnection) -> Broker:
    """The app's broker; 503 ``BROKER_UNAVAILABLE`` when none is configured."""
    broker = optional_broker(connection)
    if broker is None:
        raise BrokerUnavailable("no broker is configured")
    return broker
