"""The service's broker declarations (``stream``, ``subscribe``, ``consume``, ``respond``): a part of
:class:`~bastion._service.Service`, and the registration guard every ``Service`` method shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from bastion.broker._handlers import BoundHandler
from bastion.broker._handlers import Handler as BrokerHandler
from bastion.broker._specs import ConsumerSpec, ResponderSpec, Retention, StreamSpec, SubscriberSpec
from bastion.config._messaging import MAX_REPLICAS
from bastion.config._values import check_subject
from bastion.errors import ConfigError

P = ParamSpec("P")
R = TypeVar("R")


def _subject(subject: str, *, wildcards: bool) -> str:
    try:
        return check_subject(subject, wildcards=wildcards)
    except ValueError as exc:
        raise ConfigError(f"broker subject {exc}") from None


def before_build(method: Callable[P, R]) -> Callable[P, R]:
    """Refuse a registration after ``build()``: the built app would never see it."""

    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        if getattr(args[0], "_built", False):
            raise ConfigError(
                f"service.{method.__name__}() after service.build(): register everything before building the app"
            )
        return method(*args, **kwargs)

    guarded.__name__ = method.__name__
    guarded.__qualname__ = method.__qualname__
    guarded.__doc__ = method.__doc__
    return guarded


class BrokerRegistrations:
    """``Service``'s broker declarations (docs/broker.md); the lists are the service's, set in its ``__init__``."""

    _built: bool
    _streams: list[StreamSpec]
    _subscribers: list[SubscriberSpec]
    _consumers: list[ConsumerSpec]
    _responders: list[ResponderSpec]

    @before_build
    def stream(
        self,
        name: str,
        *,
        subjects: Sequence[str],
        max_messages: int = -1,
        max_age: float = 0.0,
        retention: Retention = "limits",
        num_replicas: int | None = None,
    ) -> None:
        """Declare a JetStream stream, created (or updated) when the broker connects. ``max_age`` in seconds
        (0: no age limit); ``retention``: ``"limits"``, ``"interest"`` or ``"workqueue"``; ``num_replicas``:
        1 to 5 copies on a NATS cluster (``None``: the server's default when created, an existing stream's own
        count kept). A ``[broker.streams.NAME]`` table of the same name in the config replaces this declaration."""
        checked = [_subject(subject, wildcards=True) for subject in subjects]
        if not checked:
            raise ConfigError(f"stream {name!r} needs at least one subject")
        if num_replicas is not None and not 1 <= num_replicas <= MAX_REPLICAS:
            raise ConfigError(f"stream {name!r}: num_replicas must be 1 to {MAX_REPLICAS}, got {num_replicas}")
        self._streams.append(
            StreamSpec(
                name=name,
                subjects=tuple(checked),
                max_messages=max_messages,
                max_age=max_age,
                retention=retention,
                num_replicas=num_replicas,
            )
        )

    @before_build
    def subscribe(self, subject: str, *, queue: str | None = None) -> Callable[[BrokerHandler], BrokerHandler]:
        """Decorator: every message on ``subject`` (``*`` one token, ``>`` the rest), at most once, no ack.

        Every instance gets each message unless they share a ``queue`` group."""

        def register(handler: BrokerHandler) -> BrokerHandler:
            self._subscribers.append(
                SubscriberSpec(subject=_subject(subject, wildcards=True), handler=BoundHandler.of(handler), queue=queue)
            )
            return handler

        return register

    @before_build
    def consume(
        self,
        subject: str,
        *,
        durable: str,
        stream: str | None = None,
        max_deliveries: int = 5,
        retry_delay: float = 1.0,
        dead_letter_subject: str | None = None,
        concurrency: int = 1,
        ack_wait: float = 30.0,
    ) -> Callable[[BrokerHandler], BrokerHandler]:
        """Decorator: a durable JetStream consumer with explicit acknowledgement.

        The handler returning acks the message; raising naks it for redelivery after ``retry_delay`` seconds
        (doubled each time, at most 60). A message whose delivery number reaches ``max_deliveries`` and fails
        again is published to the dead-letter subject (``dead_letter_subject``, else
        ``<broker.dead_letter_prefix>.<durable>``) with headers naming the original subject, the deliveries
        and the error, then acked. All instances share the durable consumer (each message goes to one).
        """
        for key, value in (("max_deliveries", max_deliveries), ("concurrency", concurrency)):
            if value < 1:
                raise ConfigError(f"consume({subject!r}): {key} must be at least 1, got {value}")
        if retry_delay < 0 or ack_wait <= 0:
            raise ConfigError(f"consume({subject!r}): retry_delay must be >= 0 and ack_wait > 0")

        def register(handler: BrokerHandler) -> BrokerHandler:
            self._consumers.append(
                ConsumerSpec(
                    subject=_subject(subject, wildcards=True),
                    durable=durable,
                    handler=BoundHandler.of(handler),
                    stream=stream,
                    max_deliveries=max_deliveries,
                    retry_delay=retry_delay,
                    dead_letter_subject=_subject(dead_letter_subject, wildcards=False) if dead_letter_subject else None,
                    concurrency=concurrency,
                    ack_wait=ack_wait,
                )
            )
            return handler

        return register

    @before_build
    def respond(
        self, subject: str, *, queue: str | None = None, concurrency: int = 100
    ) -> Callable[[BrokerHandler], BrokerHandler]:
        """Decorator: answer requests on ``subject`` with the handler's return value (JSON, or bytes/str as they
        are); an exception answers with an error the requester gets as ``BrokerRequestFailed``. Instances of
        the service share the requests (queue group: the service name, unless ``queue``); each instance
        answers up to ``concurrency`` requests at once."""
        if concurrency < 1:
            raise ConfigError(f"respond({subject!r}): concurrency must be at least 1, got {concurrency}")

        def register(handler: BrokerHandler) -> BrokerHandler:
            self._responders.append(
                ResponderSpec(
                    subject=_subject(subject, wildcards=True),
                    handler=BoundHandler.of(handler),
                    queue=queue,
                    concurrency=concurrency,
                )
            )
            return handler

        return register
