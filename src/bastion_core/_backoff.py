"""Exponential backoff with jitter, and the Retry-After header (RFC 9110 10.2.3), for any retrying caller."""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable

MAX_RETRY_AFTER_SECS = 60.0  # a peer cannot park a caller for longer than this per attempt
MAX_BACKOFF_SECS = 30.0


def backoff_delay(
    retry_number: int, *, base: float, cap: float = MAX_BACKOFF_SECS, random: Callable[[], float]
) -> float:
    """Delay before retry ``retry_number`` (1 for the first retry): base * 2**(n-1), capped, "equal jitter".

    The jitter keeps half of the exponential step and randomizes the other half, so retries of many callers
    spread out without ever collapsing to zero.
    """
    if retry_number < 1:
        raise ValueError(f"retry_number starts at 1, got {retry_number}")
    step = min(cap, base * 2.0 ** (retry_number - 1))
    return step / 2 + step / 2 * random()


def parse_retry_after(value: str | None, *, now: float, cap: float = MAX_RETRY_AFTER_SECS) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP-date).

    ``None`` when absent or unparsable, 0 for dates in the past; never more than ``cap``.
    """
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        seconds = float(int(value))
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if math.isnan(seconds):
        return None
    return min(cap, max(0.0, seconds))


def retry_wait(retry_number: int, *, retry_after: float | None, base: float, random: Callable[[], float]) -> float:
    """What to sleep before retry ``retry_number``: the peer's (capped) Retry-After when it sent one, else the
    jittered exponential backoff."""
    if retry_after is not None:
        return retry_after
    return backoff_delay(retry_number, base=base, random=random)
