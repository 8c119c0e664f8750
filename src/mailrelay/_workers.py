"""Queue mode's delivery workers: take payloads from the shared consumer, make one attempt at the delivery target
for each, then ack, nak or dead-letter it as `_redelivery.decide` says. Every relay on the stream runs them; the
consumer spreads the work."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import structlog

from bastion_core._logging import info_dropped
from mailrelay._errors import QueueUnavailable
from mailrelay._metrics import DeadLetter, Delivery, RelayMetrics, Retry
from mailrelay._redelivery import Action, RedeliveryRules, decide
from mailrelay._routing import target_label
from mailrelay._target import DeliveryTarget, Outcome, Verdict

if TYPE_CHECKING:  # nats-py (the queue extra): loaded with the queue
    from mailrelay._queue import QueuedMessage

FETCH_WAIT_SECS = 5.0  # one long poll of the consumer; messages that arrive meanwhile come at once
CIRCUIT_PAUSE_SECS = 1.0  # while the breaker is open nothing is fetched (no delivery is spent); checked this often

log = structlog.get_logger("mailrelay.workers")


class Inbox(Protocol):
    """The workers' side of the queue (`_queue.JetStreamQueue`)."""

    async def fetch(self, batch: int, *, wait: float) -> list[QueuedMessage]: ...

    async def dead_letter(self, message: QueuedMessage, *, error: str, attempts: int) -> None: ...


class DeliveryWorkers:
    """Up to `concurrency` deliveries at once from `inbox`, each one attempt at `target`; nothing is fetched while
    the target pauses (its breaker is open). Fetches only as many messages as it has free slots, so none waits in
    this process while its ack wait runs. `run()` until `stop(grace)`: then fetching stops, deliveries under way
    get `grace` seconds, and what is left unacknowledged is redelivered by the stream after its ack wait (to this
    relay or another).
    With `metrics`, records each delivery's outcome, retry and dead letter.
    """

    def __init__(
        self,
        *,
        inbox: Inbox,
        target: DeliveryTarget,
        rules: RedeliveryRules,
        route_targets: Mapping[str, DeliveryTarget] | None = None,
        concurrency: int,
        metrics: RelayMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
        random: Callable[[], float] = random.random,
    ) -> None:
        self.inbox = inbox
        self.target = target
        self.route_targets = dict(route_targets or {})
        self.rules = rules
        self.concurrency = concurrency
        self.metrics = metrics
        self._wall_clock = wall_clock
        self._random = random
        self._running: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self.run(), name="mailrelay-delivery-workers")

    async def run(self) -> None:
        while True:
            try:
                await self._fetch_round()
            except Exception:  # a bug must not stop this relay's deliveries for good
                log.exception("delivery_workers_failed")
                await asyncio.sleep(CIRCUIT_PAUSE_SECS)

    async def _fetch_round(self) -> None:
        pauses = [target.pause() for target in (self.target, *self.route_targets.values())]
        free = self.concurrency - len(self._running)
        if all(pause is not None for pause in pauses):  # with routes: a paused route's messages wait in the stream
            if free > 0:  # what pull requests made before the pause brought is attempted (a retry), never held
                self._start(await self.inbox.fetch(free, wait=0))
            retry_in = min(pause.retry_in for pause in pauses if pause is not None)
            await asyncio.sleep(min(CIRCUIT_PAUSE_SECS, max(retry_in, 0.01)))
            return
        if free <= 0:
            self._slot_freed.clear()
            await self._slot_freed.wait()
            return
        self._start(await self.inbox.fetch(free, wait=FETCH_WAIT_SECS))

    def _start(self, messages: list[QueuedMessage]) -> None:
        loop = asyncio.get_running_loop()
        for message in messages:
            task = loop.create_task(self.deliver(message))  # on the loop directly: no loop look-up (getpid)
            self._running.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._slot_freed.set()

    async def deliver(self, message: QueuedMessage) -> None:
        """One attempt for one message, then its acknowledgement; never raises (a bug costs a redelivery)."""
        try:
            await self._deliver(message)
        except Exception:
            log.exception("queued_delivery_failed", delivery_id=message.delivery_id)

    async def _deliver(self, message: QueuedMessage) -> None:
        target = self.route_targets.get(message.route or "", self.target)
        outcome = await target.attempt(message.body, delivery_id=message.delivery_id)
        if outcome.verdict is Verdict.DELIVERED:  # the usual case, without `decide` (it acks)
            await self._delivered(message, outcome)
            return
        decision = decide(
            outcome,
            number=message.number,
            age=self._wall_clock() - message.accepted_at,
            rules=self.rules,
            # at least a pause: Half-Open refuses all but its test attempts with nothing to wait for
            circuit_wait=max(pause.retry_in if (pause := target.pause()) else 0.0, CIRCUIT_PAUSE_SECS),
            random=self._random,
        )
        if decision.action is Action.ACK:
            await self._delivered(message, outcome)
            return
        bound = log.bind(delivery_id=message.delivery_id, attempt=message.number)
        metrics = self.metrics
        if decision.action is Action.RETRY:
            await message.nak(decision.delay)
            bound.info(
                "webhook_retry_scheduled",
                problem=decision.error,
                wait=round(decision.delay, 3),
                **target.log_fields,
            )
            if metrics is not None:
                circuit_open = outcome.verdict is Verdict.CIRCUIT_OPEN
                metrics.queue_retry(Retry.CIRCUIT_OPEN if circuit_open else Retry.ATTEMPT_FAILED)
            return
        error = decision.error or outcome.problem
        try:
            await self.inbox.dead_letter(message, error=error, attempts=message.number)
        except QueueUnavailable as exc:
            # Not stored as a dead letter: keep the message in the queue and try again later.
            await message.nak(self.rules.backoff_cap)
            bound.warning("dead_letter_failed", error=error, reason=exc.reason)
            if metrics is not None:
                metrics.queue_retry(Retry.DEAD_LETTER_FAILED)
            return
        await message.ack()
        bound.warning("message_dead_lettered", error=error, status=outcome.status, **target.log_fields)
        if metrics is not None:
            refused = outcome.verdict is Verdict.REJECTED
            metrics.dead_letter(DeadLetter.REFUSED if refused else DeadLetter.FAILED)
            metrics.delivery(Delivery.REFUSED if refused else Delivery.FAILED, target=target_label(message.route))

    async def _delivered(self, message: QueuedMessage, outcome: Outcome) -> None:
        await message.ack()
        if not info_dropped():
            log.info(
                "message_relayed",
                delivery_id=message.delivery_id,
                attempt=message.number,
                outcome="delivered",
                status=outcome.status,
                mode="queue",
            )
        if self.metrics is not None:
            self.metrics.delivery(Delivery.DELIVERED, target=target_label(message.route))

    async def stop(self, grace: float) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None
        if self._running:
            _done, pending = await asyncio.wait(set(self._running), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
