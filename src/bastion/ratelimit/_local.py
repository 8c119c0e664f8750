"""The local limiter: GCRA buckets in this process's memory (per instance, reset on restart).

GCRA (the generic cell rate algorithm) keeps one number per bucket, its theoretical arrival time ``tat``:
the moment the bucket would be full again. A request is allowed when ``tat`` is less than ``burst``
intervals ahead of now; it then moves ``tat`` one interval on. ``burst`` requests pass at once, after which
requests pass one per ``period / limit`` seconds: a client that spends its whole quota at the end of one
window gets nothing extra at the start of the next (no double burst at window edges).

Memory stays bounded: a bucket whose ``tat`` has passed is full and is dropped (swept every
``sweep_interval_secs``), and beyond ``max_buckets`` the least recently charged bucket is forgotten.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from bastion.ratelimit._buckets import Bucket, Outcome, combine

DEFAULT_MAX_BUCKETS = 100_000
DEFAULT_SWEEP_INTERVAL_SECS = 60.0
_EPSILON = 1e-9


class GcraStep(NamedTuple):
    """One GCRA decision: ``tat`` to store (unchanged when refused) and the numbers for the headers."""

    allowed: bool
    tat: float
    remaining: int
    retry_after: float
    reset_after: float


def gcra(tat: float | None, now: float, *, interval: float, burst: int) -> GcraStep:
    """Charge one request at ``now`` to a bucket whose theoretical arrival time is ``tat`` (``None``: full).

    ``interval`` is seconds per request (``period / limit``), ``burst`` the requests allowed at once.
    ``reset_after`` is the time until the bucket is full again. The Lua script in
    :mod:`bastion.ratelimit._distributed` is the same function in integer microseconds.
    """
    current = now if tat is None or tat < now else tat
    new_tat = current + interval
    allow_at = new_tat - burst * interval
    if now < allow_at - _EPSILON:
        return GcraStep(False, current, 0, allow_at - now, current - now)
    return GcraStep(True, new_tat, int((now - allow_at) / interval + _EPSILON), 0.0, new_tat - now)


class LocalLimiter:
    """A :class:`~bastion.ratelimit._buckets.LimiterStore` in this process's memory.

    ``clock`` (monotonic seconds) drives the algorithm; ``wall_clock`` (Unix seconds) only dates
    ``X-RateLimit-Reset``. Both are injectable so tests move time by hand.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        sweep_interval_secs: float = DEFAULT_SWEEP_INTERVAL_SECS,
    ) -> None:
        if max_buckets <= 0:
            raise ValueError(f"max_buckets must be positive, got {max_buckets}")
        self._clock = clock
        self._wall_clock = wall_clock
        self.max_buckets = max_buckets
        self.sweep_interval_secs = sweep_interval_secs
        self._tats: OrderedDict[str, float] = OrderedDict()
        self._next_sweep = clock() + sweep_interval_secs

    def __len__(self) -> int:
        return len(self._tats)

    async def charge(self, bucket: Bucket) -> Outcome:
        return self.charge_now(bucket)

    def charge_now(self, bucket: Bucket) -> Outcome:
        """Charge synchronously (the decision never waits on I/O)."""
        now = self._clock()
        if bucket.more:
            return self._charge_windows(bucket, now)
        tats = self._tats
        key, quota = bucket.key, bucket.quota
        allowed, tat, remaining, retry_after, reset_after = gcra(
            tats.get(key), now, interval=quota.interval_secs, burst=quota.burst
        )
        if allowed:
            tats[key] = tat
        self._touch(key, now)
        return Outcome(
            allowed, quota.limit, remaining, retry_after, self._wall_clock() + reset_after, (), quota.period_secs
        )

    def _charge_windows(self, bucket: Bucket, now: float) -> Outcome:
        """Several windows: each decides; the request counts in all of them only when all allow it. One pass
        over the windows; the tats are written (and the keys touched) after it."""
        tats = self._tats
        states = []
        steps = []
        allowed = True
        for key, quota in ((bucket.key, bucket.quota), *bucket.more):
            step = gcra(tats.get(key), now, interval=quota.interval_secs, burst=quota.burst)
            allowed = allowed and step[0]
            steps.append((key, step[1]))
            states.append((quota, step[0], step[2], step[3], step[4]))
        for key, tat in steps:
            if allowed:
                tats[key] = tat
            self._touch(key, now)
        return combine(tuple(states), self._wall_clock())

    def _touch(self, key: str, now: float) -> None:
        tats = self._tats
        if key in tats:
            tats.move_to_end(key)  # a refused caller is still active: keep its (spent) bucket
            if len(tats) > self.max_buckets:
                tats.popitem(last=False)
        if now >= self._next_sweep:
            self.sweep(now)

    def sweep(self, now: float | None = None) -> int:
        """Drop every full bucket (its ``tat`` has passed: it holds nothing a new bucket would not); return how many."""
        now = self._clock() if now is None else now
        stale = [key for key, tat in self._tats.items() if tat <= now]
        for key in stale:
            del self._tats[key]
        self._next_sweep = now + self.sweep_interval_secs
        return len(stale)
