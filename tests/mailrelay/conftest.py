"""Fixtures for MailRelay unit and integration tests."""

from __future__ import annotations

import pytest

from mailrelay.testing import FakeClock
from tests.mailrelay.servers import S3_ACCESS_KEY, S3_SECRET_KEY


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


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
