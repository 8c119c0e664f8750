"""MAIL_RELAY_METRICS_PORT end to end: real `mailrelay` processes, real smtplib sessions, a real webhook receiver and,
in queue mode, a real `nats-server -js`. Every scrape is an HTTP GET with httpx, read with prometheus_client's parser.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from mailrelay.testing import RecordedRequest, WebhookReceiver, free_port
from tests.e2e.mailrelay.support import (
    TARGET,
    RelayProcess,
    log_events,
    relay_command,
    relay_env,
    send_message,
    subject_of,
    wait_until,
)
from tests.mailrelay.scrape import samples
from tests.nats_server import NatsServer

ACCEPTED = (250, b"OK: Message accepted for delivery")
DELIVERY_TIMEOUT_SECS = 20.0
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Cache-Control: no-store\r\nConnection: close\r\n\r\nNot Found"
)


@dataclass
class Metered:
    """A relay with MAIL_RELAY_METRICS_PORT set."""

    relay: RelayProcess
    metrics_port: int

    def scrape(self) -> dict[str, float]:
        """GET /metrics: every `mailrelay_*` sample (without `_created`), keyed `name{label="value",...}`."""
        response = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10)
        assert (response.status_code, response.headers["content-type"]) == (200, METRICS_CONTENT_TYPE)
        return samples(response.text, "mailrelay_")

    def recorded(self, name: str) -> dict[str, float]:
        """The non-zero samples named exactly `name`, keyed by their labels (`code="250",outcome="accepted"`)."""
        return recorded(self.scrape(), name)


def recorded(found: dict[str, float], name: str) -> dict[str, float]:
    prefix = name + "{"
    return {
        key[len(prefix) : -1] if key.startswith(prefix) else "": value
        for key, value in found.items()
        if value and (key == name or key.startswith(prefix))
    }


StartMetered = Callable[..., Metered]


@pytest.fixture
def metered_relay(start_relay: Callable[..., RelayProcess]) -> Iterator[StartMetered]:
    """Factory: metered_relay(**MAIL_RELAY_overrides) -> a relay exporting metrics on a free port of its own;
    stopped at the end of the test."""
    started: list[RelayProcess] = []

    def start(**settings: str) -> Metered:
        port = free_port()
        relay = start_relay(METRICS_PORT=str(port), **settings)
        started.append(relay)
        return Metered(relay=relay, metrics_port=port)

    yield start
    for relay in started:
        relay.stop()


@pytest.fixture(scope="module")
def shared_metered(start_relay: Callable[..., RelayProcess]) -> Metered:
    """One metered relay for the tests that only read its endpoints (stopped at the end of the session)."""
    port = free_port()
    return Metered(
        relay=start_relay(WEBHOOK_URL="http://127.0.0.1:9/webhook", METRICS_PORT=str(port)), metrics_port=port
    )


def raw_http(port: int, data: bytes) -> bytes:
    """`data` as sent, then everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def by_subject(request: RecordedRequest) -> int:
    return {"refused": 422, "failing": 503}.get(subject_of(request), 200)


def test_messages_recipients_and_deliveries_are_counted_by_reply_code_and_outcome(
    metered_relay: StartMetered, own_webhook: WebhookReceiver
) -> None:
    """Direct mode: 250 (webhook 200), 550 (unknown recipient), 554 (webhook 422), 451 (webhook 503, retried once)."""
    own_webhook.answer_with(by_subject)
    metered = metered_relay(WEBHOOK_URL=own_webhook.url, WEBHOOK_MAX_RETRIES="1")
    relay = metered.relay
    assert send_message(relay, "accepted") == ACCEPTED
    with relay.smtp() as smtp:
        smtp.ehlo()
        smtp.mail("alice@example.org")
        assert smtp.rcpt("nobody@example.test") == (550, b"No such user here")
    assert send_message(relay, "refused") == (554, b"5.6.0 Webhook refused the message (HTTP 422)")
    assert send_message(relay, "failing") == (451, b"4.3.0 Webhook delivery failed (HTTP 503), try again later")
    found = metered.scrape()
    assert recorded(found, "mailrelay_smtp_messages_total") == {
        'code="250",outcome="accepted"': 1.0,
        'code="554",outcome="rejected"': 1.0,
        'code="451",outcome="rejected"': 1.0,
    }
    assert recorded(found, "mailrelay_smtp_recipients_total") == {
        'code="250",outcome="accepted"': 3.0,
        'code="550",outcome="rejected"': 1.0,
    }
    assert recorded(found, "mailrelay_webhook_deliveries_total") == {
        'outcome="delivered"': 1.0,
        'outcome="refused"': 1.0,
        'outcome="failed"': 1.0,
    }
    assert recorded(found, "mailrelay_webhook_duration_seconds_count") == {
        'outcome="delivered"': 1.0,
        'outcome="refused"': 1.0,
        'outcome="http_error"': 2.0,
    }
    buckets = recorded(found, "mailrelay_webhook_duration_seconds_bucket")
    assert {key: value for key, value in buckets.items() if key.startswith('le="+Inf"')} == {
        'le="+Inf",outcome="delivered"': 1.0,
        'le="+Inf",outcome="refused"': 1.0,
        'le="+Inf",outcome="http_error"': 2.0,
    }
    assert recorded(found, "mailrelay_webhook_circuit_state") == {'state="closed"': 1.0}
    # the target-neutral names carry the same counts (the webhook_ ones above are their deprecated aliases)
    assert recorded(found, "mailrelay_deliveries_total") == {
        'outcome="delivered",target="webhook"': 1.0,
        'outcome="refused",target="webhook"': 1.0,
        'outcome="failed",target="webhook"': 1.0,
    }
    assert recorded(found, "mailrelay_delivery_attempt_duration_seconds_count") == {
        'outcome="delivered",target="webhook"': 1.0,
        'outcome="refused",target="webhook"': 1.0,
        'outcome="http_error",target="webhook"': 2.0,
    }
    assert recorded(found, "mailrelay_delivery_circuit_state") == {'state="closed",target="webhook"': 1.0}
    assert len(own_webhook.requests) == 4
    assert [name for name in found if name.startswith(("mailrelay_queue_", "mailrelay_dmarc_"))] == []


def test_open_sessions_follow_the_smtp_connections(shared_metered: Metered) -> None:
    def active() -> float:
        return shared_metered.scrape()["mailrelay_smtp_sessions_active"]

    assert wait_until(lambda: active() == 0.0, 5)  # the start-up probe's session is gone
    with shared_metered.relay.smtp() as smtp:
        smtp.ehlo()
        assert active() == 1.0
    assert wait_until(lambda: active() == 0.0, 5)


def test_health_port_still_answers_404_not_found_for_metrics(shared_metered: Metered) -> None:
    health = shared_metered.relay.health_port
    response = httpx.get(f"http://127.0.0.1:{health}/metrics", timeout=5)
    assert (response.status_code, response.text) == (404, "Not Found")
    response = httpx.post(f"http://127.0.0.1:{health}/health", timeout=5)
    assert (response.status_code, response.content) == (200, b"")


@pytest.mark.parametrize(
    ("request_bytes", "status_line"),
    [
        pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404 Not Found", id="health-path"),
        pytest.param(b"GET /random/../metrics HTTP/1.1\r\n\r\n", b"HTTP/1.1 404 Not Found", id="dot-segments"),
        pytest.param(b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"HTTP/1.1 405 Method", id="post"),
        pytest.param(b"DELETE /metrics HTTP/1.1\r\n\r\n", b"HTTP/1.1 405 Method Not Allowed", id="delete"),
        pytest.param(b"GET http://relay.example/metrics HTTP/1.1\r\n\r\n", b"HTTP/1.1 200 OK", id="absolute-form"),
        pytest.param(b"GET http://[/metrics HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 Bad Request", id="bad-absolute-form"),
        pytest.param(b"EHLO relay.example\r\n\r\n", b"HTTP/1.1 400 Bad Request", id="smtp-instead"),
        pytest.param(b"\x00\xff\x16\x03\r\n\r\n", b"HTTP/1.1 400 Bad Request", id="binary"),
        pytest.param(b"GET /" + b"m" * 100_000 + b" HTTP/1.1\r\n\r\n", b"HTTP/1.1 431 Request Header", id="huge-line"),
        pytest.param(b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 5000 + b"\r\n", b"HTTP/1.1 431", id="huge-head"),
    ],
)
def test_bad_input_on_the_metrics_port_gets_a_clear_answer(
    shared_metered: Metered, request_bytes: bytes, status_line: bytes
) -> None:
    answer = raw_http(shared_metered.metrics_port, request_bytes)
    assert answer.startswith(status_line)
    assert b"\r\nConnection: close\r\n" in answer
    assert [e for e in shared_metered.relay.events() if e["level"] in ("error", "critical")] == []


def test_other_methods_get_405_naming_the_allowed_ones(shared_metered: Metered) -> None:
    response = httpx.put(f"http://127.0.0.1:{shared_metered.metrics_port}/metrics", content=b"x", timeout=5)
    assert (response.status_code, response.headers["allow"], response.text) == (405, "GET, HEAD", "Method Not Allowed")


def test_random_paths_are_404_not_found(shared_metered: Metered) -> None:
    for path in ("/", "/metrics/", "/Metrics", "/api/v1/query", "/favicon.ico"):
        assert raw_http(shared_metered.metrics_port, f"GET {path} HTTP/1.1\r\n\r\n".encode()) == NOT_FOUND


def test_without_the_variable_nothing_listens_and_nothing_is_announced(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver
) -> None:
    port = free_port()
    relay = start_relay(WEBHOOK_URL=receiver.url)
    try:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        (started,) = relay.events("mailrelay_started")
        assert "metrics" not in started
    finally:
        relay.stop()


def test_the_listening_port_is_announced_at_start_up(shared_metered: Metered) -> None:
    (started,) = shared_metered.relay.events("mailrelay_started")
    assert started["metrics"] == f"127.0.0.1:{shared_metered.metrics_port}"


def run_relay(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    values = {
        "TARGET_EMAILS": TARGET,
        "WEBHOOK_URL": "http://127.0.0.1:9/webhook",
        "BIND_ADDRESS": "127.0.0.1",
        "HEALTH_BIND_ADDRESS": "127.0.0.1",
        "PORT": str(free_port()),
        "HEALTH_PORT": str(free_port()),
        **settings,
    }
    return subprocess.run(
        relay_command(), cwd=tmp_path, env=relay_env(**values), capture_output=True, text=True, timeout=20
    )


def test_metrics_port_equal_to_the_health_port_exits_2_before_listening(tmp_path: Path) -> None:
    port = free_port()
    result = run_relay(tmp_path, HEALTH_PORT=str(port), METRICS_PORT=str(port))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "mailrelay: configuration error: MAIL_RELAY_METRICS_PORT: expected a TCP port other than "
        f"MAIL_RELAY_HEALTH_PORT ({port}), got '{port}'\n"
    )


def test_metrics_port_in_use_exits_1_naming_the_metrics_variables(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_relay(tmp_path, METRICS_PORT=str(port))
    assert result.returncode == 1
    (event,) = log_events(result.stderr, "listen_failed")
    assert (event["variables"], event["address"]) == (
        "MAIL_RELAY_HEALTH_BIND_ADDRESS/MAIL_RELAY_METRICS_PORT",
        f"127.0.0.1:{port}",
    )


class FailOnce:
    """The webhook's answers by subject: `refuse-me` 422, `retry-me` 503 the first time and 200 after."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[str] = set()

    def __call__(self, request: RecordedRequest) -> int:
        subject = subject_of(request)
        if subject == "refuse-me":
            return 422
        with self.lock:
            first = subject not in self.seen
            self.seen.add(subject)
        return 503 if first else 200


def test_queue_mode_shows_the_stream_depth_retries_and_dead_letters(
    queue_relay: Callable[..., RelayProcess],
    own_webhook: WebhookReceiver,
    nats_server: NatsServer,
    stream_name: str,
) -> None:
    """An accept-only relay queues two messages (depth 2); a delivering relay on the same stream retries one
    (503, then 200) and dead-letters the other (422); then the stream holds just the dead letter."""
    own_webhook.answer_with(FailOnce())
    accepting_port, delivering_port = free_port(), free_port()
    accepting = Metered(
        relay=queue_relay(nats_server.url, stream_name, QUEUE_WORKERS="0", METRICS_PORT=str(accepting_port)),
        metrics_port=accepting_port,
    )
    assert send_message(accepting.relay, "retry-me") == ACCEPTED
    assert send_message(accepting.relay, "refuse-me") == ACCEPTED
    found = accepting.scrape()
    assert (
        found["mailrelay_queue_connected"],
        found["mailrelay_queue_depth"],
        found["mailrelay_queue_dead_letter_depth"],
    ) == (1.0, 2.0, 0.0)
    assert recorded(found, "mailrelay_smtp_messages_total") == {'code="250",outcome="accepted"': 2.0}
    assert recorded(found, "mailrelay_webhook_deliveries_total") == {}

    delivering = Metered(
        relay=queue_relay(nats_server.url, stream_name, METRICS_PORT=str(delivering_port)),
        metrics_port=delivering_port,
    )
    assert wait_until(
        lambda: bool(delivering.relay.events("message_relayed") and delivering.relay.events("message_dead_lettered")),
        DELIVERY_TIMEOUT_SECS,
    )
    found = delivering.scrape()
    assert recorded(found, "mailrelay_queue_retries_total") == {'reason="attempt_failed"': 1.0}
    assert recorded(found, "mailrelay_queue_dead_letters_total") == {'reason="refused"': 1.0}
    assert recorded(found, "mailrelay_webhook_deliveries_total") == {
        'outcome="delivered"': 1.0,
        'outcome="refused"': 1.0,
    }
    assert recorded(found, "mailrelay_webhook_duration_seconds_count") == {
        'outcome="delivered"': 1.0,
        'outcome="http_error"': 1.0,
        'outcome="refused"': 1.0,
    }
    assert recorded(found, "mailrelay_queue_publish_failures_total") == {}
    # an ack is not confirmed by the server: the stream lets go of the delivered message a moment later
    assert wait_until(lambda: accepting.scrape()["mailrelay_queue_depth"] == 0.0, 5)
    found = accepting.scrape()
    assert (found["mailrelay_queue_depth"], found["mailrelay_queue_dead_letter_depth"]) == (0.0, 1.0)
    assert delivering.scrape()["mailrelay_queue_dead_letter_depth"] == 1.0
