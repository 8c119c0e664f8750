"""Fixtures for MailRelay end-to-end tests: the real `mailrelay` console script as a subprocess on
free ports, and a real webhook receiver (an HTTP server in this process) that records requests."""

from __future__ import annotations

import json
import ssl
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import jsonschema
import pytest

from mailrelay._tls import generate_self_signed
from mailrelay.testing import WebhookReceiver, free_port, payload_schema
from tests.e2e.mailrelay.support import (
    MAX_ATTACHMENT_SIZE,
    MAX_MESSAGE_SIZE,
    SECOND_TARGET,
    SECRET,
    TARGET,
    RelayProcess,
    relay_command,
    relay_env,
    wait_until_listening,
)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert_pem, key_pem = generate_self_signed("relay.test", hosts=("127.0.0.1",))
    cert, key = directory / "cert.pem", directory / "key.pem"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    return cert, key


@pytest.fixture(scope="session")
def client_tls_context(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    """A verifying client context that trusts the test certificate."""
    context = ssl.create_default_context(cafile=str(tls_files[0]))
    context.check_hostname = False  # smtplib connects to 127.0.0.1; the SAN check is not under test
    return context


@pytest.fixture(scope="session")
def start_relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RelayProcess]]:
    """Factory: start_relay(WEBHOOK_URL=..., **MAIL_RELAY_overrides) -> a listening RelayProcess; `environment`
    adds other variables (AWS_*).

    Every process started here is stopped (SIGTERM, then kill) at the end of the session.
    """
    started: list[RelayProcess] = []

    def start(*, environment: Mapping[str, str] | None = None, **settings: str) -> RelayProcess:
        workdir = tmp_path_factory.mktemp("relay")  # an empty cwd: no stray .env is read
        smtp_port, health_port = free_port(), free_port()
        values = {
            "TARGET_EMAILS": f"{TARGET}, {SECOND_TARGET.upper()}",
            "BIND_ADDRESS": "127.0.0.1",
            "PORT": str(smtp_port),
            "HEALTH_BIND_ADDRESS": "127.0.0.1",
            "HEALTH_PORT": str(health_port),
            "WEBHOOK_TIMEOUT": "5",
            "WEBHOOK_BACKOFF_BASE": "0.01",
            "MAX_MESSAGE_SIZE": str(MAX_MESSAGE_SIZE),
            "SHUTDOWN_GRACE": "5",
            "LOG_LEVEL": "DEBUG",
            **settings,
        }
        log_path = workdir / "mailrelay.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                relay_command(),
                cwd=workdir,
                env={**relay_env(**values), **(environment or {})},
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        relay = RelayProcess(proc=proc, smtp_port=smtp_port, health_port=health_port, log_path=log_path)
        started.append(relay)
        wait_until_listening(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()


@pytest.fixture
def own_webhook() -> Iterator[WebhookReceiver]:
    """A receiver of the test's own: relays of other tests never post to it."""
    with WebhookReceiver() as running:
        yield running
        check_payloads(running)


@pytest.fixture
def queue_relay(
    start_relay: Callable[..., RelayProcess], own_webhook: WebhookReceiver
) -> Iterator[Callable[..., RelayProcess]]:
    """Factory: queue_relay(nats_url, stream, **MAIL_RELAY_overrides) -> a relay in queue mode posting to
    `own_webhook`, signing with SECRET; stopped at the end of the test (not of the session)."""
    started: list[RelayProcess] = []

    def start(nats_url: str, stream: str, **settings: str) -> RelayProcess:
        values = {
            "WEBHOOK_URL": own_webhook.url,
            "WEBHOOK_SIGNING_SECRET": SECRET,
            "QUEUE": "jetstream",
            "NATS_URL": nats_url,
            "QUEUE_STREAM": stream,
            "WEBHOOK_TIMEOUT": "5",
            "QUEUE_ACK_WAIT": "8",
            **settings,
        }
        relay = start_relay(**values)
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()


@pytest.fixture
def stream_name() -> str:
    """A stream of the test's own on the shared NATS server."""
    return f"E2E{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture
def webhook(receiver: WebhookReceiver) -> Iterator[WebhookReceiver]:
    """The shared receiver, emptied and answering 200 for this test; what it got is checked against the payload
    schemas afterwards."""
    receiver.reset()
    yield receiver
    check_payloads(receiver)


SCHEMAS = {version: jsonschema.Draft202012Validator(payload_schema(version)) for version in (1, 2)}


def check_payloads(receiver: WebhookReceiver) -> None:
    """Every payload a relay posted during the test is valid against the JSON Schema of its version."""
    for request in list(receiver.requests):
        payload = json.loads(request.body)
        SCHEMAS[payload.get("payload_version", 1)].validate(payload)


@pytest.fixture(scope="session")
def relay(
    start_relay: Callable[..., RelayProcess], receiver: WebhookReceiver, tls_files: tuple[Path, Path]
) -> RelayProcess:
    """The shared relay: signing on, header passthrough for X-Custom-* and X-Tracking*, test TLS pair, the
    per-attachment limit under its old name MAX_ATTACHMENT_SIZE (with the default policy action, drop)."""
    cert, key = tls_files
    return start_relay(
        WEBHOOK_URL=receiver.url,
        MAX_ATTACHMENT_SIZE=str(MAX_ATTACHMENT_SIZE),
        WEBHOOK_SIGNING_SECRET=SECRET,
        HEADER_PREFIX="X-Custom-, x-tracking",
        TLS_CERT=str(cert),
        TLS_KEY=str(key),
    )


@pytest.fixture
def dead_url() -> str:
    """A webhook URL on a port where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/webhook"
