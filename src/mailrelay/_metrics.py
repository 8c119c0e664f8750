"""MailRelay's Prometheus metrics: one registry owned by the relay, what it records, and the finite set of values each
label may take (never an address, a subject, a path or an id).

Delivery metrics are named for the delivery, not the webhook (`mailrelay_deliveries_total{target,outcome}`, ...);
the names of 0.x releases (`mailrelay_webhook_*`) are still exported as aliases with the same values and labels
(without `target`), listed in ALIASES and docs/mailrelay.md "Metrics".

Recording is a dictionary lookup and an increment on label children created once, here (about 0.5 us; an observed
webhook attempt about 1 us). Values read from elsewhere (open sessions, the breaker, the queue) are read only when
scraped. The metrics live in the main process; the worker processes of big messages record nothing.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from bastion_core import BreakerState, CircuitBreaker
from mailrelay._attachment_policy import PolicyRule
from mailrelay._attachments import Attachment, DeliveryMode
from mailrelay._delivery import TIMEOUT_PROBLEM, Attempt, WebhookTransport
from mailrelay._dmarc import DmarcResult
from mailrelay._errors import QueueUnavailable
from mailrelay._version import __version__
from mailrelay.smtp import _replies as r
from mailrelay.smtp._replies import Reply

if TYPE_CHECKING:  # nats-py (the queue extra): loaded with the queue
    from mailrelay._queue import QueueDepth

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The text format generate_latest writes (prometheus_client's CONTENT_TYPE_LATEST names version 1.0.0 since 0.22;
the body is the same for names like ours, and 0.0.4 is what every scraper reads)."""
# http.client.request.duration's buckets (OpenTelemetry semantic conventions) up to 10 s, then the default
# MAIL_RELAY_WEBHOOK_TIMEOUT (30 s) and a minute
WEBHOOK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0)
OTHER_CODE = "other"

WEBHOOK_TARGET = "webhook"
"""The `target` label of the delivery metrics for the webhook target (the only one today)."""
DELIVERIES = "mailrelay_deliveries"
ATTEMPT_DURATION = "mailrelay_delivery_attempt_duration_seconds"
CIRCUIT_STATE = "mailrelay_delivery_circuit_state"
ALIASES = {
    DELIVERIES: "mailrelay_webhook_deliveries",
    ATTEMPT_DURATION: "mailrelay_webhook_duration_seconds",
    CIRCUIT_STATE: "mailrelay_webhook_circuit_state",
}
"""Deprecated names still exported (the webhook target's series, without the `target` label): dashboards and alerts
written for them keep working. Kept at least until the next major release."""

MESSAGE_CODES = (250, 451, 500, 550, 552, 554)
"""Every code the relay ends a message's data with (smtp/_replies.py); anything else is counted as `other`."""
RECIPIENT_REPLIES = (r.OK, r.NO_SUCH_USER, r.TOO_MANY_RECIPIENTS, r.OTHER_ROUTE, r.TOO_MANY_UNKNOWN_RCPTS)
SESSION_REFUSALS = {r.TOO_MANY_SESSIONS: "max_sessions", r.TOO_MANY_CONNECTIONS: "max_per_ip"}


class Delivery(enum.Enum):
    """How a message's delivery to its target ended at this relay."""

    DELIVERED = "delivered"  # 2xx
    REFUSED = "refused"  # a final 4xx: direct mode 554, queue mode a dead letter
    FAILED = "failed"  # retries spent (or 1xx/3xx in direct mode): direct mode 451, queue mode a dead letter
    CIRCUIT_OPEN = "circuit_open"  # direct mode: the breaker refused it, 451 (queue mode retries instead)


class Retry(enum.Enum):
    """Why a queued message was handed back to the stream for a later attempt."""

    ATTEMPT_FAILED = "attempt_failed"  # timeout, connection error, 5xx, 408, 429, 1xx or 3xx
    CIRCUIT_OPEN = "circuit_open"  # the breaker refused the attempt; nothing was sent
    DEAD_LETTER_FAILED = "dead_letter_failed"  # the dead-letter subject did not store it


class DeadLetter(enum.Enum):
    REFUSED = "refused"  # a final 4xx
    FAILED = "failed"  # MAIL_RELAY_QUEUE_MAX_ATTEMPTS spent or MAIL_RELAY_QUEUE_MAX_AGE passed


class AttemptOutcome(enum.Enum):
    """What one POST to the webhook came to (an attempt the breaker refused is not one: nothing was sent)."""

    DELIVERED = "delivered"  # 2xx
    REFUSED = "refused"  # a 4xx other than 408 and 429
    HTTP_ERROR = "http_error"  # 5xx, 408, 429
    UNEXPECTED = "unexpected"  # 1xx, 3xx
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"


def attempt_outcome(attempt: Attempt) -> AttemptOutcome:
    status = attempt.status
    if status is None:
        return AttemptOutcome.TIMEOUT if attempt.error == TIMEOUT_PROBLEM else AttemptOutcome.CONNECTION_ERROR
    if 200 <= status < 300:
        return AttemptOutcome.DELIVERED
    if status >= 500 or status in (408, 429):
        return AttemptOutcome.HTTP_ERROR
    if 400 <= status < 500:
        return AttemptOutcome.REFUSED
    return AttemptOutcome.UNEXPECTED


def _outcome(code: int) -> str:
    return "accepted" if 200 <= code < 300 else "rejected"


class QueueProbe(Protocol):
    """What the metrics read from the queue when scraped (`_queue.JetStreamQueue`)."""

    @property
    def connected(self) -> bool: ...

    async def depth(self) -> QueueDepth: ...


class RelayMetrics:
    """The relay's registry and everything recorded into it; see docs/mailrelay.md "Metrics" for each metric.

    Implements the SMTP layer's SmtpObserver. `watch_*` connect values read at scrape time; `refresh()` (awaited
    before each scrape) reads the queue's depth from NATS; `exposition()` is the text a scrape gets. The queue's
    counters are exported only with `queue` (queue mode), the DMARC results only with `dmarc` (monitor or enforce).
    """

    def __init__(self, *, queue: bool = False, dmarc: bool = False, process_collector: bool = True) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        # Not exported when the mode is off (recording into an unregistered metric is harmless and never happens).
        queue_registry = registry if queue else None
        Info("mailrelay_build", "The running relay's version.", registry=registry).info({"version": __version__})
        if process_collector:  # process_cpu_seconds_total, process_resident_memory_bytes, ... (Linux)
            ProcessCollector(registry=registry)

        self._add_smtp_metrics(registry)
        self._add_delivery_metrics(registry)
        self._add_content_metrics(registry, dmarc=dmarc)
        self._add_queue_metrics(queue_registry)
        self._add_sender_metrics(registry)
        self._queue: _QueueCollector | None = None
        self._breakers: _BreakerCollector | None = None

    def _add_smtp_metrics(self, registry: CollectorRegistry) -> None:
        """Sessions, recipients and messages, by the SMTP reply."""
        self._sessions = Gauge("mailrelay_smtp_sessions_active", "SMTP sessions open now.", registry=registry)
        refused = Counter(
            "mailrelay_smtp_sessions_refused",
            "Connections refused with 421 for a session limit.",
            ["reason"],
            registry=registry,
        )
        self._refused = {reply: refused.labels(reason) for reply, reason in SESSION_REFUSALS.items()}
        recipients = Counter(
            "mailrelay_smtp_recipients",
            "Replies to RCPT TO naming an address, by outcome and reply code.",
            ["outcome", "code"],
            registry=registry,
        )
        self._recipients = {
            reply: recipients.labels(_outcome(reply.code), str(reply.code)) for reply in RECIPIENT_REPLIES
        }
        self._message_counter = Counter(
            "mailrelay_smtp_messages",
            "Final replies to a message's data, by outcome and reply code.",
            ["outcome", "code"],
            registry=registry,
        )
        self._messages = {code: self._message_counter.labels(_outcome(code), str(code)) for code in MESSAGE_CODES}

    def _add_delivery_metrics(self, registry: CollectorRegistry) -> None:
        """Deliveries and their attempts, by target and outcome (and the deprecated aliases)."""
        duration = Histogram(
            ATTEMPT_DURATION,
            "Duration of one delivery attempt (webhook: request sent, answer read), by target and outcome.",
            ["target", "outcome"],
            buckets=WEBHOOK_BUCKETS,
            registry=registry,
        )
        self._attempts = {outcome: duration.labels(WEBHOOK_TARGET, outcome.value) for outcome in AttemptOutcome}
        self._duration = duration
        deliveries = Counter(
            DELIVERIES,
            "Messages whose delivery ended at this relay, by target and outcome.",
            ["target", "outcome"],
            registry=registry,
        )
        self._deliveries = {outcome: deliveries.labels(WEBHOOK_TARGET, outcome.value) for outcome in Delivery}
        self._deliveries_counter = deliveries
        registry.register(_Aliases([duration, deliveries]))

    def _add_content_metrics(self, registry: CollectorRegistry, *, dmarc: bool) -> None:
        """DMARC results (exported only with `dmarc`) and attachments."""
        results = Counter(
            "mailrelay_dmarc_results", "DMARC evaluations by result.", ["result"], registry=registry if dmarc else None
        )
        self._dmarc = {result: results.labels(result.value) for result in DmarcResult}
        attachments = Counter(
            "mailrelay_attachments",
            "Attachments put into payloads, by delivery (s3: uploaded).",
            ["delivery"],
            registry=registry,
        )
        self._attachments = {mode: attachments.labels(mode.value) for mode in DeliveryMode}
        dropped = Counter(
            "mailrelay_attachments_dropped",
            "Attachments the attachment policy left out (action drop), by rule.",
            ["rule"],
            registry=registry,
        )
        self._dropped = {rule: dropped.labels(rule.value) for rule in PolicyRule}
        self._store_failures = Counter(
            "mailrelay_attachment_store_failures",
            "Messages deferred (451) because an attachment upload failed.",
            registry=registry,
        )

    def _add_sender_metrics(self, registry: CollectorRegistry) -> None:
        self._sender_denials = Counter(
            "mailrelay_sender_policy_denials",
            "Messages refused (550 5.7.1) by the sender policy (MAIL_RELAY_SENDER_POLICY_FILE).",
            registry=registry,
        )

    def _add_queue_metrics(self, registry: CollectorRegistry | None) -> None:
        """Queue mode's counters (exported only with a registry: in queue mode)."""
        self._publish_failures = Counter(
            "mailrelay_queue_publish_failures",
            "Messages deferred (451) because the stream did not store them.",
            registry=registry,
        )
        retries = Counter(
            "mailrelay_queue_retries",
            "Queued messages handed back to the stream for a later attempt, by reason.",
            ["reason"],
            registry=registry,
        )
        self._retries = {reason: retries.labels(reason.value) for reason in Retry}
        dead = Counter(
            "mailrelay_queue_dead_letters",
            "Queued messages this relay put on the dead-letter subject, by reason.",
            ["reason"],
            registry=registry,
        )
        self._dead_letters = {reason: dead.labels(reason.value) for reason in DeadLetter}

    # SmtpObserver

    def session_refused(self, reply: Reply) -> None:
        child = self._refused.get(reply)
        if child is not None:
            child.inc()

    def recipient_answered(self, reply: Reply) -> None:
        child = self._recipients.get(reply)
        if child is not None:
            child.inc()

    def message_answered(self, reply: Reply) -> None:
        child = self._messages.get(reply.code)
        if child is None:  # not a code the relay sends today: still one bounded series per outcome
            child = self._message_counter.labels(_outcome(reply.code), OTHER_CODE)
        child.inc()

    # the relay and the delivery workers

    def attempt(self, attempt: Attempt, seconds: float, *, target: str = WEBHOOK_TARGET) -> None:
        """One POST that left the relay (not one the breaker refused), under its target's label (`route:<name>` for
        a routes-file route; one series per route and outcome: the routes are fixed at start-up)."""
        outcome = attempt_outcome(attempt)
        if target == WEBHOOK_TARGET:
            self._attempts[outcome].observe(seconds)
        else:
            self._duration.labels(target, outcome.value).observe(seconds)

    def delivery(self, outcome: Delivery, *, target: str = WEBHOOK_TARGET) -> None:
        if target == WEBHOOK_TARGET:
            self._deliveries[outcome].inc()
        else:
            self._deliveries_counter.labels(target, outcome.value).inc()

    def dmarc(self, result: DmarcResult) -> None:
        self._dmarc[result].inc()

    def attachments(self, attachments: Sequence[Attachment]) -> None:
        for attachment in attachments:
            self._attachments[attachment.delivery].inc()

    def attachment_dropped(self, rule: PolicyRule) -> None:
        self._dropped[rule].inc()

    def attachment_store_failed(self) -> None:
        self._store_failures.inc()

    def sender_policy_denied(self) -> None:
        self._sender_denials.inc()

    def queue_publish_failed(self) -> None:
        self._publish_failures.inc()

    def queue_retry(self, reason: Retry) -> None:
        self._retries[reason].inc()

    def dead_letter(self, reason: DeadLetter) -> None:
        self._dead_letters[reason].inc()

    # read when scraped

    def watch_sessions(self, count: Callable[[], int]) -> None:
        self._sessions.set_function(count)

    def watch_breaker(self, breaker: CircuitBreaker, *, target: str = WEBHOOK_TARGET) -> None:
        """Export `breaker`'s state under the `target` label (`webhook`; `route:<name>` for a routes-file route)."""
        if self._breakers is None:
            self._breakers = _BreakerCollector()
            self.registry.register(self._breakers)
        self._breakers.breakers.append((target, breaker))

    def watch_queue(self, queue: QueueProbe) -> None:
        self._queue = _QueueCollector(queue)
        self.registry.register(self._queue)

    async def refresh(self) -> None:
        """Read what comes from another server (the queue's depth); a failure leaves the depth out of the scrape."""
        if self._queue is not None:
            await self._queue.refresh()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class TimedTransport:
    """Implements WebhookTransport: `transport`'s POSTs, each timed into `metrics` from the request to the answer
    (status line, and a small body read for connection reuse); attempts the breaker refused are not POSTs."""

    def __init__(
        self,
        transport: WebhookTransport,
        metrics: RelayMetrics,
        *,
        target: str = WEBHOOK_TARGET,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.transport = transport
        self.metrics = metrics
        self.target = target
        self._clock = clock

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt:
        start = self._clock()
        attempt = await self.transport.post(body, headers)
        if not attempt.circuit_open:
            self.metrics.attempt(attempt, self._clock() - start, target=self.target)
        return attempt


class _BreakerCollector:
    """mailrelay_delivery_circuit_state: 1 for the webhook target's breaker state now, 0 for the others (and its
    alias). Read without moving the breaker (a scrape never makes its Open -> Half-Open transition: the next
    message does)."""

    def __init__(self) -> None:
        self.breakers: list[tuple[str, CircuitBreaker]] = []

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            CIRCUIT_STATE, "The delivery target's circuit breaker state (1 = current).", labels=["target", "state"]
        )
        for target, breaker in self.breakers:
            state = breaker.observed_state
            for each in BreakerState:
                family.add_metric([target, each.value], 1.0 if each is state else 0.0)
        yield family
        yield _alias(family)


class _Aliases:
    """The deprecated names of `collectors`' families (ALIASES), built at scrape time from the same samples."""

    def __init__(self, collectors: Sequence[Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            for family in collector.collect():
                yield _alias(family)


def _alias(family: Metric) -> Metric:
    """`family` under its old name: the webhook target's samples, without the `target` label."""
    old = ALIASES[family.name]
    shown = family.name + ("_total" if family.type == "counter" else "")
    alias = Metric(old, f"Deprecated alias of {shown} (target webhook).", family.type, family.unit)
    for sample in family.samples:
        labels = dict(sample.labels)
        if labels.pop("target", WEBHOOK_TARGET) == WEBHOOK_TARGET:
            alias.samples.append(sample._replace(name=old + sample.name[len(family.name) :], labels=labels))
    return alias


class _QueueCollector:
    """Queue mode: whether NATS is connected, and the stream's depth as last read by refresh()."""

    def __init__(self, queue: QueueProbe) -> None:
        self.queue = queue
        self.depth: QueueDepth | None = None

    async def refresh(self) -> None:
        try:
            self.depth = await self.queue.depth()
        except QueueUnavailable:
            self.depth = None

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "mailrelay_queue_connected",
            "1 while connected to NATS, else 0.",
            value=1.0 if self.queue.connected else 0.0,
        )
        if self.depth is None:
            return
        yield GaugeMetricFamily(
            "mailrelay_queue_depth",
            "Messages in the stream waiting for delivery (not yet acknowledged), all relays' together.",
            value=self.depth.messages,
        )
        yield GaugeMetricFamily(
            "mailrelay_queue_dead_letter_depth",
            "Dead letters stored on the stream's dead-letter subject, all relays' together.",
            value=self.depth.dead_letters,
        )
