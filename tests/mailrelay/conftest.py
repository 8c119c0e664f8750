"""Fixtures for MailRelay unit and integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mailrelay.testing import FakeClock
from tests.mailrelay.servers import S3_ACCESS_KEY, S3_SECRET_KEY, DnsZone, S3Server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def dns_zone() -> Iterator[DnsZone]:
    """A real DNS server on loopback (UDP and TCP) for the DMARC tests; each test publishes its own names."""
    with DnsZone() as zone:
        yield zone


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 API server in a child process on a free loopback port, stopped by its PID at the end."""
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard AWS variables the S3 client reads, set to the test server's keys."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance metadata service
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")  # nothing of the machine's own AWS set-up
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
