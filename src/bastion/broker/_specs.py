"""What a service declares for the broker: streams, subscribers, durable consumers, responders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bastion.broker._handlers import BoundHandler

Retention = Literal["limits", "interest", "workqueue"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSpec:
    """A JetStream stream: created at start-up, or updated when its limits or subjects changed."""

    name: str
    subjects: tuple[str, ...]
    max_messages: int = -1
    max_age: float = 0.0
    """Seconds; 0 keeps messages until another limit removes them."""
    retention: Retention = "limits"
    num_replicas: int | None = None
    """Copies on a NATS cluster; ``None``: the server's default (1) when created, and an existing stream's own
    count kept (a stream an operator pre-created with 3 replicas stays at 3)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriberSpec:
    """A core subscription: every message on ``subject`` (wildcards allowed), at most once, no persistence."""

    subject: str
    handler: BoundHandler
    queue: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSpec:
    """A durable JetStream consumer with explicit acknowledgement and a dead-letter subject."""

    subject: str
    durable: str
    handler: BoundHandler
    stream: str | None = None
    max_deliveries: int = 5
    retry_delay: float = 1.0
    """Seconds before the first redelivery; doubled on each further one, capped at 60."""
    dead_letter_subject: str | None = None
    concurrency: int = 1
    ack_wait: float = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponderSpec:
    """Answers requests on ``subject``; instances of one service share the load (a queue group)."""

    subject: str
    handler: BoundHandler
    queue: str | None = None
    concurrency: int = 100
    """Requests answered at once by this instance (each in its own task)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerPlan:
    """Everything a service declared, as the broker starts it."""

    streams: tuple[StreamSpec, ...] = ()
    subscribers: tuple[SubscriberSpec, ...] = ()
    consumers: tuple[ConsumerSpec, ...] = ()
    responders: tuple[ResponderSpec, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.streams or self.subscribers or self.consumers or self.responders)
