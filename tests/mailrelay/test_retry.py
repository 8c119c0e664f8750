"""Backoff, jitter, Retry-After and which statuses are retried."""

from __future__ import annotations

import email.utils

import pytest

from mailrelay.retry import (
    MAX_BACKOFF_SECS,
    MAX_RETRY_AFTER_SECS,
    backoff_delay,
    is_retryable_status,
    parse_retry_after,
    retry_wait,
)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_retryable(status: int) -> None:
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", [200, 301, 400, 401, 403, 404, 409, 410, 413, 422])
def test_not_retryable(status: int) -> None:
    assert not is_retryable_status(status)


def test_backoff_doubles_and_jitter_keeps_half() -> None:
    assert [backoff_delay(n, base=1.0, random=lambda: 1.0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert [backoff_delay(n, base=1.0, random=lambda: 0.0) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]


def test_backoff_is_capped() -> None:
    assert backoff_delay(30, base=1.0, random=lambda: 1.0) == MAX_BACKOFF_SECS


def test_backoff_rejects_retry_zero() -> None:
    with pytest.raises(ValueError, match="starts at 1"):
        backoff_delay(0, base=1.0, random=lambda: 0.5)


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("", None), ("soon", None), ("0", 0.0), ("7", 7.0), ("3600", MAX_RETRY_AFTER_SECS)],
)
def test_retry_after_seconds(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now=1_000_000.0) == expected


def test_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 10, usegmt=True), now=now) == pytest.approx(10)
    assert parse_retry_after(email.utils.formatdate(now - 10, usegmt=True), now=now) == 0.0


def test_retry_after_wins_over_backoff() -> None:
    assert retry_wait(1, retry_after=5.0, base=1.0, random=lambda: 0.5) == 5.0
    assert retry_wait(1, retry_after=None, base=1.0, random=lambda: 1.0) == 1.0
