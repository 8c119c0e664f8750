"""Reading and replaying the dead letters of a queue-mode stream (`<stream>.dead`) for `mailrelay dead-letters`.

Letters are read one at a time with JetStream's message-get API, which leaves them in the stream (a consumer would
take them: the stream has work-queue retention). A replay publishes the payload to `<stream>.messages` with its
original delivery id, then deletes the dead letter. NATS errors end here as QueueUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg

from mailrelay._dead_letters import DEFAULT_ROUTE, DeadLetter
from mailrelay._errors import QueueUnavailable
from mailrelay._queue import (
    ACCEPTED_AT_HEADER,
    ATTEMPTS_HEADER,
    CONNECT_TIMEOUT_SECS,
    DELIVERY_ID_HEADER,
    ERROR_HEADER,
    MSG_ID_HEADER,
    PUBLISH_TIMEOUT_SECS,
    ROUTE_HEADER,
    _reason,
    dead_letter_subject,
    messages_subject,
)

REQUEST_TIMEOUT_SECS = 5.0  # per JetStream request; the command fails with one line past it
RETRY_WAIT_SECS = 0.5


class DeadLetterStore:
    """The dead letters of `stream` on the NATS `servers`; `async with` connects (once, no reconnecting: a command
    that loses NATS stops with one line) and checks that the stream exists."""

    def __init__(self, *, servers: list[str], stream: str) -> None:
        self.servers = servers
        self.stream = stream
        self.subject = dead_letter_subject(stream)
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None

    async def __aenter__(self) -> DeadLetterStore:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECS + REQUEST_TIMEOUT_SECS):
                self._nc = await nats.connect(
                    servers=self.servers,
                    name="mailrelay-dead-letters",
                    connect_timeout=CONNECT_TIMEOUT_SECS,
                    allow_reconnect=False,
                    max_reconnect_attempts=1,  # each server tried twice (0 would mean forever), then one line
                    reconnect_time_wait=RETRY_WAIT_SECS,
                    error_cb=_ignore,
                )
                self._js = self._nc.jetstream(timeout=REQUEST_TIMEOUT_SECS)
                await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            await self.__aexit__()
            raise QueueUnavailable(f"stream {self.stream} not found") from None
        except nats.errors.NoServersError:
            await self.__aexit__()
            raise QueueUnavailable("no server reachable") from None
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            await self.__aexit__()
            raise QueueUnavailable(_reason(exc)) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(OSError, nats.errors.Error):
                await nc.close()

    def _context(self) -> JetStreamContext:
        if self._js is None:
            raise QueueUnavailable("not connected to NATS")
        return self._js

    async def letters(self) -> AsyncIterator[DeadLetter]:
        """Every dead letter, oldest first (one request each)."""
        sequence = 1
        while True:
            letter = await self._next(sequence)
            if letter is None:
                return
            yield letter
            sequence = letter.sequence + 1

    async def _next(self, sequence: int) -> DeadLetter | None:
        try:
            raw = await self._context().get_msg(self.stream, seq=sequence, subject=self.subject, next=True)
        except nats.js.errors.NotFoundError:
            return None
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise QueueUnavailable(_reason(exc)) from None
        return _letter(raw)

    async def find(self, reference: str) -> DeadLetter | None:
        """The dead letter with this stream sequence number (digits) or delivery id; None when there is none."""
        if reference.isdigit():
            letter = await self._next(int(reference))
            return letter if letter is not None and letter.sequence == int(reference) else None
        async for letter in self.letters():
            if letter.delivery_id == reference:
                return letter
        return None

    async def replay(self, letter: DeadLetter) -> None:
        """Queue the letter's payload again with its delivery id (workers deliver it as new, attempts and age from
        now), then delete the dead letter. QueueUnavailable when either step fails; a failed delete leaves the
        letter, so a second replay posts it again under the same delivery id (receivers deduplicate on it)."""
        headers = {
            # a message id of its own: the original one may still be in the stream's duplicate window
            MSG_ID_HEADER: f"{letter.delivery_id}.replay.{letter.sequence}",
            DELIVERY_ID_HEADER: letter.delivery_id,
            ACCEPTED_AT_HEADER: f"{time.time():.3f}",
        }
        if letter.route != DEFAULT_ROUTE:
            headers[ROUTE_HEADER] = letter.route
        js = self._context()
        try:
            await js.publish(
                messages_subject(self.stream),
                letter.body,
                timeout=PUBLISH_TIMEOUT_SECS,
                stream=self.stream,
                headers=headers,
            )
            await js.delete_msg(self.stream, letter.sequence)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise QueueUnavailable(_reason(exc)) from None


def _letter(raw: RawStreamMsg) -> DeadLetter:
    headers: Mapping[str, str] = raw.headers or {}
    dead_at = raw.time.timestamp() if raw.time is not None else time.time()
    return DeadLetter(
        sequence=raw.seq or 0,
        delivery_id=headers.get(DELIVERY_ID_HEADER) or f"seq-{raw.seq}",
        route=headers.get(ROUTE_HEADER) or DEFAULT_ROUTE,
        error=headers.get(ERROR_HEADER, ""),
        attempts=None if (attempts := _number(headers.get(ATTEMPTS_HEADER))) is None else int(attempts),
        accepted_at=_number(headers.get(ACCEPTED_AT_HEADER)),
        dead_lettered_at=dead_at,
        body=raw.data or b"",
    )


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


async def _ignore(exc: Exception) -> None:
    """nats-py's error callback: the failure reaches the command through the request that failed."""
