"""The test clients' broker: which one a client builds the service with, and ``client.broker``.

``broker=None`` (the default) runs the service's broker work on the in-memory broker when it declares some
(``service.stream`` / ``subscribe`` / ``consume`` / ``respond``) and the settings name no ``broker.url``, and on
the configured NATS server otherwise; ``"memory"`` always in memory, ``"nats"`` always as configured.
:class:`SyncMemoryBroker` is the sync client's view of the in-memory broker: each call runs in the app's loop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from bastion.broker._handlers import BrokerMessage
from bastion.broker._memory import MemoryBroker

if TYPE_CHECKING:
    from bastion._app import BastionApp
    from bastion._service import Service
    from bastion.config import Settings
    from bastion_core.testing import FakeClock

BrokerChoice = Literal["memory", "nats"]
BROKER_CHOICES = ("memory", "nats")
T = TypeVar("T")


def build_option(service: Service, settings: Settings, broker: BrokerChoice | None) -> Literal["memory"] | None:
    """``"memory"`` when the client runs the in-memory broker (see the module docstring), else ``None``."""
    if broker is not None and broker not in BROKER_CHOICES:
        raise ValueError(f"broker={broker!r}: expected 'memory', 'nats' or None (memory unless broker.url is set)")
    if broker is None:
        configured = settings.broker is not None and settings.broker.active
        return "memory" if not configured and not service.parts().broker.empty else None
    return "memory" if broker == "memory" else None


def memory_broker(app: BastionApp) -> MemoryBroker:
    """The app's in-memory broker; RuntimeError when the app runs another broker, or none."""
    if isinstance(app.broker, MemoryBroker):
        return app.broker
    if app.broker is not None:
        raise RuntimeError(
            "client.broker is the in-memory broker, and this client runs the NATS broker of broker.url "
            "(client.app.broker); pass broker='memory' to the client to test without a server"
        )
    raise RuntimeError(
        "the service has no broker: it declares no broker work (service.consume / subscribe / respond / stream); "
        "pass broker='memory' to the client for one its handlers can publish on"
    )


class SyncMemoryBroker:
    """The in-memory broker for sync tests (``ServiceClient.broker``): :class:`MemoryBroker`'s methods, each run
    in the app's event loop and returning its result."""

    def __init__(self, broker: MemoryBroker, run: Callable[[Callable[[], Any]], Any]) -> None:
        self.broker = broker
        self._run = run

    @property
    def clock(self) -> FakeClock:
        """The broker's own time (retry delays are counted on it)."""
        return self.broker.clock

    @property
    def dead_lettered(self) -> int:
        return self.broker.dead_lettered

    def publish(
        self, subject: str, data: Any, *, headers: dict[str, str] | None = None, ack: bool = False
    ) -> int | None:
        """Publish and return once what it reached has been handled (see :meth:`MemoryBroker.publish`)."""
        result: int | None = self._run(partial(self.broker.publish, subject, data, headers=headers, ack=ack))
        return result

    def request(
        self, subject: str, data: Any, *, timeout: float = 2.0, headers: dict[str, str] | None = None
    ) -> BrokerMessage:
        result: BrokerMessage = self._run(partial(self.broker.request, subject, data, timeout=timeout, headers=headers))
        return result

    def published(self, subject: str | None = None) -> list[BrokerMessage]:
        result: list[BrokerMessage] = self._run(partial(self._read, self.broker.published, subject))
        return result

    def pending(self, durable: str | None = None) -> list[BrokerMessage]:
        result: list[BrokerMessage] = self._run(partial(self._read, self.broker.pending, durable))
        return result

    def advance(self, seconds: float) -> None:
        self._run(partial(self.broker.advance, seconds))

    def drain(self) -> None:
        self._run(self.broker.drain)

    @staticmethod
    async def _read(read: Callable[[T], list[BrokerMessage]], argument: T) -> list[BrokerMessage]:
        return read(argument)
