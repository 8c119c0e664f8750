"""The broker of one app: a NATS connection with JetStream, and what the service declared running on it.

Three parts: the connection (``_connection.py``: ``[broker]`` URL, retries, ``lazy_init``), publishing and
requests (``_client.py``), and the declared streams, subscribers, consumers and responders (``_consumers.py``).
While it is not connected, :meth:`Broker.ready` raises, so ``/ready`` is 503 unless ``optional``.
"""

from __future__ import annotations

import structlog

from bastion import _tracing as tracing
from bastion._metrics import NO_METRICS, Metrics
from bastion.broker._client import BrokerClient
from bastion.broker._connection import BrokerConnection
from bastion.broker._consumers import Consumers
from bastion.broker._specs import BrokerPlan, ConsumerSpec
from bastion.config import BrokerSettings
from bastion.errors import BrokerUnavailable

log = structlog.get_logger("bastion.broker")


class Broker(BrokerClient):
    """Publish, request, and run the declared streams, subscribers, consumers and responders.

    Handlers see :class:`BrokerMessage`; see ``service.subscribe`` / ``consume`` / ``respond`` / ``stream``.
    Publishing while disconnected raises BrokerUnavailable (503): nothing is queued behind the caller's back.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        plan: BrokerPlan,
        *,
        service: str,
        metrics: Metrics = NO_METRICS,
        tracer: tracing.Tracer | None = None,
    ) -> None:
        connection = BrokerConnection(settings, service=service, set_up=self._set_up)
        super().__init__(connection, metrics=metrics, tracer=tracer)
        self.settings = settings
        self.plan = plan
        self.service = service
        self.consumers = Consumers(connection, plan, handle=self, metrics=metrics, tracer=tracer)

    @property
    def connected(self) -> bool:
        """Connected, and the streams, subscriptions and consumers are set up."""
        return self.connection.connected

    @property
    def dead_lettered(self) -> int:
        """Messages published to a dead-letter subject since start."""
        return self.consumers.dead_lettered

    def dead_letter_subject(self, spec: ConsumerSpec) -> str:
        return self.consumers.dead_letter_subject(spec)

    async def ready(self) -> None:
        """Readiness check: raises while the broker is not connected (``/ready`` lists ``broker``)."""
        if not self.connected:
            raise BrokerUnavailable("broker not connected")

    async def start(self) -> None:
        """Connect now (``lazy_init = false``: raising after the retries) or in the background."""
        await self.connection.start()

    async def stop(self) -> None:
        """Stop consuming and subscribing (handlers in flight finish, for up to ``drain_timeout_secs``), then
        drain the connection (what was published is flushed)."""
        await self.connection.stop_connecting()
        await self.consumers.stop()
        await self.connection.drain()
        log.info("broker_stopped")

    async def _set_up(self) -> None:
        await self.consumers.set_up()
