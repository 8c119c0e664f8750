"""Publishing and requests on the broker's connection, and how a NATS message becomes a :class:`BrokerMessage`.

Publishing while disconnected raises BrokerUnavailable (503): nothing is queued behind the caller's back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import Error as JetStreamError

from bastion import _tracing as tracing
from bastion._metrics import NO_METRICS, Metrics
from bastion.broker._connection import BrokerConnection
from bastion.broker._handlers import BrokerHandle, BrokerMessage, encode
from bastion.broker._outcomes import failed_reply
from bastion.errors import BrokerTimeout, BrokerUnavailable, NoResponders

log = structlog.get_logger("bastion.broker")


class BrokerClient(BrokerHandle):
    """``publish`` and ``request`` over a :class:`BrokerConnection`, counted in ``metrics`` and traced when a
    ``tracer`` is given (the span's context travels in the message's headers)."""

    def __init__(
        self, connection: BrokerConnection, *, metrics: Metrics = NO_METRICS, tracer: tracing.Tracer | None = None
    ) -> None:
        self.connection = connection
        self.metrics = metrics
        self.tracer = tracer

    async def publish(
        self, subject: str, data: Any, *, headers: Mapping[str, str] | None = None, ack: bool = False
    ) -> int | None:
        """Publish ``data`` (a pydantic model, JSON-able data, str or bytes) on ``subject``.

        ``ack=True`` publishes through JetStream and returns once a stream stored it (its sequence number);
        otherwise the message is sent at most once to whoever listens (streams capturing the subject store it too).
        BrokerUnavailable when disconnected or when no stream takes an acknowledged publish.
        """
        nc = self.connection.client()
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
        js = self.connection.js
        assert js is not None
        try:
            acked = await js.publish(subject, payload, headers=dict(headers) if headers else None)
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
            nc = self.connection.client()
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
        message = message_from(reply)
        failed = failed_reply(message)
        if failed is not None:
            self.metrics.broker_request("failed")
            raise failed
        self.metrics.broker_request("ok")
        return message

    @contextlib.contextmanager
    def _producer_span(self, operation: str, subject: str) -> Iterator[_Outgoing]:
        """A producer span for a publish or a request, its context carried in the message's headers."""
        assert self.tracer is not None
        kind = tracing.PRODUCER if operation == "publish" else tracing.CLIENT
        with self.tracer.start_as_current_span(
            f"{operation} {subject}", kind=kind, attributes=messaging_attributes(subject, "send")
        ):
            yield _Outgoing()


class _Outgoing:
    def headers(self, given: Mapping[str, str] | None) -> dict[str, str]:
        """``given`` plus ``traceparent``/``tracestate`` for the current span."""
        headers = dict(given or {})
        tracing.inject(headers)
        return headers


def messaging_attributes(subject: str, operation: str) -> dict[str, Any]:
    """The OpenTelemetry messaging attributes of a span that sends or processes a message on ``subject``."""
    return {"messaging.system": "nats", "messaging.destination.name": subject, "messaging.operation.type": operation}


def pending_after(msg: Msg) -> int | None:
    """JetStream's ``num_pending`` of ``msg``: what the consumer's stream still holds for it after this one (its
    lag); None for a core message."""
    try:
        return int(msg.metadata.num_pending)
    except Exception:  # core messages have no JetStream metadata
        return None


def message_from(msg: Msg) -> BrokerMessage:
    """``msg`` as handlers see it (delivery count, stream and sequence from its JetStream metadata, if any)."""
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
