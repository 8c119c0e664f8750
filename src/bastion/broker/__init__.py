"""The message broker: NATS with JetStream (publish/subscribe, streams, durable consumers with dead letters,
request/reply), configured by ``[broker]`` and declared on the service (see docs/broker.md).

Handlers are declared with ``service.subscribe`` / ``consume`` / ``respond`` and streams with
``service.stream`` (or ``[broker.streams.NAME]``); HTTP handlers publish through
``broker: Broker = Depends(current_broker)``.

``Broker`` loads on first use (PEP 562): it brings nats-py, the broker extra (``pip install 'bastion[broker]'``);
without it, naming ``Broker`` raises the one-line MissingExtra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bastion.broker._dependencies import current_broker, optional_broker
from bastion.broker._handlers import BrokerMessage

if TYPE_CHECKING:
    from bastion.broker._broker import Broker

__all__ = ["Broker", "BrokerMessage", "current_broker", "optional_broker"]


def __getattr__(name: str) -> object:
    if name == "Broker":
        from bastion import _extras as extras

        extras.BROKER.require()
        from bastion.broker._broker import Broker

        return Broker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
