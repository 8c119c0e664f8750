"""RelayMetrics: which families each mode exports, the bounded values of every label, and what is recorded for
which event, directly and through the Relay and the DeliveryWorkers wired as cli.py wires them (real webhook
receiver, real transport and breaker, real NATS). Each scrape is read back with prometheus_client's parser."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families

from bastion_core import BreakerState, CircuitBreaker, Guard
from mailrelay import __version__
from mailrelay._attachment_policy import AttachmentPolicy
from mailrelay._attachments import Attachment, InlineSink
from mailrelay._delivery import Attempt, WebhookClient
from mailrelay._dmarc import DmarcResult, DmarcVerdict
from mailrelay._errors import AttachmentStoreFailed
from mailrelay._metrics import (
    CONTENT_TYPE,
    AttemptOutcome,
    DeadLetter,
    Delivery,
    RelayMetrics,
    Retry,
    TimedTransport,
    attempt_outcome,
)
from mailrelay._parsing import MimePart
from mailrelay._queue import JetStreamQueue
from mailrelay._redelivery import RedeliveryRules
from mailrelay._relay import Relay
from mailrelay._transport import AiohttpTransport
from mailrelay._workers import DeliveryWorkers
from mailrelay.smtp import _replies as r
from mailrelay.smtp._replies import Reply
from mailrelay.smtp._session import Envelope, Session
from mailrelay.testing import FakeClock, WebhookReceiver, free_port
from tests.mailrelay.scrape import samples
from tests.mailrelay.waiting import eventually
from tests.nats_server import NatsServer

MESSAGE = b"From: al@example.org\r\nSubject: hi\r\n\r\nhello\r\n"
WITH_ATTACHMENTS = (
    b"Content-Type: multipart/mixed; boundary=b\r\n\r\n"
    b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n"
    b"--b\r\nContent-Type: application/pdf\r\n\r\n%PDF-1\r\n"
    b"--b\r\nContent-Type: image/png\r\n\r\nPNG\r\n"
    b"--b\r\nContent-Type: application/octet-stream\r\n\r\n" + b"y" * 200 + b"\r\n"
    b"--b--\r\n"
)
"""Three attachments: two small ones and one of 200 bytes (over a max_bytes of 100)."""

DIRECT_FAMILIES = {
    "mailrelay_build_info": "gauge",
    "mailrelay_smtp_sessions_active": "gauge",
    "mailrelay_smtp_sessions_refused": "counter",
    "mailrelay_smtp_recipients": "counter",
    "mailrelay_smtp_messages": "counter",
    "mailrelay_sender_policy_denials": "counter",
    "mailrelay_delivery_attempt_duration_seconds": "histogram",
    "mailrelay_deliveries": "counter",
    "mailrelay_webhook_duration_seconds": "histogram",  # deprecated aliases of the two above
    "mailrelay_webhook_deliveries": "counter",
    "mailrelay_attachments": "counter",
    "mailrelay_attachments_dropped": "counter",
    "mailrelay_attachment_store_failures": "counter",
}
QUEUE_COUNTERS = {
    "mailrelay_queue_publish_failures": "counter",
    "mailrelay_queue_retries": "counter",
    "mailrelay_queue_dead_letters": "counter",
}
QUEUE_GAUGES = {
    "mailrelay_queue_connected": "gauge",
    "mailrelay_queue_depth": "gauge",
    "mailrelay_queue_dead_letter_depth": "gauge",
}

MakeRelay = Callable[..., Relay]
MakeWorkers = Callable[..., DeliveryWorkers]


def text(metrics: RelayMetrics) -> str:
    return metrics.exposition().decode()


def families(metrics: RelayMetrics) -> dict[str, str]:
    """The relay's own families (name -> type), without the `_created` gauges of counters and histograms."""
    return {
        family.name: family.type
        for family in text_string_to_metric_families(text(metrics))
        if family.name.startswith("mailrelay_") and not family.name.endswith("_created")
    }


def recorded(metrics: RelayMetrics, name: str) -> dict[str, float]:
    """The non-zero samples named exactly `name`, keyed by their labels (`code="250",outcome="accepted"`)."""
    prefix = name + "{"
    return {
        key[len(prefix) : -1] if key.startswith(prefix) else "": value
        for key, value in samples(text(metrics), name).items()
        if value and (key == name or key.startswith(prefix))
    }


def fresh() -> RelayMetrics:
    """Without the process collector, whose values move on their own."""
    return RelayMetrics(process_collector=False)


def envelope(content: bytes = MESSAGE) -> Envelope:
    return Envelope(mail_from="al@example.org", recipients=["inbox@example.test"], content=content)


async def _no_sleep(seconds: float) -> None:
    return None


class TestFamilies:
    def test_direct_mode_exports_the_smtp_webhook_and_attachment_families(self) -> None:
        assert families(fresh()) == DIRECT_FAMILIES

    def test_queue_counters_only_in_queue_mode(self) -> None:
        assert families(RelayMetrics(queue=True, process_collector=False)) == {**DIRECT_FAMILIES, **QUEUE_COUNTERS}

    def test_dmarc_results_only_with_dmarc(self) -> None:
        metrics = RelayMetrics(dmarc=True, process_collector=False)
        assert families(metrics) == {**DIRECT_FAMILIES, "mailrelay_dmarc_results": "counter"}

    def test_breaker_gauge_once_watched(self) -> None:
        metrics = fresh()
        metrics.watch_breaker(CircuitBreaker("webhook"))
        assert families(metrics) == {
            **DIRECT_FAMILIES,
            "mailrelay_delivery_circuit_state": "gauge",
            "mailrelay_webhook_circuit_state": "gauge",
        }

    def test_each_routes_breaker_has_its_target_label_and_the_alias_only_the_webhook(self) -> None:
        metrics = fresh()
        metrics.watch_breaker(CircuitBreaker("webhook"))
        opened = CircuitBreaker("route:billing", min_requests=1, wait_secs=30)
        opened.record(opened.admit(), success=False)
        metrics.watch_breaker(opened, target="route:billing")
        assert recorded(metrics, "mailrelay_delivery_circuit_state") == {
            'state="closed",target="webhook"': 1.0,
            'state="open",target="route:billing"': 1.0,
        }
        assert recorded(metrics, "mailrelay_webhook_circuit_state") == {'state="closed"': 1.0}

    def test_a_routes_deliveries_and_attempts_have_its_target_label_and_the_alias_only_the_webhook(self) -> None:
        metrics = fresh()
        metrics.delivery(Delivery.DELIVERED)
        metrics.delivery(Delivery.DELIVERED, target="route:billing")
        metrics.delivery(Delivery.FAILED, target="route:billing")
        metrics.attempt(Attempt(status=200), 0.01, target="route:billing")
        assert recorded(metrics, "mailrelay_deliveries_total") == {
            'outcome="delivered",target="webhook"': 1.0,
            'outcome="delivered",target="route:billing"': 1.0,
            'outcome="failed",target="route:billing"': 1.0,
        }
        assert recorded(metrics, "mailrelay_delivery_attempt_duration_seconds_count") == {
            'outcome="delivered",target="route:billing"': 1.0
        }
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="delivered"': 1.0}

    def test_sender_policy_denials_are_counted(self) -> None:
        metrics = fresh()
        metrics.sender_policy_denied()
        assert recorded(metrics, "mailrelay_sender_policy_denials_total") == {"": 1.0}

    def test_process_collector_is_on_by_default(self) -> None:
        names = {family.name for family in text_string_to_metric_families(text(RelayMetrics()))}
        assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"} <= names

    def test_build_info_carries_the_version(self) -> None:
        assert recorded(fresh(), "mailrelay_build_info") == {f'version="{__version__}"': 1.0}

    def test_content_type_is_the_text_format_0_0_4(self) -> None:
        assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_every_label_takes_only_a_fixed_set_of_values() -> None:
    """Every series exists from the start (at 0), so these sets are all a label can ever hold: no address,
    subject, path or id can become a label value."""
    metrics = RelayMetrics(queue=True, dmarc=True, process_collector=False)
    metrics.watch_breaker(CircuitBreaker("webhook"))
    metrics.message_answered(Reply(code=599, text="not a code the relay sends"))
    labels: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text(metrics)):
        if family.name.endswith("_created"):
            continue
        for sample in family.samples:
            for name, value in sample.labels.items():
                if name != "le":
                    labels.setdefault(family.name, {}).setdefault(name, set()).add(value)
    delivery_outcomes = {"delivered", "refused", "failed", "circuit_open"}
    attempt_outcomes = {"delivered", "refused", "http_error", "unexpected", "timeout", "connection_error"}
    assert labels == {
        "mailrelay_build_info": {"version": {__version__}},
        "mailrelay_smtp_sessions_refused": {"reason": {"max_sessions", "max_per_ip"}},
        "mailrelay_smtp_recipients": {"outcome": {"accepted", "rejected"}, "code": {"250", "550", "452", "421"}},
        "mailrelay_smtp_messages": {
            "outcome": {"accepted", "rejected"},
            "code": {"250", "451", "500", "550", "552", "554", "other"},
        },
        "mailrelay_delivery_attempt_duration_seconds": {"target": {"webhook"}, "outcome": attempt_outcomes},
        "mailrelay_deliveries": {"target": {"webhook"}, "outcome": delivery_outcomes},
        "mailrelay_webhook_duration_seconds": {"outcome": attempt_outcomes},
        "mailrelay_webhook_deliveries": {"outcome": delivery_outcomes},
        "mailrelay_dmarc_results": {"result": {"pass", "fail", "none", "temperror"}},
        "mailrelay_attachments": {"delivery": {"inline", "s3"}},
        "mailrelay_attachments_dropped": {
            "rule": {"denied_extension", "denied_type", "type_not_allowed", "max_bytes", "max_count", "max_total_bytes"}
        },
        "mailrelay_queue_retries": {"reason": {"attempt_failed", "circuit_open", "dead_letter_failed"}},
        "mailrelay_queue_dead_letters": {"reason": {"refused", "failed"}},
        "mailrelay_delivery_circuit_state": {"target": {"webhook"}, "state": {"closed", "open", "half_open"}},
        "mailrelay_webhook_circuit_state": {"state": {"closed", "open", "half_open"}},
    }


class TestDeprecatedAliases:
    """The delivery metrics' names of 0.x (mailrelay_webhook_*) are still exported, with the same values."""

    def test_each_old_name_repeats_the_webhook_targets_series_without_the_target_label(self) -> None:
        clock = FakeClock()
        breaker = CircuitBreaker("webhook", min_requests=1, wait_secs=30, clock=clock)
        metrics = fresh()
        metrics.watch_breaker(breaker)
        breaker.record(breaker.admit(), success=False)
        metrics.delivery(Delivery.DELIVERED)
        metrics.delivery(Delivery.CIRCUIT_OPEN)
        metrics.attempt(Attempt(status=200), 0.3)
        metrics.attempt(Attempt(status=503), 1.5)
        for new, old in [
            ("mailrelay_deliveries_total", "mailrelay_webhook_deliveries_total"),
            ("mailrelay_delivery_attempt_duration_seconds_count", "mailrelay_webhook_duration_seconds_count"),
            ("mailrelay_delivery_attempt_duration_seconds_sum", "mailrelay_webhook_duration_seconds_sum"),
            ("mailrelay_delivery_attempt_duration_seconds_bucket", "mailrelay_webhook_duration_seconds_bucket"),
            ("mailrelay_delivery_circuit_state", "mailrelay_webhook_circuit_state"),
        ]:
            renamed = {
                key.replace('target="webhook",', "").replace(',target="webhook"', ""): value
                for key, value in recorded(metrics, new).items()
            }
            assert recorded(metrics, old) == renamed, old
        assert recorded(metrics, "mailrelay_deliveries_total") == {
            'outcome="circuit_open",target="webhook"': 1.0,
            'outcome="delivered",target="webhook"': 1.0,
        }
        assert recorded(metrics, "mailrelay_delivery_circuit_state") == {'state="open",target="webhook"': 1.0}

    def test_the_help_text_names_the_new_metric(self) -> None:
        helps = {family.name: family.documentation for family in text_string_to_metric_families(text(fresh()))}
        assert (
            helps["mailrelay_webhook_deliveries"] == "Deprecated alias of mailrelay_deliveries_total (target webhook)."
        )
        assert helps["mailrelay_webhook_duration_seconds"] == (
            "Deprecated alias of mailrelay_delivery_attempt_duration_seconds (target webhook)."
        )


class TestSmtpReplies:
    def test_message_replies_by_code_and_outcome(self) -> None:
        metrics = fresh()
        for reply in (
            r.MESSAGE_ACCEPTED,
            r.MESSAGE_ACCEPTED,
            r.temporary_failure("Webhook delivery failed (HTTP 503), try again later"),
            r.QUEUE_UNAVAILABLE,
            r.permanent_failure("Webhook refused the message (HTTP 422)"),
            r.MESSAGE_TOO_LARGE,
            r.DATA_LINE_TOO_LONG,
            r.dmarc_rejected("example.org"),
        ):
            metrics.message_answered(reply)
        assert recorded(metrics, "mailrelay_smtp_messages_total") == {
            'code="250",outcome="accepted"': 2.0,
            'code="451",outcome="rejected"': 2.0,
            'code="554",outcome="rejected"': 1.0,
            'code="552",outcome="rejected"': 1.0,
            'code="500",outcome="rejected"': 1.0,
            'code="550",outcome="rejected"': 1.0,
        }

    def test_a_code_the_relay_does_not_send_is_counted_as_other(self) -> None:
        metrics = fresh()
        metrics.message_answered(Reply(code=599, text="x"))
        metrics.message_answered(Reply(code=299, text="y"))
        assert recorded(metrics, "mailrelay_smtp_messages_total") == {
            'code="other",outcome="rejected"': 1.0,
            'code="other",outcome="accepted"': 1.0,
        }

    def test_recipient_replies_by_code_and_outcome(self) -> None:
        metrics = fresh()
        for reply in (r.OK, r.OK, r.NO_SUCH_USER, r.TOO_MANY_RECIPIENTS, r.OTHER_ROUTE, r.TOO_MANY_UNKNOWN_RCPTS):
            metrics.recipient_answered(reply)
        assert recorded(metrics, "mailrelay_smtp_recipients_total") == {
            'code="250",outcome="accepted"': 2.0,
            'code="550",outcome="rejected"': 1.0,
            'code="452",outcome="rejected"': 2.0,
            'code="421",outcome="rejected"': 1.0,
        }

    def test_a_recipient_reply_outside_the_three_is_not_counted(self) -> None:
        metrics = fresh()
        metrics.recipient_answered(r.RCPT_TO_SYNTAX)
        assert recorded(metrics, "mailrelay_smtp_recipients_total") == {}

    def test_refused_sessions_by_limit(self) -> None:
        metrics = fresh()
        metrics.session_refused(r.TOO_MANY_SESSIONS)
        metrics.session_refused(r.TOO_MANY_CONNECTIONS)
        metrics.session_refused(r.TOO_MANY_CONNECTIONS)
        metrics.session_refused(r.SHUTTING_DOWN)  # not a limit: not counted
        assert recorded(metrics, "mailrelay_smtp_sessions_refused_total") == {
            'reason="max_sessions"': 1.0,
            'reason="max_per_ip"': 2.0,
        }

    def test_open_sessions_are_read_when_scraped(self) -> None:
        metrics = fresh()
        open_sessions = [3]
        metrics.watch_sessions(lambda: open_sessions[0])
        assert recorded(metrics, "mailrelay_smtp_sessions_active") == {"": 3.0}
        open_sessions[0] = 5
        assert recorded(metrics, "mailrelay_smtp_sessions_active") == {"": 5.0}


@pytest.mark.parametrize(
    ("attempt", "outcome"),
    [
        pytest.param(Attempt(status=200), AttemptOutcome.DELIVERED, id="200"),
        pytest.param(Attempt(status=204), AttemptOutcome.DELIVERED, id="204"),
        pytest.param(Attempt(status=400), AttemptOutcome.REFUSED, id="400"),
        pytest.param(Attempt(status=422), AttemptOutcome.REFUSED, id="422"),
        pytest.param(Attempt(status=408), AttemptOutcome.HTTP_ERROR, id="408"),
        pytest.param(Attempt(status=429), AttemptOutcome.HTTP_ERROR, id="429"),
        pytest.param(Attempt(status=500), AttemptOutcome.HTTP_ERROR, id="500"),
        pytest.param(Attempt(status=503), AttemptOutcome.HTTP_ERROR, id="503"),
        pytest.param(Attempt(status=302), AttemptOutcome.UNEXPECTED, id="302"),
        pytest.param(Attempt(status=101), AttemptOutcome.UNEXPECTED, id="101"),
        pytest.param(Attempt(error="timeout"), AttemptOutcome.TIMEOUT, id="timeout"),
        pytest.param(Attempt(error="connection error: ClientConnectorError"), AttemptOutcome.CONNECTION_ERROR, id="ce"),
    ],
)
def test_attempt_outcome(attempt: Attempt, outcome: AttemptOutcome) -> None:
    assert attempt_outcome(attempt) is outcome


def test_each_attempt_is_observed_under_its_outcome() -> None:
    metrics = fresh()
    metrics.attempt(Attempt(status=200), 0.02)
    metrics.attempt(Attempt(status=200), 0.3)
    metrics.attempt(Attempt(status=503), 1.5)
    assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {
        'outcome="delivered"': 2.0,
        'outcome="http_error"': 1.0,
    }
    assert recorded(metrics, "mailrelay_webhook_duration_seconds_sum") == {
        'outcome="delivered"': pytest.approx(0.32),
        'outcome="http_error"': 1.5,
    }
    buckets = recorded(metrics, "mailrelay_webhook_duration_seconds_bucket")
    assert (buckets['le="0.025",outcome="delivered"'], buckets['le="0.5",outcome="delivered"']) == (1.0, 2.0)
    assert ('le="1.0",outcome="http_error"' in buckets, buckets['le="2.5",outcome="http_error"']) == (False, 1.0)


class TestBreakerState:
    def test_one_for_the_current_state(self) -> None:
        clock = FakeClock()
        breaker = CircuitBreaker("webhook", min_requests=1, wait_secs=30, clock=clock)
        metrics = fresh()
        metrics.watch_breaker(breaker)
        assert recorded(metrics, "mailrelay_webhook_circuit_state") == {'state="closed"': 1.0}
        breaker.record(breaker.admit(), success=False)
        assert recorded(metrics, "mailrelay_webhook_circuit_state") == {'state="open"': 1.0}
        clock.advance(30)
        assert recorded(metrics, "mailrelay_webhook_circuit_state") == {'state="half_open"': 1.0}

    def test_a_scrape_does_not_move_the_breaker(self) -> None:
        """The wait is over, so the gauge says half_open; the transition itself is left to the next message."""
        clock = FakeClock()
        breaker = CircuitBreaker("webhook", min_requests=1, wait_secs=30, clock=clock)
        breaker.record(breaker.admit(), success=False)
        metrics = fresh()
        metrics.watch_breaker(breaker)
        clock.advance(31)
        with structlog.testing.capture_logs() as logs:
            metrics.exposition()
        assert logs == []
        with structlog.testing.capture_logs() as logs:
            assert breaker.state is BreakerState.HALF_OPEN
        assert [entry["event"] for entry in logs] == ["circuit_breaker_state_changed"]


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture
async def open_transport(receiver: WebhookReceiver) -> AsyncIterator[Callable[..., AiohttpTransport]]:
    """Factory: the real transport to `receiver` (or `url`) under `breaker`, closed at the end."""
    opened: list[AiohttpTransport] = []

    def make(breaker: CircuitBreaker, url: str | None = None) -> AiohttpTransport:
        transport = AiohttpTransport.open(url=url or receiver.url, guard=Guard(breaker=breaker), timeout=5)
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        await transport.close()


class TestTimedTransport:
    async def test_a_post_is_timed_from_request_to_answer(
        self, open_transport: Callable[..., AiohttpTransport]
    ) -> None:
        metrics = fresh()
        clock = iter([100.0, 100.2]).__next__
        timed = TimedTransport(open_transport(CircuitBreaker("webhook")), metrics, clock=clock)
        assert await timed.post(b"{}", {}) == Attempt(status=200)
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="delivered"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_sum") == {
            'outcome="delivered"': pytest.approx(0.2)
        }

    async def test_a_connection_error_is_observed_as_such(
        self, open_transport: Callable[..., AiohttpTransport]
    ) -> None:
        metrics = fresh()
        dead = f"http://127.0.0.1:{free_port()}/webhook"
        attempt = await TimedTransport(open_transport(CircuitBreaker("webhook"), dead), metrics).post(b"{}", {})
        assert attempt.status is None
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="connection_error"': 1.0}

    async def test_an_attempt_the_breaker_refused_is_not_a_post(
        self, open_transport: Callable[..., AiohttpTransport], receiver: WebhookReceiver
    ) -> None:
        metrics = fresh()
        breaker = CircuitBreaker("webhook", min_requests=1, wait_secs=60, clock=FakeClock())
        breaker.record(breaker.admit(), success=False)
        attempt = await TimedTransport(open_transport(breaker), metrics).post(b"{}", {})
        assert attempt.circuit_open
        assert (recorded(metrics, "mailrelay_webhook_duration_seconds_count"), receiver.requests) == ({}, [])


class FailingSink(InlineSink):
    """Attachment storage that is down (the real S3 failure is tested in test_s3.py)."""

    async def store(self, parts: Sequence[MimePart], *, delivery_id: str) -> list[Attachment]:
        raise AttachmentStoreFailed("timeout")


class ScriptedDmarc:
    def __init__(self, result: DmarcResult) -> None:
        self.result = result

    async def evaluate(self, *, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict:
        return DmarcVerdict(result=self.result, domain="example.org")


@pytest.fixture
def make_relay(open_transport: Callable[..., AiohttpTransport]) -> MakeRelay:
    """Factory: make_relay(metrics, breaker=..., **Relay options) -> a Relay wired as cli.py wires it: the webhook
    client posts through TimedTransport over the real transport, one retry, no waiting."""

    def make(metrics: RelayMetrics, *, breaker: CircuitBreaker | None = None, **options: object) -> Relay:
        breaker = breaker or CircuitBreaker("webhook", min_requests=10, wait_secs=60, clock=FakeClock())
        transport = TimedTransport(open_transport(breaker), metrics)
        return Relay(
            target=WebhookClient(transport=transport, user_agent="UA", breaker=breaker, max_retries=1, sleep=_no_sleep),
            attachment_policy=options.pop("attachment_policy", None) or AttachmentPolicy(max_bytes=10_000),  # type: ignore[arg-type]
            metrics=metrics,
            **options,  # type: ignore[arg-type]
        )

    return make


class TestThroughTheRelay:
    async def test_a_delivered_message(self, make_relay: MakeRelay) -> None:
        metrics = fresh()
        assert await make_relay(metrics).handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="delivered"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="delivered"': 1.0}

    async def test_a_message_the_webhook_refused(self, make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
        metrics = fresh()
        receiver.script(422)
        reply = await make_relay(metrics).handle_envelope(envelope(), Session(peer_ip="x"))
        assert reply.code == 554
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="refused"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="refused"': 1.0}

    async def test_a_message_whose_retries_ran_out(self, make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
        metrics = fresh()
        receiver.script(500, 503)
        reply = await make_relay(metrics).handle_envelope(envelope(), Session(peer_ip="x"))
        assert reply.code == 451
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="failed"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="http_error"': 2.0}

    async def test_a_redirect_is_a_failed_delivery_of_an_unexpected_attempt(
        self, make_relay: MakeRelay, receiver: WebhookReceiver
    ) -> None:
        metrics = fresh()
        receiver.script(302)
        assert (await make_relay(metrics).handle_envelope(envelope(), Session(peer_ip="x"))).code == 451
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="failed"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="unexpected"': 1.0}

    async def test_the_circuit_opening_counts_each_message_it_ended(
        self, make_relay: MakeRelay, receiver: WebhookReceiver
    ) -> None:
        """The first message's 500 opens the breaker and its retry is refused; the second is refused up front."""
        metrics = fresh()
        breaker = CircuitBreaker("webhook", min_requests=1, wait_secs=60, clock=FakeClock())
        receiver.script(500)
        relay = make_relay(metrics, breaker=breaker)
        assert (await relay.handle_envelope(envelope(), Session(peer_ip="x"))).code == 451
        assert (await relay.handle_envelope(envelope(), Session(peer_ip="x"))).code == 451
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="circuit_open"': 2.0}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="http_error"': 1.0}
        assert len(receiver.requests) == 1

    async def test_attachments_delivered_and_dropped(self, make_relay: MakeRelay) -> None:
        metrics = fresh()
        relay = make_relay(metrics, attachment_policy=AttachmentPolicy(max_bytes=100))
        assert await relay.handle_envelope(envelope(WITH_ATTACHMENTS), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
        assert recorded(metrics, "mailrelay_attachments_total") == {'delivery="inline"': 2.0}
        assert recorded(metrics, "mailrelay_attachments_dropped_total") == {'rule="max_bytes"': 1.0}

    async def test_a_failed_upload(self, make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
        metrics = fresh()
        relay = make_relay(metrics, attachment_sink=FailingSink())
        assert await relay.handle_envelope(envelope(WITH_ATTACHMENTS), Session(peer_ip="x")) == (
            r.ATTACHMENT_STORE_FAILED
        )
        assert recorded(metrics, "mailrelay_attachment_store_failures_total") == {"": 1.0}
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {}

    @pytest.mark.parametrize("result", list(DmarcResult), ids=lambda result: result.value)
    async def test_dmarc_results(self, make_relay: MakeRelay, result: DmarcResult) -> None:
        metrics = RelayMetrics(dmarc=True, process_collector=False)
        await make_relay(metrics, dmarc=ScriptedDmarc(result)).handle_envelope(envelope(), Session(peer_ip="x"))
        assert recorded(metrics, "mailrelay_dmarc_results_total") == {f'result="{result.value}"': 1.0}


@pytest.fixture
async def queue(nats_server: NatsServer) -> AsyncIterator[JetStreamQueue]:
    """An opened queue on the shared NATS server, on a stream of the test's own."""
    opened = JetStreamQueue(
        servers=[nats_server.url], stream=f"M{uuid.uuid4().hex[:12]}", ack_wait=30, shown_url=nats_server.url
    )
    await opened.open()
    yield opened
    await opened.close()


def depths(metrics: RelayMetrics) -> tuple[float | None, float | None, float | None]:
    """mailrelay_queue_connected, mailrelay_queue_depth and mailrelay_queue_dead_letter_depth (None: not exported)."""
    found = samples(text(metrics), "mailrelay_queue_")
    return (
        found.get("mailrelay_queue_connected"),
        found.get("mailrelay_queue_depth"),
        found.get("mailrelay_queue_dead_letter_depth"),
    )


class TestQueueMode:
    async def test_a_queued_message_is_no_delivery_yet(
        self, make_relay: MakeRelay, queue: JetStreamQueue, receiver: WebhookReceiver
    ) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        assert await make_relay(metrics, queue=queue).handle_envelope(envelope(), Session(peer_ip="x")) == (
            r.MESSAGE_ACCEPTED
        )
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {}
        assert (recorded(metrics, "mailrelay_queue_publish_failures_total"), receiver.requests) == ({}, [])

    async def test_a_publish_the_stream_did_not_store(
        self, make_relay: MakeRelay, own_nats_server: NatsServer, receiver: WebhookReceiver
    ) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        queue = JetStreamQueue(servers=[own_nats_server.url], stream="DOWN", ack_wait=30, shown_url="nats://x")
        await queue.open()
        try:
            own_nats_server.stop()
            await eventually(lambda: not queue.connected, what="the client noticed the outage")
            reply = await make_relay(metrics, queue=queue).handle_envelope(envelope(), Session(peer_ip="x"))
        finally:
            await queue.close()
        assert reply == r.QUEUE_UNAVAILABLE
        assert recorded(metrics, "mailrelay_queue_publish_failures_total") == {"": 1.0}
        assert (recorded(metrics, "mailrelay_webhook_deliveries_total"), receiver.requests) == ({}, [])

    async def test_depth_and_dead_letters_are_read_from_the_stream_when_scraped(self, queue: JetStreamQueue) -> None:
        """Two payloads queued, one of them (fetched, not yet acknowledged) also stored as a dead letter."""
        metrics = RelayMetrics(queue=True, process_collector=False)
        metrics.watch_queue(queue)
        await metrics.refresh()
        assert depths(metrics) == (1.0, 0.0, 0.0)
        await queue.enqueue(b"{}", delivery_id="one")
        await queue.enqueue(b"{}", delivery_id="two")
        (first, *_) = await queue.fetch(1, wait=2)
        await queue.dead_letter(first, error="HTTP 422", attempts=1)
        await metrics.refresh()
        assert depths(metrics) == (1.0, 2.0, 1.0)

    async def test_without_nats_the_depth_is_left_out_and_connected_is_0(self, queue: JetStreamQueue) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        metrics.watch_queue(queue)
        await metrics.refresh()
        await queue.close()
        await metrics.refresh()
        assert depths(metrics) == (0.0, None, None)


@pytest.fixture
def make_workers(open_transport: Callable[..., AiohttpTransport], queue: JetStreamQueue) -> MakeWorkers:
    """Factory: make_workers(metrics, breaker=..., max_attempts=3) -> DeliveryWorkers on `queue`, posting through
    TimedTransport over the real transport, as cli.py wires them."""

    def make(metrics: RelayMetrics, *, breaker: CircuitBreaker | None = None, max_attempts: int = 3) -> DeliveryWorkers:
        breaker = breaker or CircuitBreaker("webhook", min_requests=10, wait_secs=60, clock=FakeClock())
        transport = TimedTransport(open_transport(breaker), metrics)
        return DeliveryWorkers(
            inbox=queue,
            target=WebhookClient(transport=transport, user_agent="UA", breaker=breaker),
            rules=RedeliveryRules(max_attempts=max_attempts, max_age=3600, backoff_base=0.01),
            concurrency=1,
            metrics=metrics,
        )

    return make


async def deliver_one(queue: JetStreamQueue, workers: DeliveryWorkers) -> None:
    """Queue one payload, fetch it and make its one delivery attempt."""
    await queue.enqueue(b'{"subject":"x"}', delivery_id=uuid.uuid4().hex)
    (message,) = await queue.fetch(1, wait=2)
    await workers.deliver(message)


class TestThroughTheDeliveryWorkers:
    async def test_a_delivered_message(self, make_workers: MakeWorkers, queue: JetStreamQueue) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        await deliver_one(queue, make_workers(metrics))
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="delivered"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="delivered"': 1.0}
        assert recorded(metrics, "mailrelay_queue_retries_total") == {}

    async def test_a_failed_attempt_is_a_retry(
        self, make_workers: MakeWorkers, queue: JetStreamQueue, receiver: WebhookReceiver
    ) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        receiver.script(503)
        await deliver_one(queue, make_workers(metrics))
        assert recorded(metrics, "mailrelay_queue_retries_total") == {'reason="attempt_failed"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {}
        assert recorded(metrics, "mailrelay_webhook_duration_seconds_count") == {'outcome="http_error"': 1.0}

    async def test_an_open_circuit_is_a_retry_without_a_post(
        self, make_workers: MakeWorkers, queue: JetStreamQueue, receiver: WebhookReceiver
    ) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        breaker = CircuitBreaker("webhook", min_requests=1, wait_secs=60, clock=FakeClock())
        breaker.record(breaker.admit(), success=False)
        await deliver_one(queue, make_workers(metrics, breaker=breaker))
        assert recorded(metrics, "mailrelay_queue_retries_total") == {'reason="circuit_open"': 1.0}
        assert (recorded(metrics, "mailrelay_webhook_duration_seconds_count"), receiver.requests) == ({}, [])

    async def test_a_refused_message_is_a_dead_letter(
        self, make_workers: MakeWorkers, queue: JetStreamQueue, receiver: WebhookReceiver
    ) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        receiver.script(422)
        await deliver_one(queue, make_workers(metrics))
        assert recorded(metrics, "mailrelay_queue_dead_letters_total") == {'reason="refused"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="refused"': 1.0}

    async def test_the_last_failed_attempt_is_a_dead_letter(
        self, make_workers: MakeWorkers, queue: JetStreamQueue, receiver: WebhookReceiver
    ) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        receiver.script(500)
        await deliver_one(queue, make_workers(metrics, max_attempts=1))
        assert recorded(metrics, "mailrelay_queue_dead_letters_total") == {'reason="failed"': 1.0}
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {'outcome="failed"': 1.0}
        assert recorded(metrics, "mailrelay_queue_retries_total") == {}

    async def test_a_dead_letter_the_stream_did_not_store_is_a_retry(
        self, make_workers: MakeWorkers, queue: JetStreamQueue, receiver: WebhookReceiver
    ) -> None:
        metrics = RelayMetrics(queue=True, process_collector=False)
        workers = make_workers(metrics)
        receiver.script(422)
        await queue.enqueue(b"{}", delivery_id="poison")
        (message,) = await queue.fetch(1, wait=2)
        await queue.close()  # NATS gone between the attempt's answer and the dead letter
        await workers.deliver(message)
        assert recorded(metrics, "mailrelay_queue_retries_total") == {'reason="dead_letter_failed"': 1.0}
        assert recorded(metrics, "mailrelay_queue_dead_letters_total") == {}
        assert recorded(metrics, "mailrelay_webhook_deliveries_total") == {}


@pytest.mark.parametrize(
    ("record", "name", "labels"),
    [
        pytest.param(lambda m: m.delivery(Delivery.CIRCUIT_OPEN), "webhook_deliveries", 'outcome="circuit_open"'),
        pytest.param(lambda m: m.queue_retry(Retry.ATTEMPT_FAILED), "queue_retries", 'reason="attempt_failed"'),
        pytest.param(lambda m: m.dead_letter(DeadLetter.FAILED), "queue_dead_letters", 'reason="failed"'),
        pytest.param(lambda m: m.attachment_store_failed(), "attachment_store_failures", ""),
        pytest.param(lambda m: m.queue_publish_failed(), "queue_publish_failures", ""),
    ],
)
def test_each_recording_method_adds_one(record: Callable[[RelayMetrics], None], name: str, labels: str) -> None:
    metrics = RelayMetrics(queue=True, process_collector=False)
    record(metrics)
    record(metrics)
    assert recorded(metrics, f"mailrelay_{name}_total") == {labels: 2.0}
