"""Audit events to the broker: ``<audit.broker_subject_prefix>.<service>.<kind>``, never in a request's way.

Events go into a bounded buffer (``audit.broker_buffer``) that a background task publishes from; a full
buffer or a broker that is down drops the event (counted in ``dropped``, logged on the first drop and every
100th), and the log sink still has it. A request never waits for the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

import structlog

from bastion._audit import AuditEvent
from bastion.broker._handlers import Publisher
from bastion.errors import BrokerUnavailable

log = structlog.get_logger("bastion.audit")

FLUSH_ON_STOP_SECS = 2.0
_NOT_A_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def subject_token(name: str) -> str:
    """``name`` as one subject token (a service name may hold dots or spaces)."""
    return _NOT_A_TOKEN.sub("_", name) or "_"


class BrokerAuditSink:
    def __init__(self, broker: Publisher, *, prefix: str, service: str, buffer: int) -> None:
        self.broker = broker
        self.prefix = f"{prefix}.{subject_token(service)}"
        self.service = service
        self.queue: asyncio.Queue[AuditEvent] = asyncio.Queue(maxsize=buffer)
        self.published = 0
        self.dropped = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="broker-audit")

    async def emit(self, event: AuditEvent) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self._drop(event, "buffer full")

    def _drop(self, event: AuditEvent, reason: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 100 == 0:
            log.warning("audit_events_dropped", dropped=self.dropped, reason=reason, kind=event.name)

    async def _publish(self, event: AuditEvent) -> None:
        try:
            await self.broker.publish(f"{self.prefix}.{event.name}", event.document(self.service))
        except BrokerUnavailable:
            self._drop(event, "broker unavailable")
            return
        self.published += 1

    async def _run(self) -> None:
        while True:
            await self._publish(await self.queue.get())

    async def stop(self) -> None:
        """Publish what is buffered (for up to two seconds), then stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FLUSH_ON_STOP_SECS):
                while not self.queue.empty():
                    await self._publish(self.queue.get_nowait())
