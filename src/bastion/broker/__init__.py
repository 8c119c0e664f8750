"""The message broker: NATS with JetStream (publish/subscribe, streams, durable consumers with dead letters,
request/reply), configured by ``[broker]`` and declared on the service (see docs/broker.md).

Handlers are declared with ``service.subscribe`` / ``consume`` / ``respond`` and streams with
``service.stream`` (or ``[broker.streams.NAME]``); HTTP handlers publish through
``broker: Broker = Depends(current_broker)``.
"""

from bastion.broker._broker import Broker
from bastion.broker._dependencies import current_broker, optional_broker
from bastion.broker._handlers import BrokerMessage

__all__ = ["Broker", "BrokerMessage", "current_broker", "optional_broker"]
