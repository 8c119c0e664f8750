"""The broker of one app: a NATS connection with JetStream, and what the service declared running on it.

Connection (``[broker]``): ``url`` (several comma-separated for a cluster, ``tls://`` for TLS, ``user:password@``
credentials, never logged), ``name``, ``max_reconnects`` once connected, ``max_retries`` for the first
connection with exponential backoff from ``retry_delay_secs``. ``lazy_init`` (default): the app starts at once
and connects in the background, trying until it succeeds; otherwise start-up waits and fails after the retries.
While it is not connected, :meth:`Broker.ready` raises, so ``/ready`` is 503 unless ``optional``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError as JetStreamAPIError
from nats.js.errors import Error as JetStreamError
from nats.js.errors import NotFoundError as JetStreamNotFound
from nats.js.errors import ServiceUnavailableError as JetStreamServiceUnavailable

from bastion import _tracing as tracing
from bastion._metrics import NO_METRICS, Metrics
from bastion.broker._handlers import BrokerHandle, BrokerMessage, encode
from bastion.broker._specs import BrokerPlan, ConsumerSpec, ResponderSpec, SubscriberSpec
from bastion.broker._streams import ensure_stream
from bastion.config import BrokerSettings
from bastion.errors import (
    BastionError,
    BrokerRequestFailed,
    BrokerTimeout,
    BrokerUnavailable,
    ConfigError,
    NoResponders,
)
from bastion_core import backoff_delay, mask_url

log = structlog.get_logger("bastion.broker")

ERROR_HEADER = "Bastion-Error"
DEAD_LETTER_HEADERS = ("Bastion-Original-Subject", "Bastion-Deliveries", "Bastion-Error", "Bastion-Consumer")
MAX_RETRY_DELAY_SECS = 60.0
MAX_BACKGROUND_BACKOFF_SECS = 10.0
FETCH_WAIT_SECS = 1.0


class Broker(BrokerHandle):
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
        if settings.url is None:
            raise ConfigError("the broker needs broker.url (or SERVICE_BROKER_URL)")
        self.settings = settings
        self.plan = plan
        self.service = service
        self.metrics = metrics
        self.tracer = tracer
        self._servers = [part.strip() for part in settings.url.get_secret_value().split(",")]
        self.shown_url = mask_url(settings.url.get_secret_value(), cluster=True)
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self._connector: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._subscriptions: list[Any] = []
        self._pulls: list[Any] = []
        self._answering: set[asyncio.Task[None]] = set()
        self._dead_letter_streams: dict[str, str | None] = {}
        self._stopping = False
        self._set_up_done = False
        self.dead_lettered = 0

    # -- connection -------------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Connected, and the streams, subscriptions and consumers are set up."""
        return self._set_up_done and self.nc is not None and self.nc.is_connected

    async def ready(self) -> None:
        """Readiness check: raises while the broker is not connected (``/ready`` lists ``broker``)."""
        if not self.connected:
            raise BrokerUnavailable("broker not connected")

    async def start(self) -> None:
        """Connect now (``lazy_init = false``: raising after the retries) or in the background."""
        if self.settings.lazy_init:
            self._connector = asyncio.create_task(self._connect_until_connected(), name="broker-connect")
            return
        await self._connect_with_retries(self.settings.max_retries)

    async def _connect_until_connected(self) -> None:
        attempt = 0
        while not self._stopping:
            attempt += 1
            try:
                await self._connect()
                return
            except BrokerUnavailable as exc:
                delay = min(MAX_BACKGROUND_BACKOFF_SECS, max(0.1, self.settings.retry_delay_secs) * 2 ** (attempt - 1))
                log.warning(
                    "broker_connect_failed", url=self.shown_url, attempt=attempt, retry_in=delay, error=str(exc)
                )
                await asyncio.sleep(delay)
            except ConfigError as exc:
                log.error("broker_setup_failed", error=str(exc))
                return

    async def _connect_with_retries(self, retries: int) -> None:
        for attempt in range(1, retries + 2):
            try:
                await self._connect()
                return
            except BrokerUnavailable as exc:
                if attempt > retries:
                    fix = (
                        "check the user and password in broker.url"
                        if "Authorization" in str(exc.detail)
                        else "start NATS, fix the URL, or set broker.lazy_init = true to start without it"
                    )
                    tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
                    raise ConfigError(
                        f"broker.url {self.shown_url}: cannot connect after {tries} ({exc.detail}); {fix}"
                    ) from None
                delay = max(0.0, self.settings.retry_delay_secs) * 2 ** (attempt - 1)
                log.warning(
                    "broker_connect_failed", url=self.shown_url, attempt=attempt, retry_in=delay, error=str(exc)
                )
                await asyncio.sleep(delay)

    async def _connect(self) -> None:
        options: dict[str, Any] = {
            "servers": self._servers,
            "name": self.settings.name or self.service,
            "connect_timeout": self.settings.connect_timeout_secs,
            # The start-up attempts are ours (max_retries with backoff): nats-py tries each server twice and
            # reports the real error (an authorization failure, say) rather than retrying it 60 times.
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0.1,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "closed_cb": self._on_closed,
            "error_cb": self._on_error,
            "drain_timeout": math.ceil(self.settings.drain_timeout_secs),
        }
        if any(server.startswith("tls://") for server in self._servers):
            options["tls"] = ssl.create_default_context()
        nc = Client()
        try:
            await nc.connect(**options)
        except (TimeoutError, OSError, NatsError) as exc:
            with contextlib.suppress(Exception):
                await nc.close()  # the transport of a refused attempt (bad credentials) is still open
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}".removesuffix(": ")) from None
        # Connected: from now on nats-py reconnects by itself, max_reconnects times (-1: forever, 0: never),
        # retry_delay_secs apart. nats-py reads these options on each reconnect.
        nc.options["allow_reconnect"] = self.settings.max_reconnects != 0
        nc.options["max_reconnect_attempts"] = self.settings.max_reconnects
        nc.options["reconnect_time_wait"] = max(0.1, float(self.settings.retry_delay_secs))
        self.nc = nc
        self.js = nc.jetstream()
        log.info("broker_connected", url=self.shown_url)
        try:
            await self._set_up()
        except BaseException as exc:
            self.nc = None  # first: the closing connection's callbacks stay quiet, and readiness stays false
            with contextlib.suppress(Exception):
                await nc.close()
            if isinstance(exc, NoRespondersError | JetStreamServiceUnavailable):
                raise ConfigError(
                    f"broker.url {self.shown_url}: JetStream is not enabled on this NATS server (start it with -js)"
                ) from None
            if isinstance(exc, TimeoutError | NatsError | JetStreamError):
                raise BrokerUnavailable(f"set-up failed: {type(exc).__name__}: {exc}") from None
            raise
        self._set_up_done = True

    async def _set_up(self) -> None:
        """Streams, then core subscriptions and responders, then the consumers' fetch loops (once)."""
        assert self.nc is not None
        assert self.js is not None
        self._subscriptions, self._pulls, self._dead_letter_streams = [], [], {}
        for spec in self.plan.streams:
            await ensure_stream(self.js, spec)
        for subscriber in self.plan.subscribers:
            self._subscriptions.append(
                await self.nc.subscribe(
                    subscriber.subject, queue=subscriber.queue or "", cb=self._subscriber(subscriber)
                )
            )
        for responder in self.plan.responders:
            queue = responder.queue or self.service
            self._subscriptions.append(
                await self.nc.subscribe(responder.subject, queue=queue, cb=self._responder(responder))
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

    async def _confirm_subscriptions(self) -> None:
        """Return once the server has every subscription made so far, so start-up completes with them live.

        A message to ourselves proves it (the server reads a connection's protocol in order). ``flush()`` does
        not: right after connecting, nats-py's first flush can be answered by an earlier PONG.
        """
        assert self.nc is not None
        probe = self.nc.new_inbox()
        subscription = await self.nc.subscribe(probe, max_msgs=1)
        await self.nc.publish(probe, b"")
        try:
            await subscription.next_msg(timeout=self.settings.connect_timeout_secs)
        except NatsTimeoutError:
            raise BrokerUnavailable("the broker did not confirm the subscriptions in time") from None

    def dead_letter_subject(self, spec: ConsumerSpec) -> str:
        return spec.dead_letter_subject or f"{self.settings.dead_letter_prefix}.{spec.durable}"

    async def _find_dead_letter_stream(self, spec: ConsumerSpec) -> None:
        """Whether a stream stores this consumer's dead letters (then they are published with an ack)."""
        assert self.js is not None
        subject = self.dead_letter_subject(spec)
        try:
            stream: str | None = await self.js.find_stream_name_by_subject(subject)
        except JetStreamNotFound:
            stream = None
            log.warning(
                "broker_dead_letters_not_stored",
                consumer=spec.durable,
                dead_letter_subject=subject,
                hint="declare a stream on the dead-letter subject to keep them (docs/broker.md)",
            )
        self._dead_letter_streams[spec.durable] = stream

    async def _pull_subscription(self, spec: ConsumerSpec) -> Any:
        """The durable consumer (created when missing; explicit acks; redeliveries counted by us, not capped)."""
        assert self.js is not None
        try:
            return await self.js.pull_subscribe(
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

    async def _on_disconnected(self) -> None:
        if self.nc is not None and not self._stopping:  # (a failed start-up attempt is reported by its loop)
            log.warning("broker_disconnected", url=self.shown_url)

    async def _on_reconnected(self) -> None:
        log.info("broker_reconnected", url=self.shown_url)

    async def _on_closed(self) -> None:
        if self.nc is not None and not self._stopping:
            log.error("broker_connection_closed", url=self.shown_url, reason="reconnect attempts exhausted")

    async def _on_error(self, exc: Exception) -> None:
        if self.nc is None:
            return  # a failed start-up attempt: reported by the connect loop
        log.warning("broker_error", error=f"{type(exc).__name__}: {exc}")

    async def stop(self) -> None:
        """Stop consuming and subscribing (handlers in flight finish, for up to ``drain_timeout_secs``), then
        drain the connection (what was published is flushed)."""
        self._stopping = True
        if self._connector is not None:
            self._connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connector
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
        if self.nc is not None and not self.nc.is_closed:
            try:
                await self.nc.drain()
            except (TimeoutError, NatsError) as exc:
                log.warning("broker_drain_failed", error=f"{type(exc).__name__}: {exc}")
                await self.nc.close()
        log.info("broker_stopped")

    # -- publishing and requests ------------------------------------------------------------------------------

    def _require(self) -> Client:
        if self.nc is None or not self.nc.is_connected:
            raise BrokerUnavailable()
        return self.nc

    async def publish(
        self, subject: str, data: Any, *, headers: Mapping[str, str] | None = None, ack: bool = False
    ) -> int | None:
        """Publish ``data`` (a pydantic model, JSON-able data, str or bytes) on ``subject``.

        ``ack=True`` publishes through JetStream and returns once a stream stored it (its sequence number);
        otherwise the message is sent at most once to whoever listens (streams capturing the subject store it too).
        BrokerUnavailable when disconnected or when no stream takes an acknowledged publish.
        """
        nc = self._require()
        payload = encode(data)
        if self.tracer is not None:
            with self._producer_span("publish", subject) as traced:
                return await self._publish(nc, subject, payload, traced.headers(headers), ack)
        return await self._publish(nc, subject, payload, headers, ack)

    async def _publish(
        self, nc: Client, subject: str, payload: bytes, headers: Mapping[str, str] | None, ack: bool
    ) -> int | None:
        if not ack:
            try:
                await nc.publish(subject, payload, headers=dict(headers) if headers else None)
            except NatsError as exc:
                raise BrokerUnavailable(f"publish failed: {type(exc).__name__}") from None
            self.metrics.broker_published(acknowledged=False)
            return None
        assert self.js is not None
        try:
            acked = await self.js.publish(subject, payload, headers=dict(headers) if headers else None)
        except NoRespondersError:
            raise BrokerUnavailable(f"no stream stores subject {subject!r}") from None
        except (TimeoutError, NatsError, JetStreamError) as exc:
            raise BrokerUnavailable(f"publish failed: {type(exc).__name__}") from None
        self.metrics.broker_published(acknowledged=True)
        return int(acked.seq)

    async def request(
        self,
        subject: str,
        data: Any,
        *,
        timeout: float = 2.0,  # noqa: ASYNC109 - the reply deadline NATS itself enforces, as in nats-py
        headers: Mapping[str, str] | None = None,
    ) -> BrokerMessage:
        """Send a request and wait up to ``timeout`` seconds for the reply.

        BrokerTimeout (504) when none comes, NoResponders (503) when nobody listens, BrokerRequestFailed (502)
        when the responder failed (its error in ``responder_error``). Uncaught in an HTTP handler, each renders
        as its status with a body that does not name the subject (the log does).
        """
        try:
            nc = self._require()
        except BrokerUnavailable:
            self.metrics.broker_request("unavailable")
            raise
        try:
            if self.tracer is not None:
                with self._producer_span("request", subject) as traced:
                    reply = await nc.request(subject, encode(data), timeout=timeout, headers=traced.headers(headers))
            else:
                reply = await nc.request(
                    subject, encode(data), timeout=timeout, headers=dict(headers) if headers else None
                )
        except NoRespondersError:
            self.metrics.broker_request("no_responders")
            log.warning("broker_no_responders", request_subject=subject)
            raise NoResponders() from None
        except NatsTimeoutError:
            self.metrics.broker_request("timeout")
            log.warning("broker_request_timed_out", request_subject=subject, timeout=timeout)
            raise BrokerTimeout() from None
        except NatsError as exc:
            self.metrics.broker_request("unavailable")
            raise BrokerUnavailable(f"request failed: {type(exc).__name__}") from None
        message = _message(reply)
        if ERROR_HEADER in message.headers:
            self.metrics.broker_request("failed")
            raise BrokerRequestFailed(responder_error=message.data.decode(errors="replace"))
        self.metrics.broker_request("ok")
        return message

    # -- subscribers, responders, consumers -------------------------------------------------------------------

    def _subscriber(self, spec: SubscriberSpec) -> Any:
        async def callback(msg: Msg) -> None:
            message = _message(msg)
            with self._consumer_span(message), structlog.contextvars.bound_contextvars(message_subject=message.subject):
                try:
                    await spec.handler(message, self)
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
        message = _message(msg)
        nc = self._require()
        with self._consumer_span(message), structlog.contextvars.bound_contextvars(message_subject=message.subject):
            try:
                result = await spec.handler(message, self)
            except Exception as exc:
                tracing.fail(exc)
                code = exc.code if isinstance(exc, BastionError) else "RESPONDER_ERROR"
                log.warning("broker_responder_failed", responder=spec.subject, error=f"{type(exc).__name__}: {exc}")
                reply, headers = encode({"error": str(exc), "code": code}), {ERROR_HEADER: code}
            else:
                reply, headers = encode(result if result is not None else b""), {}
            try:
                await nc.publish(msg.reply, reply, headers=headers or None)
            except NatsError as exc:
                log.warning("broker_reply_failed", error=type(exc).__name__)

    async def _consume(self, spec: ConsumerSpec, subscription: Any) -> None:
        """Fetch and handle messages until stopped; survive outages (the fetch resumes after a reconnect)."""
        failures = 0
        while not self._stopping:
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
        message = _message(msg)
        with (
            self._consumer_span(message, consumer=spec.durable),
            structlog.contextvars.bound_contextvars(message_id=message.message_id, consumer=spec.durable),
        ):
            try:
                await spec.handler(message, self)
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
        error = f"{type(exc).__name__}: {exc}"[:500]
        try:
            if message.deliveries >= spec.max_deliveries:
                await self._dead_letter(spec, message, error)
                await msg.ack()
                self.metrics.broker_consumed(spec.durable, "dead_letter")
                return
            delay = backoff_delay(
                message.deliveries, base=spec.retry_delay, cap=MAX_RETRY_DELAY_SECS, random=lambda: 1.0
            )
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
        headers = dict(
            zip(DEAD_LETTER_HEADERS, (message.subject, str(message.deliveries), error, spec.durable), strict=True)
        )
        stream = self._dead_letter_streams.get(spec.durable)
        nc = self._require()
        if stream is not None:
            assert self.js is not None
            await self.js.publish(subject, message.data, headers=headers, stream=stream)
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

    # -- tracing (a tracer only when tracing is on) -------------------------------------------------------------

    @contextlib.contextmanager
    def _producer_span(self, operation: str, subject: str) -> Iterator[_Outgoing]:
        """A producer span for a publish or a request, its context carried in the message's headers."""
        assert self.tracer is not None
        kind = tracing.PRODUCER if operation == "publish" else tracing.CLIENT
        with self.tracer.start_as_current_span(
            f"{operation} {subject}", kind=kind, attributes=_messaging(subject, "send")
        ):
            yield _Outgoing()

    def _consumer_span(self, message: BrokerMessage, *, consumer: str | None = None) -> ContextManager[object]:
        """The span of handling one message: a child of the publisher's span when its headers carry one."""
        if self.tracer is None:
            return _NO_SPAN
        attributes = _messaging(message.subject, "process")
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


class _Outgoing:
    def headers(self, given: Mapping[str, str] | None) -> dict[str, str]:
        """``given`` plus ``traceparent``/``tracestate`` for the current span."""
        headers = dict(given or {})
        tracing.inject(headers)
        return headers


def _messaging(subject: str, operation: str) -> dict[str, Any]:
    return {"messaging.system": "nats", "messaging.destination.name": subject, "messaging.operation.type": operation}


def _message(msg: Msg) -> BrokerMessage:
    deliveries, stream, sequence = 1, None, None
    with contextlib.suppress(Exception):  # core messages have no JetStream metadata
        metadata = msg.metadata
        deliveries = int(metadata.num_delivered or 1)
        stream, sequence = metadata.stream, int(metadata.sequence.stream)
    return BrokerMessage(
        subject=msg.subject,
        data=msg.data,
        headers=dict(msg.headers or {}),
        reply=msg.reply or None,
        deliveries=deliveries,
        stream=stream,
        sequence=sequence,
    )
