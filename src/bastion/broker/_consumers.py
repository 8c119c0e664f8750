"""What the service declared running on the broker: streams, subscribers, responders and durable consumers
(their fetch loops, retries with backoff, dead letters), set up on each connection and stopped with a drain."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError as JetStreamAPIError
from nats.js.errors import Error as JetStreamError
from nats.js.errors import NotFoundError as JetStreamNotFound

from bastion import _tracing as tracing
from bastion._metrics import Metrics
from bastion.broker import _outcomes as outcomes
from bastion.broker._client import message_from, messaging_attributes, pending_after
from bastion.broker._connection import MAX_BACKGROUND_BACKOFF_SECS, BrokerConnection
from bastion.broker._handlers import BrokerHandle, BrokerMessage
from bastion.broker._specs import BrokerPlan, ConsumerSpec, ResponderSpec, SubscriberSpec
from bastion.broker._streams import ensure_stream
from bastion.errors import BrokerUnavailable, ConfigError

log = structlog.get_logger("bastion.broker")

FETCH_WAIT_SECS = 1.0


class Consumers:
    """The declared streams and handlers of ``plan`` on ``connection``; each handler gets ``handle`` (the broker)
    to publish follow-ups. ``set_up`` runs on each new connection, ``stop`` once, after the connection stops
    connecting and before it drains."""

    def __init__(
        self,
        connection: BrokerConnection,
        plan: BrokerPlan,
        *,
        handle: BrokerHandle,
        metrics: Metrics,
        tracer: tracing.Tracer | None,
    ) -> None:
        self.connection = connection
        self.settings = connection.settings
        self.plan = plan
        self.handle = handle
        self.metrics = metrics
        self.tracer = tracer
        self._workers: list[asyncio.Task[None]] = []
        self._subscriptions: list[Any] = []
        self._pulls: list[Any] = []
        self._answering: set[asyncio.Task[None]] = set()
        self._dead_letter_streams: dict[str, str | None] = {}
        self.dead_lettered = 0

    async def set_up(self) -> None:
        """Streams, then core subscriptions and responders, then the consumers' fetch loops (once)."""
        nc, js = self.connection.nc, self.connection.js
        assert nc is not None
        assert js is not None
        self._subscriptions, self._pulls, self._dead_letter_streams = [], [], {}
        for spec in self.plan.streams:
            await ensure_stream(js, spec)
        for subscriber in self.plan.subscribers:
            self._subscriptions.append(
                await nc.subscribe(subscriber.subject, queue=subscriber.queue or "", cb=self._subscriber(subscriber))
            )
        for responder in self.plan.responders:
            queue = responder.queue or self.connection.service
            self._subscriptions.append(
                await nc.subscribe(responder.subject, queue=queue, cb=self._responder(responder))
            )
        await self._confirm_subscriptions()
        pulls = [(consumer, await self._pull_subscription(consumer)) for consumer in self.plan.consumers]
        for consumer in self.plan.consumers:
            await self._find_dead_letter_stream(consumer)
        self._pulls = [subscription for _, subscription in pulls]
        for consumer, subscription in pulls:
            self._workers.append(
                asyncio.create_task(self._consume(consumer, subscription), name=f"broker-consumer-{consumer.durable}")
            )

    async def stop(self) -> None:
        """Stop consuming and subscribing; handlers in flight finish, for up to ``drain_timeout_secs``."""
        if self._workers:
            # Each worker leaves its loop after the fetch in progress and the handlers it started; a handler
            # still running after drain_timeout_secs is cancelled (its message, unacked, is redelivered).
            _, late = await asyncio.wait(self._workers, timeout=self.settings.drain_timeout_secs)
            for worker in late:
                worker.cancel()
            for worker in late:
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
        for subscription in self._subscriptions:
            # No new messages; those already received are handled (responders' answers are awaited below).
            with contextlib.suppress(NatsError, TimeoutError):
                await subscription.drain()
        if self._answering:
            _, late = await asyncio.wait(self._answering, timeout=self.settings.drain_timeout_secs)
            for task in late:
                task.cancel()
        for pull in self._pulls:
            # A pull subscription has nothing to drain once its worker stopped fetching (and nats-py's drain
            # would wait for it until drain_timeout): unsubscribe it first.
            with contextlib.suppress(NatsError):
                await pull.unsubscribe()

    def dead_letter_subject(self, spec: ConsumerSpec) -> str:
        return outcomes.dead_letter_subject(spec, self.settings.dead_letter_prefix)

    async def _confirm_subscriptions(self) -> None:
        """Return once the server has every subscription made so far, so start-up completes with them live.

        A message to ourselves proves it (the server reads a connection's protocol in order). ``flush()`` does
        not: right after connecting, nats-py's first flush can be answered by an earlier PONG.
        """
        nc = self.connection.nc
        assert nc is not None
        probe = nc.new_inbox()
        subscription = await nc.subscribe(probe, max_msgs=1)
        await nc.publish(probe, b"")
        try:
            await subscription.next_msg(timeout=self.settings.connect_timeout_secs)
        except NatsTimeoutError:
            raise BrokerUnavailable("the broker did not confirm the subscriptions in time") from None

    async def _find_dead_letter_stream(self, spec: ConsumerSpec) -> None:
        """Whether a stream stores this consumer's dead letters (then they are published with an ack)."""
        assert self.connection.js is not None
        subject = self.dead_letter_subject(spec)
        try:
            stream: str | None = await self.connection.js.find_stream_name_by_subject(subject)
        except JetStreamNotFound:
            stream = None
            log.warning(
                "broker_dead_letters_not_stored",
                consumer=spec.durable,
                dead_letter_subject=subject,
                hint="declare a stream on the dead-letter subject to keep them (bastion docs broker)",
            )
        self._dead_letter_streams[spec.durable] = stream

    async def _pull_subscription(self, spec: ConsumerSpec) -> Any:
        """The durable consumer (created when missing; explicit acks; redeliveries counted by us, not capped)."""
        assert self.connection.js is not None
        try:
            return await self.connection.js.pull_subscribe(
                spec.subject,
                durable=spec.durable,
                stream=spec.stream,
                config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_deliver=-1, ack_wait=spec.ack_wait),
            )
        except JetStreamNotFound:
            raise ConfigError(
                f"broker consumer {spec.durable!r}: no stream stores subject {spec.subject!r}; declare one with "
                "service.stream(...) or a [broker.streams.NAME] table"
            ) from None
        except JetStreamAPIError as exc:
            raise ConfigError(f"broker consumer {spec.durable!r} cannot be created: {exc.description}") from None

    def _subscriber(self, spec: SubscriberSpec) -> Any:
        async def callback(msg: Msg) -> None:
            message = message_from(msg)
            with self._consumer_span(message), structlog.contextvars.bound_contextvars(message_subject=message.subject):
                try:
                    await spec.handler(message, self.handle)
                except Exception as exc:
                    tracing.fail(exc)
                    log.error("broker_subscriber_failed", subscriber=spec.subject, exc_info=exc)

        return callback

    def _responder(self, spec: ResponderSpec) -> Any:
        """Each request is answered in its own task (a slow answer does not hold up the next request), at most
        ``spec.concurrency`` at once; beyond that the subscription's pending queue waits."""
        slots = asyncio.Semaphore(spec.concurrency)

        async def answer(msg: Msg) -> None:
            try:
                await self._answer(spec, msg)
            finally:
                slots.release()

        async def callback(msg: Msg) -> None:
            if not msg.reply:
                return
            await slots.acquire()
            task = asyncio.create_task(answer(msg))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

        return callback

    async def _answer(self, spec: ResponderSpec, msg: Msg) -> None:
        message = message_from(msg)
        nc = self.connection.client()
        with self._consumer_span(message), structlog.contextvars.bound_contextvars(message_subject=message.subject):
            try:
                result = await spec.handler(message, self.handle)
            except Exception as exc:
                tracing.fail(exc)
                log.warning("broker_responder_failed", responder=spec.subject, error=f"{type(exc).__name__}: {exc}")
                reply, headers = outcomes.error_reply(exc)
            else:
                reply, headers = outcomes.reply_to(result)
            try:
                await nc.publish(msg.reply, reply, headers=headers or None)
            except NatsError as exc:
                log.warning("broker_reply_failed", error=type(exc).__name__)

    async def _consume(self, spec: ConsumerSpec, subscription: Any) -> None:
        """Fetch and handle messages until stopped; survive outages (the fetch resumes after a reconnect)."""
        failures = 0
        while not self.connection.stopping:
            try:
                messages = await subscription.fetch(batch=spec.concurrency, timeout=FETCH_WAIT_SECS)
            except (TimeoutError, NatsTimeoutError):
                continue
            except (NatsError, JetStreamError) as exc:
                failures += 1
                delay = min(MAX_BACKGROUND_BACKOFF_SECS, 0.2 * 2 ** min(failures, 6))
                log.warning("broker_consumer_waiting", consumer=spec.durable, error=type(exc).__name__, retry_in=delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            await asyncio.gather(*(self._handle(spec, msg) for msg in messages))

    async def _handle(self, spec: ConsumerSpec, msg: Msg) -> None:
        message = message_from(msg)
        pending = pending_after(msg)
        if pending is not None:
            self.metrics.broker_pending(spec.durable, pending)
        with (
            self._consumer_span(message, consumer=spec.durable),
            structlog.contextvars.bound_contextvars(message_id=message.message_id, consumer=spec.durable),
        ):
            try:
                await spec.handler(message, self.handle)
            except Exception as exc:
                tracing.fail(exc)
                await self._failed(spec, msg, message, exc)
                return
            try:
                await msg.ack()
            except NatsError as exc:
                # Not acknowledged: JetStream redelivers it after ack_wait (at least once).
                log.warning("broker_ack_failed", error=type(exc).__name__)
                return
            self.metrics.broker_consumed(spec.durable, "ack")

    async def _failed(self, spec: ConsumerSpec, msg: Msg, message: BrokerMessage, exc: Exception) -> None:
        error = outcomes.failure(exc)
        try:
            if message.deliveries >= spec.max_deliveries:
                await self._dead_letter(spec, message, error)
                await msg.ack()
                self.metrics.broker_consumed(spec.durable, "dead_letter")
                return
            delay = outcomes.retry_delay(spec, message.deliveries)
            log.warning("broker_message_failed", deliveries=message.deliveries, retry_in=delay, error=error)
            await msg.nak(delay=delay)
            self.metrics.broker_consumed(spec.durable, "nak")
        except (TimeoutError, NatsError, JetStreamError, BrokerUnavailable) as failure:
            # Neither acked nor dead-lettered: JetStream redelivers it; nothing is lost.
            log.warning("broker_failure_not_recorded", error=type(failure).__name__)

    async def _dead_letter(self, spec: ConsumerSpec, message: BrokerMessage, error: str) -> None:
        """Publish to the dead-letter subject: acknowledged by its stream when one stores it, else to whoever
        listens. Raises when that fails (the caller then leaves the message unacked: it comes again)."""
        subject = self.dead_letter_subject(spec)
        headers = outcomes.dead_letter_headers(spec, message, error)
        stream = self._dead_letter_streams.get(spec.durable)
        nc = self.connection.client()
        if stream is not None:
            assert self.connection.js is not None
            await self.connection.js.publish(subject, message.data, headers=headers, stream=stream)
        else:
            await nc.publish(subject, message.data, headers=headers)
            await nc.flush()
        self.dead_lettered += 1
        log.warning(
            "broker_message_dead_lettered",
            dead_letter_subject=subject,
            original_subject=message.subject,
            deliveries=message.deliveries,
            stored_in=stream,
            error=error,
        )

    def _consumer_span(self, message: BrokerMessage, *, consumer: str | None = None) -> ContextManager[object]:
        """The span of handling one message (a tracer only when tracing is on): a child of the publisher's span
        when its headers carry one."""
        if self.tracer is None:
            return _NO_SPAN
        attributes = messaging_attributes(message.subject, "process")
        if consumer is not None:
            attributes["messaging.consumer.group.name"] = consumer
        if message.deliveries > 1:
            attributes["messaging.message.delivery_count"] = message.deliveries
        return _traced(
            self.tracer.start_as_current_span(
                f"process {message.subject}",
                context=tracing.extract((name.lower(), value) for name, value in message.headers.items()),
                kind=tracing.CONSUMER,
                attributes=attributes,
            )
        )


_NO_SPAN = contextlib.nullcontext()


@contextlib.contextmanager
def _traced(span_context: ContextManager[tracing.Span]) -> Iterator[object]:
    """``span_context`` entered, with its ids bound into every log line within."""
    with span_context as span, structlog.contextvars.bound_contextvars(**tracing.ids(span)):
        yield span
