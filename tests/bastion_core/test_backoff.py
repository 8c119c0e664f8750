"""Backoff, jitter and Retry-After: the retry timing MailRelay's webhook client (and any retrying caller) uses.

docs/mailrelay.md promises these numbers (60 s Retry-After cap, base * 2^(n-1) capped at 30 s, half of it jitter).
"""

from __future__ import annotations

import email.utils

import pytest

from bastion_core import MAX_BACKOFF_SECS, MAX_RETRY_AFTER_SECS, backoff_delay, parse_retry_after, retry_wait


def test_documented_caps() -> None:
    assert (MAX_RETRY_AFTER_SECS, MAX_BACKOFF_SECS) == (60.0, 30.0)


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
