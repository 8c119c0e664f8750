"""Circuit breaker over whole messages: consecutive failed deliveries open it, one probe closes it.

Pure state machine: no I/O, time comes from an injected clock so tests move it by hand.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Counts consecutive failed messages; at `threshold` it opens for `reset_after` seconds.

    `allow()` is asked before a message is delivered and, when it says yes, exactly one of
    `record_success()` / `record_failure()` must follow. While OPEN nothing is allowed; once
    `reset_after` has passed the breaker is HALF_OPEN and lets a single probe through: its success
    closes the breaker, its failure opens it again for another `reset_after`.
    """

    def __init__(self, *, threshold: int, reset_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        if reset_after <= 0:
            raise ValueError(f"reset_after must be > 0, got {reset_after}")
        self.threshold = threshold
        self.reset_after = reset_after
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.reset_after:
            self._state = BreakerState.HALF_OPEN
            self._probe_in_flight = False
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def retry_in(self) -> float:
        """Seconds until the next probe may pass (0 when not open)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.reset_after - self._clock())

    def allow(self) -> bool:
        """May a message be delivered now? In HALF_OPEN only the first caller gets a yes."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probe_in_flight:
            self._probe_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._probe_in_flight = False

    def record_failure(self) -> None:
        self._failures += 1
        if self._state is BreakerState.HALF_OPEN or self._failures >= self.threshold:
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
        self._probe_in_flight = False
