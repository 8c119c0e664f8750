"""The in-memory broker of the test clients: the service's streams, subscribers, durable consumers and responders
run in the test's event loop, with JetStream's semantics where a test can see them and no server.

A publish runs what it reaches before it returns: each matching subscriber, then each durable consumer's
deliveries that are due (one at a time per consumer, in order). A handler that raises naks: the message comes
again after its retry delay on the broker's own clock (a :class:`FakeClock` starting at 0), which only
:meth:`MemoryBroker.advance` and :meth:`MemoryBroker.drain` move, so a redelivery never costs real time. What
differs from JetStream is listed in docs/testing.md ("The in-memory broker").
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import itertools
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from bastion._metrics import NO_METRICS, Metrics
from bastion.broker import _outcomes as outcomes
from bastion.broker._handlers import BrokerHandle, BrokerMessage, encode
from bastion.broker._specs import BrokerPlan, ConsumerSpec, StreamSpec
from bastion.config import BrokerSettings
from bastion.errors import BrokerTimeout, BrokerUnavailable, ConfigError, NoResponders
from bastion_core.testing import FakeClock

log = structlog.get_logger("bastion.broker")
T = TypeVar("T")

MAX_DRAIN_DELIVERIES = 10_000
"""``drain()`` gives up after this many deliveries (a handler that republishes what it consumes never settles)."""


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` is one of ``pattern``'s subjects (``*``: one token, a last ``>``: one or more)."""
    tokens = subject.split(".")
    for index, token in enumerate(pattern.split(".")):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or token not in ("*", tokens[index]):
            return False
    return len(pattern.split(".")) == len(tokens)


def subjects_overlap(first: str, second: str) -> bool:
    """Whether some subject matches both patterns."""
    a, b = first.split("."), second.split(".")
    for x, y in zip(a, b, strict=False):
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(a) == len(b)


@dataclass(slots=True, kw_only=True)
class _Delivery:
    """A stored message a durable consumer has not settled, due at ``due`` on the broker's clock (its
    ``deliveries`` so far are in the message; ``order`` keeps publishing order among equal times)."""

    message: BrokerMessage
    due: float
    order: int


@dataclass(slots=True)
class _Stream:
    spec: StreamSpec
    sequence: int = 0


@dataclass(slots=True)
class _Consumer:
    spec: ConsumerSpec
    stream: str
    waiting: list[_Delivery] = field(default_factory=list)
    busy: bool = False

    def next_due(self, now: float) -> _Delivery | None:
        due = [delivery for delivery in self.waiting if delivery.due <= now]
        if not due:
            return None
        first = min(due, key=lambda delivery: (delivery.due, delivery.order))
        self.waiting.remove(first)
        return first


class MemoryBroker(BrokerHandle):
    """The service's broker work, in memory: ``publish``, ``request``, ``ready``, ``start``, ``stop`` as the NATS
    Broker has them, plus what tests read and drive (:meth:`published`, :meth:`pending`, :meth:`advance`,
    :meth:`drain`, ``clock``, ``dead_lettered``).

    Handlers get this broker where they ask for ``Broker`` (a parameter, ``Depends(current_broker)``).
    """

    def __init__(
        self, settings: BrokerSettings, plan: BrokerPlan, *, service: str, metrics: Metrics = NO_METRICS
    ) -> None:
        self.settings = settings
        self.plan = plan
        self.service = service
        self.metrics = metrics
        self.clock = FakeClock(0.0)
        """The broker's own time in seconds: retry delays are counted on it (``advance``/``drain`` move it)."""
        self.connected = False
        self.dead_lettered = 0
        self._published: list[BrokerMessage] = []
        self._streams: dict[str, _Stream] = {}
        self._consumers: list[_Consumer] = []
        self._orders = itertools.count()
        self._answering: set[asyncio.Task[Any]] = set()

    async def ready(self) -> None:
        """Readiness check: raises while the broker is not started."""
        if not self.connected:
            raise BrokerUnavailable("broker not connected")

    async def start(self) -> None:
        """Create the streams and bind each consumer to its stream: ConfigError where JetStream refuses."""
        self._streams, self._consumers = {}, []
        for spec in self.plan.streams:
            for other in self._streams.values():
                if any(subjects_overlap(a, b) for a in spec.subjects for b in other.spec.subjects):
                    raise ConfigError(
                        f"broker stream {spec.name!r} cannot be created: subjects overlap with an existing stream"
                    )
            self._streams[spec.name] = _Stream(spec)
        self._consumers = [_Consumer(spec, self._stream_of(spec)) for spec in self.plan.consumers]
        for consumer in self._consumers:
            subject = self.dead_letter_subject(consumer.spec)
            if self._storing(subject) is None:
                log.warning(
                    "broker_dead_letters_not_stored",
                    consumer=consumer.spec.durable,
                    dead_letter_subject=subject,
                    hint="declare a stream on the dead-letter subject to keep them (bastion docs broker)",
                )
        self.connected = True

    async def stop(self) -> None:
        """Stop: publishing raises BrokerUnavailable again; replies still being computed are cancelled."""
        self.connected = False
        for task in self._answering:
            task.cancel()
        await asyncio.gather(*self._answering, return_exceptions=True)

    def dead_letter_subject(self, spec: ConsumerSpec) -> str:
        return outcomes.dead_letter_subject(spec, self.settings.dead_letter_prefix)

    def published(self, subject: str | None = None) -> list[BrokerMessage]:
        """What was published (by handlers, the test, dead letters, audit events), oldest first; only on subjects
        ``subject`` matches when given (wildcards allowed)."""
        return [m for m in self._published if subject is None or subject_matches(subject, m.subject)]

    def pending(self, durable: str | None = None) -> list[BrokerMessage]:
        """Messages a durable consumer (``durable``, else any) has not settled yet, as last delivered."""
        return [
            delivery.message
            for consumer in self._consumers
            if durable is None or consumer.spec.durable == durable
            for delivery in sorted(consumer.waiting, key=lambda d: (d.due, d.order))
        ]

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward and run the redeliveries that became due."""
        self.clock.advance(seconds)
        await self._run_consumers()

    async def drain(self) -> None:
        """Run every waiting delivery, moving the clock to each redelivery's time, until every message is acked
        or dead-lettered. RuntimeError after 10,000 deliveries (a loop that never settles)."""
        for _ in range(MAX_DRAIN_DELIVERIES):
            due = [delivery.due for consumer in self._consumers for delivery in consumer.waiting]
            if not due:
                return
            self.clock.now = max(self.clock.now, min(due))
            await self._run_consumers()
        raise RuntimeError(f"the in-memory broker did not settle after {MAX_DRAIN_DELIVERIES} deliveries")

    async def publish(
        self, subject: str, data: Any, *, headers: Mapping[str, str] | None = None, ack: bool = False
    ) -> int | None:
        """Publish as the NATS Broker does; returns once the subscribers and the consumers' due deliveries it
        reached have run. ``ack=True``: the stream's sequence number, BrokerUnavailable when no stream stores
        ``subject``."""
        if not self.connected:
            raise BrokerUnavailable()
        stream = self._storing(subject)
        if ack and stream is None:
            raise BrokerUnavailable(f"no stream stores subject {subject!r}")
        message = BrokerMessage(subject=subject, data=encode(data), headers=dict(headers or {}))
        self._published.append(message)
        self.metrics.broker_published(acknowledged=ack)
        sequence = self._store(stream, message) if stream is not None else None
        await self._run_subscribers(message)
        await self._run_consumers()
        return sequence if ack else None

    async def request(
        self,
        subject: str,
        data: Any,
        *,
        timeout: float = 2.0,  # noqa: ASYNC109 - the reply deadline, as the NATS Broker's
        headers: Mapping[str, str] | None = None,
    ) -> BrokerMessage:
        """Ask the first matching responder, as the NATS Broker does (BrokerTimeout after ``timeout`` seconds of
        real time, NoResponders, BrokerRequestFailed). A request only subscribers hear times out at once."""
        if not self.connected:
            self.metrics.broker_request("unavailable")
            raise BrokerUnavailable()
        inbox = f"_INBOX.{os.urandom(11).hex()}"
        message = BrokerMessage(subject=subject, data=encode(data), headers=dict(headers or {}), reply=inbox)
        responders = [spec for spec in self.plan.responders if subject_matches(spec.subject, subject)]
        if not responders:
            heard = await self._run_subscribers(message)
            self.metrics.broker_request("timeout" if heard else "no_responders")
            if heard:
                log.warning("broker_request_timed_out", request_subject=subject, timeout=timeout)
                raise BrokerTimeout()
            log.warning("broker_no_responders", request_subject=subject)
            raise NoResponders()
        task = _isolated(self._answer(responders[0].subject, responders[0].handler, message))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        try:
            async with asyncio.timeout(timeout):
                body, reply_headers = await asyncio.shield(task)
        except TimeoutError:
            self.metrics.broker_request("timeout")
            log.warning("broker_request_timed_out", request_subject=subject, timeout=timeout)
            raise BrokerTimeout() from None
        reply = BrokerMessage(subject=inbox, data=body, headers=reply_headers)
        failed = outcomes.failed_reply(reply)
        self.metrics.broker_request("failed" if failed else "ok")
        if failed is not None:
            raise failed
        return reply

    def _storing(self, subject: str) -> str | None:
        """The stream that stores ``subject``, if any."""
        for name, stream in self._streams.items():
            if any(subject_matches(pattern, subject) for pattern in stream.spec.subjects):
                return name
        return None

    def _stream_of(self, spec: ConsumerSpec) -> str:
        """The stream a durable consumer reads (its ``stream``, else the one storing its subject)."""
        named = [spec.stream] if spec.stream is not None else list(self._streams)
        for name in named:
            stream = self._streams.get(name)
            if stream is not None and any(subjects_overlap(spec.subject, s) for s in stream.spec.subjects):
                return name
            if stream is not None and spec.stream is not None:
                raise ConfigError(
                    f"broker consumer {spec.durable!r} cannot be created: consumer filter subject is not a valid "
                    "subset of the interest subjects"
                )
        raise ConfigError(
            f"broker consumer {spec.durable!r}: no stream stores subject {spec.subject!r}; declare one with "
            "service.stream(...) or a [broker.streams.NAME] table"
        )

    def _store(self, name: str, message: BrokerMessage) -> int:
        """Append to the stream; each of its consumers whose subject matches gets a delivery, due now."""
        stream = self._streams[name]
        stream.sequence += 1
        stored = dataclasses.replace(message, stream=name, sequence=stream.sequence, deliveries=0)
        for consumer in self._consumers:
            if consumer.stream == name and subject_matches(consumer.spec.subject, message.subject):
                consumer.waiting.append(_Delivery(message=stored, due=self.clock(), order=next(self._orders)))
        return stream.sequence

    async def _run_subscribers(self, message: BrokerMessage) -> bool:
        """Each matching subscriber (one per queue group) handles ``message``; whether any heard it."""
        groups: set[str] = set()
        heard = False
        for spec in self.plan.subscribers:
            if not subject_matches(spec.subject, message.subject) or spec.queue in groups:
                continue
            if spec.queue is not None:
                groups.add(spec.queue)
            heard = True
            await _isolated(self._subscriber(spec.subject, spec.handler, message))
        return heard

    async def _subscriber(self, subject: str, handler: Callable[..., Awaitable[Any]], message: BrokerMessage) -> None:
        with structlog.contextvars.bound_contextvars(message_subject=message.subject):
            try:
                await handler(dataclasses.replace(message, reply=None), self)
            except Exception as exc:
                log.error("broker_subscriber_failed", subscriber=subject, exc_info=exc)

    async def _answer(
        self, subject: str, handler: Callable[..., Awaitable[Any]], message: BrokerMessage
    ) -> tuple[bytes, dict[str, str]]:
        with structlog.contextvars.bound_contextvars(message_subject=message.subject):
            try:
                result = await handler(message, self)
            except Exception as exc:
                log.warning("broker_responder_failed", responder=subject, error=f"{type(exc).__name__}: {exc}")
                return outcomes.error_reply(exc)
            return outcomes.reply_to(result)

    async def _run_consumers(self) -> None:
        for consumer in self._consumers:
            if not consumer.busy:
                await _isolated(self._consume(consumer))

    async def _consume(self, consumer: _Consumer) -> None:
        """Deliver what is due, one at a time and in order; a publish from a handler queues behind it."""
        consumer.busy = True
        try:
            while self.connected and (delivery := consumer.next_due(self.clock())) is not None:
                await self._deliver(consumer, delivery)
        finally:
            consumer.busy = False

    async def _deliver(self, consumer: _Consumer, delivery: _Delivery) -> None:
        spec = consumer.spec
        message = dataclasses.replace(delivery.message, deliveries=delivery.message.deliveries + 1)
        with structlog.contextvars.bound_contextvars(message_id=message.message_id, consumer=spec.durable):
            try:
                await spec.handler(message, self)
            except Exception as exc:
                error = outcomes.failure(exc)
                if message.deliveries >= spec.max_deliveries:
                    await self._dead_letter(spec, message, error)
                    self.metrics.broker_consumed(spec.durable, "dead_letter")
                    return
                delay = outcomes.retry_delay(spec, message.deliveries)
                log.warning("broker_message_failed", deliveries=message.deliveries, retry_in=delay, error=error)
                consumer.waiting.append(_Delivery(message=message, due=self.clock() + delay, order=next(self._orders)))
                self.metrics.broker_consumed(spec.durable, "nak")
                return
            self.metrics.broker_consumed(spec.durable, "ack")

    async def _dead_letter(self, spec: ConsumerSpec, message: BrokerMessage, error: str) -> None:
        subject = self.dead_letter_subject(spec)
        await self.publish(subject, message.data, headers=outcomes.dead_letter_headers(spec, message, error))
        self.dead_lettered += 1
        log.warning(
            "broker_message_dead_lettered",
            dead_letter_subject=subject,
            original_subject=message.subject,
            deliveries=message.deliveries,
            stored_in=self._storing(subject),
            error=error,
        )


def _isolated(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """``work`` as a task in a context of its own: a handler does not see the publisher's context (its request
    id, its log fields), as a consumer in another process would not."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())
