"""The circuit breaker state machine (spec, "States and transitions"): pure, the clock injected.

    Closed    outcomes observed   failure rate > threshold over >= min_requests outcomes   -> Open
    Closed    request             otherwise                                                 -> Closed (passes)
    Open      request             wait not elapsed                                          -> Open (rejected)
    Open      wait elapsed                                                                  -> Half-Open
    Half-Open test requests       succeed (half_open_requests of them)                      -> Closed
    Half-Open test requests       one fails                                                 -> Open

The failure rate is taken over a sliding window of the last ``min_requests`` outcomes (a count-based window:
the rate is known only once that many outcomes are in it). Half-Open admits at most ``half_open_requests``
test requests at a time; the rest are rejected as while Open.

Why not a library: purgatory, pybreaker and aiobreaker count *consecutive* failures; none has a failure
rate over a sliding window with a minimum call count, which is what the spec asks for.
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import structlog

from bastion_core._errors import ConfigError

log = structlog.get_logger("bastion_core.breaker")

DEFAULT_THRESHOLD = 0.5
DEFAULT_MIN_REQUESTS = 10
DEFAULT_WAIT_SECS = 30.0
DEFAULT_HALF_OPEN_REQUESTS = 1


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Ticket(NamedTuple):
    """What :meth:`CircuitBreaker.admit` hands out; pass it back to :meth:`CircuitBreaker.record`.

    ``generation`` changes with every transition: an outcome of a call admitted before a transition (a slow
    call finishing after the circuit opened) never counts in the new state.
    """

    generation: int
    probe: bool


class CircuitOpenError(Exception):
    """A call was rejected without being made: the circuit is open (or Half-Open has no test slot left)."""

    def __init__(self, name: str, retry_after: float) -> None:
        super().__init__(f"circuit {name!r} is open; retry in {math.ceil(retry_after)}s")
        self.name = name
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class BreakerSnapshot:
    """What a breaker's state looks like now (for logs, metrics and readiness)."""

    name: str
    state: BreakerState
    failure_rate: float
    window: int
    rejected: int
    retry_after: float


class CircuitBreaker:
    """Closed / Open / Half-Open over a sliding window of outcomes; see the module docstring for the table.

    Use: ``ticket = breaker.admit()`` (raises CircuitOpenError), make the call, then exactly one
    ``breaker.record(ticket, success=...)``; ``breaker.record(ticket, success=None)`` when the call's outcome
    says nothing about the downstream (it was cancelled by its caller, or refused by a bulkhead).

    ``threshold`` outside 0.0..1.0 is clamped (with a warning); ``min_requests``, ``wait_secs`` and
    ``half_open_requests`` must be positive (ConfigError naming the argument).
    """

    def __init__(
        self,
        name: str = "default",
        *,
        threshold: float = DEFAULT_THRESHOLD,
        min_requests: int = DEFAULT_MIN_REQUESTS,
        wait_secs: float = DEFAULT_WAIT_SECS,
        half_open_requests: int = DEFAULT_HALF_OPEN_REQUESTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            clamped = min(1.0, max(0.0, threshold))
            log.warning("circuit_breaker_threshold_clamped", breaker=name, threshold=threshold, clamped=clamped)
            threshold = clamped
        for key, value in (
            ("min_requests", min_requests),
            ("wait_secs", wait_secs),
            ("half_open_requests", half_open_requests),
        ):
            if not value > 0:
                raise ConfigError(f"circuit breaker {name!r}: {key} must be positive, got {value!r}")
        self.name = name
        self.threshold = threshold
        self.min_requests = min_requests
        self.wait_secs = wait_secs
        self.half_open_requests = half_open_requests
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._generation = 0
        self._window: deque[bool] = deque(maxlen=min_requests)  # True = failure
        self._failures = 0
        self._opened_at = 0.0
        self._probes_in_flight = 0
        self._probe_successes = 0
        self.rejected = 0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.wait_secs:
            self._transition(BreakerState.HALF_OPEN)
        return self._state

    @property
    def observed_state(self) -> BreakerState:
        """The state ``state`` would report, without making the Open -> Half-Open transition itself: safe to read
        from another thread (a metrics scrape)."""
        state = self._state
        if state is BreakerState.OPEN and self._clock() - self._opened_at >= self.wait_secs:
            return BreakerState.HALF_OPEN
        return state

    @property
    def failure_rate(self) -> float:
        """Failures over the outcomes in the window (0.0 while it is empty)."""
        return self._failures / len(self._window) if self._window else 0.0

    def retry_after(self) -> float:
        """Seconds until the circuit half-opens (0 unless Open)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.wait_secs - self._clock())

    def admit(self) -> Ticket:
        """Let one call through or raise CircuitOpenError (counted in ``rejected``)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return Ticket(self._generation, probe=False)
        if state is BreakerState.HALF_OPEN and self._probes_in_flight < self.half_open_requests:
            self._probes_in_flight += 1
            return Ticket(self._generation, probe=True)
        self.rejected += 1
        # Half-Open with every test slot taken: the answer comes within about one call.
        raise CircuitOpenError(self.name, self.retry_after() or 1.0)

    def record(self, ticket: Ticket, *, success: bool | None) -> None:
        """The outcome of an admitted call: True, False (a failure), or None (no information)."""
        if ticket.generation != self._generation:
            return  # admitted in an earlier state: its outcome says nothing about this one
        if ticket.probe:
            self._probes_in_flight -= 1
            if success is None:
                return
            if not success:
                self._open()
                return
            self._probe_successes += 1
            if self._probe_successes >= self.half_open_requests:
                self._transition(BreakerState.CLOSED)
            return
        if success is None:
            return
        failed = not success
        if len(self._window) == self._window.maxlen and self._window[0]:
            self._failures -= 1
        self._window.append(failed)
        self._failures += failed
        if len(self._window) >= self.min_requests and self.failure_rate > self.threshold:
            self._open()

    async def ready(self) -> None:
        """A readiness check: raises CircuitOpenError while the circuit is open, so ``/ready`` shows the
        dependency this breaker guards as unhealthy (``service.add_readiness_check(name, breaker.ready)``)."""
        if self.state is BreakerState.OPEN:
            raise CircuitOpenError(self.name, self.retry_after())

    def snapshot(self) -> BreakerSnapshot:
        return BreakerSnapshot(
            name=self.name,
            state=self.state,
            failure_rate=round(self.failure_rate, 4),
            window=len(self._window),
            rejected=self.rejected,
            retry_after=round(self.retry_after(), 3),
        )

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._transition(BreakerState.OPEN)

    def _transition(self, new: BreakerState) -> None:
        old = self._state
        rate = self.failure_rate
        self._state = new
        self._generation += 1
        self._probes_in_flight = 0
        self._probe_successes = 0
        if new is not BreakerState.HALF_OPEN:
            self._window.clear()
            self._failures = 0
        log.warning(
            "circuit_breaker_state_changed",
            breaker=self.name,
            old_state=old.value,
            new_state=new.value,
            failure_rate=round(rate, 4),
        )
